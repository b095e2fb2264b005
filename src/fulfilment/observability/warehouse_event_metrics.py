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

from fulfilment.domain.warehouse_events import (
    DiscrepancyKind,
    ShipmentKind,
    ShipmentOutcome,
    Source,
    WarehouseCancellationKind,
    WarehouseCancellationOutcome,
)

WarehouseEventOutcome = ShipmentOutcome | WarehouseCancellationOutcome
"""The outcome of applying a shipment or a cancellation of the warehouse."""

EVENT_OUTCOMES: dict[str, tuple[str, ...]] = {
    "shipment": tuple(str(kind) for kind in ShipmentKind),
    "cancellation": tuple(str(kind) for kind in WarehouseCancellationKind),
}
"""The ``outcome`` values of each ``event``: the kinds of its command's outcome."""

DISCREPANCY_KINDS = tuple(str(kind) for kind in DiscrepancyKind)
"""The ``kind`` of a discrepancy, as ``warehouse_discrepancies.kind`` records it."""


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

    def count(self, outcome: WarehouseEventOutcome) -> None:
        """Count an event applied with ``outcome`` by its kind, and its discrepancies by theirs.

        A discrepancy is a row of ``warehouse_discrepancies``, as ``outcome.discrepancies``
        gives the rows it kept (the functions return the rows they wrote).
        """
        event = "shipment" if isinstance(outcome, ShipmentOutcome) else "cancellation"
        self.events[event, str(outcome.kind)].inc()
        for found in outcome.discrepancies:
            self.discrepancies[found.kind].inc()
