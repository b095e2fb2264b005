"""The warehouse's events applied, counted the same way by whichever program applied them.

A shipment or a cancellation of the warehouse reaches the service by webhook (the intake) or by
the poll (the dispatcher); each program counts what it applied on its own registry, under the
same names, so that a sum over the programs is every event applied:
``fulfilment_warehouse_events_total{event, source, outcome}`` and
``fulfilment_warehouse_discrepancies_total{kind}``. Labels are bound at 0: ``event`` 2 values,
``outcome`` the command's kinds (4 each), ``kind`` 4; ``source`` is the program's own
(``webhook`` for the intake, ``poll`` for the dispatcher).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from fulfilment.domain.lifecycle import OrderStatus
from fulfilment.domain.polls import WarehouseChange
from fulfilment.domain.warehouse_events import (
    RecordShipment,
    ShipmentKind,
    ShipmentOutcome,
    Source,
    WarehouseCancellationKind,
    WarehouseCancellationOutcome,
)
from fulfilment.domain.warehouse_lifecycle import DiscrepancyKind

WarehouseEventOutcome = ShipmentOutcome | WarehouseCancellationOutcome
"""The outcome of applying a shipment or a cancellation of the warehouse."""

EVENT_OUTCOMES: dict[str, tuple[str, ...]] = {
    "shipment": tuple(str(kind) for kind in ShipmentKind),
    "cancellation": tuple(str(kind) for kind in WarehouseCancellationKind),
}
"""The ``outcome`` values of each ``event``: the kinds of its command's outcome."""

DISCREPANCY_KINDS = tuple(str(kind) for kind in DiscrepancyKind)
"""The ``kind`` of a discrepancy, as ``warehouse_discrepancies.kind`` records it."""


def discrepancy_kinds(change: WarehouseChange, outcome: WarehouseEventOutcome) -> list[str]:
    """The kinds of the discrepancies that applying ``change`` with ``outcome`` kept, a row each.

    As ``fulfilment.domain.warehouse_lifecycle`` keeps them: an order unknown or not reserved
    is a row per SKU the change named (one for a cancellation of the whole order); a shipment
    of a reserved order a row per SKU it could not take in full, ``more_than_held`` when it
    took some of that SKU, else ``sku_not_held``. The outcome does not say whether the order
    once held a SKU it took none of, so a SKU whose held units all shipped or were released
    before counts as ``sku_not_held`` here where its row says ``more_than_held``. An
    ``already_shipped`` shipment, an ``ignored`` cancellation and a ``duplicate`` keep none.
    """
    if outcome.kind in {ShipmentKind.DISCREPANCY, WarehouseCancellationKind.DISCREPANCY}:
        if outcome.status is None:
            return ["unknown_order" for _ in _named(change)]
        if outcome.status is not OrderStatus.RESERVED:
            return ["order_not_reserved" for _ in _named(change)]
    if isinstance(outcome, ShipmentOutcome):
        taken = {line.sku for line in outcome.lines}
        return [
            "more_than_held" if line.sku in taken else "sku_not_held" for line in outcome.unmatched
        ]
    return []


def _named(change: WarehouseChange) -> list[str | None]:
    """The SKUs ``change`` named, merged; ``[None]`` for a cancellation of the whole order."""
    if isinstance(change, RecordShipment):
        return list(change.shipped())
    cancelled = change.cancelled()
    return [None] if cancelled is None else list(cancelled)


class WarehouseEventMetrics:
    """The two counters of the warehouse's events that ``source`` brought, on ``registry``."""

    def __init__(self, registry: CollectorRegistry, source: Source) -> None:
        self.source = source
        events = Counter(
            "fulfilment_warehouse_events",
            "Shipments and cancellations of the warehouse applied, by how they arrived and"
            " how their processing ended (duplicate: applied before, nothing changed).",
            ["event", "source", "outcome"],
            registry=registry,
        )
        self.events = {
            (event, outcome): events.labels(event=event, source=str(source), outcome=outcome)
            for event, outcomes in EVENT_OUTCOMES.items()
            for outcome in outcomes
        }
        discrepancies = Counter(
            "fulfilment_warehouse_discrepancies",
            "What the warehouse reported that the service could not apply, kept as a"
            " discrepancy, by kind.",
            ["kind"],
            registry=registry,
        )
        self.discrepancies = {kind: discrepancies.labels(kind=kind) for kind in DISCREPANCY_KINDS}

    def count(self, change: WarehouseChange, outcome: WarehouseEventOutcome) -> None:
        """Count ``change`` applied by its outcome's kind, and the discrepancies it kept."""
        event = "shipment" if isinstance(outcome, ShipmentOutcome) else "cancellation"
        self.events[event, str(outcome.kind)].inc()
        for kind in discrepancy_kinds(change, outcome):
            self.discrepancies[kind].inc()
