"""Side-by-side benchmark: the worker against a hand-written aio-pika + asyncpg consumer.

``make bench`` (or ``uv run python bench/run.py --help``) does, in one run, in a RabbitMQ
virtual host and a PostgreSQL database of its own (created at the start, deleted at the end,
so it never touches anybody's queues or stock):

1. makes N orders of 1 to 3 lines over 1,000 real SKUs of the Online Retail files (default:
   the shipped sample) and stock large enough that none is rejected (``workload.py``);
2. for each of ``--rounds`` rounds, alternately: publishes the N orders as a backlog into
   ``fulfilment.order-placed`` (through exchange ``orders``, as checkout does) and drains it
   with the real worker process (``python -m fulfilment``) while a ``fulfilment relay`` process
   publishes its outbox to ``fulfilment.events``, where a queue bound with the routing key of
   every result event about an order (:data:`EVENTS_QUEUE`, purged before each drain) takes
   them (those about a SKU, ``stock.adjusted`` and ``stock.shortage``, go to a queue of their
   own, :data:`SKU_EVENTS_QUEUE`); then publishes
   the same N orders into a queue of the reference consumer (``reference.py``, bound to
   ``orders`` with another routing key, the same quorum-queue arguments; it publishes
   nothing) and drains that; the database is emptied and the stock reloaded before each drain;
3. measures each drain. The headline, for the worker: an order counts when its result event
   (``stock.reserved``/``stock.rejected``) is confirmed by the broker, that is when it has
   reached :data:`EVENTS_QUEUE` (see :class:`Events` for why the queue's depth counts the
   confirmed events): the rate is the events that arrived from the 1st percentile of the
   count to the last, read from the queue's depth sampled every 0.1 s. Beside it, the drain's
   rate: the orders committed (and acknowledged) from the 1st percentile of
   ``reservations.created_at`` to the last, over that time, so the start-up of either process
   is left out; the reference, which publishes nothing, is compared on this one. Commit ->
   confirm p50/p95/p99 per event (:func:`confirm_lags_ms`). CPU seconds per 1,000 orders of
   each process (the worker or the reference, each of :data:`SERVICE_PROCESSES`), the broker
   (``beam.smp``), PostgreSQL (the benchmark database's backends and the server's shared
   processes) and the rest of the machine, from the 1st percentile of the commits to the
   last confirm (to the last commit where nothing is published; ``measure.py``); peak RSS
   (``VmHWM``, also every 20,000 orders committed); transactions and rows per order
   (``pg_stat_database``);
4. publishes orders at a steady rate of half the worker's median drain rate for
   ``--latency-seconds``, each stamped ``placed_at`` = now, to a running worker and relay
   (and then to the reference), and reports placed_at -> commit percentiles and, for the
   worker, commit -> confirm from the events' queue (its depth read every 0.01 s) and
   commit -> published (``outbox.published_at - created_at``) as a cross-check;
5. prints the table drain by drain (each round: the worker, the reference, their ratio) and
   the medians with their ratio, and writes everything as JSON to ``--results``.

``--profile`` instead drains one backlog with the worker under py-spy (the processes beside
it running) and prints where its CPU goes; ``--no-relay`` runs the worker alone (the figures
before result events counted: an order counts when its delivery is acknowledged);
``--worker-src`` runs another version's worker (its ``src/``, e.g. from ``git archive``) to
compare versions; ``--env NAME=VALUE`` sets the environment of every service process (a
setting, tracing); ``--traceparent-sampled RATIO`` publishes every order with a producer's
``traceparent`` (a trace of its own, sampled with that probability), the same ones for every
consumer and variant. A ``--variant`` with ``webhooks; adjust=RATE`` also sends signed
``inventory.adjusted`` webhooks of the backlog's hot SKUs to that intake at RATE a second
while the worker drains (:class:`AdjustmentSender`), and checks that each was applied once.
The benchmark is not run by CI: it takes minutes and its figures depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import functools
import http.server
import json
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aio_pika
import asyncpg
from figures import (
    Ratio,
    Row,
    arrivals,
    comparison_table,
    lag_percentiles_ms,
    median,
    median_ratio,
    median_row,
    number,
    percentile,
    ratio_row,
    reached,
    relative_row,
    spacing_ms,
)
from measure import CpuSampler, peak_rss_bytes
from workload import (
    Adjustment,
    Order,
    SteadyPost,
    Workload,
    hot_skus,
    load_workload,
    net_deltas,
    plan_adjustments,
    post_steadily,
    publish_backlog,
    publish_steadily,
)

from fulfilment.contracts.result_events import RESULT_EVENTS, SkuEventV1
from fulfilment.contracts.topology import (
    EVENTS_EXCHANGE,
    ORDER_PLACED,
    ORDER_PLACED_DEAD_LETTER_QUEUE,
    ORDER_PLACED_QUEUE,
    ORDER_PLACED_ROUTING_KEY,
    ORDERS_EXCHANGE,
)
from fulfilment.intake.app import WEBHOOK_PATH
from fulfilment.settings import ENV_PREFIX, variables
from fulfilment.worker.topology import Topology, declare_topology

ROOT = Path(__file__).resolve().parent.parent
REFERENCE_QUEUE = "bench.reference.order-placed"
REFERENCE_ROUTING_KEY = "bench.reference"
EVENTS_QUEUE = "bench.result-events"
"""Quorum queue bound to ``fulfilment.events`` with :data:`ORDER_EVENT_KEYS`: a downstream
consumer's queue that nobody consumes, so its depth counts the result events about orders
that reached it."""
SKU_EVENTS_QUEUE = "bench.sku-events"
"""Quorum queue bound with :data:`SKU_EVENT_KEYS`, nobody consuming it either: the events of a
variant's adjustments reach it, so that :data:`EVENTS_QUEUE`'s depth still counts orders."""
SKU_EVENT_KEYS = tuple(key for key, model in RESULT_EVENTS.items() if issubclass(model, SkuEventV1))
"""The routing keys of the result events about a SKU (``stock.adjusted``, ``stock.shortage``)."""
ORDER_EVENT_KEYS = tuple(key for key in RESULT_EVENTS if key not in SKU_EVENT_KEYS)
"""The routing keys of the result events about an order: every other one."""
WARM_UP_SHARE = 0.01
"""Share of the first commits of a drain left out of its rate and CPU (start-up, warm-up)."""
DEPTH_SAMPLE_SECONDS = 0.1
"""Time between two reads of :data:`EVENTS_QUEUE`'s depth (a passive declare) in a drain."""
LATENCY_DEPTH_SAMPLE_SECONDS = 0.01
"""The same in the latency phase, whose commit -> confirm lags are tens of milliseconds: the
lag read from the depth is good to about this spacing (a drain's rate is not measured there)."""
RSS_CHECKPOINT_ORDERS = 20_000
"""Every this many orders committed, a drain records its processes' peak RSS (``VmHWM``)."""

SETTING_DEFAULTS = {
    name.removeprefix(ENV_PREFIX).lower(): group.model_fields[field].default
    for group, field, name in variables()
}


# --- services -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Services:
    """The benchmark's own virtual host and database, as URLs for the consumers."""

    amqp_url: str
    database_url: str
    """``postgresql://`` (asyncpg); the worker gets the same with ``+asyncpg``."""


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)


@contextlib.contextmanager
def dedicated_database(admin_database_url: str) -> Iterator[str]:
    """Create and migrate a database of this run's own; drop it at the end.

    Yields its ``postgresql://`` URL; ``admin_database_url`` must be allowed to create databases.
    """
    from fulfilment.adapters.postgres.schema import migrate  # noqa: PLC0415 - needs the DB up

    database = f"fulfilment_bench_{uuid.uuid4().hex[:10]}"
    admin = urllib.parse.urlsplit(admin_database_url)
    database_url = urllib.parse.urlunsplit(admin._replace(path=f"/{database}"))
    asyncio.run(_admin(admin_database_url, f'CREATE DATABASE "{database}"'))
    try:
        migrate(database_url.replace("postgresql://", "postgresql+asyncpg://", 1))
        yield database_url
    finally:
        drop = f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'
        asyncio.run(_admin(admin_database_url, drop))


@contextlib.contextmanager
def dedicated_services(admin_database_url: str, amqp_url: str) -> Iterator[Services]:
    """Create a virtual host and a migrated database for this run; delete both at the end.

    Raises:
        SystemExit: ``rabbitmqctl`` is not available (a virtual host is required so that the
            benchmark never publishes into a user's queues).
    """
    if shutil.which("rabbitmqctl") is None:
        msg = "bench: rabbitmqctl is needed to create the benchmark's own virtual host"
        raise SystemExit(msg)
    vhost = f"fulfilment-bench-{uuid.uuid4().hex[:10]}"
    user = urllib.parse.urlsplit(amqp_url).username or "guest"
    with dedicated_database(admin_database_url) as database_url:
        _rabbitmqctl("add_vhost", vhost)
        try:
            _rabbitmqctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
            yield Services(
                amqp_url=amqp_url.rstrip("/") + "/" + urllib.parse.quote(vhost, safe=""),
                database_url=database_url,
            )
        finally:
            _rabbitmqctl("delete_vhost", vhost)


async def _admin(url: str, sql: str) -> None:
    connection = await asyncpg.connect(url, timeout=5)
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


async def declare_queues(amqp_url: str, delivery_limit: int) -> None:
    """The product's topology, the reference's queue and the result events' queues.

    The reference consumer's queue has the same arguments as the worker's; the events' queues
    (:data:`EVENTS_QUEUE`, :data:`SKU_EVENTS_QUEUE`) are quorum queues bound to
    ``fulfilment.events`` with every routing key of the events about an order, and about a
    SKU: each event the relay publishes reaches one of them, as ``mandatory`` needs.
    """
    topology = Topology(delivery_limit=delivery_limit)
    await declare_topology(amqp_url, topology)
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(
            REFERENCE_QUEUE,
            durable=True,
            arguments=dict(topology.queue(ORDER_PLACED).arguments or {}),
        )
        await queue.bind(ORDERS_EXCHANGE, routing_key=REFERENCE_ROUTING_KEY)
        for name, keys in ((EVENTS_QUEUE, ORDER_EVENT_KEYS), (SKU_EVENTS_QUEUE, SKU_EVENT_KEYS)):
            events = await channel.declare_queue(
                name, durable=True, arguments={"x-queue-type": "quorum"}
            )
            for key in keys:
                await events.bind(EVENTS_EXCHANGE, routing_key=key)
    finally:
        await connection.close()


async def purge_events_queue(amqp_url: str) -> None:
    """Empty the events' queues, so that their depths count one drain's events."""
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        for name in (EVENTS_QUEUE, SKU_EVENTS_QUEUE):
            queue = await channel.declare_queue(name, passive=True)
            await queue.purge()
    finally:
        await connection.close()


async def queue_depth(amqp_url: str, name: str) -> int:
    """The messages in queue ``name`` now (a passive declare's count)."""
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        declared = await channel.declare_queue(name, passive=True)
        return int(declared.declaration_result.message_count or 0)
    finally:
        await connection.close()


