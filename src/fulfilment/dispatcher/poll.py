"""The poll of fulfilment orders with no news: which to ask about, and what the answer changes.

Webhooks arrive at least once and sometimes never, so the dispatcher also asks the warehouse
(``GET {base}/fulfilment-orders/{id}``) about every accepted fulfilment order whose order still
holds units and has had no news for ``FULFILMENT_WAREHOUSE_RECONCILE_AFTER_SECONDS``, then again
at that interval while it holds units (``domain.polls``). The dispatcher's loop
(``dispatcher.service``) sends the polls through the gates of its sends (the rate cap, the
``Retry-After`` gate, the circuit, the credentials) with the slots the sends left; a
:class:`Poller` is the rest: it finds the due orders (``FulfilmentOrderPolls``), applies what
an answer lists through ``Stock.apply`` exactly as the intake applies a webhook (a shipment or
cancellation applied before is a ``duplicate`` and changes nothing), counts and logs it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import structlog

from fulfilment.application.ports import FulfilmentOrderPolls, Stock
from fulfilment.domain.handoff import CredentialsRefused, RateLimited
from fulfilment.domain.polls import FulfilmentOrderToPoll, PollAnswer, Polled, WarehouseChange
from fulfilment.domain.warehouse_events import RecordShipment
from fulfilment.observability.dispatcher_metrics import POLL_OUTCOMES, DispatcherMetrics
from fulfilment.observability.warehouse_event_metrics import WarehouseEventOutcome

logger = structlog.get_logger("fulfilment.dispatcher")

POLLS_IN_FLIGHT_MAX = 2
"""Most polls in flight at once (fewer with a concurrency cap under 4: half of it, at least
one), so that a send that becomes due finds a slot, and at most this many polls ahead of it
at the rate cap."""

CHECK_SECONDS_MAX = 60.0
"""Longest wait between two looks for due polls while none was due: an order is asked about
at most this long after its interval ended."""


@dataclass(frozen=True, slots=True)
class PollOptions:
    """The poll's interval, built by the dispatcher's root from the settings.

    Attributes:
        reconcile_after_seconds: how long an accepted fulfilment order holding units may go
            without news before it is asked about, and the interval between two polls of it
            (``FULFILMENT_WAREHOUSE_RECONCILE_AFTER_SECONDS``).
        concurrency: the dispatcher's concurrency cap; polls take at most half of it.
    """

    reconcile_after_seconds: float
    concurrency: int

    @property
    def in_flight_max(self) -> int:
        """Most polls in flight: half the concurrency cap, at least 1, at most 2."""
        return max(1, min(POLLS_IN_FLIGHT_MAX, self.concurrency // 2))

    @property
    def check_seconds(self) -> float:
        """Seconds between two looks for due polls when the last one found fewer than asked.

        A tenth of the interval, at most :data:`CHECK_SECONDS_MAX`: an order is asked about
        within 10 % (or a minute) of its time, and the look, a read of the reserved orders,
        runs at most once a minute at the default hour.
        """
        return min(CHECK_SECONDS_MAX, self.reconcile_after_seconds / 10)


class Poller:
    """The dispatcher's polls but their sending: due orders, answers applied, counted, logged.

    Args:
        polls: the store of the fulfilment orders to ask about (``FulfilmentOrderPolls``).
        stock: the stock store the answers' shipments and cancellations are applied to (a
            ``PostgresStock``, as the intake's).
        options: the interval.
        metrics: the dispatcher's collectors.
    """

    def __init__(
        self,
        polls: FulfilmentOrderPolls,
        stock: Stock,
        options: PollOptions,
        metrics: DispatcherMetrics,
    ) -> None:
        self._polls = polls
        self._stock = stock
        self.options = options
        self._metrics = metrics

    async def due(
        self, limit: int, *, excluding: Collection[int] = ()
    ) -> list[FulfilmentOrderToPoll]:
        """Up to ``limit`` fulfilment orders due to be asked about, but those of ``excluding``.

        Raises:
            TransientError: the store failed.
        """
        return await self._polls.due_polls(
            limit, after_seconds=self.options.reconcile_after_seconds, excluding=excluding
        )

    async def read_without_news(self) -> None:
        """Set ``fulfilment_warehouse_orders_without_news`` from the store.

        Raises:
            TransientError: the store failed.
        """
        count = await self._polls.orders_without_news(self.options.reconcile_after_seconds)
        self._metrics.orders_without_news.set(count)

    async def postpone(self, order: FulfilmentOrderToPoll) -> None:
        """Ask about ``order`` again an interval from now, whatever came of this poll.

        Raises:
            TransientError: the store failed.
        """
        await self._polls.record_polls([order.request_id])

    async def settle(self, order: FulfilmentOrderToPoll, answer: PollAnswer) -> None:
        """Apply, count and log the warehouse's ``answer`` about ``order``.

        What a 200 lists is applied one change at a time, in the order it happened, each by
        ``Stock.apply`` (a duplicate changes nothing), and counted in
        ``fulfilment_warehouse_events_total{source="poll"}`` and the discrepancies. Then the
        order's ``polled_at`` is set, so it is asked again an interval later, whatever the
        answer (a 404, a 5xx or a timeout too), but a 429 or refused credentials: those
        leave it due as soon as the dispatcher sends again. A log line ``dispatcher.poll``
        says what came and what it changed.

        Raises:
            TransientError: the stock store or the polls' store failed; what was applied
                stays applied, and the order is due again (a poll of it applies the rest, the
                applied ones being duplicates).
        """
        self._metrics.record_poll(answer)
        applied: dict[str, int] = {}
        discrepancies: list[str] = []
        if isinstance(answer, Polled):
            for change in answer.changes:
                outcome = await _apply(self._stock, change)
                self._metrics.warehouse_events.count(outcome)
                label = str(outcome.kind)
                applied[label] = applied.get(label, 0) + 1
                discrepancies.extend(str(found.kind) for found in outcome.discrepancies)
        if not isinstance(answer, RateLimited | CredentialsRefused):
            await self._polls.record_polls([order.request_id])
        _log_poll(order, answer, applied, discrepancies)


async def _apply(stock: Stock, change: WarehouseChange) -> WarehouseEventOutcome:
    """``stock.apply(change)``, one command type at a time (``apply`` is generic in it)."""
    if isinstance(change, RecordShipment):
        return await stock.apply(change)
    return await stock.apply(change)


def _log_poll(
    order: FulfilmentOrderToPoll,
    answer: PollAnswer,
    applied: dict[str, int],
    discrepancies: list[str],
) -> None:
    fields: dict[str, object] = {
        "order_id": str(order.order_id),
        "warehouse_id": order.warehouse_id,
        "outcome": POLL_OUTCOMES[type(answer)],
        "status_code": answer.status_code,
    }
    if isinstance(answer, Polled):
        logger.info(
            "dispatcher.poll",
            status=answer.status,
            changes=len(answer.changes),
            applied=applied,
            discrepancies=discrepancies,
            **fields,
        )
    else:
        logger.warning("dispatcher.poll", answer=answer.answer, **fields)
