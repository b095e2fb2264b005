"""The drift check on a schedule: the service's stock beside the warehouse's, for the gauges.

``fulfilment stock drift`` compares once, when an operator asks; the active dispatcher runs the
same comparison (``adapters.warehouse.drift.read_drift``) every
``FULFILMENT_WAREHOUSE_DRIFT_INTERVAL_SECONDS``, so that a drift that persists raises an alert
(``FulfilmentStockDrift``) instead of waiting for someone to look. The dispatcher, not another
process, because it already holds what the read needs and must not share: the warehouse's
client and credentials, and the account's rate cap. Its requests go through the dispatcher's
gates (``Dispatcher.inventory_gate``): after the requests and the polls, within the rate cap,
never while the warehouse is down or refuses the token. Only the holder of the dispatcher's
advisory lock runs it; a standby exports no drift figures, which would be stale.

A check that fails (the warehouse does not answer or refuses, the database fails) is counted
and logged, and the next one runs an interval later; the figures of the last completed check
stay until then, with their time (``fulfilment_stock_drift_checked_timestamp_seconds``), which
``FulfilmentStockDriftUnchecked`` watches.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager

import structlog
from sqlalchemy.exc import DBAPIError

from fulfilment.adapters.warehouse.drift import DriftReport, DriftState
from fulfilment.adapters.warehouse.inventory import InventoryReadError
from fulfilment.observability.dispatcher_metrics import DispatcherMetrics

logger = structlog.get_logger("fulfilment.dispatcher")

SKUS_LOGGED = 10
"""Unexplained SKUs named in the log line of a check (the gauges count them all)."""

ReadDrift = Callable[[AbstractAsyncContextManager[object]], Awaitable[DriftReport]]
"""Reads and compares both sides, each warehouse request within the gate it is given
(``read_drift`` with its engine, client and timeout bound)."""


class WarehouseHaltedError(Exception):
    """The dispatcher only probes (the warehouse is down or refuses the token): not sent."""


class DriftCheck:
    """The scheduled drift check: :meth:`run` while the dispatcher is active.

    Args:
        read: the comparison (:data:`ReadDrift`).
        interval_seconds: seconds from the end of a check to the start of the next (> 0).
        metrics: the dispatcher's collectors (the drift gauges).
        clock: Unix seconds, for the time of a completed check (``time.time``).
    """

    def __init__(
        self,
        read: ReadDrift,
        interval_seconds: float,
        metrics: DispatcherMetrics,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._read = read
        self.interval_seconds = interval_seconds
        self._metrics = metrics
        self._clock = clock

    async def run(self, gate: AbstractAsyncContextManager[object]) -> None:
        """Check an interval after starting, then an interval after each check, until cancelled.

        The interval is ``interval_seconds``. Not at once: a dispatcher restarted by every
        rollout (or a leader that changes) would otherwise read the warehouse's whole inventory
        each time, in the first seconds, which the requests due since it stopped wait for too.

        Cancelled (the dispatcher stops or loses the lock), it removes the drift gauges.
        """
        try:
            while True:
                await asyncio.sleep(self.interval_seconds)
                await self.check(gate)
        finally:
            self._metrics.forget_drift()

    async def check(self, gate: AbstractAsyncContextManager[object]) -> DriftReport | None:
        """One comparison, exported and logged; None when it failed (counted and logged).

        A failure of the warehouse, of the gates or of the database is logged as a warning
        line ``dispatcher.drift_check_failed``; any other error with its traceback (a bug must
        not stop the dispatcher either).
        """
        try:
            report = await self._read(gate)
        except (InventoryReadError, WarehouseHaltedError, DBAPIError, OSError) as error:
            self._metrics.drift_checks["failed"].inc()
            logger.warning("dispatcher.drift_check_failed", error=str(error))
            return None
        except Exception:
            self._metrics.drift_checks["failed"].inc()
            logger.exception("dispatcher.drift_check_failed")
            return None
        skus: dict[str, int] = {}
        units: dict[str, int] = {}
        for sku in report.differing:
            skus[sku.state] = skus.get(sku.state, 0) + 1
            units[sku.state] = units.get(sku.state, 0) + abs(sku.difference)
        self._metrics.set_drift(skus, units, self._clock())
        unexplained = [sku.sku for sku in report.differing if sku.state is DriftState.UNEXPLAINED]
        log = logger.warning if unexplained else logger.info
        log(
            "dispatcher.drift",
            compared=len(report.skus),
            in_flight=report.count(DriftState.IN_FLIGHT),
            unexplained=len(unexplained),
            unexplained_skus=unexplained[:SKUS_LOGGED],
            as_of=report.as_of.isoformat(),
        )
        return report
