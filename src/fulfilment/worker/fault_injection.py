"""Crash injection for the fault suite; off unless ``FULFILMENT_FAULT_INJECTION`` is set.

The worker kills itself with SIGKILL (no cleanup, no ack, no rollback: a crash, an OOM kill or
a node loss look the same to the broker and the database) at one of these points of a
delivery of any event (an order placed, cancelled or shipped):

``before_transaction``
    the event is validated (and a redelivery counted), nothing is written yet.
``in_transaction``
    the event's writes are done (inbox row, reservation, stock) but not committed. Each
    transition is one statement, so a client can only die inside it or after it; the armed
    path runs that statement in an explicit transaction and pauses before ``COMMIT``, and the
    database's ``client_connection_check_interval`` aborts the orphaned transaction.
``after_commit``
    the transaction is committed, the delivery is not acknowledged yet.

and, in the relay (``fulfilment relay``), at one of these points of a batch of outbox rows:

``before_publish``
    the batch is read, nothing of it is published yet.
``after_publish``
    the batch is published and confirmed by the broker, its rows are not marked yet (so
    they are published again, with the same ``event_id``, by the next relay).

The setting is a comma-separated list of ``point:probability`` (each delivery draws once per
point), plus ``poison_sku:<SKU>`` to crash on every delivery of an order, or a cancel of lines,
holding that SKU:
``FULFILMENT_FAULT_INJECTION="before_transaction:0.01,after_commit:0.01,poison_sku:POISON"``.

This module is the plan, which the settings validate; ``worker.crashing_warehouse`` carries it
out, around the warehouse port, and ``main`` builds it only when the plan is armed.
"""

from __future__ import annotations

import os
import random
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

import structlog

from fulfilment.domain.lifecycle import CancelOrder, ShipOrder
from fulfilment.domain.model import ReserveStock

Command = ReserveStock | CancelOrder | ShipOrder
"""A command of the warehouse that a crash point can interrupt."""

logger = structlog.get_logger("fulfilment.faults")


class CrashPoint(StrEnum):
    """Where in a delivery an injected crash happens."""

    BEFORE_TRANSACTION = "before_transaction"
    IN_TRANSACTION = "in_transaction"
    AFTER_COMMIT = "after_commit"
    BEFORE_PUBLISH = "before_publish"
    AFTER_PUBLISH = "after_publish"


@dataclass(frozen=True, slots=True)
class FaultPlan:
    """Crash probabilities per point (0 to 1) and the SKUs that always crash."""

    probabilities: Mapping[CrashPoint, float] = field(default_factory=dict)
    poison_skus: frozenset[str] = frozenset()

    @property
    def armed(self) -> bool:
        """True when any crash can happen."""
        return bool(self.poison_skus) or any(p > 0 for p in self.probabilities.values())

    def crashes_at(self, point: CrashPoint, command: Command | None = None) -> bool:
        """Whether this delivery of ``command`` (None: the relay's batch) crashes at ``point``.

        Draws at random, except for a poison SKU, which always crashes.
        """
        lines = () if command is None or isinstance(command, ShipOrder) else command.lines or ()
        if point is CrashPoint.BEFORE_TRANSACTION and any(
            line.sku in self.poison_skus for line in lines
        ):
            return True
        probability = self.probabilities.get(point, 0.0)
        return probability > 0 and random.random() < probability  # noqa: S311 - fault timing, not security


def parse_fault_plan(text: str) -> FaultPlan:
    """Parse ``FULFILMENT_FAULT_INJECTION``; an empty string means no faults.

    Raises:
        ValueError: an unknown point, a probability outside 0..1, or a malformed item.
    """
    probabilities: dict[CrashPoint, float] = {}
    poison: set[str] = set()
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition(":")
        if name == "poison_sku" and value:
            poison.add(value)
            continue
        try:
            point = CrashPoint(name)
            probability = float(value)
        except ValueError:
            points = ", ".join(p.value for p in CrashPoint)
            msg = f"{item!r}: expected <point>:<probability> (point: {points}) or poison_sku:<SKU>"
            raise ValueError(msg) from None
        if not 0 <= probability <= 1:
            msg = f"{item!r}: probability must be between 0 and 1"
            raise ValueError(msg)
        probabilities[point] = probability
    return FaultPlan(probabilities, frozenset(poison))


def crash(point: CrashPoint, event_id: object) -> None:
    """Kill this process with SIGKILL, after one log line saying where and at which event."""
    logger.warning("fault.crash", point=str(point), event_id=str(event_id))
    os.kill(os.getpid(), signal.SIGKILL)
