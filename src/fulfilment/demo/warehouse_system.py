"""The demo's warehouse system: the simulator and ``fulfilment dispatcher``, while they run.

:func:`warehouse_system` starts both (the simulator from the checkout's ``simulator/``), and
yields a :class:`Handoff`, through which the player waits until no warehouse request is open
and checks, day by day, what the warehouse received (``demo.handoff.check_day``); it stops
both whatever happens, and says what the warehouse received in all.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from uuid import UUID

from fulfilment.adapters.postgres.warehouse_requests import PostgresWarehouseRequests
from fulfilment.contracts.result_events import STOCK_RESERVED_ROUTING_KEY
from fulfilment.demo.children import Child, start_child, stop, wait_ready
from fulfilment.demo.errors import DemoError
from fulfilment.demo.handoff import (
    CONCURRENCY,
    PICK_DELAY_SECONDS,
    RATE_PER_SECOND,
    SIMULATOR_TOKEN,
    HandoffCounts,
    HandoffMismatchError,
    WarehouseOrders,
    check_day,
    read_warehouse,
)
from fulfilment.domain.handoff import RequestStatus

if TYPE_CHECKING:
    from fulfilment.adapters.postgres.admin import OutboxEntry
    from fulfilment.adapters.postgres.stock import PostgresStock
    from fulfilment.dataset.retail_lifecycle import RetailDay
    from fulfilment.domain.lifecycle import OrderStatus
    from fulfilment.tools.command import Echo

DISPATCHER_COMMAND = ("-c", "from fulfilment.entrypoints.dispatcher import main; main()")
"""``fulfilment dispatcher`` run by this interpreter: what the console script calls, found
without looking for the script on the ``PATH`` (the demo may not import the dispatcher's root)."""
SIMULATOR_PATH = Path(__file__).resolve().parents[3] / "simulator"
"""The checkout's ``simulator/`` folder, which holds ``warehouse_simulator`` (a test and demo
tool, in neither the wheel nor the image)."""

HANDOFF_POLL_SECONDS = 0.05
"""Interval between two counts of the open warehouse requests while the day's hand-off settles:
the dispatcher answers a request in milliseconds at the demo's caps."""

HANDOFF_STALL_SECONDS = 60.0
"""The demo fails if the dispatcher gets none of the open warehouse requests answered for this
long."""


class Handoff:
    """The demo's warehouse system (the simulator) and ``fulfilment dispatcher``, while they run.

    Counts what the warehouse received, day by day, and checks it
    (:func:`fulfilment.demo.handoff.check_day`).
    """

    def __init__(self, simulator: Child, dispatcher: Child) -> None:
        self.simulator = simulator
        self.dispatcher = dispatcher
        self.dispatcher_code: int | None = None
        self.total = HandoffCounts()
        self._cancellations_seen = 0

    @property
    def env(self) -> dict[str, str]:
        """The settings of the hand-off, for the worker (and the dispatcher)."""
        return _handoff_env(self.simulator)

    async def settle(self, day: RetailDay, stock: PostgresStock) -> None:
        """Wait until no warehouse request is open (``pending`` or ``sending``).

        Raises:
            DemoError: the dispatcher or the simulator exited, or no open request was
                answered for :data:`HANDOFF_STALL_SECONDS`.
        """
        requests = PostgresWarehouseRequests(stock.engine, retry_budget_seconds=10.0)
        last, changed = -1, time.monotonic()
        while (left := (await requests.backlog()).open_count) > 0:
            for child in (self.dispatcher, self.simulator):
                if child.process.returncode is not None:
                    msg = (
                        f"{day.name}: the {child.name} exited with code"
                        f" {child.process.returncode} with {left} warehouse requests open"
                        f" (log: {child.log})"
                    )
                    raise DemoError(msg)
            now = time.monotonic()
            if left != last:
                last, changed = left, now
            if now - changed > HANDOFF_STALL_SECONDS:
                msg = (
                    f"{day.name}: the dispatcher got none of the {left} open warehouse requests"
                    f" answered for {HANDOFF_STALL_SECONDS:g} s (log: {self.dispatcher.log})"
                )
                raise DemoError(msg)
            await asyncio.sleep(HANDOFF_POLL_SECONDS)

    async def check(
        self,
        day: RetailDay,
        stock: PostgresStock,
        statuses: Mapping[UUID, OrderStatus],
        entries: Sequence[OutboxEntry],
    ) -> str:
        """Check what the warehouse received for ``day``; the day's warehouse line.

        ``entries`` are the outbox rows the day wrote, ``statuses`` its orders' after the
        shipments.

        Raises:
            DemoError: it does not match the day's reservations (one line).
        """
        requests = PostgresWarehouseRequests(stock.engine, retry_budget_seconds=10.0)
        records = await requests.find(list(RequestStatus), limit=10**9)
        received = await asyncio.to_thread(read_warehouse, self.simulator_admin)
        answered = received.cancellations[self._cancellations_seen :]
        self._cancellations_seen = len(received.cancellations)
        reserved = {
            e.order_id
            for e in entries
            if e.routing_key == STOCK_RESERVED_ROUTING_KEY and e.order_id is not None
        }
        try:
            counts = check_day(
                reserved,
                requests=records,
                warehouse=received,
                cancellations=answered,
                entries=entries,
                statuses=statuses,
            )
        except HandoffMismatchError as mismatch:
            msg = f"{day.name}: warehouse hand-off: {mismatch}"
            raise DemoError(msg) from mismatch
        self.total.add(counts)
        return f"{day.name}: warehouse {counts.describe()}"

    @property
    def simulator_admin(self) -> str:
        """The simulator's admin endpoints, ``http://127.0.0.1:N/_simulator``."""
        return f"http://127.0.0.1:{self.simulator.port}/_simulator"

    def summary(self, received: WarehouseOrders) -> str:
        """The run's line: what the warehouse received, checked, and the dispatcher's exit."""
        extra = len(received.orders) - self.total.orders
        return (
            f"warehouse system (simulator, pick delay {PICK_DELAY_SECONDS:g} s): "
            f"{self.total.describe()}"
            + (f" (and {extra} orders of earlier runs' requests)" if extra else "")
            + f"; each checked against the reservations; dispatcher stopped with exit code"
            f" {self.dispatcher_code}"
        )


def _handoff_env(simulator: Child) -> dict[str, str]:
    """The hand-off's settings: the simulator's API, its token, the demo's caps."""
    return {
        "FULFILMENT_WAREHOUSE_URL": f"http://127.0.0.1:{simulator.port}/api/v1",
        "FULFILMENT_WAREHOUSE_TOKEN": SIMULATOR_TOKEN,
        "FULFILMENT_WAREHOUSE_RATE_PER_SECOND": f"{RATE_PER_SECOND:g}",
        "FULFILMENT_WAREHOUSE_CONCURRENCY": str(CONCURRENCY),
    }


@contextlib.asynccontextmanager
async def warehouse_system(stop_grace_seconds: float, echo: Echo) -> AsyncIterator[Handoff]:
    """Start the simulator and ``fulfilment dispatcher``, yield them, stop them, echo the sum.

    Neither is left running, whatever happens (the simulator is stopped last: the dispatcher's
    requests in flight get their answers).

    Raises:
        DemoError: the simulator is not in this checkout, or either did not get ready.
    """
    if not (SIMULATOR_PATH / "warehouse_simulator").is_dir():
        msg = f"the warehouse simulator is not in this checkout ({SIMULATOR_PATH})"
        raise DemoError(msg)
    python_path = os.pathsep.join(
        p for p in (str(SIMULATOR_PATH), os.environ.get("PYTHONPATH", "")) if p
    )
    simulator = await start_child(
        "warehouse-simulator",
        (
            "-m",
            "warehouse_simulator",
            "--token",
            SIMULATOR_TOKEN,
            "--pick-delay-seconds",
            f"{PICK_DELAY_SECONDS:g}",
        ),
        None,
        env={"PYTHONPATH": python_path},
    )
    try:
        await wait_ready(simulator, "/_simulator/stats")
        dispatcher: Child | None = None
        handoff: Handoff | None = None
        try:
            env = _handoff_env(simulator)
            dispatcher = await start_child(
                "dispatcher", DISPATCHER_COMMAND, "FULFILMENT_DISPATCHER_PORT", env=env
            )
            handoff = Handoff(simulator, dispatcher)
            echo(
                f"warehouse system: simulator at {env['FULFILMENT_WAREHOUSE_URL']} (pid"
                f" {simulator.process.pid}, pick delay {PICK_DELAY_SECONDS:g} s, log"
                f" {simulator.log}), dispatcher started"
                f" ({dispatcher.describe()})"
            )
            await wait_ready(dispatcher)
            yield handoff
        finally:
            if dispatcher is not None:
                code = await stop(dispatcher.process, stop_grace_seconds)
                if handoff is not None:
                    handoff.dispatcher_code = code
        received = await asyncio.to_thread(read_warehouse, handoff.simulator_admin)
        echo(handoff.summary(received))
    finally:
        await stop(simulator.process, stop_grace_seconds)
