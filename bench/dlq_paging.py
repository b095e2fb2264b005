"""Wall time and peak memory of ``fulfilment dlq list`` on deep dead-letter queues.

For each size (10,000 and 100,000 by default): a virtual host of its own on the RabbitMQ of
``FULFILMENT_TEST_AMQP_URL`` (the local one by default; created with ``rabbitmqctl`` and
deleted at the end), the worker's topology declared in it, the order-placed DLQ filled with
that many dead letters as the worker writes them (headers with a stack, an ``OrderPlaced`` body
of five lines: about 2 KiB each), then ``fulfilment dlq list`` run as a child process. Prints
its wall time, its peak RSS (``wait4``'s ``ru_maxrss``), the dead letters it counted, and the
DLQ's depth afterwards (the walk puts every message back).

Run: ``uv run python bench/dlq_paging.py [size ...]`` (defaults 10000 100000).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import aio_pika

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fulfilment.contracts import dead_letter as h
from fulfilment.contracts.order_placed import order_placed_body
from fulfilment.contracts.topology import (
    DEAD_LETTER_EXCHANGE,
    ORDER_PLACED,
    ORDER_PLACED_DEAD_LETTER_QUEUE,
)
from fulfilment.worker.topology import Topology, declare_topology
from tests.support.services import AMQP_URL

FULFILMENT = str(Path(sys.executable).with_name("fulfilment"))
PUBLISH_AT_ONCE = 500
STACK = "\n".join(f'  File "fulfilment/worker/delivery.py", line {n}, in handle' for n in range(20))


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)


@contextlib.contextmanager
def own_vhost(amqp_url: str) -> Iterator[str]:
    """A virtual host for one run, deleted at the end; yields its URL."""
    if shutil.which("rabbitmqctl") is None:
        msg = "bench: rabbitmqctl is needed to create the benchmark's own virtual host"
        raise SystemExit(msg)
    vhost = f"fulfilment-bench-dlq-{uuid.uuid4().hex[:10]}"
    user = urllib.parse.urlsplit(amqp_url).username or "guest"
    _rabbitmqctl("add_vhost", vhost)
    try:
        _rabbitmqctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
        yield amqp_url.rstrip("/") + "/" + urllib.parse.quote(vhost, safe="")
    finally:
        _rabbitmqctl("delete_vhost", vhost)


async def fill(amqp_url: str, size: int) -> int:
    """Publish ``size`` dead letters to the order-placed DLQ; returns its depth after."""
    await declare_topology(amqp_url, Topology(delivery_limit=5))
    connection = await aio_pika.connect(amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(DEAD_LETTER_EXCHANGE)
        moment = datetime.now(UTC)
        skus = [("85123A", 6), ("71053", 6), ("84406B", 8), ("84029G", 6), ("84029E", 6)]

        def letter(index: int) -> aio_pika.Message:
            event_id = uuid.uuid4()
            return aio_pika.Message(
                order_placed_body(
                    event_id=event_id, order_id=uuid.uuid4(), placed_at=moment, lines=skus
                ),
                message_id=str(event_id),
                content_type="application/json",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                headers={
                    h.FAILURE_CLASS: "permanent" if index % 3 else "unexpected",
                    h.EXCEPTION_TYPE: "MalformedEventError" if index % 3 else "KeyError",
                    h.REASON: "MalformedEventError: lines.0.quantity: Input should be > 0",
                    h.STACK: STACK,
                    h.DEAD_LETTERED_AT: moment.isoformat(),
                    h.ORIGINAL_QUEUE: ORDER_PLACED.name,
                },
            )

        for start in range(0, size, PUBLISH_AT_ONCE):
            count = min(PUBLISH_AT_ONCE, size - start)
            await asyncio.gather(
                *(
                    exchange.publish(
                        letter(start + i), routing_key=ORDER_PLACED.dead_letter_routing_key
                    )
                    for i in range(count)
                )
            )
        return await depth(connection)
    finally:
        await connection.close()


async def depth(connection: aio_pika.abc.AbstractConnection) -> int:
    """Ready messages of the order-placed DLQ."""
    channel = await connection.channel()
    try:
        queue = await channel.declare_queue(ORDER_PLACED_DEAD_LETTER_QUEUE, passive=True)
        return int(queue.declaration_result.message_count or 0)
    finally:
        await channel.close()


async def depth_of(amqp_url: str) -> int:
    """:func:`depth` on a connection of its own."""
    connection = await aio_pika.connect(amqp_url)
    try:
        return await depth(connection)
    finally:
        await connection.close()


def run_list(amqp_url: str) -> tuple[float, float, int, str]:
    """``fulfilment dlq list --json`` in a child: (seconds, peak RSS in MiB, counted, stderr)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "FULFILMENT_AMQP_URL": amqp_url}
    started = time.perf_counter()
    child = subprocess.Popen(
        [FULFILMENT, "dlq", "list", "--queue", ORDER_PLACED_DEAD_LETTER_QUEUE, "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = child.communicate()
    # communicate() reaped the child; its rusage is in RUSAGE_CHILDREN only as a maximum over
    # all children, so each size runs in a fresh interpreter of this script (main below).
    seconds = time.perf_counter() - started
    counted = sum(group["count"] for group in json.loads(stdout)) if child.returncode == 0 else -1
    peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return seconds, peak_mib, counted, stderr.strip()


def measure(size: int) -> None:
    """One size, in this process: fill, list, print one line."""
    with own_vhost(AMQP_URL) as amqp_url:
        started = time.perf_counter()
        filled = asyncio.run(fill(amqp_url, size))
        fill_seconds = time.perf_counter() - started
        seconds, peak_mib, counted, stderr = run_list(amqp_url)
        after = asyncio.run(depth_of(amqp_url))
    print(
        f"{size:>7} dead letters (filled in {fill_seconds:5.1f} s, depth {filled}): "
        f"dlq list {seconds:6.1f} s, peak RSS {peak_mib:6.1f} MiB, counted {counted}, "
        f"depth after {after}" + (f"  [{stderr}]" if stderr else ""),
        flush=True,
    )


def main() -> None:
    """Each size of the command line, or 10,000 and 100,000."""
    sizes = [int(arg) for arg in sys.argv[1:]] or [10_000, 100_000]
    if len(sizes) == 1:
        measure(sizes[0])
        return
    for size in sizes:  # a fresh process per size: ru_maxrss of children is a running maximum
        subprocess.run([sys.executable, __file__, str(size)], check=True)


if __name__ == "__main__":
    main()
