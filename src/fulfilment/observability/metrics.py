"""The service's Prometheus metrics, on a registry of its own (never the global one).

Label sets are small and fixed: an event, an outcome and a reason drawn from closed lists,
never an order id, event id or SKU (each label value is a time series kept forever by Prometheus).
Children of labelled metrics are bound once, here, so that the hot path increments a child
found in a dict instead of building a label tuple under a lock per message, and so that every
series exists at 0 from the start (``rate()`` and the alert ratios need the zero).

FastStream's own middleware (``faststream_*`` metrics) registers on the same registry.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
"""Handler latency buckets, 5 ms to 30 s (the handler deadline is 10 s)."""

ORDER_LATENCY_BUCKETS_SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
"""End-to-end buckets, 50 ms to an hour: they include the wait in the queue, which a backlog
or a replay stretches far past the handler deadline."""

DEAD_LETTERED = "dead_lettered"
"""The ``outcome`` label of events the service published to the DLQ."""
REQUEUED = "requeued"
"""The ``outcome`` label of deliveries sent back to the queue because the database is down
(see ``worker.consumer_control.ConsumerPause``); their ``reason`` is ``transient``."""
REQUEUED_TRANSIENT = "transient"

INVARIANTS = ("stock_out_of_bounds", "reserved_mismatches", "inbox_unaccounted", "orphan_lines")
"""The ``invariant`` label values: the checks of ``fulfilment report``."""

MONITOR_CHECKS = ("queues", "invariants")
"""The ``check`` label values of :attr:`Metrics.monitor_errors`."""


class Metrics:
    """Collectors of one worker process, registered on :attr:`registry` (a new one by default).

    Args:
        registry: where to register; a fresh ``CollectorRegistry`` when None.
        version: the service's version, exported as ``fulfilment_build_info{version}`` = 1.
        event_outcomes: per event (the ``event`` label: ``order_placed``, ...), the
            ``(outcome, reason)`` pairs its handler can return, bound at 0.
        dead_letter_classes: failure classes the worker writes, bound at 0 as ``reason`` of
            ``outcome="dead_lettered"`` for every event of ``event_outcomes``, as is
            ``requeued``/``transient``.
        database_retry_errors: the closed list of ``error`` labels of retried database errors
            (the PostgreSQL adapter's, which knows the errors), bound at 0.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        version: str = "",
        event_outcomes: Mapping[str, Iterable[tuple[str, str]]] | None = None,
        dead_letter_classes: Iterable[str] = (),
        database_retry_errors: Iterable[str] = (),
    ) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.events = Counter(
            "fulfilment_events_total",
            "Deliveries by event and final outcome (reserved, rejected, released, shipped, "
            "duplicate, dead_lettered, ...), with the rejection reason, duplicate kind or "
            "failure class.",
            ["event", "outcome", "reason"],
            registry=self.registry,
        )
        self.handler_duration = Histogram(
            "fulfilment_handler_duration_seconds",
            "Time from receiving a delivery to settling it, in seconds.",
            buckets=LATENCY_BUCKETS_SECONDS,
            registry=self.registry,
        )
        self.end_to_end_latency = Histogram(
            "fulfilment_order_latency_seconds",
            "Time from the order's placed_at to the commit of its reservation, in seconds.",
            buckets=ORDER_LATENCY_BUCKETS_SECONDS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "fulfilment_messages_in_flight",
            "Deliveries being handled by this process right now.",
            registry=self.registry,
        )
        self.database_retries = Counter(
            "fulfilment_database_retries_total",
            "Database attempts that failed with a transient error and were retried, by kind "
            "of error (serialization_failure, deadlock, lock_timeout, connection, ...).",
            ["error"],
            registry=self.registry,
        )
        self.dead_letter_publish_failures = Counter(
            "fulfilment_dead_letter_publish_failures_total",
            "Dead letters the broker refused or did not confirm; the delivery was rejected "
            "and dead-lettered by the broker instead, without the service's reason headers.",
            registry=self.registry,
        )
        self.queue_ready = Gauge(
            "fulfilment_queue_messages_ready",
            "Messages ready for delivery in a queue, polled from the broker by this process.",
            ["queue"],
            registry=self.registry,
        )
        self.queue_consumers = Gauge(
            "fulfilment_queue_consumers",
            "Consumers attached to a queue (all replicas), polled from the broker.",
            ["queue"],
            registry=self.registry,
        )
        self.dead_letter_oldest = Gauge(
            "fulfilment_dead_letters_oldest_age_seconds",
            "Age of the oldest message in the dead-letter queues, in seconds; 0 when empty.",
            registry=self.registry,
        )
        self.stock_invariant_violations = Gauge(
            "fulfilment_stock_invariant_violations",
            "Rows breaking a stock invariant at the last check (must stay 0).",
            ["invariant"],
            registry=self.registry,
        )
        self.monitor_errors = Counter(
            "fulfilment_monitor_errors_total",
            "Failed background checks: polling the broker's queues, or the stock invariants.",
            ["check"],
            registry=self.registry,
        )
        self.build_info = Gauge(
            "fulfilment_build_info",
            "Always 1; the version label says which version runs.",
            ["version"],
            registry=self.registry,
        )
        self.build_info.labels(version or "unknown").set(1)

        self._events: dict[tuple[str, str, str], Counter] = {}
        failures = [(DEAD_LETTERED, str(failure_class)) for failure_class in dead_letter_classes]
        for event, outcomes in (event_outcomes or {}).items():
            for outcome, reason in [*outcomes, *failures, (REQUEUED, REQUEUED_TRANSIENT)]:
                self.event(event, outcome, reason)
        self._retries = {
            label: self.database_retries.labels(label) for label in database_retry_errors
        }
        for invariant in INVARIANTS:
            self.stock_invariant_violations.labels(invariant)
        for check in MONITOR_CHECKS:
            self.monitor_errors.labels(check)
        self._oldest_dead_letter_at: float | None = None
        self.dead_letter_oldest.set_function(self._dead_letter_age)

    def event(self, event: str, outcome: str, reason: str) -> Counter:
        """The ``fulfilment_events_total`` child of ``(event, outcome, reason)``, bound once."""
        child = self._events.get((event, outcome, reason))
        if child is None:
            child = self._events[event, outcome, reason] = self.events.labels(
                event, outcome, reason
            )
        return child

    def count_database_retry(self, error: str) -> None:
        """Count one retried database attempt under its ``error`` label (e.g. ``deadlock``).

        ``error`` is one of ``database_retry_errors``; a label outside that list gets its
        series at its first retry.
        """
        child = self._retries.get(error)
        if child is None:
            child = self._retries[error] = self.database_retries.labels(error)
        child.inc()

    def set_oldest_dead_letter(self, dead_lettered_at: float | None) -> None:
        """Remember when the DLQ's oldest message was dead-lettered (Unix seconds), or None.

        The age is computed at each scrape, so it keeps growing between two polls.
        """
        self._oldest_dead_letter_at = dead_lettered_at

    def _dead_letter_age(self) -> float:
        if self._oldest_dead_letter_at is None:
            return 0.0
        return max(0.0, time.time() - self._oldest_dead_letter_at)
