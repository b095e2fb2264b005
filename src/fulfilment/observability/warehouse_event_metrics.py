"""The warehouse's events applied, counted the same way by whichever program applied them.

A shipment or a cancellation of the warehouse reaches the service by webhook (the intake) or by
the poll (the dispatcher), an adjustment of its stock by webhook; each program counts what it
applied on its own registry, under the same names, so that a sum over the programs is every
event applied: ``fulfilment_warehouse_events_total{event, source, outcome}`` and
``fulfilment_warehouse_discrepancies_total{kind}``, and for the adjustments
``fulfilment_stock_adjustments_total{reason}`` and
``fulfilment_stock_adjusted_units_total{reason, direction}`` (the units ``on_hand`` moved,
``in`` or ``out``). Labels are bound at 0: ``event`` 3 values, ``outcome`` the command's
kinds, ``kind`` the discrepancy kinds, ``reason`` the six reasons; ``source`` is the
program's own (``webhook`` for the intake, ``poll`` for the dispatcher).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from fulfilment.domain.lifecycle import OrderStatus
from fulfilment.domain.polls import WarehouseChange
from fulfilment.domain.warehouse_events import (
    AdjustmentKind,
    AdjustmentOutcome,
    AdjustmentReason,
    RecordAdjustment,
    RecordShipment,
    ShipmentKind,
    ShipmentOutcome,
    Source,
    WarehouseCancellationKind,
    WarehouseCancellationOutcome,
)
from fulfilment.domain.warehouse_lifecycle import DiscrepancyKind

WarehouseEventOutcome = ShipmentOutcome | WarehouseCancellationOutcome | AdjustmentOutcome
"""The outcome of applying a shipment, a cancellation or an adjustment of the warehouse."""

AppliedChange = WarehouseChange | RecordAdjustment
"""A change of the warehouse's that a program applied and counts."""

EVENT_OUTCOMES: dict[str, tuple[str, ...]] = {
    "shipment": tuple(str(kind) for kind in ShipmentKind),
    "cancellation": tuple(str(kind) for kind in WarehouseCancellationKind),
    "adjustment": tuple(str(kind) for kind in AdjustmentKind),
}
"""The ``outcome`` values of each ``event``: the kinds of its command's outcome."""

DISCREPANCY_KINDS = tuple(str(kind) for kind in DiscrepancyKind)
"""The ``kind`` of a discrepancy, as ``warehouse_discrepancies.kind`` records it."""

DIRECTIONS = ("in", "out")
"""The ``direction`` of ``fulfilment_stock_adjusted_units_total``: onto the shelf, or off."""


def discrepancy_kinds(change: AppliedChange, outcome: WarehouseEventOutcome) -> list[str]:
    """The kinds of the discrepancies that applying ``change`` with ``outcome`` kept, a row each.

    As ``fulfilment.domain.warehouse_lifecycle`` keeps them: an order unknown or not reserved
    is a row per SKU the change named (one for a cancellation of the whole order); a shipment
    of a reserved order a row per SKU it could not take in full, ``more_than_held`` when it
    took some of that SKU, else ``sku_not_held``. The outcome does not say whether the order
    once held a SKU it took none of, so a SKU whose held units all shipped or were released
    before counts as ``sku_not_held`` here where its row says ``more_than_held``. An
    ``already_shipped`` shipment, an ``ignored`` cancellation and a ``duplicate`` keep none.
    An adjustment keeps one ``more_than_on_hand`` row when a loss was larger than on hand.
    """
    if isinstance(outcome, AdjustmentOutcome) or isinstance(change, RecordAdjustment):
        lost_beyond = isinstance(outcome, AdjustmentOutcome) and outcome.discrepancy > 0
        return ["more_than_on_hand"] if lost_beyond else []
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
        adjustments = Counter(
            "fulfilment_stock_adjustments",
            "Adjustments of on hand applied (not their duplicates), by reason.",
            ["reason"],
            registry=registry,
        )
        self.adjustments = {
            str(reason): adjustments.labels(reason=str(reason)) for reason in AdjustmentReason
        }
        units = Counter(
            "fulfilment_stock_adjusted_units",
            "Units the applied adjustments moved on hand by (a loss beyond on hand counts what"
            " it took), by reason and direction (in, out).",
            ["reason", "direction"],
            registry=registry,
        )
        self.adjusted_units = {
            (str(reason), direction): units.labels(reason=str(reason), direction=direction)
            for reason in AdjustmentReason
            for direction in DIRECTIONS
        }

    def count(self, change: AppliedChange, outcome: WarehouseEventOutcome) -> None:
        """Count ``change`` applied by its outcome's kind, and the discrepancies it kept."""
        if isinstance(outcome, ShipmentOutcome):
            event = "shipment"
        elif isinstance(outcome, AdjustmentOutcome):
            event = "adjustment"
        else:
            event = "cancellation"
        self.events[event, str(outcome.kind)].inc()
        for kind in discrepancy_kinds(change, outcome):
            self.discrepancies[kind].inc()
        if (
            isinstance(change, RecordAdjustment)
            and isinstance(outcome, AdjustmentOutcome)
            and outcome.kind is AdjustmentKind.ADJUSTED
        ):
            reason = str(change.reason)
            self.adjustments[reason].inc()
            direction = "in" if outcome.applied > 0 else "out"
            self.adjusted_units[reason, direction].inc(abs(outcome.applied))
