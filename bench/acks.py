"""The broker's CPU per 1,000 deliveries of a quorum queue, acknowledged one by one or together.

Publishes N persistent messages to a quorum queue of its own (``bench.acks``, deleted at the
end), consumes them with a prefetch of 96, and acknowledges either each delivery with its own
``basic.ack`` (``each``) or every 16 deliveries with one ``basic.ack`` with ``multiple``
(``multiple``), as the worker's ``ChannelAcks`` does for the deliveries of one committed
batch. Prints the
CPU seconds of the broker (``beam.smp``, the whole broker: keep the machine otherwise quiet)
per 1,000 deliveries from the first delivery to the last ack, for each mode in turn.

Run: ``uv run python bench/acks.py [--messages N] [--rounds R] [--amqp-url URL]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import aio_pika
import psutil
from aio_pika.abc import AbstractIncomingMessage
from measure import BROKER_PROCESS

QUEUE = "bench.acks"
PREFETCH = 96
TOGETHER = 16
"""Deliveries one ``basic.ack`` with ``multiple`` acknowledges in ``multiple`` mode."""


def broker_cpu_seconds() -> float:
    """User + system CPU seconds of the broker's ``beam.smp`` so far."""
    for process in psutil.process_iter(["name"]):
        if process.info["name"] == BROKER_PROCESS:
            times = process.cpu_times()
            return float(times.user + times.system)
    msg = f"no {BROKER_PROCESS} process on this machine"
    raise SystemExit(msg)


async def drain(amqp_url: str, messages: int, mode: str) -> float:
    """Fill the queue, drain it acknowledging by ``mode``; the broker's CPU s per 1,000."""
    connection = await aio_pika.connect(amqp_url)
    try:
        setup = await connection.channel(publisher_confirms=True)
        queue = await setup.declare_queue(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
        await queue.purge()
        body = b"x" * 300
        for start in range(0, messages, 500):
            await asyncio.gather(
                *(
                    setup.default_exchange.publish(aio_pika.Message(body), routing_key=QUEUE)
                    for _ in range(min(500, messages - start))
                )
            )
        consuming = await connection.channel()
        await consuming.set_qos(prefetch_count=PREFETCH)
        done = asyncio.Event()
        received = 0
        pending: list[AbstractIncomingMessage] = []

        async def on_message(message: AbstractIncomingMessage) -> None:
            nonlocal received
            received += 1
            if mode == "each":
                await message.ack()
            else:
                pending.append(message)
                if len(pending) >= TOGETHER or received == messages:
                    last = pending[-1]
                    pending.clear()
                    await last.ack(multiple=True)
            if received == messages:
                done.set()

        before = broker_cpu_seconds()
        consumed = await consuming.get_queue(QUEUE)
        tag = await consumed.consume(on_message)
        await asyncio.wait_for(done.wait(), timeout=600)
        await asyncio.sleep(0.5)  # the broker applies the last settlements
        spent = broker_cpu_seconds() - before
        await consumed.cancel(tag)
        await queue.delete(if_unused=False, if_empty=False)
        return spent / messages * 1000
    finally:
        await connection.close()


async def main() -> None:
    """Parse the command line; drain in each mode in turn, ``--rounds`` times."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--amqp-url", default="amqp://guest:guest@127.0.0.1:5672/")
    args = parser.parse_args()
    figures: dict[str, list[float]] = {"each": [], "multiple": []}
    started = time.perf_counter()
    for _ in range(args.rounds):
        for mode, values in figures.items():
            values.append(await drain(args.amqp_url, args.messages, mode))
            print(f"{mode:8s} {values[-1]:.4f} broker CPU s per 1,000 deliveries")
    for mode, values in figures.items():
        print(f"median {mode:8s} {statistics.median(values):.4f} (of {len(values)})")
    print(f"{time.perf_counter() - started:.0f} s in all")


if __name__ == "__main__":
    asyncio.run(main())
