"""Typed settings, read once from ``FULFILMENT_*`` environment variables.

Every number that bounds time is a named setting in seconds, and :class:`Settings` refuses to
exist when they do not nest (docs/configuration.md)::

    lock timeout < statement timeout < retry budget < handler deadline < graceful timeout
        < orchestrator grace period
    handler deadline < broker consumer timeout

so that a transient error is retried by one layer within the handler's deadline, an in-flight
handler finishes before the broker drains it away, and Kubernetes never SIGKILLs a draining pod.
With group commit a delivery may also wait for the transaction running before its batch; in a
long database slowdown its deadline can then pass while its batch commits, and the delivery is
requeued and answered ``duplicate:event`` on redelivery (docs/events.md, "Outcomes and failures").
"""

from __future__ import annotations

import base64
import binascii
import difflib
import io
import ipaddress
import itertools
import os
import re
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Final, Literal, NamedTuple, Self

from dotenv.parser import Original, parse_stream
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from fulfilment.asyncpg_url import ASYNCPG_URL_PARAMETERS
from fulfilment.contracts.dead_letter import DEAD_LETTER_TTL_SECONDS
from fulfilment.utf8 import at_line, not_utf8

ENV_PREFIX = "FULFILMENT_"

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

SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
"""libpq's ``sslmode`` values (PostgreSQL manual, "SSL Support"), with libpq's meanings."""


def _check_tls_parameters(url: str) -> None:
    """Refuse query parameters of a database URL that no connection could use.

    Raises:
        ValueError: a near miss of a parameter asyncpg reads (``sslmod``, ``sslrootcrt``,
            ``SSLMODE``; ``asyncpg_url.ASYNCPG_URL_PARAMETERS``), which asyncpg would send to the
            server as a setting (no setting in PostgreSQL 15's ``pg_settings`` is that near
            one); an ``sslmode`` outside :data:`SSL_MODES`; or ``ssl=`` (asyncpg's keyword,
            which a URL would send to the server as a setting, failing every pooled connection
            with "parameter ssl cannot be changed now"). The files ``sslrootcert`` and the
            others name are read when connecting, not here: the settings are also checked
            where those files are not mounted (the deploy files' tests).
    """
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    for name in query:
        if name in ASYNCPG_URL_PARAMETERS or "." in name:  # a dotted name: an extension's
            continue
        meant = difflib.get_close_matches(name.lower(), ASYNCPG_URL_PARAMETERS, n=1, cutoff=0.8)
        if meant:
            msg = (
                f"has {name}=, which is no connection parameter and would reach the server as"
                f" a setting: did you mean {meant[0]}=?"
            )
            raise ValueError(msg)
    if "ssl" in query:
        msg = "takes TLS as libpq does: use sslmode=verify-full (or require), not ssl="
        raise ValueError(msg)
    for mode in query.get("sslmode", []):
        if mode not in SSL_MODES:
            msg = f"has sslmode={mode!r}; it must be one of {', '.join(SSL_MODES)}"
            raise ValueError(msg)


AMQP_TLS_PARAMETERS = ("cafile", "capath", "cadata", "certfile", "keyfile", "no_verify_ssl")
"""TLS query parameters of an ``amqps://`` URL, as aiormq reads them for every connection
(aiormq's README, "Full SSL/TLS support with url query parameters"): the CA file, folder or
base64 data the server's certificate is checked against (the system's CAs without them); a
client certificate and its key; and ``no_verify_ssl=1``, which turns the check off."""

AMQP_FOREIGN_TLS_PARAMETERS = {
    "ca_certs": "cafile",
    "cacertfile": "cafile",
    "cacert": "cafile",
    "sslrootcert": "cafile",
    "sslcert": "certfile",
    "sslkey": "keyfile",
    "cert_reqs": "no_verify_ssl",
    "verify": "no_verify_ssl",
    "check_hostname": "no_verify_ssl",
    "sslmode": "amqps://",
    "ssl": "amqps://",
    "tls": "amqps://",
    "ssl_version": "amqps://",
    "server_name_indication": "amqps://",
}
"""TLS parameters of other clients (pika, the Erlang client, libpq, older aio-pika examples)
that aiormq ignores without a word, so that a URL with them would connect without the check
its author asked for; each with what this client reads instead."""