async def reset_database(database_url: str, workload: Workload) -> None:
    """Empty the tables, load the workload's stock, checkpoint: every drain starts equal."""
    connection = await asyncpg.connect(database_url)
    try:
        tables = await connection.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            " AND tablename <> 'alembic_version'"
        )
        names = ", ".join(f'"{row["tablename"]}"' for row in tables)
        await connection.execute(f"TRUNCATE {names} CASCADE")
        await connection.copy_records_to_table(
            "stock_levels", records=workload.stock().items(), columns=["sku", "on_hand"]
        )
        await connection.execute("VACUUM ANALYZE")
        await connection.execute("CHECKPOINT")
    finally:
        await connection.close()


async def versions(services: Services) -> str:
    """``RabbitMQ x.y.z, PostgreSQL a.b``: the servers' own answers."""
    broker = await aio_pika.connect(services.amqp_url)
    try:
        transport = broker.transport
        if transport is None:
            msg = "RabbitMQ closed the connection before it said its version"
            raise RuntimeError(msg)
        properties = transport.connection.server_properties
        rabbitmq = properties.get("version", "?")
    finally:
        await broker.close()
    database = await asyncpg.connect(services.database_url)
    try:
        postgres = await database.fetchval("SHOW server_version")
    finally:
        await database.close()
    return f"RabbitMQ {rabbitmq!s}, PostgreSQL {postgres}"


async def connections_free(database_url: str) -> int:
    """Connections PostgreSQL can still open to a role that is not a superuser.

    ``max_connections`` less ``superuser_reserved_connections`` and the sessions open now.
    """
    database = await asyncpg.connect(database_url)
    try:
        free = await database.fetchval(
            "SELECT current_setting('max_connections')::int"
            " - current_setting('superuser_reserved_connections')::int"
            " - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')"
        )
    finally:
        await database.close()
    return int(free)


def cpu_model() -> str:
    """The processor's model name from ``/proc/cpuinfo``, or ``?``."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "?"


# --- consumers ------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Consumer:
    """One process under test (the worker, its relay or the reference) with its log file."""

    kind: str
    command: list[str]
    env: dict[str, str]
    log_path: Path
    http_port: int | None = None
    process: subprocess.Popen[bytes] | None = None
    ready_path: str = "/health/ready"
    """What answers 200 once the process is ready (the simulator has no ``/health``)."""

    def start(self) -> None:
        """Start the process; its standard error (and the worker's output) go to the log."""
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command,
                env=self.env,
                stdout=subprocess.PIPE if self.kind == "reference" else log,
                stderr=log,
                cwd=ROOT,
            )

    def wait_ready(self, timeout: float = 60) -> None:
        """Until the worker or relay answers ``/health/ready`` or the reference prints ``ready``."""
        assert self.process is not None  # noqa: S101 - started first
        deadline = time.monotonic() + timeout
        if self.kind == "reference":
            assert self.process.stdout is not None  # noqa: S101 - piped above
            if self.process.stdout.readline().strip() == b"ready":
                return
        else:
            while time.monotonic() < deadline and self.process.poll() is None:
                if self.get(self.ready_path) is not None:
                    return
                time.sleep(0.1)
        msg = f"{self.kind} not ready (exit code {self.process.poll()}): {self.log_tail()}"
        raise RuntimeError(msg)

    def get(self, path: str) -> str | None:
        """The body of GET ``path`` on the process's HTTP port when it answers 200, else None."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.http_port}{path}", timeout=2
            ) as response:
                return response.read().decode() if response.status == 200 else None
        except OSError:
            return None

    def metrics(self) -> str:
        """The worker's or relay's Prometheus exposition text (empty for the reference)."""
        return (self.get("/metrics") or "") if self.http_port else ""

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, then wait; return the exit code."""
        assert self.process is not None  # noqa: S101 - started first
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def log_tail(self, count: int = 5) -> str:
        """The last ``count`` lines of the log, on one line."""
        return " | ".join(self.log_path.read_text(errors="replace").splitlines()[-count:])


@dataclass(frozen=True, slots=True)
class ServiceProcess:
    """One of the service's processes that runs beside the worker in the product's drains."""

    name: str
    """Its CPU group, log file and column in the table."""
    command: tuple[str, ...]
    port_setting: str | None
    """The environment variable of its HTTP port (``/health/ready``, ``/metrics``); None for
    one whose port is fixed in its command (:attr:`port`)."""
    port: int | None = None
    """Its fixed port (the warehouse simulator's, which the others' settings name)."""
    ready_path: str = "/health/ready"
    env: tuple[tuple[str, str], ...] = ()
    """Extra environment of this process alone."""


SERVICE_PROCESSES = (
    ServiceProcess(
        "relay",
        (str(Path(sys.executable).parent / "fulfilment"), "relay"),
        "FULFILMENT_RELAY_HTTP_PORT",
    ),
)
"""The processes measured beside the worker (``--workers`` copies of it), at their defaults.

Each is started before the worker, stopped once the outbox has no unpublished row, and gets
its own CPU and peak-RSS columns. The warehouse dispatcher, when it lands, is one more entry
(and, if it finishes on something other than the outbox, its own wait in :func:`drain`)."""

WAREHOUSE_LATENCY_SECONDS = 0.02
"""How long the simulated warehouse takes to answer each request with ``--warehouse``."""

WAREHOUSE_RATE_PER_SECOND = 200
"""The dispatcher's rate cap with ``--warehouse``: above the worker's drain on 2 cores, so
the dispatcher sends while the worker drains (its CPU counted beside it) instead of idling
at the default 2.5 a second."""


def warehouse_processes(port: int) -> tuple[ServiceProcess, ...]:
    """The processes ``--warehouse`` runs beside the worker and the relay.

    The simulated warehouse on ``port``, answering in :data:`WAREHOUSE_LATENCY_SECONDS`, and
    ``fulfilment dispatcher``.
    """
    return (
        ServiceProcess(
            "warehouse",
            (
                sys.executable,
                "-m",
                "warehouse_simulator",
                "--port",
                str(port),
                "--latency-seconds",
                str(WAREHOUSE_LATENCY_SECONDS),
            ),
            None,
            port=port,
            ready_path="/_simulator/stats",
            env=(("PYTHONPATH", str(ROOT / "simulator")),),
        ),
        ServiceProcess(
            "dispatcher",
            (str(Path(sys.executable).parent / "fulfilment"), "dispatcher"),
            "FULFILMENT_DISPATCHER_PORT",
        ),
    )


def warehouse_env(port: int) -> dict[str, str]:
    """The settings that turn the hand-off on, against the simulator on ``port``."""
    return {
        "FULFILMENT_WAREHOUSE_URL": f"http://127.0.0.1:{port}/api/v1",
        "FULFILMENT_WAREHOUSE_TOKEN": "simulator-token",
        "FULFILMENT_WAREHOUSE_RATE_PER_SECOND": str(WAREHOUSE_RATE_PER_SECOND),
        "FULFILMENT_WAREHOUSE_CONCURRENCY": "8",
    }


WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"the benchmark's warehouse secret").decode()
"""The secret ``fulfilment webhooks`` knows in a variant with ``webhooks`` (it needs one)."""


def webhooks_process() -> ServiceProcess:
    """``fulfilment webhooks``, the intake, on free ports: idle beside the worker (``webhooks``).

    Nobody sends it a webhook: the variant measures what an idle intake takes from the worker
    and the relay (its pool, its probes' server, its start-up). ``bench/webhooks.py`` measures
    it under a burst.
    """
    return ServiceProcess(
        "webhooks",
        (str(Path(sys.executable).parent / "fulfilment"), "webhooks"),
        "FULFILMENT_WEBHOOKS_HTTP_PORT",
        env=(
            ("FULFILMENT_WEBHOOKS_PORT", str(_free_port())),
            ("FULFILMENT_WAREHOUSE_WEBHOOK_SECRETS", WEBHOOK_SECRET),
        ),
    )


def with_warehouse(
    env: dict[str, str], beside: tuple[ServiceProcess, ...]
) -> tuple[dict[str, str], tuple[ServiceProcess, ...]]:
    """``env`` and ``beside`` with the hand-off on.

    The simulator on a free port and the dispatcher beside; their settings under the ones
    ``env`` already has.
    """
    port = _free_port()
    return warehouse_env(port) | env, (*beside, *warehouse_processes(port))


@dataclass(frozen=True, slots=True)
class Plan:
    """What to run: the settings of one benchmark invocation."""

    services: Services
    logs: Path
    prefetch: int
    workers: int
    env: dict[str, str]
    """Extra environment of every service process (``--env``), e.g. tracing's settings."""
    beside_worker: tuple[ServiceProcess, ...] = SERVICE_PROCESSES
    """The processes run beside the worker: none with ``--no-relay`` (the worker alone)."""
    label: str = ""
    """The variant's name (``--variant``); empty for the configuration the options give."""
    adjust_per_second: float = 0.0
    """Adjustments of the hot SKUs sent to the intake beside the worker while it drains, per
    second (a variant's ``adjust`` item); 0 for none."""

    @property
    def hands_off(self) -> bool:
        """Whether a dispatcher runs beside the worker (``--warehouse`` or a variant's)."""
        return any(process.name == "dispatcher" for process in self.beside_worker)

    def _service_env(self) -> dict[str, str]:
        """The service's processes' environment: this run's services, JSON logs, extras."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("FULFILMENT_")}
        return env | {
            "FULFILMENT_AMQP_URL": self.services.amqp_url,
            "FULFILMENT_DATABASE_URL": self.services.database_url.replace(
                "postgresql://", "postgresql+asyncpg://", 1
            ),
            "FULFILMENT_PREFETCH_COUNT": str(self.prefetch),
            "FULFILMENT_HTTP_HOST": "127.0.0.1",
            "FULFILMENT_LOG_FORMAT": "json",
            **self.env,
        }

    def beside(self, kind: str, label: str) -> list[Consumer]:
        """The processes of :attr:`beside_worker` (each on a port of its own), not started.

        None (an empty list) for the reference, which publishes nothing.
        """
        if kind != "worker":
            return []
        made = []
        for process in self.beside_worker:
            port = process.port or _free_port()
            env = self._service_env() | dict(process.env)
            if process.port_setting is not None:
                env[process.port_setting] = str(port)
            log = self.logs / f"{label}-{process.name}.log"
            made.append(
                Consumer(
                    process.name,
                    list(process.command),
                    env,
                    log,
                    http_port=port,
                    ready_path=process.ready_path,
                )
            )
        return made

    def consumers(self, kind: str, label: str) -> list[Consumer]:
        """``workers`` processes of ``kind`` (``worker`` or ``reference``), not started."""
        made = []
        for index in range(self.workers):
            log = self.logs / f"{label}-{kind}-{index}.log"
            if kind == "worker":
                port = _free_port()
                env = self._service_env() | {"FULFILMENT_HTTP_PORT": str(port)}
                command = [sys.executable, "-m", "fulfilment"]
                made.append(Consumer(kind, command, env, log, http_port=port))
            else:
                command = [
                    sys.executable,
                    str(ROOT / "bench" / "reference.py"),
                    "--amqp-url",
                    self.services.amqp_url,
                    "--database-url",
                    self.services.database_url,
                    "--queue",
                    REFERENCE_QUEUE,
                    "--concurrency",
                    str(self.prefetch),
                ]
                made.append(Consumer(kind, command, dict(os.environ), log))
        return made


def _route(kind: str) -> str:
    return ORDER_PLACED_ROUTING_KEY if kind == "worker" else REFERENCE_ROUTING_KEY


def _queue(kind: str) -> str:
    return ORDER_PLACED_QUEUE if kind == "worker" else REFERENCE_QUEUE


# --- measurements ---------------------------------------------------------------------------


@dataclass
class Events:
    """The result events of one worker drain, as they reached :data:`EVENTS_QUEUE`.

    ``count`` is the queue's depth once the outbox has no unpublished row: a message counts
    in a quorum queue's depth once its Raft log has committed it, which is when the broker
    confirms it to the relay (``fulfilment.events`` routes it to no other queue here), so the
    depth is the number of confirmed events. ``rate`` (events per second, one per order here)
    is read from the depth sampled every :data:`DEPTH_SAMPLE_SECONDS`: the events that arrived
    from the moment the depth passed :data:`WARM_UP_SHARE` of ``count`` to the moment it
    reached ``count`` (both interpolated between samples), over that time, as for the orders'
    rate. ``marked_rate`` is the same from ``outbox.published_at`` (set after the confirm), a
    cross-check. ``relay_cpu_per_1000`` is the relay's CPU seconds per 1,000 events over the
    queue's window. ``lag_ms`` is commit -> confirm (:func:`confirm_lags_ms`).
    """

    count: int
    outbox_rows: int
    rate: float
    marked_rate: float
    relay_cpu_per_1000: float
    started: float
    """When the depth passed the warm-up share (epoch seconds)."""
    finished: float
    """When the depth reached ``count`` (epoch seconds): the last event's confirm."""
    lag_ms: dict[str, float] = field(default_factory=dict)
    depth_spacing_ms: float = math.nan
    """The median time between two reads of the depth: what ``lag_ms`` is good to."""


