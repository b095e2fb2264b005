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

from fulfilment.domain.warehouse_events import (
    AdjustmentKind,
    AdjustmentOutcome,
    AdjustmentReason,
    DiscrepancyKind,
    ShipmentKind,
    ShipmentOutcome,
    Source,
    WarehouseCancellationKind,
    WarehouseCancellationOutcome,
)

WarehouseEventOutcome = ShipmentOutcome | WarehouseCancellationOutcome | AdjustmentOutcome
"""The outcome of applying a shipment, a cancellation or an adjustment of the warehouse."""

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

    def count(self, outcome: WarehouseEventOutcome) -> None:
        """Count an event applied with ``outcome`` by its kind, and its discrepancies by theirs.

        A discrepancy is a row of ``warehouse_discrepancies``, as ``outcome.discrepancies``
        gives the rows it kept (the functions return the rows they wrote).
        """
        if isinstance(outcome, ShipmentOutcome):
            event = "shipment"
        elif isinstance(outcome, AdjustmentOutcome):
            event = "adjustment"
        else:
            event = "cancellation"
        self.events[event, str(outcome.kind)].inc()
        for found in outcome.discrepancies:
            self.discrepancies[found.kind].inc()
        if isinstance(outcome, AdjustmentOutcome) and outcome.kind is AdjustmentKind.ADJUSTED:
            reason = str(outcome.reason)
            self.adjustments[reason].inc()
            direction = "in" if outcome.applied > 0 else "out"
            self.adjusted_units[reason, direction].inc(abs(outcome.applied))