MAX_PORT: Final = 65535


def _check_ports(url: str) -> None:
    """Refuse a URL whose host, or one of whose hosts, names a port that is no TCP port.

    The client libraries would raise it as a bare ``ValueError`` or ``OverflowError`` at the
    first connection (``port can't be converted to integer``), a traceback instead of the
    variable's name. A database URL may list several hosts (``h1:5432,h2:5433``, libpq's
    form, which asyncpg reads); each is checked. An IPv6 literal keeps its brackets.

    Raises:
        ValueError: a port that is not a whole number from 1 to 65535; the password is not shown.
    """
    hosts = urllib.parse.urlsplit(url).netloc.rpartition("@")[2]
    for host in hosts.split(","):
        after_address = host.rpartition("]")[2] if host.startswith("[") else host
        text = after_address.rpartition(":")[2] if ":" in after_address else ""
        if text and not (text.isdigit() and 1 <= int(text) <= MAX_PORT):
            msg = f"names the port {text!r}: a port is a whole number from 1 to {MAX_PORT}"
            raise ValueError(msg)


def _check_amqp_tls_parameters(url: str) -> None:
    """Refuse TLS query parameters of a broker URL that aiormq would ignore or misread.

    Raises:
        ValueError: a parameter of :data:`AMQP_FOREIGN_TLS_PARAMETERS`; a parameter of
            :data:`AMQP_TLS_PARAMETERS` on a plain ``amqp://`` URL (it would connect without
            TLS); ``no_verify_ssl`` other than 0 or 1 (aiormq turns the check off for every
            value but 0, ``false`` included); ``keyfile`` without ``certfile`` (ignored);
            ``cadata`` that is not base64. The files are read when connecting, not here (as
            for the database URL).
    """
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
    for name, instead in AMQP_FOREIGN_TLS_PARAMETERS.items():
        if name in query:
            msg = (
                f"has {name}=, which the AMQP client does not read: TLS is asked for with"
                f" amqps:// and set with {', '.join(AMQP_TLS_PARAMETERS)}"
                f" (use {instead} here)"
            )
            raise ValueError(msg)
    given = [name for name in AMQP_TLS_PARAMETERS if name in query]
    if given and parts.scheme != "amqps":
        msg = f"has {given[0]}= but amqp:// connects without TLS: use amqps://"
        raise ValueError(msg)
    for value in query.get("no_verify_ssl", []):
        if value not in {"0", "1"}:
            msg = (
                f"has no_verify_ssl={value!r}; it must be 0 (check the server's certificate"
                " and host name, the default) or 1 (do not)"
            )
            raise ValueError(msg)
    if "keyfile" in query and "certfile" not in query:
        msg = "has keyfile= without certfile=: the client certificate needs both"
        raise ValueError(msg)
    for value in query.get("cadata", []):
        try:
            base64.b64decode(value, validate=True)
        except binascii.Error:
            msg = "has cadata= that is not base64 (of the CA's DER or PEM bytes)"
            raise ValueError(msg) from None


class SettingsError(Exception):
    """The environment holds a value the service cannot start with.

    ``str(error)`` is one line per problem, each naming the environment variable.
    """


