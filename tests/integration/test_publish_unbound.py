"""``fulfilment publish`` before the worker has bound its queue: one line, exit 1, promptly.

The first publish the broker returns stops the run while up to ``PUBLISH_CONCURRENCY`` others
are in flight; the broker returns them too. Cancelling them once left aiormq's channel reader
failing on their returns and waiting 10 s to close, with a stack of unretrieved task errors on
stderr, in about one run of six: hence the repeated runs.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fulfilment.adapters.rabbitmq.connection import connect
from fulfilment.adapters.rabbitmq.publishing import OutgoingEvent, UnroutableError, publish_events
from fulfilment.contracts.topology import ORDER_PLACED_ROUTING_KEY, ORDERS_EXCHANGE

pytestmark = pytest.mark.rabbitmq

FULFILMENT = str(Path(sys.executable).with_name("fulfilment"))
SAMPLE = Path(__file__).parents[2] / "data" / "sample" / "online-retail"
UNBOUND_LINE = (
    f"fulfilment: exchange {ORDERS_EXCHANGE!r} has no queue bound for"
    f" {ORDER_PLACED_ROUTING_KEY!r}: start the worker first, it declares its queue\n"
)


def test_publishing_with_no_queue_bound_ends_at_once_with_one_line(private_vhost_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FULFILMENT_")}
    env["FULFILMENT_AMQP_URL"] = private_vhost_url

    for _ in range(4):
        started = time.monotonic()
        result = subprocess.run(
            [FULFILMENT, "publish", str(SAMPLE)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

        assert (result.returncode, result.stderr) == (1, UNBOUND_LINE)
        assert time.monotonic() - started < 8.0


async def test_a_returned_publish_stops_the_run_without_waiting_on_the_channel(
    private_vhost_url: str,
) -> None:
    events = [OutgoingEvent(b"{}", f"event-{number}") for number in range(500)]

    async with connect(private_vhost_url) as connection:
        for _ in range(25):
            started = time.monotonic()
            with pytest.raises(UnroutableError):
                async with asyncio.timeout(5.0):
                    await publish_events(
                        connection,
                        events,
                        exchange=ORDERS_EXCHANGE,
                        routing_key=ORDER_PLACED_ROUTING_KEY,
                    )
            assert time.monotonic() - started < 2.0