@dataclass
class Drain:
    """One drain of a backlog: rates in orders per second, CPU in seconds per 1,000 orders."""

    kind: str
    orders: int
    publish_seconds: float
    rate: float
    """The drain's rate: orders committed (the worker acknowledges each after its commit)."""
    cpu_per_1000: dict[str, float]
    """Per group (``consumer``, each process beside it, ``broker``, ``postgres``, ``rest``)
    over the counted window: from the warm-up share of commits to the last result event's
    confirm, or to the last commit where no event is published (the reference, ``--no-relay``)."""
    cpu_per_1000_drain: dict[str, float]
    """The same over the commits' window alone (the figure before result events counted)."""
    peak_rss_mib: list[float]
    outcomes: dict[str, int]
    database_per_order: dict[str, float]
    """Transactions and rows written per order (``pg_stat_database``), all clients of the
    benchmark's database included; once the consumers have exited, so their counts are in."""
    beside_peak_rss_mib: dict[str, float] = field(default_factory=dict)
    """``VmHWM`` of each process beside the worker once every event is published, by name."""
    events: Events | None = None
    """None for the reference (it publishes nothing) and without a relay."""
    peak_rss_by_orders: dict[int, dict[str, list[float]]] = field(default_factory=dict)
    """``{orders committed: {"worker": [MiB per process], "relay": [MiB]}}``: ``VmHWM`` read
    every :data:`RSS_CHECKPOINT_ORDERS` orders committed and at the end (the relay's last
    once it has published every event)."""
    variant: str = ""
    """The plan's label: the variant drained (empty: the options' configuration)."""
    handoff: Handoff | None = None
    """What the dispatcher did over the counted window; None when none ran."""
    adjustments: AdjustmentFigures | None = None
    """What the adjustments sent during the drain did; None when none were sent."""

    @property
    def counted_rate(self) -> float:
        """The headline: result events confirmed per second, or the drain's rate without any."""
        return self.events.rate if self.events is not None else self.rate


@dataclass(frozen=True, slots=True)
class Handoff:
    """What the dispatcher did in a drain.

    ``answered_per_second``: requests answered for good (``answered_at``) per second over the
    counted window; ``cap_per_second`` its rate cap (``FULFILMENT_WAREHOUSE_RATE_PER_SECOND``);
    ``open_at_end``: requests recorded and not yet answered when the window ended (the
    backlog the dispatcher had left). From the simulated warehouse, once every result event
    was confirmed: ``requests``, the most requests it received in one second
    (``max_requests_per_second``), the requests it received in each whole second of the
    counted window (``window_seconds``: the rate the cap is held at while the worker drains,
    without the dispatcher's start-up), and the TCP ``connections`` it accepted.
    """

    answered_per_second: float
    cap_per_second: float
    open_at_end: int
    requests: int
    max_requests_per_second: int
    connections: int
    window_seconds: tuple[int, ...] = ()


async def handoff_of_drain(
    plan: Plan, start: float, end: float, warehouse: dict[str, Any]
) -> Handoff:
    """The dispatcher's figures between ``start`` and ``end`` (epoch seconds).

    ``warehouse`` is the simulator's ``/_simulator/stats``, read at the window's end.
    """
    connection = await asyncpg.connect(plan.services.database_url)
    try:
        row = await connection.fetchrow(
            "SELECT count(*) FILTER (WHERE answered_at BETWEEN to_timestamp($1)"
            "                                           AND to_timestamp($2)) AS answered,"
            "       count(*) FILTER (WHERE created_at <= to_timestamp($2)"
            "                          AND (answered_at IS NULL"
            "                               OR answered_at > to_timestamp($2))) AS open"
            " FROM warehouse_requests",
            start,
            end,
        )
    finally:
        await connection.close()
    return Handoff(
        answered_per_second=row["answered"] / (end - start),
        cap_per_second=float(plan.env.get("FULFILMENT_WAREHOUSE_RATE_PER_SECOND", "nan")),
        open_at_end=row["open"],
        requests=int(warehouse["requests_total"]),
        max_requests_per_second=int(warehouse["max_requests_per_second"]),
        connections=int(warehouse["connections"]),
        window_seconds=tuple(
            int(count)
            for second, count in sorted(
                (int(second), count)
                for second, count in warehouse.get("requests_per_second", {}).items()
            )
            if start <= second and second + 1 <= end
        ),
    )


DATABASE_COUNTERS = ("xact_commit", "xact_rollback", "tup_inserted", "tup_updated")


async def database_counters(database_url: str) -> dict[str, int]:
    """``pg_stat_database`` counters of the benchmark's database (:data:`DATABASE_COUNTERS`)."""
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute("SELECT pg_stat_clear_snapshot()")
        row = await connection.fetchrow(
            f"SELECT {', '.join(DATABASE_COUNTERS)} FROM pg_stat_database"  # noqa: S608 - constants
            " WHERE datname = current_database()"
        )
    finally:
        await connection.close()
    return dict(row)


async def wait_committed(
    database_url: str,
    expected: int,
    *,
    within: float,
    consumers: Sequence[Consumer] = (),
    progress: Callable[[int], None] | None = None,
) -> None:
    """Until ``reservations`` holds ``expected`` rows; ``progress(count)`` after each read.

    A lost connection (the server restarted under the benchmark) is opened again, with a
    warning: the figures of that drain are disturbed.

    Raises:
        RuntimeError: not within ``within`` seconds, or one of ``consumers`` exited.
    """
    connection = await asyncpg.connect(database_url)
    try:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            try:
                committed = await connection.fetchval("SELECT count(*) FROM reservations")
            except (OSError, asyncpg.InterfaceError, asyncpg.PostgresConnectionError) as error:
                print(f"warning: the database connection was lost ({error!r}); reconnecting")
                await asyncio.sleep(1)
                with contextlib.suppress(OSError, asyncpg.PostgresError):
                    connection = await asyncpg.connect(database_url)
                continue
            if progress is not None:
                progress(committed)
            if committed >= expected:
                return
            for consumer in consumers:
                if consumer.process is not None and consumer.process.poll() is not None:
                    msg = f"{consumer.kind} exited with {consumer.process.returncode}: "
                    raise RuntimeError(msg + consumer.log_tail())
            await asyncio.sleep(0.25)
    finally:
        await connection.close()
    msg = f"fewer than {expected} reservations after {within:g} s"
    raise RuntimeError(msg)


async def wait_published(database_url: str, *, within: float, relays: Sequence[Consumer]) -> None:
    """Until the outbox has no unpublished row.

    Raises:
        RuntimeError: not within ``within`` seconds, or one of ``relays`` exited.
    """
    connection = await asyncpg.connect(database_url)
    try:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            left = await connection.fetchval(
                "SELECT count(*) FROM outbox WHERE published_at IS NULL"
            )
            if left == 0:
                return
            for relay in relays:
                if relay.process is not None and relay.process.poll() is not None:
                    msg = f"{relay.kind} exited with {relay.process.returncode}: "
                    raise RuntimeError(msg + relay.log_tail())
            await asyncio.sleep(0.1)
    finally:
        await connection.close()
    msg = f"outbox rows still unpublished after {within:g} s"
    raise RuntimeError(msg)


async def sample_depth(
    amqp_url: str,
    samples: list[tuple[float, int]],
    stop: asyncio.Event,
    every: float = DEPTH_SAMPLE_SECONDS,
) -> None:
    """Append ``(time.time(), depth of EVENTS_QUEUE)`` every ``every`` seconds.

    Until ``stop`` is set, then once more. The depth is the ``message_count`` of a passive
    declare, the queue's own count (the management statistics lag by seconds); the time is
    the middle of the round trip. Nobody consumes the queue meanwhile: a consumer would add
    the broker's deliveries to the figures.
    """
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel()
        while True:
            asked = time.time()
            declared = await channel.declare_queue(EVENTS_QUEUE, passive=True)
            depth = int(declared.declaration_result.message_count or 0)
            samples.append(((asked + time.time()) / 2, depth))
            if stop.is_set():
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every)
    finally:
        await connection.close()


async def commit_times_in_queue_order(amqp_url: str, count: int) -> list[float]:
    """The ``occurred_at`` of the first ``count`` events of :data:`EVENTS_QUEUE`, in its order.

    In epoch seconds. Consumes them (no acknowledgements): called once the figures' window
    is over. ``occurred_at`` is the outbox row's time, ``now()`` of the transaction that wrote
    it (its start, a few milliseconds before its commit, so the lag is a little longer than
    from the commit itself).

    Raises:
        TimeoutError: fewer than ``count`` messages came.
    """
    connection = await aio_pika.connect(amqp_url)
    committed: list[float] = []
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(EVENTS_QUEUE, passive=True)
        async with asyncio.timeout(60 + count / 100), queue.iterator(no_ack=True) as messages:
            async for message in messages:
                occurred = json.loads(message.body)["occurred_at"]
                committed.append(datetime.fromisoformat(occurred).timestamp())
                if len(committed) >= count:
                    break
    finally:
        await connection.close()
    return committed