class Settings(BaseSettings):
    """All of the service's configuration; built only by the composition roots and the CLI.

    The fields are grouped by the process that reads them: shared, the worker, the relay, the
    operator tools. One flat model, so that every variable keeps its plain name
    (``FULFILMENT_<FIELD>``; nested models would prefix their group's name).
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        frozen=True,
    )

    # Shared: read by more than one of the worker, the relay and the operator tools.
    amqp_url: SecretStr = SecretStr("amqp://guest:guest@localhost:5672/")
    """RabbitMQ URL (``amqp://`` or ``amqps://``), credentials and virtual host included. Every
    connection of the service reads TLS from it the same way (aiormq's query parameters,
    :data:`AMQP_TLS_PARAMETERS`): ``amqps://`` checks the server's certificate chain and host
    name, against ``cafile`` (the CA file) or else the system's CAs; ``certfile``/``keyfile``
    add a client certificate; ``no_verify_ssl=1`` turns the check off."""

    database_url: SecretStr = SecretStr("postgresql+asyncpg://postgres@localhost:5432/fulfilment")
    """PostgreSQL URL; ``postgresql://`` is accepted and run with the asyncpg driver. TLS is
    set by libpq's query parameters: ``sslmode`` (one of :data:`SSL_MODES`), ``sslrootcert``
    (the CA file), ``sslcert``/``sslkey`` (a client certificate). ``verify-full`` checks the
    server's certificate and host name; ``require`` only encrypts, unless ``sslrootcert`` is
    given (libpq's meaning). Servers of which the primary is to be used: one ``host`` each,
    ``?host=a:5432&host=b:5432&target_session_attrs=read-write`` (``engine.asyncpg_dsn``)."""

    consumer_name: str = Field(default="fulfilment", min_length=1, max_length=100)
    """Inbox namespace: the ``consumer`` column of ``inbox_messages``. Never change it on a live
    database, or every past event would look new."""

    database_connect_timeout_seconds: Seconds = 2.0
    """Time allowed to open one PostgreSQL connection."""

    database_statement_timeout_seconds: Seconds = 3.0
    """Server-side ``statement_timeout`` of the worker's sessions: the server, not the client,
    cancels a slow statement, so a statement time-out never leaves its commit in doubt. The
    reservation pool waits 1 s longer, and only then gives up on the connection."""

    database_lock_timeout_seconds: Seconds = 1.0
    """Server-side ``lock_timeout``: a reservation waiting this long for a stock row lock fails
    with a retryable error instead of queueing behind a stuck transaction."""

    http_host: str = "0.0.0.0"  # noqa: S104 - probes and scrapes reach the pod on its own IP
    """IP address (v4 or v6) the HTTP server for ``/health/live``, ``/health/ready`` and
    ``/metrics`` listens on; ``0.0.0.0`` is every IPv4 interface, ``::`` every IPv6 one. A
    host name is refused: it would be resolved only when the server starts."""

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Threshold of the service's logs."""

    log_format: Literal["auto", "json", "console"] = "auto"
    """``auto`` writes JSON unless standard error is a terminal."""

    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    """The event loop of the worker and the relay: ``uvloop`` (libuv; it spends less CPU per
    message, see docs/performance.md) or the standard library's ``asyncio`` loop."""

    # The worker (``fulfilment worker``).
    prefetch_count: int = Field(default=64, ge=1, le=1000)
    """Unacknowledged deliveries per queue the worker consumes (each of its three queues has a
    channel of its own with this prefetch), hence handlers running at once per queue: FastStream
    starts one task per delivery and has no other concurrency limit on RabbitMQ."""

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

    handler_deadline_seconds: Seconds = 10.0
    """Longest time one delivery may take from receipt to the reservation's commit."""

    retry_budget_seconds: Seconds = 5.0
    """Total time the database retry policy may spend on one reservation, sleeps included."""

    graceful_timeout_seconds: Seconds = 20.0
    """How long SIGTERM waits for in-flight handlers before cancelling them (they are requeued)."""

    orchestrator_grace_period_seconds: Seconds = 30.0
    """The orchestrator's SIGTERM-to-SIGKILL window (``terminationGracePeriodSeconds``)."""

    broker_consumer_timeout_seconds: Seconds = 1800.0
    """RabbitMQ's ``consumer_timeout`` (30 minutes by default): an unacknowledged delivery older
    than this closes the channel."""

    consumer_lost_exit_seconds: Seconds = 30.0
    """How long the worker may run without a consumer on its queue (cancelled by the broker,
    not restored after a reconnect) before it exits with code 1 for the orchestrator to
    restart it. Pauses during a database outage do not count."""

    database_pool_size: int = Field(default=2, ge=1, le=200)
    """Most reservation transactions one worker process runs at once, each on a connection of
    its own (opened on demand). Deliveries that arrive while a transaction runs wait, and the
    next transaction reserves them together (group commit, at most ``reservation_batch_max``
    orders); one beside a running transaction starts only when a whole batch waits
    (``adapters.postgres.group_commit``). The process holds at most this many connections plus
    ``ENGINE_POOL_SIZE`` (2) for everything else (``adapters.postgres.engine``)."""

    reservation_batch_max: int = Field(default=64, ge=1, le=MAX_RESERVATION_BATCH)
    """Most orders one reservation transaction carries. Unset, it follows ``prefetch_count``
    (every delivery in flight); 1 commits every order in a transaction of its own."""

    http_port: int = Field(default=8080, ge=1, le=65535)
    """Port of that HTTP server."""

    queue_poll_interval_seconds: Seconds = 15.0
    """How often each worker reads the depth and consumers of its queue and of the DLQ (a
    passive declare) for the ``fulfilment_queue_*`` gauges; about the scrape interval."""

    invariant_check_interval_seconds: Seconds = 60.0
    """How often each worker checks the stock invariants for
    ``fulfilment_stock_invariant_violations``: one read of the stock and reservation tables."""

    # The relay (``fulfilment relay``).
    relay_batch_size: int = Field(default=100, ge=1, le=10000)
    """Most outbox rows the relay reads and publishes at once (one per order in a batch)."""

    relay_poll_seconds: Seconds = 1.0
    """How often the active relay reads the outbox without a notification, and how often a
    standby relay tries the advisory lock (the longest take-over after the holder's session
    ends) and reads the backlog gauges."""

    relay_batch_window_seconds: float = Field(default=0.02, ge=0, le=1, allow_inf_nan=False)
    """After a batch smaller than ``relay_batch_size``, how long the relay lets outbox rows
    gather before it reads the next batch, counted from the read of that batch (its publish
    and mark count towards it): fewer, larger batches under load (less CPU per event) for at
    most this much more commit-to-published lag. 0 reads at once."""

    relay_publish_timeout_seconds: Seconds = 10.0
    """How long a batch may wait for the broker's confirms before the relay takes its broker
    connection for lost and connects again (the unconfirmed rows are published again)."""

    relay_http_port: int = Field(default=8081, ge=1, le=65535)
    """Port of the relay's ``/health/live``, ``/health/ready`` and ``/metrics`` (on
    ``FULFILMENT_HTTP_HOST``)."""

    # The operator tools (``migrate``, ``prune``, ``outbox prune``, ``dlq``).
    database_runtime_role: str = ""
    """The PostgreSQL role the worker and the relay connect as (the user of their
    ``FULFILMENT_DATABASE_URL``), for ``fulfilment migrate`` only: after upgrading, it gives this
    role the privileges of ``adapters.postgres.privileges.RUNTIME_PRIVILEGES`` and nothing
    else (docs/security.md, "Least privilege"). Empty: no grants (one line says so), as when every
    process connects as the owner."""

    # The hand-off to the warehouse system and the dispatcher that sends it (docs/design.md,
    # "Warehouse hand-off").

    warehouse_url: str | None = None
    """Base of the warehouse system's API, e.g. ``https://wms.example/api/v1`` (``http://`` or
    ``https://``). Unset: no hand-off; the service behaves as without a warehouse system and
    ``fulfilment dispatcher`` refuses to start."""

    warehouse_token: SecretStr = SecretStr("")
    """The API's secret, sent as ``Authorization: Bearer <token>``; empty: no
    ``Authorization`` header."""

    warehouse_ca_file: str | None = None
    """A PEM CA bundle the warehouse system's certificate is checked against (an ``https://``
    URL only); unset: the system's CAs. Read when the dispatcher starts."""

    warehouse_timeout_seconds: Seconds = 10.0
    """One request's timeout, for each of connect, write, read and the wait for a pooled
    connection, and for the request as a whole. A request that times out is sent again later
    under the same key (the warehouse may have committed it)."""

    warehouse_rate_per_second: PerSecond = 2.5
    """Most requests per second to the warehouse system (2.5: 150 a minute, what real 3PL APIs
    allow per account). Held for every request, retries and probes included, and never
    exceeded within a second (up to 50 a second, requests go at least ``1 / rate`` seconds
    apart; above, a wake-up that came late is caught up within the second's cap)."""

    warehouse_concurrency: int = Field(default=4, ge=1, le=256)
    """Most requests in flight at once, and the most connections of the dispatcher's pool."""

    warehouse_key_retention_seconds: Seconds = 24 * 3600.0
    """How long the warehouse system keeps an idempotency key (24 h, as Stripe). A request
    still unanswered this long after its first attempt is ``expired``: a retry after it could
    create a second order, so it waits for an operator (``resend``)."""

    dispatcher_port: int = Field(default=8082, ge=1, le=65535)
    """Port of the dispatcher's ``/health/live``, ``/health/ready`` and ``/metrics`` (on
    ``FULFILMENT_HTTP_HOST``)."""

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

    replay_limit: int = Field(default=3, ge=1, le=1000)
    """Replays after which ``fulfilment dlq replay`` refuses a dead letter without ``--force``
    (counted by its ``x-fulfilment-replay-count`` header and by the audit table)."""

    @field_validator("amqp_url")
    @classmethod
    def _amqp_scheme(cls, value: SecretStr) -> SecretStr:
        if not value.get_secret_value().startswith(("amqp://", "amqps://")):
            msg = "must start with amqp:// or amqps://"
            raise ValueError(msg)
        _check_ports(value.get_secret_value())
        _check_amqp_tls_parameters(value.get_secret_value())
        return value

    @field_validator("database_url")
    @classmethod
    def _database_scheme(cls, value: SecretStr) -> SecretStr:
        url = value.get_secret_value()
        for prefix in ("postgresql+asyncpg://", "postgresql://", "postgres://"):
            if url.startswith(prefix):
                _check_ports(url)
                _check_tls_parameters(url)
                return SecretStr("postgresql+asyncpg://" + url.removeprefix(prefix))
        msg = "must start with postgresql:// or postgresql+asyncpg://"
        raise ValueError(msg)

    @field_validator("warehouse_url")
    @classmethod
    def _warehouse_url(cls, value: str | None) -> str | None:
        if not value:
            return None
        parts = urllib.parse.urlsplit(value)
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            msg = "must be an http:// or https:// URL with a host, e.g. https://wms.example/api/v1"
            raise ValueError(msg)
        if parts.query or parts.fragment:
            msg = "is the API's base: no ?query or #fragment"
            raise ValueError(msg)
        _check_ports(value)
        return value

    @field_validator("warehouse_ca_file")
    @classmethod
    def _warehouse_ca_file(cls, value: str | None) -> str | None:
        return value or None

    @field_validator("database_runtime_role")
    @classmethod
    def _role_name(cls, value: str) -> str:
        if value and not RUNTIME_ROLE_PATTERN.fullmatch(value):
            msg = (
                f"{value!r} is not a role name: lower-case letters, digits and _, not starting"
                " with a digit, at most 63 characters"
            )
            raise ValueError(msg)
        return value

    @field_validator("http_host")
    @classmethod
    def _ip_address(cls, value: str) -> str:
        try:
            ipaddress.ip_address(value)
        except ValueError:
            msg = f"{value!r} is not an IP address: use 0.0.0.0 (every interface) or 127.0.0.1"
            raise ValueError(msg) from None
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
    def _deadlines_nest(self) -> Self:
        chain = [
            "retry_budget_seconds",
            "handler_deadline_seconds",
            "graceful_timeout_seconds",
            "orchestrator_grace_period_seconds",
        ]
        problems = [
            f"{env_name(inner)}={getattr(self, inner):.10g} must be less than "
            f"{env_name(outer)}={getattr(self, outer):.10g}"
            for inner, outer in [
                *itertools.pairwise(chain),
                ("handler_deadline_seconds", "broker_consumer_timeout_seconds"),
                ("database_statement_timeout_seconds", "retry_budget_seconds"),
                ("database_lock_timeout_seconds", "database_statement_timeout_seconds"),
                # Processed ids outlive every way a message can come back (docs/runbook.md,
                # "Retention of processed ids").
                ("dead_letter_ttl_seconds", "processed_id_retention_seconds"),
                ("outbox_retention_seconds", "processed_id_retention_seconds"),
                # A request must be able to time out many times within its key's retention.
                ("warehouse_timeout_seconds", "warehouse_key_retention_seconds"),
            ]
            if getattr(self, inner) >= getattr(self, outer)
        ]
        if self.warehouse_ca_file and not (self.warehouse_url or "").startswith("https://"):
            problems.append(
                f"{env_name('warehouse_ca_file')} is set but {env_name('warehouse_url')} is not"
                " an https:// URL: the CA file would check nothing"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


def env_name(field: str) -> str:
    """The environment variable that sets ``field``, e.g. ``FULFILMENT_PREFETCH_COUNT``."""
    return f"{ENV_PREFIX}{field.upper()}"


NOT_SETTINGS_PREFIXES = (f"{ENV_PREFIX}TEST_", f"{ENV_PREFIX}BENCH_")
"""Variables of the test suite and the benchmark, which share the prefix but are not settings."""


def unknown_variables(
    environ: Mapping[str, str | None], places: Mapping[str, str] | None = None
) -> list[str]:
    """One line per ``FULFILMENT_*`` variable that is no setting, with the likely intended one.

    A misspelt variable (``FULFILMENT_PREFTCH_COUNT``) would otherwise be ignored in silence
    and the default used, which an operator finds out only in production.

    Args:
        environ: the variables, names in any case.
        places: ``{NAME: "FILE:LINE"}`` of variables read from a file: a line about one of
            them starts with its place, as the file's other problems do.
    """
    known = {env_name(field) for field in Settings.model_fields}
    problems = []
    for name in sorted(key.upper() for key in environ):
        if (
            not name.startswith(ENV_PREFIX)
            or name in known
            or name.startswith(NOT_SETTINGS_PREFIXES)
        ):
            continue
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        where = f"{places[name]}: " if places and name in places else ""
        problems.append(f"{where}{name}: not a setting of this service{hint}")
    return problems


class EnvFileReading(NamedTuple):
    """What one reading of the ``.env`` file found (:func:`env_file_problems`).

    Attributes:
        misread: the lines that would not set what they seem to, numbered.
        unknown: as :func:`unknown_variables` says them, its ``FULFILMENT_*`` keys that are no
            setting, each naming the file and the line that sets it.
        lines: ``{NAME: "FILE:LINE"}`` of every ``FULFILMENT_*`` key it sets, names in upper
            case, the last line of a name that appears twice (the one that takes effect).
    """

    misread: list[str]
    unknown: list[str]
    lines: dict[str, str]


def env_file_problems() -> EnvFileReading:
    """What is wrong with the ``.env`` file the settings read, from one reading of it.

    Returns:
        Its misread lines, its unknown keys and where each key is set; all empty without the
        file (:class:`EnvFileReading`).

    python-dotenv, the parser pydantic-settings reads the file with and the one used here,
    skips a line that is no ``NAME=VALUE`` (an unclosed quote) with a logged warning and reads
    on, reads a bare ``NAME`` as no value, and lets a quote closed on a later line take the
    lines between into the value: in each case the variable would take the environment's
    value, its default or a mangled one, and a command could run against the default database
    instead of the one the line names. A file that is not UTF-8 is a problem too, rather than
    a traceback, named at the line of its first bad byte. The file is found as
    :class:`Settings` finds it; no value is shown, since one may hold a password.
    """
    env_file = Settings.model_config.get("env_file")
    misread: list[str] = []
    unknown: list[str] = []
    lines: dict[str, str] = {}
    if env_file is None:
        return EnvFileReading(misread, unknown, lines)
    names = [env_file] if isinstance(env_file, str | Path) else list(env_file)
    for name in names:
        path = Path(name).expanduser()
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding=Settings.model_config.get("env_file_encoding"))
        except UnicodeDecodeError as error:
            bad_line, problem = not_utf8(path, error)
            misread.append(at_line(name, bad_line, problem))
            continue
        keys: dict[str, str | None] = {}
        for binding in parse_stream(io.StringIO(text)):
            where = f"{name}:{_first_line(binding.original)}"
            if binding.error:
                line = binding.original.string
                hint = " (an unclosed quote?)" if any(quote in line for quote in "'\"") else ""
                misread.append(
                    f"{where}: {_line_start(line)} cannot be read as NAME=VALUE{hint}:"
                    " fix or remove it"
                )
            elif binding.key is None or not binding.key.upper().startswith(ENV_PREFIX):
                continue
            elif binding.value is None:
                misread.append(f"{where}: {binding.key} has no =VALUE: give it one or remove it")
            elif "\n" in binding.value:
                misread.append(
                    f"{where}: {binding.key}'s quoted value runs onto the next lines (a quote"
                    " closed on a later line?): no setting takes a line break"
                )
            else:
                keys[binding.key] = binding.value
                lines[binding.key.upper()] = where
        unknown += unknown_variables(keys, lines)
    return EnvFileReading(misread, unknown, lines)


def _first_line(original: Original) -> int:
    """The line where a binding's text starts, past the blank lines python-dotenv gives it.

    The parser counts the blank lines before a binding as the binding's own (its ``line`` is the
    first of them), so a line number taken as it is would name a blank line above the one meant.
    """
    text = original.string
    return original.line + text[: len(text) - len(text.lstrip())].count("\n")


def _line_start(line: str) -> str:
    """The variable an unreadable ``.env`` line meant to set, or "the line" when none shows."""
    name = line.partition("=")[0].strip().removeprefix("export ").strip()
    return name if name.isidentifier() else "the line"


def load_settings() -> Settings:
    """Read and validate the settings from the environment (and ``.env``, if present).

    Raises:
        SettingsError: one line per invalid or unknown variable, each naming it and saying why
            (and the ``.env`` file, for a key of that file: with its line for a bad value), or
            per line of ``.env`` that cannot be read.
    """
    reading = env_file_problems()
    if reading.misread:
        raise SettingsError("\n".join(reading.misread))
    unknown = unknown_variables(os.environ) + reading.unknown
    if unknown:
        raise SettingsError("\n".join(unknown))
    try:
        return Settings()
    except ValidationError as error:
        # The environment wins over .env (pydantic-settings), names in any case.
        from_environment = {name.upper() for name in os.environ}
        lines = []
        for problem in error.errors():
            field = ".".join(str(part) for part in problem["loc"])
            message = problem["msg"].removeprefix("Value error, ")
            if not field:
                # A rule across fields (the nesting of deadlines) names its variables itself.
                lines.append(message)
                continue
            name = env_name(field)
            where = reading.lines.get(name) if name not in from_environment else None
            lines.append(f"{where}: {name}: {message}" if where else f"{name}: {message}")
        raise SettingsError("\n".join(lines)) from None
