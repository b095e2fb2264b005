"""``fulfilment demo``: the main job on real data, from an empty database to a reconciled report.

Steps: create and migrate the database; plan and load stock from the data; start the worker
as a child process and wait until it is ready; publish one event per invoice; wait until the
queue is drained; stop the worker with SIGTERM (it finishes in-flight work and exits 0); then
reconcile every published event against the inbox and the dead-letter queue and print the
report.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client.parser import text_string_to_metric_families

from fulfilment.adapters.postgres.admin import (
    ensure_database,
    reset_tables,
    warehouse_session,
)
from fulfilment.adapters.postgres.errors import StockBelowReservedError
from fulfilment.adapters.postgres.schema import migrate
from fulfilment.adapters.rabbitmq import UnroutableError, connect, queue_state
from fulfilment.contracts.topology import DEAD_LETTER_QUEUE, MAIN_QUEUE
from fulfilment.tools.command import CommandError, Echo, ToolOptions, read_order_files
from fulfilment.tools.online_retail import ReadResult
from fulfilment.tools.publish import publish_orders
from fulfilment.tools.report import collect_report, reconcile, render_report
from fulfilment.tools.stock_plan import plan_stock

if TYPE_CHECKING:
    from aio_pika.abc import AbstractConnection

READY_WAIT_SECONDS = 60.0
"""How long the worker may take to report ready before the demo gives up."""
DRAIN_POLL_SECONDS = 0.5
"""Interval between two looks at the queue while waiting for it to drain."""
DRAIN_EMPTY_LOOKS = 2
"""Looks in a row that must find the queue empty: nothing ready and nothing arriving."""
DRAIN_STALL_SECONDS = 120.0
"""The demo fails if the queue's depth does not fall for this long."""


class DemoError(CommandError):
    """A step of the demo failed; the message says which and why (exit 1)."""


async def demo_command(
    options: ToolOptions,
    data: Path,
    *,
    reset: bool,
    stop_grace_seconds: float,
    echo: Echo,
) -> int:
    """Run the demo over the orders of ``data`` (a file or folder of Online Retail CSVs).

    ``reset`` empties the service's tables and queues first; ``stop_grace_seconds`` is how long
    the worker may take to stop after SIGTERM before it is killed (the orchestrator's grace
    period). Returns 0 when every event is accounted for, the worker stopped cleanly and the
    stock invariants hold, else 1.

    Raises:
        CommandError: ``data`` cannot be read (exit 2); a step failed, or no queue was bound
            for the events (exit 1).
        DatabaseUnavailableError, BrokerUnavailableError: a service does not answer.
    """
    read = read_order_files([data])
    try:
        return await _demo(
            options, read, reset=reset, stop_grace_seconds=stop_grace_seconds, echo=echo
        )
    except UnroutableError as error:
        raise CommandError(str(error)) from error


async def _demo(
    options: ToolOptions,
    read: ReadResult,
    *,
    reset: bool,
    stop_grace_seconds: float,
    echo: Echo,
) -> int:
    started = time.monotonic()
    database_url = options.database.url
    amqp_url = options.amqp_url
    async with connect(amqp_url):
        pass  # both services answer before anything is changed
    if await ensure_database(database_url):
        echo("created the database")
    await asyncio.to_thread(migrate, database_url)
    echo("database migrated to head")

    levels = plan_stock(read.orders)
    async with warehouse_session(options.database, consumer=options.consumer) as warehouse:
        if reset:
            await reset_tables(warehouse)
            await _purge_queues(amqp_url)
            echo("emptied the service's tables and queues")
        try:
            await warehouse.put_stock(levels)
        except StockBelowReservedError as error:
            msg = (
                f"the database already holds reservations that this data's stock plan would "
                f"undercut ({error}); run the demo with --reset (make demo RESET=1) to start "
                "empty, or point FULFILMENT_DATABASE_URL at another database"
            )
            raise DemoError(msg) from error
    echo(f"loaded {len(levels)} planned stock levels")

    # A port of its own: whatever else answers on FULFILMENT_HTTP_PORT is not this worker.
    port = _free_port()
    log_path = Path(tempfile.gettempdir()) / f"fulfilment-demo-worker-{port}.log"
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "fulfilment",
            stdout=log,
            stderr=log,
            env={**os.environ, "FULFILMENT_HTTP_PORT": str(port)},
        )
        echo(f"worker started (pid {process.pid}, port {port}, log {log_path})")
        try:
            await _wait_ready(port, process, log_path)
            async with connect(amqp_url) as connection:
                published = await publish_orders(connection, read.orders)
                echo(f"published {published} events (skipped: {read.skipped.describe()})")
                await _wait_drained(connection, echo)
            echo("this run's outcomes: " + await asyncio.to_thread(_run_outcomes, port))
        finally:
            code = await _stop(process, stop_grace_seconds)
    echo(f"worker stopped with exit code {code}")

    reconciliation = await reconcile(options, [order.event_id for order in read.orders])
    echo(reconciliation.describe())
    document = await collect_report(options)
    echo(render_report(document))
    echo(f"wall time {time.monotonic() - started:.1f} s")
    return 0 if reconciliation.ok and code == 0 and document["invariants"]["ok"] else 1