async def confirm_lags_ms(
    amqp_url: str, samples: Sequence[tuple[float, int]], count: int
) -> dict[str, float]:
    """Commit -> confirm of the queue's ``count`` events: p50, p95, p99 and max, in ms.

    The ``k``-th message of the queue arrived (was confirmed) when its sampled depth reached
    ``k`` (:func:`figures.arrivals`, good to the samples' spacing); its commit is its body's
    ``occurred_at`` (:func:`commit_times_in_queue_order`). Reading the arrival from the depth
    rather than from a consumer leaves the broker's work as in production minus a consumer,
    the same in every drain, and the rate undisturbed; both times are this machine's clock.
    """
    if count == 0:
        return {}
    committed = await commit_times_in_queue_order(amqp_url, count)
    return lag_percentiles_ms(committed, arrivals(samples, range(1, count + 1)))


async def events_of_drain(
    services: Services, samples: Sequence[tuple[float, int]], sampler: CpuSampler
) -> Events:
    """The drain's result events: count, arrival rate, relay CPU, lag (see :class:`Events`).

    Those about orders alone, in the queue as in the outbox (``order_id`` set): a variant's
    adjustments write events of their SKUs, which go to :data:`SKU_EVENTS_QUEUE`.
    """
    count = await queue_depth(services.amqp_url, EVENTS_QUEUE)
    skip = max(1, int(count * WARM_UP_SHARE))
    start, end = reached(samples, skip), reached(samples, count)
    database = await asyncpg.connect(services.database_url)
    try:
        row = await database.fetchrow(
            "SELECT (SELECT published_at FROM outbox WHERE order_id IS NOT NULL"
            "        ORDER BY published_at OFFSET $1 LIMIT 1) AS first,"
            " max(published_at) AS last, count(*) AS rows FROM outbox WHERE order_id IS NOT NULL",
            skip,
        )
    finally:
        await database.close()
    marked = (row["rows"] - skip - 1) / (row["last"] - row["first"]).total_seconds()
    relay_cpu = sampler.between(start, end).get("relay", math.nan)
    return Events(
        count=count,
        outbox_rows=int(row["rows"]),
        rate=round((count - skip) / (end - start), 1),
        marked_rate=round(marked, 1),
        relay_cpu_per_1000=round(relay_cpu / (count - skip) * 1000, 3),
        started=start,
        finished=end,
        lag_ms=await confirm_lags_ms(services.amqp_url, samples, count),
        depth_spacing_ms=spacing_ms(samples),
    )


def _peak_rss_mib(processes: Sequence[Consumer]) -> list[float]:
    """Each started process's ``VmHWM``, in MiB."""
    return [
        round(peak_rss_bytes(process.process.pid) / 2**20, 1)
        for process in processes
        if process.process is not None
    ]


def _by_name(processes: Sequence[Consumer]) -> dict[str, list[Consumer]]:
    grouped: dict[str, list[Consumer]] = {}
    for process in processes:
        grouped.setdefault(process.kind, []).append(process)
    return grouped


def _pids(processes: Sequence[Consumer]) -> list[int]:
    return [process.process.pid for process in processes if process.process is not None]


def _kind_pids(processes: Sequence[Consumer], kind: str) -> list[int]:
    """The pids of the processes of ``kind`` among ``processes``, as they are when asked."""
    return _pids(_by_name(processes)[kind])


async def commit_window(database_url: str, total: int) -> tuple[float, float, int]:
    """(start, end, orders): the commit times of the 1st percentile and of the last order."""
    skip = max(1, int(total * WARM_UP_SHARE))
    connection = await asyncpg.connect(database_url)
    try:
        start = await connection.fetchval(
            "SELECT created_at FROM reservations ORDER BY created_at OFFSET $1 LIMIT 1", skip
        )
        end = await connection.fetchval("SELECT max(created_at) FROM reservations")
    finally:
        await connection.close()
    return start.timestamp(), end.timestamp(), total - skip - 1


async def outcomes(services: Services, kind: str) -> dict[str, int]:
    """Reservations by status, and what is left in the consumer's queue and in the DLQ."""
    connection = await asyncpg.connect(services.database_url)
    try:
        rows = await connection.fetch("SELECT status, count(*) FROM reservations GROUP BY 1")
    finally:
        await connection.close()
    counts = {row[0]: row[1] for row in rows}
    broker = await aio_pika.connect(services.amqp_url)
    try:
        channel = await broker.channel()
        for name, queue in (
            ("left_in_queue", _queue(kind)),
            ("dead_letters", ORDER_PLACED_DEAD_LETTER_QUEUE),
        ):
            declared = await channel.declare_queue(queue, passive=True)
            counts[name] = int(declared.declaration_result.message_count or 0)
    finally:
        await broker.close()
    return counts


@dataclass
class RssCheckpoints:
    """Peak RSS (``VmHWM``, MiB) of a drain's processes every :data:`RSS_CHECKPOINT_ORDERS`.

    ``by_orders`` is ``{orders committed: {"worker": [MiB per process], name: [MiB]}}``, a
    name for each process beside the worker.
    """

    consumers: Sequence[Consumer]
    beside: Sequence[Consumer]
    orders: int
    by_orders: dict[int, dict[str, list[float]]] = field(default_factory=dict)

    def now(self) -> dict[str, list[float]]:
        """Every process's peak RSS now, by name."""
        named = _by_name(self.beside)
        return {"worker": _peak_rss_mib(self.consumers)} | {
            name: _peak_rss_mib(processes) for name, processes in named.items()
        }

    def note(self, committed: int) -> None:
        """Record the checkpoints that ``committed`` orders have passed (the last excepted)."""
        for mark in range(
            RSS_CHECKPOINT_ORDERS, min(committed + 1, self.orders), RSS_CHECKPOINT_ORDERS
        ):
            if mark not in self.by_orders:
                self.by_orders[mark] = self.now()


# --- adjustments during a drain -------------------------------------------------------------

ADJUST_PER_SECOND = 100.0
"""The rate of a variant's ``adjust`` item that names none, per second."""
HOT_SKUS = 10
"""The SKUs a variant's adjustments name: those of which the backlog orders the most units."""
ADJUSTMENT_SEED = 37
"""Seed of the adjustments sent during a drain: every drain of a run gets the same ones."""


def adjust_rate(item: str) -> float:
    """The rate per second of a variant's ``adjust`` item: ``adjust``, ``adjust=100``, ``=100/s``.

    Raises:
        ValueError: the rate is not a positive number.
    """
    _, equals, value = item.partition("=")
    if not equals:
        return ADJUST_PER_SECOND
    try:
        rate = float(value.strip().removesuffix("/s"))
    except ValueError:
        rate = math.nan
    if not rate > 0 or math.isinf(rate):
        msg = f"{item!r}: the rate is a positive number of adjustments a second, e.g. adjust=100"
        raise ValueError(msg)
    return rate


def checked(found: Mapping[str, Any], expected: Mapping[str, int]) -> dict[str, Any]:
    """Each count of ``found`` with an ``_ok`` beside it: whether it is the one ``expected``."""
    result: dict[str, Any] = {}
    for name, value in found.items():
        result[name] = value
        result[f"{name}_ok"] = value == expected[name]
    return result


Level = tuple[int, int, int]
"""A SKU's ``(on_hand, reserved, shipped)``."""


async def stock_levels(database_url: str) -> dict[str, Level]:
    """Every SKU's :data:`Level` now."""
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch("SELECT sku, on_hand, reserved, shipped FROM stock_levels")
    finally:
        await connection.close()
    return {row["sku"]: (row["on_hand"], row["reserved"], row["shipped"]) for row in rows}


def stock_wrong(
    before: Mapping[str, Level], after: Mapping[str, Level], adjustments: Sequence[Adjustment]
) -> list[str]:
    """The SKUs whose level ``after`` is not ``before`` changed by ``adjustments``, sorted.

    ``before`` is the level each SKU would have without the adjustments. Right is ``on_hand``
    = before + the sum of the SKU's deltas, ``reserved`` and ``shipped`` as before (an
    adjustment changes neither); a SKU missing on one side counts as 0, 0, 0 (none of the
    benchmark's adjustments takes more than the SKU's own receipts gave, so none stops at 0).
    """
    net = net_deltas(adjustments)
    wrong = []
    for sku in sorted(before.keys() | after.keys() | net.keys()):
        on_hand, reserved, shipped = before.get(sku, (0, 0, 0))
        if after.get(sku, (0, 0, 0)) != (on_hand + net[sku], reserved, shipped):
            wrong.append(sku)
    return wrong


async def adjustment_checks(
    database_url: str, before: Mapping[str, Level], adjustments: Sequence[Adjustment]
) -> dict[str, Any]:
    """Counts after ``adjustments`` were sent, each with an ``_ok``: each applied once, stock exact.

    One ``warehouse_adjustments`` row per adjustment and no other, each applied whole
    (``applied = delta``), one ``webhook_inbox`` row ``adjusted`` and one ``stock.adjusted``
    outbox row for each, no ``stock.shortage`` and no discrepancy, and every SKU's level
    ``before`` changed by its deltas (:func:`stock_wrong`: ``skus_wrong``, ``stock_ok``).
    """
    ids = [adjustment.adjustment_id for adjustment in adjustments]
    connection = await asyncpg.connect(database_url)
    try:
        found = {
            "adjustments": await connection.fetchval(
                "SELECT count(*) FROM warehouse_adjustments WHERE adjustment_id = ANY($1::text[])",
                ids,
            ),
            "adjustment_rows": await connection.fetchval(
                "SELECT count(*) FROM warehouse_adjustments"
            ),
            "applied_whole": await connection.fetchval(
                "SELECT count(*) FROM warehouse_adjustments WHERE applied = delta"
            ),
            "webhooks": await connection.fetchval(
                "SELECT count(*) FROM webhook_inbox WHERE outcome = 'adjusted'"
            ),
            "events": await connection.fetchval(
                "SELECT count(DISTINCT body ->> 'adjustment_id') FROM outbox"
                " WHERE routing_key = 'stock.adjusted'"
            ),
            "event_rows": await connection.fetchval(
                "SELECT count(*) FROM outbox WHERE routing_key = 'stock.adjusted'"
            ),
            "shortages": await connection.fetchval(
                "SELECT count(*) FROM outbox WHERE routing_key = 'stock.shortage'"
            ),
            "discrepancies": await connection.fetchval(
                "SELECT count(*) FROM warehouse_discrepancies"
            ),
        }
    finally:
        await connection.close()
    every = len(adjustments)
    result = checked(
        found,
        {
            "adjustments": every,
            "adjustment_rows": every,
            "applied_whole": every,
            "webhooks": every,
            "events": every,
            "event_rows": every,
            "shortages": 0,
            "discrepancies": 0,
        },
    )
    wrong = stock_wrong(before, await stock_levels(database_url), adjustments)
    result["skus_wrong"] = len(wrong)
    result["stock_ok"] = not wrong
    return result


