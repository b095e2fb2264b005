"""The settings' groups, one per concern, each read from its own ``FULFILMENT_*`` variables.

Every number that bounds time is a named setting in seconds, and a group refuses to exist when
its bounds do not nest; the one rule across groups is on ``fulfilment.settings.Settings``.
A field's docstring is its entry in the configuration reference (``make docs``).
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import itertools
import re
from collections.abc import Mapping
from typing import Annotated, Literal, Self

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from fulfilment.contracts.dead_letter import DEAD_LETTER_TTL_SECONDS
from fulfilment.settings import urls
from fulfilment.settings.dotenv import ENV_FILE, ENV_PREFIX
from fulfilment.settings.urls import AMQP_TLS_PARAMETERS, SSL_MODES

__all__ = [
    "AMQP_TLS_PARAMETERS",
    "ENV_FILE_ENCODING",
    "SSL_MODES",
    "BrokerSettings",
    "DatabaseSettings",
    "DeadlineSettings",
    "HttpSettings",
    "ProcessSettings",
    "RelaySettings",
    "RetentionSettings",
    "SettingsGroup",
    "WarehouseSettings",
    "WebhooksSettings",
    "WorkerSettings",
    "env_name",
    "not_less",
]

ENV_FILE_ENCODING = "utf-8"
"""The encoding ``.env`` is read in; a file that is not valid in it is refused at its line."""

WEBHOOK_SECRET_PREFIX = "whsec_"  # noqa: S105 - the prefix of every secret, not one
"""How a Standard Webhooks secret starts: ``whsec_`` and the base64 of its bytes."""

WEBHOOK_SECRET_MIN_BYTES = 24
"""The fewest bytes a webhook secret's key may have: Standard Webhooks asks for 24 to 64 random
bytes."""

MAX_RESERVATION_BATCH = 1000
"""Most orders one reservation transaction may carry (``reservation_batch_max``)."""

Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
"""A duration in seconds, finite and positive."""

PerSecond = Annotated[float, Field(gt=0, allow_inf_nan=False)]
"""A rate per second, finite and positive."""

RUNTIME_ROLE_PATTERN = re.compile(r"[a-z_][a-z0-9_]{0,62}")
"""Role names ``FULFILMENT_DATABASE_RUNTIME_ROLE`` accepts: PostgreSQL's unquoted identifiers in
lower case, at most 63 bytes (``NAMEDATALEN - 1``), so that a name reads the same quoted (as
the grants quote it) or not (as in docs/security.md's SQL)."""


def _config(prefix: str) -> SettingsConfigDict:
    """A group's configuration: its variables start with ``prefix``; it reads ``.env`` too."""
    return SettingsConfigDict(
        env_prefix=prefix,
        env_file=ENV_FILE,
        env_file_encoding=ENV_FILE_ENCODING,
        extra="ignore",  # the environment and .env hold the other groups' variables
        frozen=True,
    )


class SettingsGroup(BaseSettings):
    """One concern's settings; a field ``name`` is read from ``<env_prefix><NAME>``.

    Built alone (``DatabaseSettings()``), a group reads the environment and ``.env``; built
    with ``model_validate``, only the values given and its defaults.
    """

    def _must_be_less(self, *pairs: tuple[str, str]) -> list[str]:
        """A line per ``(inner, outer)`` pair of fields whose values do not nest."""
        return [
            not_less(
                (type(self), inner, getattr(self, inner)), (type(self), outer, getattr(self, outer))
            )
            for inner, outer in pairs
            if getattr(self, inner) >= getattr(self, outer)
        ]


Bound = tuple[type[BaseSettings], str, float]
"""A time bound as a rule across fields names it: its group, its field and its value."""


def not_less(inner: Bound, outer: Bound) -> str:
    """``FULFILMENT_A=5 must be less than FULFILMENT_B=3``: both variables, both values."""
    return " must be less than ".join(
        f"{env_name(group, field)}={value:.10g}" for group, field, value in (inner, outer)
    )


def _raise_if(problems: list[str]) -> None:
    """Raise the problems of a rule across fields as one message (each names its variables)."""
    if problems:
        raise ValueError("; ".join(problems))


def env_name(group: type[BaseSettings], field: str) -> str:
    """The environment variable of ``group``'s ``field``, e.g. ``FULFILMENT_PREFETCH_COUNT``."""
    return f"{group.model_config.get('env_prefix', '')}{field}".upper()


class DatabaseSettings(SettingsGroup):
    """PostgreSQL: where it is, how long a connection and a statement may take, the pool.

    Read by every program (``FULFILMENT_DATABASE_*``).
    """

    model_config = _config(f"{ENV_PREFIX}DATABASE_")

    url: SecretStr = SecretStr("postgresql+asyncpg://postgres@localhost:5432/fulfilment")
    """PostgreSQL URL; ``postgresql://`` is accepted and run with the asyncpg driver. TLS is
    set by libpq's query parameters: ``sslmode`` (one of :data:`SSL_MODES`), ``sslrootcert``
    (the CA file), ``sslcert``/``sslkey`` (a client certificate). ``verify-full`` checks the
    server's certificate and host name; ``require`` only encrypts, unless ``sslrootcert`` is
    given (libpq's meaning). Servers of which the primary is to be used: one ``host`` each,
    ``?host=a:5432&host=b:5432&target_session_attrs=read-write`` (``engine.asyncpg_dsn``).
    It must name its database (its path, or ``dbname=``): without one the server would be
    asked for the database named as the user, ``postgres`` for the default user."""

    connect_timeout_seconds: Seconds = 2.0
    """Time allowed to open one PostgreSQL connection."""

    statement_timeout_seconds: Seconds = 3.0
    """Server-side ``statement_timeout`` of the worker's sessions: the server, not the client,
    cancels a slow statement, so a statement time-out never leaves its commit in doubt. The
    reservation pool waits 1 s longer, and only then gives up on the connection."""

    lock_timeout_seconds: Seconds = 1.0
    """Server-side ``lock_timeout``: a reservation waiting this long for a stock row lock fails
    with a retryable error instead of queueing behind a stuck transaction."""

    pool_size: int = Field(default=2, ge=1, le=200)
    """Most reservation transactions one worker process runs at once, each on a connection of
    its own (opened on demand). Deliveries that arrive while a transaction runs wait, and the
    next transaction reserves them together (group commit, at most ``reservation_batch_max``
    orders); one beside a running transaction starts only when a whole batch waits
    (``adapters.postgres.group_commit``). The process holds at most this many connections plus
    ``ENGINE_POOL_SIZE`` (2) for everything else (``adapters.postgres.engine``)."""

    runtime_role: str = ""
    """The PostgreSQL role the worker and the relay connect as (the user of their
    ``FULFILMENT_DATABASE_URL``), for ``fulfilment migrate`` only: after upgrading, it gives this
    role the privileges of ``adapters.postgres.privileges.RUNTIME_PRIVILEGES`` and nothing
    else (docs/security.md, "Least privilege"). Empty: no grants (one line says so), as when every
    process connects as the owner."""

    @field_validator("url")
    @classmethod
    def _url(cls, value: SecretStr) -> SecretStr:
        return SecretStr(urls.database_url(value.get_secret_value()))

    @field_validator("runtime_role")
    @classmethod
    def _role_name(cls, value: str) -> str:
        if value and not RUNTIME_ROLE_PATTERN.fullmatch(value):
            msg = (
                f"{value!r} is not a role name: lower-case letters, digits and _, not starting"
                " with a digit, at most 63 characters"
            )
            raise ValueError(msg)
        return value

    @model_validator(mode="after")
    def _timeouts_nest(self) -> Self:
        _raise_if(self._must_be_less(("lock_timeout_seconds", "statement_timeout_seconds")))
        return self


class BrokerSettings(SettingsGroup):
    """RabbitMQ: where it is, and the arguments of the queues the worker declares.

    Read by the worker, the relay and the operator tools.
    """

    model_config = _config(ENV_PREFIX)

    amqp_url: SecretStr = SecretStr("amqp://guest:guest@localhost:5672/")
    """RabbitMQ URL (``amqp://`` or ``amqps://``), credentials and virtual host included. Every
    connection of the service reads TLS from it the same way (aiormq's query parameters,
    :data:`AMQP_TLS_PARAMETERS`): ``amqps://`` checks the server's certificate chain and host
    name, against ``cafile`` (the CA file) or else the system's CAs; ``certfile``/``keyfile``
    add a client certificate; ``no_verify_ssl=1`` turns the check off."""

    delivery_limit: int = Field(default=5, ge=1, le=1000)
    """``x-delivery-limit`` of the main queue. The service dead-letters a message that keeps
    crashing or stalling workers as ``poison`` on this delivery, counting redeliveries itself
    (RabbitMQ 4.3 stopped counting crash returns); the broker's own limit is the backstop. Set
    explicitly because RabbitMQ 4.0 changed the default to 20."""

    quorum_initial_group_size: int = Field(default=3, ge=1)
    """``x-quorum-initial-group-size`` of every quorum queue the worker declares: how many
    members (replicas on distinct nodes) RabbitMQ gives a queue when it creates it, at most the
    nodes the cluster has then (a single node: 1). 3 matches a three-node cluster, which keeps
    its queues through the loss of one node. Odd: a group of 2n members survives no more lost
    members than one of 2n - 1. Read by RabbitMQ only at creation; a queue that exists keeps
    its members (docs/events.md, "Topology and delivery limit")."""

    @field_validator("amqp_url")
    @classmethod
    def _amqp_url(cls, value: SecretStr) -> SecretStr:
        urls.check_broker_url(value.get_secret_value())
        return value

    @field_validator("quorum_initial_group_size")
    @classmethod
    def _odd_group(cls, value: int) -> int:
        if value % 2 == 0:
            msg = (
                f"must be odd: a group of {value} members survives no more lost members than "
                f"one of {value - 1}"
            )
            raise ValueError(msg)
        return value


class DeadlineSettings(SettingsGroup):
    """The time bounds of one delivery and of a shutdown, which must nest.

    ``retry budget < handler deadline < graceful timeout < orchestrator grace period`` and
    ``handler deadline < broker consumer timeout``: a transient error is retried within the
    handler's deadline, an in-flight handler finishes before the broker drains it away, and
    Kubernetes never SIGKILLs a draining pod. The retry budget also bounds the retries of the
    relay's, the dispatcher's and the tools' database calls.
    """

    model_config = _config(ENV_PREFIX)

    retry_budget_seconds: Seconds = 5.0
    """Total time the database retry policy may spend on one reservation, sleeps included."""

    handler_deadline_seconds: Seconds = 10.0
    """Longest time one delivery may take from receipt to the reservation's commit."""

    graceful_timeout_seconds: Seconds = 20.0
    """How long SIGTERM waits for in-flight handlers before cancelling them (they are requeued)."""

    orchestrator_grace_period_seconds: Seconds = 30.0
    """The orchestrator's SIGTERM-to-SIGKILL window (``terminationGracePeriodSeconds``)."""

    broker_consumer_timeout_seconds: Seconds = 1800.0
    """RabbitMQ's ``consumer_timeout`` (30 minutes by default): an unacknowledged delivery older
    than this closes the channel."""

    @model_validator(mode="after")
    def _deadlines_nest(self) -> Self:
        chain = [
            "retry_budget_seconds",
            "handler_deadline_seconds",
            "graceful_timeout_seconds",
            "orchestrator_grace_period_seconds",
        ]
        _raise_if(
            self._must_be_less(
                *itertools.pairwise(chain),
                ("handler_deadline_seconds", "broker_consumer_timeout_seconds"),
            )
        )
        return self


class WorkerSettings(SettingsGroup):
    """The worker (``fulfilment worker``): its inbox, its concurrency and batches, its monitors."""

    model_config = _config(ENV_PREFIX)

    consumer_name: str = Field(default="fulfilment", min_length=1, max_length=100)
    """Inbox namespace: the ``consumer`` column of ``inbox_messages``. Never change it on a live
    database, or every past event would look new."""

    prefetch_count: int = Field(default=64, ge=1, le=1000)
    """Unacknowledged deliveries per queue the worker consumes (each of its three queues has a
    channel of its own with this prefetch), hence handlers running at once per queue: FastStream
    starts one task per delivery and has no other concurrency limit on RabbitMQ."""

    reservation_batch_max: int = Field(default=64, ge=1, le=MAX_RESERVATION_BATCH)
    """Most orders one reservation transaction carries, at most ``prefetch_count``: a batch
    holds deliveries in flight, and there are no more of those. Unset, it follows
    ``prefetch_count`` (every delivery in flight); 1 commits every order in a transaction of
    its own."""

    consumer_lost_exit_seconds: Seconds = 30.0
    """How long the worker may run without a consumer on its queue (cancelled by the broker,
    not restored after a reconnect) before it exits with code 1 for the orchestrator to
    restart it. Pauses during a database outage do not count."""

    queue_poll_interval_seconds: Seconds = 15.0
    """How often each worker reads the depth and consumers of its queue and of the DLQ (a
    passive declare) for the ``fulfilment_queue_*`` gauges; about the scrape interval."""

    invariant_check_interval_seconds: Seconds = 60.0
    """How often each worker checks the stock invariants for
    ``fulfilment_stock_invariant_violations``: one read of the stock and reservation tables."""

    @model_validator(mode="before")
    @classmethod
    def _batch_follows_prefetch(cls, data: object) -> object:
        if not isinstance(data, Mapping) or data.get("reservation_batch_max") is not None:
            return data
        try:
            prefetch = int(data["prefetch_count"])
        except (KeyError, TypeError, ValueError):
            return data  # the default follows the default; a bad prefetch is reported alone
        if 1 <= prefetch <= MAX_RESERVATION_BATCH:
            return {**data, "reservation_batch_max": prefetch}
        return data

    @model_validator(mode="after")
    def _batch_within_prefetch(self) -> Self:
        # A batch gathers the deliveries in flight, at most the prefetch: a larger maximum
        # could never fill, and would read as a promise of larger transactions.
        if self.reservation_batch_max > self.prefetch_count:
            msg = (
                f"{env_name(WorkerSettings, 'reservation_batch_max')}="
                f"{self.reservation_batch_max} must not be more than"
                f" {env_name(WorkerSettings, 'prefetch_count')}={self.prefetch_count}:"
                " a batch holds deliveries in flight, and no more than the prefetch are"
            )
            raise ValueError(msg)
        return self


class RelaySettings(SettingsGroup):
    """The relay (``fulfilment relay``): how it reads the outbox and publishes it."""

    model_config = _config(f"{ENV_PREFIX}RELAY_")

    batch_size: int = Field(default=100, ge=1, le=10000)
    """Most outbox rows the relay reads and publishes at once (one per order in a batch)."""

    poll_seconds: Seconds = 1.0
    """How often the active relay reads the outbox without a notification, and how often a
    standby relay tries the advisory lock (the longest take-over after the holder's session
    ends) and reads the backlog gauges."""

    batch_window_seconds: float = Field(default=0.02, ge=0, le=1, allow_inf_nan=False)
    """After a batch smaller than ``relay_batch_size``, how long the relay lets outbox rows
    gather before it reads the next batch, counted from the read of that batch (its publish
    and mark count towards it): fewer, larger batches under load (less CPU per event) for at
    most this much more commit-to-published lag. 0 reads at once."""

    publish_timeout_seconds: Seconds = 10.0
    """How long a batch may wait for the broker's confirms before the relay takes its broker
    connection for lost and connects again (the unconfirmed rows are published again)."""


class WarehouseSettings(SettingsGroup):
    """The warehouse system and the hand-off the dispatcher sends it: API, limits, keys' lifetime.

    Read by the dispatcher (docs/design.md, "Warehouse hand-off"); the worker reads only
    whether ``FULFILMENT_WAREHOUSE_URL`` is set (it then records hand-off requests), the
    operator tools the URL and its secret.
    """

    model_config = _config(f"{ENV_PREFIX}WAREHOUSE_")

    url: str | None = None
    """Base of the warehouse system's API, e.g. ``https://wms.example/api/v1`` (``http://`` or
    ``https://``). Unset: no hand-off; the service behaves as without a warehouse system and
    ``fulfilment dispatcher`` refuses to start."""

    token: SecretStr = SecretStr("")
    """The API's secret, sent as ``Authorization: Bearer <token>``; empty: no
    ``Authorization`` header."""

    ca_file: str | None = None
    """A PEM CA bundle the warehouse system's certificate is checked against (an ``https://``
    URL only); unset: the system's CAs. Read when the dispatcher starts."""

    timeout_seconds: Seconds = 10.0
    """One request's timeout, for each of connect, write, read and the wait for a pooled
    connection, and for the request as a whole. A request that times out is sent again later
    under the same key (the warehouse may have committed it)."""

    rate_per_second: PerSecond = 2.5
    """Most requests per second to the warehouse system (2.5: 150 a minute, what real 3PL APIs
    allow per account). Held for every request, retries and probes included, and never
    exceeded within a second (up to 50 a second, requests go at least ``1 / rate`` seconds
    apart; above, a wake-up that came late is caught up within the second's cap)."""

    concurrency: int = Field(default=4, ge=1, le=256)
    """Most requests in flight at once, and the most connections of the dispatcher's pool."""

    key_retention_seconds: Seconds = 24 * 3600.0
    """How long the warehouse system keeps an idempotency key (24 h, as Stripe). A request
    still unanswered this long after its first attempt is ``expired``: a retry after it could
    create a second order, so it waits for an operator (``resend``)."""

    reconcile_after_seconds: Seconds = 3600.0
    """How long an accepted fulfilment order that still holds units may go without news (no
    shipment, no cancellation of the warehouse) before the dispatcher asks the warehouse about
    it (``GET /fulfilment-orders/{id}``), and then the interval between two polls of it while
    it holds units. What the answer lists is applied as if it had come by webhook. The polls
    share the rate cap, after the requests."""

    drift_interval_seconds: float = Field(default=900.0, ge=0, le=24 * 3600, allow_inf_nan=False)
    """How often the active dispatcher compares the service's stock with the warehouse's
    (``GET /inventory``, as ``fulfilment stock drift``) for the gauges
    ``fulfilment_stock_drift_skus`` and ``fulfilment_stock_drift_units`` and the alert on
    unexplained drift; 0 turns the check off. The first check runs this long after a dispatcher
    becomes active, the next this long after the last one ended. Its requests share the rate cap,
    after the requests and the polls (a page of 500 SKUs per request)."""

    webhook_secrets: SecretStr = SecretStr("")
    """The secrets the warehouse signs its webhooks with: one or more ``whsec_<base64>``,
    separated by spaces, each key at least 24 bytes (Standard Webhooks: 24 to 64 random
    bytes). A webhook passes when any of its ``v1`` signatures matches any of them, so a new
    secret is added beside the old one, the warehouse switched, then the old one removed,
    without a pause. Needed by ``fulfilment webhooks`` alone, which refuses to start
    without it."""

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if not value:
            return None
        urls.check_warehouse_url(value)
        return value

    @field_validator("webhook_secrets")
    @classmethod
    def _webhook_secrets(cls, value: SecretStr) -> SecretStr:
        # The message names the position of a bad secret, never the secret itself.
        if "," in value.get_secret_value():  # never in base64: a list written with commas
            msg = "secrets are separated by spaces, not commas"
            raise ValueError(msg)
        for position, secret in enumerate(value.get_secret_value().split(), start=1):
            if not secret.startswith(WEBHOOK_SECRET_PREFIX):
                msg = f"secret {position} does not start with {WEBHOOK_SECRET_PREFIX!r}"
                raise ValueError(msg)
            try:
                key = base64.b64decode(secret.removeprefix(WEBHOOK_SECRET_PREFIX), validate=True)
            except binascii.Error:
                msg = f"secret {position} is not {WEBHOOK_SECRET_PREFIX}<base64>"
                raise ValueError(msg) from None
            if not key:
                msg = f"secret {position} is empty"
                raise ValueError(msg)
            if len(key) < WEBHOOK_SECRET_MIN_BYTES:
                msg = (
                    f"secret {position} is {len(key)} bytes, fewer than the"
                    f" {WEBHOOK_SECRET_MIN_BYTES} random bytes Standard Webhooks asks for"
                )
                raise ValueError(msg)
        return value

    @field_validator("ca_file")
    @classmethod
    def _ca_file(cls, value: str | None) -> str | None:
        return value or None

    @model_validator(mode="after")
    def _hand_off_holds(self) -> Self:
        # A request must be able to time out many times within its key's retention.
        problems = self._must_be_less(("timeout_seconds", "key_retention_seconds"))
        if self.ca_file and not (self.url or "").startswith("https://"):
            problems.append(
                f"{env_name(WarehouseSettings, 'ca_file')} is set but"
                f" {env_name(WarehouseSettings, 'url')} is not an https:// URL: the CA file"
                " would check nothing"
            )
        _raise_if(problems)
        return self


class WebhooksSettings(SettingsGroup):
    """The intake of the warehouse's webhooks (``fulfilment webhooks``): ports and limits.

    Read by ``fulfilment webhooks`` only (docs/design.md, "Hearing back from the warehouse"),
    which also needs ``FULFILMENT_WAREHOUSE_WEBHOOK_SECRETS``. The endpoint and the probes
    listen on ports of their own (on ``FULFILMENT_HTTP_HOST``), so that an Ingress exposes the
    endpoint and nothing else.
    """

    model_config = _config(f"{ENV_PREFIX}WEBHOOKS_")

    port: int = Field(default=8083, ge=1, le=65535)
    """Port of ``POST /webhooks/warehouse``, the endpoint the warehouse sends its webhooks to."""

    http_port: int = Field(default=8084, ge=1, le=65535)
    """Port of the intake's ``/health/live``, ``/health/ready`` and ``/metrics``."""

    tolerance_seconds: int = Field(default=300, ge=1, le=24 * 3600)
    """How far a webhook's ``webhook-timestamp`` may be from now, either way, in whole seconds
    (300, as the Standard Webhooks libraries and Stripe): an older or newer one is refused 401,
    so that a captured request cannot be replayed later."""

    max_body_bytes: int = Field(default=1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    """Largest webhook body taken, in bytes (1 MiB). A larger one is refused 413 as soon as its
    ``Content-Length`` or the bytes read so far pass it, before the whole body is in memory."""

    @model_validator(mode="after")
    def _ports_differ(self) -> Self:
        if self.port == self.http_port:
            msg = (
                f"{env_name(WebhooksSettings, 'port')} and"
                f" {env_name(WebhooksSettings, 'http_port')} are both {self.port}: the endpoint"
                " and the probes listen on ports of their own"
            )
            raise ValueError(msg)
        return self


class HttpSettings(SettingsGroup):
    """Where each program serves ``/health/live``, ``/health/ready`` and ``/metrics``."""

    model_config = _config(ENV_PREFIX)

    http_host: str = "0.0.0.0"  # noqa: S104 - probes and scrapes reach the pod on its own IP
    """IP address (v4 or v6) the HTTP server for ``/health/live``, ``/health/ready`` and
    ``/metrics`` listens on; ``0.0.0.0`` is every IPv4 interface, ``::`` every IPv6 one. A
    host name is refused: it would be resolved only when the server starts."""

    http_port: int = Field(default=8080, ge=1, le=65535)
    """Port of that HTTP server."""

    relay_http_port: int = Field(default=8081, ge=1, le=65535)
    """Port of the relay's ``/health/live``, ``/health/ready`` and ``/metrics`` (on
    ``FULFILMENT_HTTP_HOST``)."""

    dispatcher_port: int = Field(default=8082, ge=1, le=65535)
    """Port of the dispatcher's ``/health/live``, ``/health/ready`` and ``/metrics`` (on
    ``FULFILMENT_HTTP_HOST``)."""

    @field_validator("http_host")
    @classmethod
    def _ip_address(cls, value: str) -> str:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            msg = f"{value!r} is not an IP address: use 0.0.0.0 (every interface) or 127.0.0.1"
            raise ValueError(msg) from None
        return value


class ProcessSettings(SettingsGroup):
    """How every program runs: its logs and its event loop."""

    model_config = _config(ENV_PREFIX)

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Threshold of the service's logs."""

    log_format: Literal["auto", "json", "console"] = "auto"
    """``auto`` writes JSON unless standard error is a terminal."""

    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    """The event loop of the worker and the relay: ``uvloop`` (libuv; it spends less CPU per
    message, see docs/performance.md) or the standard library's ``asyncio`` loop."""


class RetentionSettings(SettingsGroup):
    """How long the outbox, the inboxes and the dead letters keep what they hold, and the replays.

    Read by ``fulfilment prune``, ``outbox prune`` and ``dlq``; processed ids must outlive
    every way a message can come back.
    """

    model_config = _config(ENV_PREFIX)

    outbox_retention_seconds: Seconds = 7 * 24 * 3600.0
    """How long a published outbox row is kept (7 days) before ``fulfilment outbox prune``
    deletes it: the window in which an event can be looked up by its ``event_id``."""

    outbox_prune_batch_size: int = Field(default=1000, ge=1, le=100000)
    """Rows ``fulfilment prune`` deletes per transaction, from the outbox and from the inbox."""

    dead_letter_ttl_seconds: Seconds = DEAD_LETTER_TTL_SECONDS
    """How long a dead letter stays in its DLQ (14 days) before the broker drops it: the
    ``message-ttl`` of the DLQ policies (``deploy/rabbitmq/definitions.json``,
    ``k8s/rabbitmq-policy.yaml``, in milliseconds there), stated here so the service can check
    the retention below against it. Handle a dead letter before then (the DLQ alerts fire
    long before)."""

    processed_id_retention_seconds: Seconds = 30 * 24 * 3600.0
    """How long an event's inbox row (its processed id) is kept (30 days) before ``fulfilment
    prune`` may delete it. Must be longer than ``dead_letter_ttl_seconds`` and
    ``outbox_retention_seconds``: processed ids are kept as long as a message can come back,
    and ``fulfilment dlq replay`` refuses a dead letter older than this."""

    webhook_inbox_retention_seconds: Seconds = 7 * 24 * 3600.0
    """How long a warehouse webhook's id (``webhook_inbox``) is kept (7 days) before
    ``fulfilment prune`` deletes it: longer than the sender retries a webhook (ShipBob up to
    24 hours, the Standard Webhooks schedule about 3 days), so a retry is a duplicate by its
    webhook id. A webhook that comes later still changes nothing: its shipment or
    cancellation is recorded by its own id, which is never pruned."""

    replay_limit: int = Field(default=3, ge=1, le=1000)
    """Replays after which ``fulfilment dlq replay`` refuses a dead letter without ``--force``
    (counted by its ``x-fulfilment-replay-count`` header and by the audit table)."""

    @model_validator(mode="after")
    def _processed_ids_outlive_messages(self) -> Self:
        # Processed ids outlive every way a message can come back (docs/runbook.md,
        # "Retention of processed ids").
        _raise_if(
            self._must_be_less(
                ("dead_letter_ttl_seconds", "processed_id_retention_seconds"),
                ("outbox_retention_seconds", "processed_id_retention_seconds"),
            )
        )
        return self