async def _purge_queues(amqp_url: str) -> None:
    async with connect(amqp_url) as connection:
        channel = await connection.channel()
        for name in (MAIN_QUEUE, DEAD_LETTER_QUEUE):
            with contextlib.suppress(Exception):
                queue = await channel.get_queue(name, ensure=True)
                await queue.purge()
        if not channel.is_closed:
            await channel.close()


async def _wait_ready(port: int, process: asyncio.subprocess.Process, log: Path) -> None:
    url = f"http://127.0.0.1:{port}/health/ready"
    deadline = time.monotonic() + READY_WAIT_SECONDS
    while time.monotonic() < deadline:
        if process.returncode is not None:
            text = await asyncio.to_thread(log.read_text, errors="replace")
            msg = f"the worker exited with code {process.returncode}: {_first_error(text)}"
            raise DemoError(msg)
        if await asyncio.to_thread(_http_ok, url):
            return
        await asyncio.sleep(0.5)
    msg = f"the worker was not ready at {url} within {READY_WAIT_SECONDS:g} s (log: {log})"
    raise DemoError(msg)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - a fixed http URL on loopback
            return 200 <= int(response.status) < 300  # noqa: PLR2004 - the 2xx range
    except (urllib.error.URLError, OSError):
        return False


async def _wait_drained(connection: AbstractConnection, echo: Echo) -> None:
    last_depth, last_change, last_echo = -1, time.monotonic(), 0.0
    quiet = 0
    while quiet < DRAIN_EMPTY_LOOKS:
        state = await queue_state(connection, MAIN_QUEUE)
        depth = state.ready if state else 0
        now = time.monotonic()
        if depth != last_depth:
            last_depth, last_change = depth, now
        if now - last_change > DRAIN_STALL_SECONDS:
            msg = f"the queue stayed at {depth} messages for {DRAIN_STALL_SECONDS:g} s"
            raise DemoError(msg)
        if now - last_echo > 5:  # noqa: PLR2004 - a progress line every 5 s
            echo(f"waiting for the queue to drain: {depth} ready")
            last_echo = now
        quiet = quiet + 1 if depth == 0 else 0
        await asyncio.sleep(DRAIN_POLL_SECONDS)


async def _stop(process: asyncio.subprocess.Process, grace_seconds: float) -> int:
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(grace_seconds):
                await process.wait()
        except TimeoutError:
            process.kill()
            await process.wait()
    return process.returncode if process.returncode is not None else -1


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _first_error(log: str) -> str:
    """The first error-level line's reason in a JSON log, else its last line."""
    lines = log.strip().splitlines()
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("level") == "error":
            return str(entry.get("reason") or entry.get("event"))
    return lines[-1] if lines else "(no output)"


def _run_outcomes(port: int) -> str:
    """``fulfilment_events_total`` of the demo's worker, read from its ``/metrics``."""
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    counts: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "fulfilment_events":
            continue
        for sample in family.samples:
            if sample.name == "fulfilment_events_total" and sample.value:
                outcome, reason = sample.labels["outcome"], sample.labels["reason"]
                label = f"{outcome}:{reason}" if reason else outcome
                counts[label] = counts.get(label, 0) + int(sample.value)
    return ", ".join(f"{label} {count}" for label, count in sorted(counts.items())) or "none"