class AdjustmentSender:
    """Signed ``inventory.adjusted`` webhooks to the intake beside the worker, at a steady rate.

    Once started, it waits for ``intake`` to be ready, then sends ``plan_adjustments`` of
    ``skus`` (:data:`ADJUSTMENT_SEED`: the same in every drain) at ``rate`` per second
    (``post_steadily``) until :meth:`finish`. ``before`` is the stock as the drain found it.
    """

    def __init__(
        self, intake: Consumer, skus: Sequence[str], rate: float, before: Mapping[str, Level]
    ) -> None:
        self.intake = intake
        self.skus = tuple(skus)
        self.rate = rate
        self.before = dict(before)
        self.posted: SteadyPost[Adjustment] = SteadyPost()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[SteadyPost[Adjustment]] | None = None

    @classmethod
    async def for_drain(
        cls, plan: Plan, kind: str, beside: Sequence[Consumer], orders: Sequence[Order]
    ) -> AdjustmentSender | None:
        """The sender of ``plan``'s adjustments to its intake among ``beside``, not started.

        Of the hot SKUs of ``orders`` (:data:`HOT_SKUS`); None when the plan sends none or
        ``kind`` is the reference's drain.
        """
        if not plan.adjust_per_second or kind != "worker":
            return None
        return cls(
            _by_name(beside)["webhooks"][0],
            hot_skus(orders, HOT_SKUS),
            plan.adjust_per_second,
            await stock_levels(plan.services.database_url),
        )

    def start(self) -> None:
        """Start sending, in a task of the running loop."""
        self._task = asyncio.create_task(self._send())

    async def _send(self) -> SteadyPost[Adjustment]:
        await asyncio.to_thread(self.intake.wait_ready)
        port = self.intake.env["FULFILMENT_WEBHOOKS_PORT"]
        return await post_steadily(
            f"http://127.0.0.1:{port}{WEBHOOK_PATH}",
            plan_adjustments(self.skus, seed=ADJUSTMENT_SEED, namespace="drain"),
            rate=self.rate,
            secret=WEBHOOK_SECRET,
            stop=self._stop,
        )

    async def finish(self) -> None:
        """Stop sending; once every request is answered, :attr:`posted` says what was sent.

        Raises:
            RuntimeError: the intake was not ready (it exited, or not within a minute).
        """
        assert self._task is not None  # noqa: S101 - started first
        self._stop.set()
        self.posted = await self._task

    async def cancel(self) -> None:
        """Stop at once, the requests in flight abandoned (the drain failed)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


@dataclass(frozen=True, slots=True)
class AdjustmentFigures:
    """What a variant's adjustments did during a drain (:class:`AdjustmentSender`).

    ``sent_per_second`` is over the sender's own span, from the intake's readiness to the
    drain's last commit; ``window_per_second`` counts the adjustments applied
    (``warehouse_adjustments.recorded_at``) within the drain's counted window, over it: what
    the worker met. ``answer_ms``: p50, p99 and max from sending to the intake's answer.
    ``checks`` are :func:`adjustment_checks`' against the level the drain alone leaves
    (:func:`level_after_drain`), and ``confirmed``: the ``stock.adjusted`` events that
    reached :data:`SKU_EVENTS_QUEUE`.
    """

    target_per_second: float
    sent: int
    sent_per_second: float
    window_per_second: float
    answered: dict[str, int]
    skus: tuple[str, ...]
    checks: dict[str, Any]
    answer_ms: dict[str, float] = field(default_factory=dict)

    @property
    def applied_once(self) -> bool:
        """Whether every adjustment was answered 2xx and every check holds."""
        answered = all(status.startswith("2") for status in self.answered)
        return answered and all(
            value is True for key, value in self.checks.items() if key.endswith("ok")
        )


def level_after_drain(before: Mapping[str, Level], orders: Sequence[Order]) -> dict[str, Level]:
    """Each SKU's level ``before`` once every one of ``orders`` is reserved from it.

    ``reserved`` up by the orders' units of the SKU, ``on_hand`` and ``shipped`` as they were:
    the level the drain alone leaves (its stock is large enough that it rejects no order).
    """
    ordered: Counter[str] = Counter()
    for order in orders:
        for sku, quantity in order.lines:
            ordered[sku] += quantity
    return {
        sku: (on_hand, reserved + ordered[sku], shipped)
        for sku, (on_hand, reserved, shipped) in before.items()
    }


async def adjustments_of_drain(
    services: Services, sender: AdjustmentSender, orders: Sequence[Order], window: Sequence[float]
) -> AdjustmentFigures:
    """The figures and checks of what ``sender`` sent during the drain of ``orders``.

    ``window`` is the drain's counted window: its start and end (epoch seconds).
    """
    posted = sender.posted
    start, end = window
    connection = await asyncpg.connect(services.database_url)
    try:
        in_window = await connection.fetchval(
            "SELECT count(*) FROM warehouse_adjustments"
            " WHERE recorded_at BETWEEN to_timestamp($1) AND to_timestamp($2)",
            start,
            end,
        )
    finally:
        await connection.close()
    expected = level_after_drain(sender.before, orders)
    checks = await adjustment_checks(services.database_url, expected, posted.sent)
    confirmed = await queue_depth(services.amqp_url, SKU_EVENTS_QUEUE)
    checks |= checked({"confirmed": confirmed}, {"confirmed": len(posted.sent)})
    return AdjustmentFigures(
        target_per_second=sender.rate,
        sent=len(posted.sent),
        sent_per_second=round(posted.rate, 1),
        window_per_second=round(in_window / (end - start), 1),
        answered=posted.answered,
        skus=sender.skus,
        checks=checks,
        answer_ms={
            "p50": round(percentile(posted.answer_ms, 0.5), 1),
            "p99": round(percentile(posted.answer_ms, 0.99), 1),
            "max": round(max(posted.answer_ms, default=math.nan), 1),
        },
    )


async def drain(plan: Plan, kind: str, orders: Sequence[Order], label: str) -> Drain:
    """Publish ``orders`` as a backlog, start the consumers (and the processes beside), measure.

    Until all are committed and, with a relay, until every result event has reached
    :data:`EVENTS_QUEUE`; every process is stopped once the outbox has no unpublished row (the
    reference once it has committed every order).
    """
    services = plan.services
    await purge_events_queue(services.amqp_url)
    broker = await aio_pika.connect(services.amqp_url)
    try:
        publish_seconds = await publish_backlog(
            broker,
            exchange=ORDERS_EXCHANGE,
            routing_key=_route(kind),
            orders=orders,
        )
    finally:
        await broker.close()
    consumers = plan.consumers(kind, label)
    beside = plan.beside(kind, label)
    before = await database_counters(services.database_url)
    database = urllib.parse.urlsplit(services.database_url).path.lstrip("/")
    rss = RssCheckpoints(consumers, beside, len(orders))
    groups: dict[str, Callable[[], Sequence[int]]] = {"consumer": lambda: _pids(consumers)}
    for process in beside:
        groups[process.kind] = functools.partial(_kind_pids, beside, process.kind)
    depths: list[tuple[float, int]] = []
    stop_depths = asyncio.Event()
    sender = await AdjustmentSender.for_drain(plan, kind, beside, orders)
    with CpuSampler(groups, database) as sampler:
        depth_task = asyncio.create_task(sample_depth(services.amqp_url, depths, stop_depths))
        for process in [*beside, *consumers]:
            process.start()
        if sender is not None:
            sender.start()
        try:
            await wait_committed(
                services.database_url,
                len(orders),
                within=120 + len(orders) / 50,
                consumers=[*consumers, *beside],
                progress=rss.note,
            )
            if sender is not None:
                await sender.finish()
            if beside:
                # The worker idles until the last confirm: stopped at once, its shutdown
                # would fall into the counted window, which ends there.
                await wait_published(
                    services.database_url, within=120 + len(orders) / 50, relays=beside
                )
            # The depth's last read before any process stops: stopping one blocks this loop
            # (for seconds with the hand-off), and a read after it would put the last
            # arrivals, and the end of the counted window, that much later.
            stop_depths.set()
            await depth_task
            rss.by_orders[len(orders)] = rss.now()
            worker_rss = rss.by_orders[len(orders)]["worker"]
            simulator = _by_name(beside).get("warehouse", [])
            warehouse = (
                json.loads(simulator[0].get("/_simulator/stats") or "{}") if simulator else {}
            )
        finally:
            if sender is not None:
                await sender.cancel()
            for process in [*consumers, *beside]:
                process.stop()
            stop_depths.set()
            await depth_task
    start, end, counted = await commit_window(services.database_url, len(orders))
    events = await events_of_drain(services, depths, sampler) if beside else None
    counted_end = max(end, events.finished) if events is not None else end
    await asyncio.sleep(1)  # backends report their counters when they exit
    after = await database_counters(services.database_url)

    def per_1000(cpu: dict[str, float]) -> dict[str, float]:
        return {group: seconds / counted * 1000 for group, seconds in cpu.items()}

    handoff = await handoff_of_drain(plan, start, counted_end, warehouse) if warehouse else None

    return Drain(
        kind=kind,
        orders=len(orders),
        publish_seconds=round(publish_seconds, 2),
        rate=counted / (end - start),
        cpu_per_1000=per_1000(sampler.between(start, counted_end)),
        cpu_per_1000_drain=per_1000(sampler.between(start, end)),
        peak_rss_mib=worker_rss,
        outcomes=await outcomes(services, kind),
        database_per_order={
            name: round((after[name] - before[name]) / len(orders), 2) for name in DATABASE_COUNTERS
        },
        beside_peak_rss_mib={
            name: max(values)
            for name, values in rss.by_orders[len(orders)].items()
            if name != "worker" and values
        },
        events=events,
        peak_rss_by_orders=rss.by_orders,
        variant=plan.label,
        handoff=handoff,
        adjustments=await adjustments_of_drain(services, sender, orders, (start, counted_end))
        if sender is not None
        else None,
    )


@dataclass
class Latency:
    """End-to-end latency at a steady publish rate, in milliseconds."""

    kind: str
    target_rate: float
    achieved_rate: float
    orders: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    order_confirm_ms: dict[str, float] = field(default_factory=dict)
    """placed_at -> the broker's confirm of the order itself, p50/p95/p99/max: its write into its
    quorum queue, which comes before the worker can see the order, and the same kind of write
    as each result event's."""
    metric_share_within_100ms: float | None = None
    metric_p99_ms: float | None = None
    handler_p50_ms: float | None = None
    handler_p99_ms: float | None = None
    events: int | None = None
    """Result events the relay published in the phase; None without a relay."""
    confirm_lag_ms: dict[str, float] = field(default_factory=dict)
    """Commit -> confirm, p50/p95/p99/max (:func:`confirm_lags_ms`, depth read every
    :data:`LATENCY_DEPTH_SAMPLE_SECONDS`); empty without a relay."""
    depth_spacing_ms: float | None = None
    """The median time between two reads of the depth: what ``confirm_lag_ms`` is good to."""
    published_lag_p50_ms: float | None = None
    """Commit -> published: ``outbox.published_at - created_at`` of the phase's rows."""
    published_lag_p99_ms: float | None = None
    published_lag_max_ms: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


