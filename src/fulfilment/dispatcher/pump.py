"""One active dispatcher per database: a pump (``pump.leader``) whose turn runs a ``Dispatcher``.

The rate cap and the ``Retry-After`` gate are the warehouse account's, not a replica's: two
dispatchers sending at once would each hold the cap and together exceed it. So, as the relay
does, replicas take turns on a PostgreSQL session advisory lock
(``adapters.postgres.advisory_lock.DISPATCHER_LOCK_KEY``): the holder claims and sends, the
others stand by and try the lock every ``poll_seconds``, reading the backlog for their gauges.
The claim itself is still ``FOR UPDATE SKIP LOCKED`` with a lease, so that a holder that dies
mid-send leaves its rows to the next one. The work goes through the store's own pool, not the
lock's session, so that session is pinged every ``poll_seconds``; its loss stops the active
loop (its requests in flight are recorded first) and the dispatcher connects again.
"""

from __future__ import annotations

import asyncio
from typing import ClassVar

import asyncpg
import structlog

from fulfilment.adapters.warehouse.client import WarehouseClient
from fulfilment.application.ports import TransientError, WarehouseRequests
from fulfilment.dispatcher.drift import DriftCheck
from fulfilment.dispatcher.poll import Poller
from fulfilment.dispatcher.service import Dispatcher, DispatcherOptions, Halt, read_backlog
from fulfilment.observability.dispatcher_metrics import DispatcherMetrics
from fulfilment.pump.leader import LockOptions, Pump, PumpEvents, Role

logger = structlog.get_logger("fulfilment.dispatcher")


class DispatcherPump(Pump):
    """One dispatcher process: :meth:`run` until :meth:`stop`.

    Args:
        lock: its session's URL and bounds, and ``DISPATCHER_LOCK_KEY``.
        requests: the store (``WarehouseRequests``).
        client: the warehouse system's client.
        options: the caps and intervals of each turn's :class:`Dispatcher`.
        metrics: the process's collectors.
        poller: the polls of fulfilment orders with no news; None: no polls.
        drift: the scheduled drift check, run by the active replica only; None: no check.
    """

    name: ClassVar[str] = "dispatcher"
    events: ClassVar[PumpEvents] = PumpEvents(
        starting="dispatcher.starting",
        standing_by="dispatcher.standing_by",
        active="dispatcher.active",
        connection_lost="dispatcher.connection_lost",
        reconnecting="dispatcher.reconnecting",
        stopped="dispatcher.stopped",
    )

    def __init__(  # noqa: PLR0913 - the root passes each collaborator by name
        self,
        lock: LockOptions,
        requests: WarehouseRequests,
        client: WarehouseClient,
        options: DispatcherOptions,
        metrics: DispatcherMetrics,
        *,
        poller: Poller | None = None,
        drift: DriftCheck | None = None,
    ) -> None:
        super().__init__(lock, metrics.active)
        self._requests = requests
        self._client = client
        self._options = options
        self._metrics = metrics
        self._poller = poller
        self._drift = drift
        self.dispatcher: Dispatcher | None = None
        """The loop running while this replica holds the lock, else None."""

    def readiness(self) -> dict[str, bool | str]:
        """``{"database": connected, "role": "active"|"standby"|"connecting", "halt": ...}``."""
        active = self.dispatcher is not None and self.role is Role.ACTIVE
        halt = self.dispatcher.halt if self.dispatcher is not None and active else Halt.NONE
        return {
            "database": self.role is not Role.CONNECTING,
            "role": str(self.role),
            "halt": str(halt),
        }

    def ready(self) -> bool:
        """Connected, sending or standing by, and the warehouse accepts the credentials.

        With a token refused it is not ready (``"halt": "credentials_refused"``), so the pod
        shows what an operator must fix. A warehouse that is down (the circuit open) leaves
        it ready: it is doing its job, probing.
        """
        checks = self.readiness()
        return bool(checks["database"]) and checks["halt"] != Halt.CREDENTIALS_REFUSED

    async def stand_by(self, session: asyncpg.Connection) -> None:
        """Read the backlog for its gauges; a store that fails is logged, not fatal."""
        del session  # the store has its own pool
        try:
            await read_backlog(self._requests, self._metrics, self._poller)
        except TransientError as error:
            logger.warning("dispatcher.store_failed", error=str(error))

    async def work(self, session: asyncpg.Connection, lost: asyncio.Event) -> None:
        """Run a new :class:`Dispatcher` until ``lost`` or stopped; then let it finish.

        A new loop per turn on the lock: its gates start open, as another replica's did.
        """
        del session  # pinged by the pump; the store has its own pool
        dispatcher = Dispatcher(
            self._requests,
            self._client,
            self._options,
            self._metrics,
            poller=self._poller,
            drift=self._drift,
        )
        self.dispatcher = dispatcher
        running = asyncio.create_task(dispatcher.run())
        ending = [asyncio.create_task(lost.wait()), asyncio.create_task(self.stopping.wait())]
        try:
            await asyncio.wait([running, *ending], return_when=asyncio.FIRST_COMPLETED)
        finally:
            dispatcher.stop()
            for task in ending:
                task.cancel()
            await running
            self.dispatcher = None