async def _database_latencies(database_url: str) -> tuple[asyncpg.Record, asyncpg.Record]:
    """placed_at -> commit and commit -> published (p50, p99, max in ms) from the tables."""
    connection = await asyncpg.connect(database_url)
    try:
        row = await connection.fetchrow(
            "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) AS p50,"
            " percentile_cont(0.99) WITHIN GROUP (ORDER BY ms) AS p99, max(ms) AS top"
            " FROM (SELECT extract(epoch FROM created_at - placed_at) * 1000 AS ms"
            " FROM reservations) AS l"
        )
        lag = await connection.fetchrow(
            "SELECT count(*) AS events,"
            " percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) AS p50,"
            " percentile_cont(0.99) WITHIN GROUP (ORDER BY ms) AS p99, max(ms) AS top"
            " FROM (SELECT extract(epoch FROM published_at - created_at) * 1000 AS ms"
            " FROM outbox) AS l"
        )
    finally:
        await connection.close()
    return row, lag


async def latency(plan: Plan, kind: str, orders: Sequence[Order], rate: float) -> Latency:
    """Publish ``orders`` at ``rate`` per second to running consumers; measure placed_at->commit.

    From the database: ``reservations.created_at`` (the start of the reserving transaction)
    minus ``placed_at``. From the worker's metric ``fulfilment_order_latency_seconds``
    (observed after the commit): the share within 100 ms and p99 interpolated in its buckets.
    With the worker's relay running too: commit -> confirm from the events' queue
    (:func:`confirm_lags_ms`), and as a cross-check commit -> published,
    ``outbox.published_at`` (set when the broker has confirmed the event) minus
    ``outbox.created_at`` (the start of the transaction that wrote it), over the phase's rows.
    """
    services = plan.services
    consumers = plan.consumers(kind, f"latency-{kind}")
    beside = plan.beside(kind, f"latency-{kind}")
    await purge_events_queue(services.amqp_url)
    depths: list[tuple[float, int]] = []
    stop_depths = asyncio.Event()
    for process in [*beside, *consumers]:
        process.start()
    try:
        for process in [*beside, *consumers]:
            process.wait_ready()
        depth_task = asyncio.create_task(
            sample_depth(services.amqp_url, depths, stop_depths, LATENCY_DEPTH_SAMPLE_SECONDS)
        )
        try:
            broker = await aio_pika.connect(services.amqp_url)
            try:
                published = await publish_steadily(
                    broker,
                    exchange=ORDERS_EXCHANGE,
                    routing_key=_route(kind),
                    orders=orders,
                    rate=rate,
                )
            finally:
                await broker.close()
            await wait_committed(
                services.database_url, len(orders), within=120, consumers=[*consumers, *beside]
            )
            if beside:
                await wait_published(services.database_url, within=120, relays=beside)
        finally:
            stop_depths.set()
            await depth_task
        exposition = [consumer.metrics() for consumer in consumers]
    finally:
        for process in [*consumers, *beside]:
            process.stop()
    row, lag = await _database_latencies(services.database_url)
    result = Latency(
        kind=kind,
        target_rate=round(rate, 1),
        achieved_rate=round(published.rate, 1),
        orders=len(orders),
        p50_ms=round(float(row["p50"]), 1),
        p99_ms=round(float(row["p99"]), 1),
        max_ms=round(float(row["top"]), 1),
        order_confirm_ms=lag_percentiles_ms(published.placed, published.confirmed),
    )
    if beside and lag["events"]:
        result.events = int(lag["events"])
        result.confirm_lag_ms = await confirm_lags_ms(services.amqp_url, depths, depths[-1][1])
        result.depth_spacing_ms = spacing_ms(depths)
        result.published_lag_p50_ms = round(float(lag["p50"]), 1)
        result.published_lag_p99_ms = round(float(lag["p99"]), 1)
        result.published_lag_max_ms = round(float(lag["top"]), 1)
    if kind == "worker":
        buckets = _histogram(exposition, "fulfilment_order_latency_seconds")
        if buckets:
            result.metric_share_within_100ms = round(_share_within(buckets, 0.1), 5)
            result.metric_p99_ms = round(_quantile(buckets, 0.99) * 1000, 1)
        handled = _handler_durations(consumers)
        if handled:
            result.handler_p50_ms = round(percentile(handled, 0.5), 1)
            result.handler_p99_ms = round(percentile(handled, 0.99), 1)
    return result


def _histogram(expositions: Sequence[str], name: str) -> list[tuple[float, float]]:
    """Cumulative ``(le, count)`` buckets of histogram ``name``, summed over processes."""
    totals: dict[float, float] = {}
    prefix = f"{name}_bucket{{"
    for text in expositions:
        for line in text.splitlines():
            if line.startswith(prefix):
                labels, value = line[len(prefix) :].rsplit("} ", 1)
                le = dict(part.split("=", 1) for part in labels.split(","))["le"].strip('"')
                totals[float(le)] = totals.get(float(le), 0.0) + float(value)
    return sorted(totals.items())


def _share_within(buckets: Sequence[tuple[float, float]], bound: float) -> float:
    total = buckets[-1][1]
    within = next(count for le, count in buckets if le >= bound)
    return within / total if total else float("nan")


def _quantile(buckets: Sequence[tuple[float, float]], q: float) -> float:
    """Prometheus' ``histogram_quantile``: linear within the bucket holding the rank."""
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return lower_bound
            return lower_bound + (le - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = le, count
    return float("nan")


def _handler_durations(consumers: Sequence[Consumer]) -> list[float]:
    durations = []
    for consumer in consumers:
        for line in consumer.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                entry = json.loads(line)
                if entry["event"] == "order_placed.handled":
                    durations.append(float(entry["duration_ms"]))
    return durations


# --- profile --------------------------------------------------------------------------------


async def profile(plan: Plan, orders: Sequence[Order], out: Path) -> None:
    """Drain ``orders`` with one worker under py-spy; print the hottest functions.

    The processes beside it run as in a drain (none with ``--no-relay``), not profiled.
    """
    await purge_events_queue(plan.services.amqp_url)
    broker = await aio_pika.connect(plan.services.amqp_url)
    try:
        await publish_backlog(
            broker,
            exchange=ORDERS_EXCHANGE,
            routing_key=ORDER_PLACED_ROUTING_KEY,
            orders=orders,
        )
    finally:
        await broker.close()
    (worker,) = plan.consumers("worker", "profile")[:1]
    beside = plan.beside("worker", "profile")
    for process in [*beside, worker]:
        process.start()
    assert worker.process is not None  # noqa: S101 - just started
    # The virtual environment's py-spy, beside this interpreter: it need not be on the PATH.
    spy_binary = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    command = [spy_binary, "record", "--pid", str(worker.process.pid), "--rate", "200"]
    spy = subprocess.Popen(  # noqa: ASYNC220 - starting it does not block; its end is awaited below
        [*command, "--format", "raw", "--output", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await wait_committed(
            plan.services.database_url, len(orders), within=600, consumers=[worker, *beside]
        )
    finally:
        for process in [worker, *beside]:
            process.stop()
        spy.wait(timeout=60)
    print(summarise_profile(out))


IDLE_LEAVES = frozenset({"Condition.wait (threading.py)"})
"""Leaf frames of threads parked on a lock (py-spy samples them as active)."""


def summarise_profile(path: Path, top: int = 30) -> str:
    """Where a py-spy ``raw`` (collapsed) profile spends its samples.

    Three views of the samples that are not idle: the inclusive (and self) share of the top
    functions, the top functions by self share, and self share per package (the standard
    library's modules by module name), which says which library's code the CPU runs in.
    """
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    total = idle = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        frames = [_short(frame) for frame in stack.split(";")]
        if frames[-1] in IDLE_LEAVES:
            idle += count
            continue
        total += count
        own[frames[-1]] += count
        packages[_package(stack.split(";")[-1])] += count
        for frame in set(frames):
            inclusive[frame] += count
    lines = [
        f"{total} samples ({idle} idle left out); inclusive (self) share, top {top} functions:"
    ]
    lines += [
        f"{count / total:6.1%} ({own[frame] / total:5.1%})  {frame}"
        for frame, count in inclusive.most_common(top)
    ]
    lines += ["", f"top {top} by self share:"]
    lines += [f"{count / total:6.1%}  {frame}" for frame, count in own.most_common(top)]
    lines += ["", "self share per package:"]
    lines += [f"{count / total:6.1%}  {name}" for name, count in packages.most_common(top)]
    return "\n".join(lines)


def _where(frame: str) -> list[str]:
    """The module path of a py-spy frame, e.g. ``["sqlalchemy", "engine", "base.py"]``."""
    return frame.partition(" (")[2].rsplit(":", 1)[0].removesuffix(")").split("/")


def _package(frame: str) -> str:
    """The top-level package of a frame (``asyncio``, ``sqlalchemy``, ``fulfilment``...)."""
    parts = _where(frame)
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


def _short(frame: str) -> str:
    """``function (package/sub/module.py:line)`` -> ``function (package/module.py)``."""
    name = frame.partition(" (")[0]
    parts = _where(frame)
    return f"{name} ({parts[0] + '/' if len(parts) > 2 else ''}{'/'.join(parts[-1:])})"


# --- main -----------------------------------------------------------------------------------


def _row(label: str, drain: Drain) -> Row:
    rss = {"consumer": max(drain.peak_rss_mib, default=math.nan)} | drain.beside_peak_rss_mib
    return Row(
        label=label,
        counted=drain.events.rate if drain.events is not None else math.nan,
        drained=drain.rate,
        lag_ms=drain.events.lag_ms if drain.events is not None else {},
        cpu=drain.cpu_per_1000,
        rss_mib=rss,
    )


def _name(kind: str, plan: Plan) -> str:
    if kind == "reference":
        return "reference (publishes nothing)"
    processes = " + ".join(["worker", *(process.name for process in plan.beside_worker)])
    return f"{plan.label}: {processes}" if plan.label else processes


def comparison_rows(drains: Sequence[Drain], plans: Sequence[Plan]) -> list[Row | Ratio]:
    """Round by round, then the medians, and each variant's median over the first plan's.

    A round is each plan's drain, the reference's, and each plan over the reference.
    """
    rows: list[Row | Ratio] = []
    reference = [d for d in drains if d.kind == "reference"]
    mine = {
        plan.label: [d for d in drains if d.kind == "worker" and d.variant == plan.label]
        for plan in plans
    }
    runs: dict[str, list[Row]] = {plan.label: [] for plan in plans}
    round_ratios: dict[str, list[Ratio]] = {plan.label: [] for plan in plans}
    reference_rows: list[Row] = []
    rounds = max([len(reference), *(len(of) for of in mine.values())])
    for index in range(rounds):
        made: dict[str, Row] = {}
        for plan in plans:
            if index < len(mine[plan.label]):
                made[plan.label] = _row(
                    f"round {index + 1}: {_name('worker', plan)}", mine[plan.label][index]
                )
                runs[plan.label].append(made[plan.label])
                rows.append(made[plan.label])
        if index < len(reference):
            against = _row(f"round {index + 1}: {_name('reference', plans[0])}", reference[index])
            reference_rows.append(against)
            rows.append(against)
            for plan in plans:
                if plan.label in made:
                    compared = ratio_row(
                        f"round {index + 1}: {_ratio_name(plan)}", made[plan.label], against
                    )
                    round_ratios[plan.label].append(compared)
                    rows.append(compared)
    medians = {
        plan.label: median_row(f"**median: {_name('worker', plan)}**", runs[plan.label])
        for plan in plans
        if runs[plan.label]
    }
    rows += medians.values()
    if reference_rows:
        reference_median = median_row(f"**median: {_name('reference', plans[0])}**", reference_rows)
        rows.append(reference_median)
        rows += [
            ratio_row(f"**median: {_ratio_name(plan)}**", medians[plan.label], reference_median)
            for plan in plans
            if plan.label in medians
        ]
        rows += [
            median_ratio(f"**median of the rounds: {_ratio_name(plan)}**", round_ratios[plan.label])
            for plan in plans
            if round_ratios[plan.label]
        ]
    base = plans[0]
    rows += [
        relative_row(
            f"**median: {plan.label} / {base.label or 'without it'}**",
            medians[plan.label],
            medians[base.label],
        )
        for plan in plans[1:]
        if plan.label in medians and base.label in medians
    ]
    return rows


def _ratio_name(plan: Plan) -> str:
    return f"{plan.label} / reference" if plan.label else "ratio (over the reference)"


def report(drains: Sequence[Drain], latencies: Sequence[Latency], plans: Sequence[Plan]) -> str:
    """The result table and the lines under it, as Markdown."""
    plan = plans[0]
    rounds = sum(1 for d in drains if d.kind == "worker" and d.variant == plan.label)
    beside = list(dict.fromkeys(p.name for each in plans for p in each.beside_worker))
    lines: list[str] = []
    if drains:
        counted = (
            "an order counts when its result event is confirmed (it has reached "
            f"`{EVENTS_QUEUE}`, bound to `{EVENTS_EXCHANGE}`)"
            if beside
            else "the worker alone: an order counts when its delivery is acknowledged"
        )
        variants = "".join(
            f"; variant `{each.label}`: {_variant_text(each, plan)}" for each in plans[1:]
        )
        lines += [
            (
                f"orders per drain: {drains[0].orders:,}; prefetch (concurrency) {plan.prefetch}; "
                f"{plan.workers} worker process(es); {counted}; {rounds} round(s); CPU over the "
                f"counted window; the reference is compared on its drain{variants}"
            ),
            "",
            *comparison_table(
                comparison_rows(drains, plans),
                cpu_groups=["consumer", *beside, "broker", "postgres"],
                rss_processes=["consumer", *beside],
                events=bool(beside),
            ),
        ]
    lines += _events_lines(drains)
    lines += _handoff_lines(drains)
    lines += adjustment_lines(drains)
    for result in latencies:
        lines += ["", _latency_line(result)]
    return "\n".join(lines)


def _variant_text(variant: Plan, base: Plan) -> str:
    """What a variant adds to the base plan: processes and settings."""
    added = [p.name for p in variant.beside_worker if p not in base.beside_worker]
    settings = [
        f"{name}={value}"
        for name, value in variant.env.items()
        if base.env.get(name) != value and name != "FULFILMENT_WAREHOUSE_TOKEN"
    ]
    adjusting = (
        [f"{variant.adjust_per_second:g} adjustments/s of the {HOT_SKUS} hot SKUs"]
        if variant.adjust_per_second != base.adjust_per_second
        else []
    )
    return ", ".join([*(f"+ {name}" for name in added), *adjusting, *settings]) or "as the base"


def _handoff_lines(drains: Sequence[Drain]) -> list[str]:
    """What the dispatcher did in each drain that ran one."""
    lines = []
    for d in drains:
        h = d.handoff
        if h is None:
            continue
        lines.append(
            f"{d.variant or 'worker'} drain: the dispatcher answered {h.answered_per_second:,.0f}"
            f" requests/s over the counted window (cap {number(h.cap_per_second, 1)}/s; the"
            f" worker drained {d.rate:,.0f} orders/s), {h.open_at_end:,} still open at its end"
            " (the backlog it had left behind the worker);"
            f" the warehouse received {h.requests:,} requests, at most"
            f" {h.max_requests_per_second:,} in one second, over {h.connections} connection(s)"
            + (
                f"; {min(h.window_seconds)} to {max(h.window_seconds)} in each of the"
                f" {len(h.window_seconds)} whole seconds of the window"
                if h.window_seconds
                else ""
            )
        )
    return ["", *lines] if lines else []


def adjustment_lines(drains: Sequence[Drain]) -> list[str]:
    """What the adjustments sent during each drain did, a line per drain that sent some."""
    lines = []
    for index, d in enumerate((d for d in drains if d.adjustments is not None), start=1):
        a = d.adjustments
        assert a is not None  # noqa: S101 - filtered above
        failed = [key.removesuffix("_ok") for key, ok in a.checks.items() if ok is False]
        lines.append(
            f"adjusted drain {index}{_of_variant(d)}: {a.sent:,} `inventory.adjusted` of the"
            f" {len(a.skus)} hot SKUs ({', '.join(a.skus)}) sent at {a.sent_per_second:,.1f}/s"
            f" (target {a.target_per_second:g}/s), {a.window_per_second:,.1f}/s applied over the"
            f" counted window; answers "
            + ", ".join(f"{status}: {n:,}" for status, n in sorted(a.answered.items()))
            + " in "
            + ", ".join(f"{key} {number(ms, 1)} ms" for key, ms in a.answer_ms.items())
            + "; each applied once, its event confirmed, stock exact: "
            + ("yes" if a.applied_once else f"**no** ({', '.join(failed) or 'answers'})")
        )
    return ["", *lines] if lines else []


def _of_variant(drain: Drain) -> str:
    return f" ({drain.variant})" if drain.variant else ""


def _events_lines(drains: Sequence[Drain]) -> list[str]:
    """The result events per worker drain, and peak RSS by orders committed."""
    lines = []
    for index, d in enumerate((d for d in drains if d.events is not None), start=1):
        e = d.events
        assert e is not None  # noqa: S101 - filtered above
        lines.append(
            f"worker drain {index}{_of_variant(d)}: {e.count:,} result events reached the queue "
            f"({e.outbox_rows:,} outbox rows) at {e.rate:,.0f}/s (marked published: "
            f"{e.marked_rate:,.0f}/s), relay CPU {e.relay_cpu_per_1000:.3f} s per 1,000 events; "
            f"commit -> confirm max {number(e.lag_ms.get('max'), 1)} ms (depth read every "
            f"{number(e.depth_spacing_ms, 1)} ms, median)"
        )
    for index, d in enumerate((d for d in drains if d.kind == "worker"), start=1):
        if len(d.peak_rss_by_orders) > 1:
            names = dict.fromkeys(name for rss in d.peak_rss_by_orders.values() for name in rss)
            for process in names:
                marks = ", ".join(
                    f"{orders:,}: {'/'.join(f'{v:.1f}' for v in rss[process])}"
                    for orders, rss in sorted(d.peak_rss_by_orders.items())
                    if rss.get(process)
                )
                if marks:
                    lines.append(
                        f"worker drain {index}{_of_variant(d)}, {process} peak RSS MiB by orders"
                        " committed: " + marks
                    )
    return ["", *lines] if lines else []


def _latency_line(result: Latency) -> str:
    text = (
        f"latency, {result.kind}, {result.orders:,} orders at {result.achieved_rate:,.0f}/s: "
        f"placed_at -> commit p50 {result.p50_ms:.1f} ms, p99 {result.p99_ms:.1f} ms, "
        f"max {result.max_ms:.1f} ms (database); placed_at -> the order confirmed by the broker "
        + ", ".join(f"{key} {value:.1f} ms" for key, value in result.order_confirm_ms.items())
    )
    if result.metric_share_within_100ms is not None:
        text += (
            f"; metric: {result.metric_share_within_100ms:.2%} within 100 ms, "
            f"p99 {result.metric_p99_ms} ms"
        )
    if result.handler_p50_ms is not None:
        text += f"; handler p50 {result.handler_p50_ms} ms, p99 {result.handler_p99_ms} ms"
    if result.events is not None:
        lag = result.confirm_lag_ms
        text += (
            f"; commit -> confirm, {result.events:,} events: "
            + ", ".join(f"{key} {number(value, 1)} ms" for key, value in lag.items())
            + f" (depth read every {number(result.depth_spacing_ms, 1)} ms, median;"
            f" commit -> published p50 {result.published_lag_p50_ms} ms, p99 "
            f"{result.published_lag_p99_ms} ms)"
        )
    elif result.kind == "reference":
        text += "; publishes no events"
    return text


class OtlpSink:
    """An OTLP/HTTP endpoint that answers 200 to every export and counts the requests and bytes.

    A collector's work is not the service's: the sink keeps it out of the figures (its CPU is
    the benchmark's own, in the rest of the machine) while the exporters do all theirs.
    """

    def __init__(self) -> None:
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                self.rfile.read(length)
                sink.requests += 1
                sink.bytes += length
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.requests = 0
        self.bytes = 0
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


def variant_plan(text: str, base: Plan, sink: Callable[[], OtlpSink]) -> Plan:
    """The plan of ``--variant`` ``text`` (``LABEL; ITEM; ...``): ``base`` with the ITEMs.

    ``adjust`` (or ``adjust=RATE``, :func:`adjust_rate`) sends adjustments of the hot SKUs to
    the variant's intake during each drain, so it goes with ``webhooks``.

    Raises:
        ValueError: no label, an unknown ITEM, `warehouse` or `webhooks` where it cannot be
            added, `adjust` without `webhooks` or with a rate that is not a positive number.
    """
    label, *items = [part.strip() for part in text.split(";")]
    if not label or "=" in label:
        msg = f"--variant {text!r}: it starts with a label, e.g. 'hand-off; warehouse'"
        raise ValueError(msg)
    env = dict(base.env)
    beside = base.beside_worker
    adjusts = [item for item in items if item.partition("=")[0].strip() == "adjust"]
    for item in (item for item in items if item not in adjusts):
        if item == "warehouse":
            if base.hands_off or not beside:
                msg = f"--variant {text!r}: warehouse needs the relay and no --warehouse"
                raise ValueError(msg)
            env, beside = with_warehouse(env, beside)
        elif item == "webhooks":
            if not beside:
                msg = f"--variant {text!r}: webhooks needs the relay (drop --no-relay)"
                raise ValueError(msg)
            beside = (*beside, webhooks_process())
        elif item == "otlp":
            env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{sink().port}"
        elif "=" in item:
            name, value = item.split("=", 1)
            env[name.strip()] = value.strip()
        else:
            msg = (
                f"--variant {text!r}: {item!r} is neither warehouse, webhooks, otlp, adjust nor"
                " NAME=VALUE"
            )
            raise ValueError(msg)
    adjust = _variant_adjust(text, adjusts, beside, base.adjust_per_second)
    return replace(base, env=env, beside_worker=beside, label=label, adjust_per_second=adjust)


def _variant_adjust(
    text: str, items: Sequence[str], beside: Sequence[ServiceProcess], base: float
) -> float:
    """The adjustments per second of variant ``text``: its last ``adjust`` item's, or ``base``.

    Raises:
        ValueError: a rate that is not a positive number, or no intake (``webhooks``) beside.
    """
    try:
        adjust = adjust_rate(items[-1]) if items else base
    except ValueError as error:
        msg = f"--variant {text!r}: {error}"
        raise ValueError(msg) from error
    if adjust and not any(process.name == "webhooks" for process in beside):
        msg = f"--variant {text!r}: adjust sends to the intake, which webhooks adds: add it"
        raise ValueError(msg)
    return adjust


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line; every option has a default that ``make bench`` uses."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--orders", "-n", type=int, default=20_000, help="orders per backlog")
    parser.add_argument("--rounds", type=int, default=3, help="drains per consumer, alternating")
    parser.add_argument(
        "--prefetch",
        type=int,
        default=SETTING_DEFAULTS["prefetch_count"],
        help="the worker's FULFILMENT_PREFETCH_COUNT and the reference's concurrency",
    )
    parser.add_argument("--workers", type=int, default=1, help="processes per consumer")
    parser.add_argument(
        "--data", type=Path, default=ROOT / "data/sample/online-retail", help="Online Retail CSVs"
    )
    parser.add_argument("--latency-seconds", type=float, default=20, help="0 to skip")
    parser.add_argument(
        "--latency-rate",
        type=float,
        help="orders per second of the latency phase (default: half the worker's median drain"
        " rate); with --rounds 0, the latency phase runs alone",
    )
    parser.add_argument("--seed", type=int, default=6)
    parser.add_argument(
        "--traceparent-sampled",
        type=float,
        metavar="RATIO",
        help="publish every order with a `traceparent` of a trace of its own, as a traced"
        " producer does, sampled with this probability (0 to 1): every consumer and variant"
        " gets the same ones; by default no order has one, so with tracing on the worker"
        " starts each trace",
    )
    parser.add_argument("--skip-reference", action="store_true", help="drain with the worker only")
    parser.add_argument(
        "--no-relay",
        action="store_true",
        help="the worker alone, as before result events counted: no `fulfilment relay` (nor"
        " any other process) beside it, its outbox rows stay unpublished, an order counts when"
        " its delivery is acknowledged",
    )
    parser.add_argument(
        "--warehouse",
        action="store_true",
        help="the hand-off on: a simulated warehouse answering in about 20 ms and `fulfilment"
        " dispatcher` run beside the worker (and the relay), FULFILMENT_WAREHOUSE_URL set",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="LABEL; ITEM; ...",
        help="drain this variant of the configuration too, in every round beside it, and compare"
        " it with it: ITEMs are `warehouse` (the hand-off on, as --warehouse), `webhooks` (the"
        " intake, `fulfilment webhooks`, running idle beside the worker), `adjust` or"
        " `adjust=RATE` (with `webhooks`: signed inventory.adjusted webhooks of the backlog's"
        f" {HOT_SKUS} most ordered SKUs sent to that intake at RATE a second, default"
        f" {ADJUST_PER_SECOND:g}, while the worker drains), `otlp` (traces"
        " exported to a sink the benchmark serves, which only counts them) and NAME=VALUE"
        " settings, e.g. 'tracing 1 %%; otlp; OTEL_TRACES_SAMPLER=parentbased_traceidratio;"
        " OTEL_TRACES_SAMPLER_ARG=0.01'; repeat for more",
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment of every service process (the worker and those beside it),"
        " e.g. FULFILMENT_DATABASE_POOL_SIZE=16 or tracing's settings; repeat for more",
    )
    parser.add_argument(
        "--worker-src",
        type=Path,
        help="run the worker from this source folder (e.g. an older version's src/, exported"
        " with git archive) instead of the installed package, to compare versions",
    )
    parser.add_argument(
        "--profile", action="store_true", help="one worker drain under py-spy; no figures"
    )
    parser.add_argument("--results", type=Path, default=ROOT / "bench/results")
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep the consumers' logs in --results"
    )
    parser.add_argument(
        "--admin-database-url",
        default=os.environ.get(
            "FULFILMENT_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
        help="PostgreSQL URL allowed to create databases (env FULFILMENT_BENCH_DATABASE_URL)",
    )
    parser.add_argument(
        "--amqp-url",
        default=os.environ.get("FULFILMENT_BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
        help="RabbitMQ URL of the default virtual host (env FULFILMENT_BENCH_AMQP_URL)",
    )
    args = parser.parse_args(argv)
    if args.traceparent_sampled is not None and not 0 <= args.traceparent_sampled <= 1:
        parser.error(f"--traceparent-sampled {args.traceparent_sampled:g}: a ratio, 0 to 1")
    return args


def plans_of(
    args: argparse.Namespace, services: Services, logs: Path, sink: Callable[[], OtlpSink]
) -> list[Plan]:
    """The options' plan, then one per ``--variant``.

    Raises:
        ValueError: options that do not go together, or a variant that is not understood.
    """
    env = dict(item.split("=", 1) for item in args.env)
    if args.worker_src is not None:
        env["PYTHONPATH"] = str(args.worker_src.resolve())
    if args.warehouse and args.no_relay:
        msg = "--warehouse needs the relay: drop --no-relay"
        raise ValueError(msg)
    beside: tuple[ServiceProcess, ...] = () if args.no_relay else SERVICE_PROCESSES
    if args.warehouse:
        env, beside = with_warehouse(env, beside)
    plan = Plan(services, logs, args.prefetch, args.workers, env, beside_worker=beside)
    plans = [plan, *(variant_plan(text, plan, sink) for text in args.variant)]
    if len({each.label for each in plans}) < len(plans):
        msg = "--variant: each needs a label of its own"
        raise ValueError(msg)
    return plans


def drain_rounds(
    plans: Sequence[Plan],
    workload: Workload,
    backlog: Sequence[Order],
    *,
    rounds: int,
    reference: bool,
) -> list[Drain]:
    """``rounds`` rounds, each a drain of ``backlog`` per plan, then the reference's."""
    runs = [(each, "worker") for each in plans] + ([(plans[0], "reference")] if reference else [])
    drains: list[Drain] = []
    for round_number in range(1, rounds + 1):
        for plan, kind in runs:
            asyncio.run(reset_database(plan.services.database_url, workload))
            label = f"round{round_number}" + (f"-v{plans.index(plan)}" if plan.label else "")
            result = asyncio.run(drain(plan, kind, backlog, label))
            drains.append(result)
            print(
                f"round {round_number} {_name(kind, plan)}: {result.rate:,.0f} orders/s"
                " drained, "
                + (f"{result.events.rate:,.0f}/s confirmed, " if result.events else "")
                + "CPU/1k "
                + ", ".join(f"{k} {v:.3f} s" for k, v in result.cpu_per_1000.items())
                + f", peak RSS {result.peak_rss_mib} MiB (beside "
                + f"{result.beside_peak_rss_mib}), {result.outcomes}, per order "
                + f"{result.database_per_order}, events {result.events}"
                + (f", hand-off {result.handoff}" if result.handoff else "")
                + (f", adjustments {result.adjustments}" if result.adjustments else ""),
                flush=True,
            )
    return drains


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the table; return the exit code (1: an adjustment not once)."""
    args = parse_args(argv)
    workload = load_workload(args.data)
    backlog = workload.make_orders(
        args.orders,
        seed=args.seed,
        namespace="backlog",
        traceparent_sampled=args.traceparent_sampled,
    )
    args.results.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    sinks: list[OtlpSink] = []

    def sink() -> OtlpSink:
        if not sinks:
            sinks.append(OtlpSink())
        return sinks[0]

    with (
        tempfile.TemporaryDirectory(prefix="fulfilment-bench-") as temporary,
        dedicated_services(args.admin_database_url, args.amqp_url) as services,
        contextlib.ExitStack() as closing,
    ):
        for each in sinks:
            closing.callback(each.close)
        logs = args.results / f"logs-{stamp}" if args.keep_logs else Path(temporary)
        logs.mkdir(exist_ok=True)
        try:
            plans = plans_of(args, services, Path(logs), sink)
        except ValueError as error:
            print(error, file=sys.stderr)
            return 2
        plan = plans[0]
        asyncio.run(declare_queues(services.amqp_url, SETTING_DEFAULTS["delivery_limit"]))
        servers = asyncio.run(versions(services))
        if args.profile:
            asyncio.run(reset_database(services.database_url, workload))
            out = args.results / f"profile-{stamp}.txt"
            asyncio.run(profile(plan, backlog, out))
            print(f"\nraw profile: {out}")
            return 0
        kinds = ["worker"] if args.skip_reference else ["worker", "reference"]
        # The reference pools as many connections as its concurrency, in each process.
        wanted = args.workers * args.prefetch
        if (
            not args.skip_reference
            and (free := asyncio.run(connections_free(plan.services.database_url))) < wanted
        ):
            print(
                f"bench: the reference opens {args.workers} x {args.prefetch} = {wanted}"
                f" PostgreSQL connections, and the server has {free} free (max_connections):"
                " lower --prefetch or --workers, or add --skip-reference",
                file=sys.stderr,
            )
            return 2
        if args.rounds < 1 and not (args.latency_rate and args.latency_seconds > 0):
            print("--rounds 0 needs --latency-rate and --latency-seconds", file=sys.stderr)
            return 2
        drains = drain_rounds(
            plans, workload, backlog, rounds=args.rounds, reference=not args.skip_reference
        )
        latencies = []
        if args.latency_seconds > 0:
            rate = (
                args.latency_rate
                or median([d.rate for d in drains if d.kind == "worker" and not d.variant]) / 2
            )
            steady = workload.make_orders(
                int(rate * args.latency_seconds),
                seed=args.seed + 1,
                namespace="steady",
                traceparent_sampled=args.traceparent_sampled,
            )
            for kind in kinds:
                asyncio.run(reset_database(services.database_url, workload))
                latencies.append(asyncio.run(latency(plan, kind, steady, rate)))
                print(f"latency {kind}: {asdict(latencies[-1])}", flush=True)
        exported = (
            f"\ntraces exported to the sink: {sinks[0].requests:,} requests,"
            f" {sinks[0].bytes / 2**20:,.1f} MiB"
            if sinks
            else ""
        )
    table = report(drains, latencies, plans) + exported
    machine = (
        f"{os.cpu_count()} CPUs ({cpu_model()}), {servers}, Python "
        f"{platform.python_version()}, {platform.system()} {platform.release()}"
    )
    print(f"\n{machine}\n{table}")
    document = {
        "when": stamp,
        "machine": machine,
        "arguments": {k: str(v) for k, v in vars(args).items()},
        "drains": [asdict(d) for d in drains],
        "latency": [asdict(result) for result in latencies],
        "table": table,
    }
    out = args.results / f"bench-{stamp}.json"
    out.write_text(json.dumps(document, indent=2))
    print(f"\nresults: {out}")
    return 1 if any(d.adjustments and not d.adjustments.applied_once for d in drains) else 0


if __name__ == "__main__":
    sys.exit(main())
