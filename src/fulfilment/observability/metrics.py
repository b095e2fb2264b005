"""The service's Prometheus metrics, on a registry of its own (never the global one).

Label sets are small and fixed: an event, an outcome and a reason drawn from closed lists,
never an order id, event id or SKU (each label value is a time series kept forever by
Prometheus). Children of labelled counters are bound once, here, so that the hot path
increments a child found in a dict instead of building a label tuple under a lock per message,
and so that every counter series exists at 0 from the start (``rate()`` and the alert ratios
need the zero). The gauges the background monitors set are the other way round: absent until
measured, and absent again while their monitor cannot measure (:meth:`Metrics.forget_queues`,
:meth:`Metrics.forget_invariants`), because a stale value would hide the outage.

The registry also holds prometheus-client's process, platform and garbage-collector
collectors (``process_*``, ``python_*``), which by default register only on the global
registry the service never serves. It holds none of FastStream's: the worker has no
Prometheus middleware, whose series repeated ``fulfilment_events_total`` and
``fulfilment_handler_duration_seconds`` for CPU spent on every delivery.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from fulfilment.domain.warehouse_events import AdjustmentReason, Source

LATENCY_BUCKETS_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
"""Handler latency buckets, 5 ms to 30 s (the handler deadline is 10 s)."""

ORDER_LATENCY_BUCKETS_SECONDS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
"""End-to-end buckets, 50 ms to an hour: they include the wait in the queue, which a backlog
or a replay stretches far past the handler deadline."""

DEAD_LETTERED = "dead_lettered"
"""The ``outcome`` label of events the service published to the DLQ."""
REQUEUED = "requeued"
"""The ``outcome`` label of deliveries sent back to the queue: because the database is down
(``reason`` ``transient``, see ``worker.consumer_control.ConsumerPause``), or because the DLQ
would not take their dead letter for as long as a delivery can be held (``reason``
``dead_letter_refused``, see ``worker.delivery``)."""
REQUEUED_TRANSIENT = "transient"
REQUEUED_DEAD_LETTER_REFUSED = "dead_letter_refused"

INVARIANTS = (
    "stock_out_of_bounds",
    "reserved_mismatches",
    "inbox_unaccounted",
    "orphan_lines",
    "shipped_mismatches",
)
"""The ``invariant`` label values of :attr:`Metrics.stock_invariant_violations`: the checks of
``fulfilment.adapters.postgres.outcomes.InvariantChecks`` (``shipped_mismatches``: on hand went
down by other than exactly the shipped lines)."""

MONITOR_CHECKS = ("queues", "invariants", "consumer")
"""The ``check`` label values of :attr:`Metrics.monitor_errors`: the worker's background tasks
(``worker.monitors``), the consumer watchdog included."""

DEAD_LETTER_AGE = "fulfilment_dead_letters_oldest_age_seconds"
DEAD_LETTER_AGE_HELP = (
    "Age of the oldest message in the dead-letter queues, in seconds; 0 when empty, absent "
    "while the queue monitor cannot read the queues."
)


def build_info(registry: CollectorRegistry, version: str) -> Gauge:
    """Register ``fulfilment_build_info{version}`` = 1 on ``registry`` (``unknown`` if empty).

    The worker and the relay both export it, with the same labels, so that the dashboard's
    ``$pod`` choice (``label_values(fulfilment_build_info, pod)``) lists the pods of both.
    """
    gauge = Gauge(
        "fulfilment_build_info",
        "Always 1; the version label says which version runs.",
        ["version"],
        registry=registry,
    )
    gauge.labels(version or "unknown").set(1)
    return gauge


class Metrics:
    """Collectors of one worker process, registered on :attr:`registry` (a new one by default).

    Besides the service's own metrics, the registry gets the process's memory, CPU time and
    open files (``process_*``, read from ``/proc``, so on Linux only), the Python version
    (``python_info``) and the garbage collector's passes (``python_gc_*``).

    Args:
        registry: where to register; a fresh ``CollectorRegistry`` when None. Never the global
            one, which already holds the process collectors (registering twice raises).
        version: the service's version, exported as ``fulfilment_build_info{version}`` = 1.
        event_outcomes: per event (the ``event`` label: ``order_placed``, ...), the
            ``(outcome, reason)`` pairs its handler can return, bound at 0.
        dead_letter_classes: failure classes the worker writes, bound at 0 as ``reason`` of
            ``outcome="dead_lettered"`` for every event of ``event_outcomes``, as are
            ``requeued``/``transient`` and ``requeued``/``dead_letter_refused``.
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
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
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
            "Dead-letter publishes the broker refused, returned or did not confirm, one per "
            "attempt; the delivery stays unacknowledged and its dead letter is tried again.",
            registry=self.registry,
        )
        self.dead_letters_held = Gauge(
            "fulfilment_dead_letters_held",
            "Deliveries this process holds unacknowledged because the broker would not take "
            "their dead letter (a full or unavailable dead-letter queue).",
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
        self._dead_letter_age = _DeadLetterAge()
        self.registry.register(self._dead_letter_age)
        self.stock_invariant_violations = Gauge(
            "fulfilment_stock_invariant_violations",
            "Rows breaking a stock invariant at the last check (must stay 0): SKUs out of "
            "bounds, SKUs whose reserved or shipped units differ from their orders' lines, "
            "unaccounted inbox rows, orphan lines; absent while the invariant check cannot "
            "read the database.",
            ["invariant"],
            registry=self.registry,
        )
        self.stock_short_skus = MeasuredGauge(
            "fulfilment_stock_short_skus",
            "SKUs short at the last check: more units reserved than on hand after a reported "
            "loss (the shortage rule; not a violation); absent while the check cannot read the "
            "database.",
        )
        self.stock_short_units = MeasuredGauge(
            "fulfilment_stock_short_units",
            "Units the short SKUs are short by at the last check (reserved - on_hand, summed); "
            "absent while the check cannot read the database.",
        )
        self.registry.register(self.stock_short_skus)
        self.registry.register(self.stock_short_units)
        self.adjustments_recorded = RecordedAdjustments()
        self.registry.register(self.adjustments_recorded)
        self.monitor_errors = Counter(
            "fulfilment_monitor_errors_total",
            "Failures of a background task (each then started again after a back-off): polling "
            "the broker's queues, checking the stock invariants, watching the consumer.",
            ["check"],
            registry=self.registry,
        )
        self.build_info = build_info(self.registry, version)

        self._events: dict[tuple[str, str, str], Counter] = {}
        failures = [(DEAD_LETTERED, str(failure_class)) for failure_class in dead_letter_classes]
        requeued = [(REQUEUED, REQUEUED_TRANSIENT), (REQUEUED, REQUEUED_DEAD_LETTER_REFUSED)]
        for event, outcomes in (event_outcomes or {}).items():
            for outcome, reason in [*outcomes, *failures, *requeued]:
                self.event(event, outcome, reason)
        self._retries = {
            label: self.database_retries.labels(label) for label in database_retry_errors
        }
        for check in MONITOR_CHECKS:
            self.monitor_errors.labels(check)

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
        """Remember when the DLQs' oldest message was dead-lettered (Unix seconds), or None.

        None means every DLQ is empty (age 0). The age is computed at each scrape, so it keeps
        growing between two polls.
        """
        self._dead_letter_age.measured(dead_lettered_at)

    def forget_queues(self) -> None:
        """Remove every queue's series (depth, consumers, the DLQs' oldest age) until a poll."""
        self.queue_ready.clear()
        self.queue_consumers.clear()
        self._dead_letter_age.forget()

    def forget_invariants(self) -> None:
        """Remove the invariant series until the next check."""
        self.stock_invariant_violations.clear()
        self.stock_short_skus.forget()
        self.stock_short_units.forget()
        self.adjustments_recorded.forget()


class MeasuredGauge(Collector):
    """A gauge without labels that has no sample until measured, and none once forgotten.

    For figures absent while their monitor cannot measure (the invariant monitor's, as
    ``fulfilment_stock_invariant_violations`` is; the dispatcher's drift check's): a ``Gauge``
    without labels always exports a sample. Register it on the registry.

    Args:
        name: the metric's name.
        documentation: its help text.
    """

    def __init__(self, name: str, documentation: str) -> None:
        self._name, self._documentation = name, documentation
        self._value: float | None = None

    def measured(self, value: float) -> None:
        """Export ``value`` from now on."""
        self._value = value

    def forget(self) -> None:
        """Export no sample until measured again."""
        self._value = None

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The family, without a sample (the registry learns the name)."""
        yield GaugeMetricFamily(self._name, self._documentation)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """The family, with the measured sample unless forgotten."""
        family = GaugeMetricFamily(self._name, self._documentation)
        if self._value is not None:
            family.add_metric([], self._value)
        yield family


ADJUSTMENT_SOURCES = (str(Source.WEBHOOK), str(Source.OPERATOR))
"""The ``source`` label of the recorded adjustments: ``warehouse_adjustments.source``."""

RECORDED_ADJUSTMENTS = "fulfilment_stock_adjustments_recorded"
RECORDED_ADJUSTMENTS_HELP = (
    "Adjustments of on hand recorded in the database (warehouse_adjustments), by source"
    " (webhook: the warehouse's; operator: fulfilment stock adjust) and reason; read by the"
    " invariant check of every worker (the same totals: max, never sum), absent while it"
    " cannot read the database."
)
RECORDED_UNITS = "fulfilment_stock_adjusted_units_recorded"
RECORDED_UNITS_HELP = (
    "Units the recorded adjustments moved on hand by, by source, reason and direction (in,"
    " out); read as fulfilment_stock_adjustments_recorded_total is."
)


class RecordedAdjustments(Collector):
    """The adjustments recorded in the database, as counters read from its rows.

    The intake counts the warehouse's adjustments as it applies them, but an operator's
    (``fulfilment stock adjust``) is made by a command that exits at once: its counters would
    die with it, unscraped. So the figures are the table's own totals, which only grow
    (adjustments are never deleted), read by the worker's invariant check
    (``worker.monitors.check_invariants``) and exported as counters: ``rate()`` and
    ``increase()`` hold across worker restarts, as they do for a counter that resets. Every
    source, reason and direction is exported (0 when none) once measured; nothing before the
    first check or once forgotten.
    """

    def __init__(self) -> None:
        self._totals: Mapping[tuple[str, str], tuple[int, int, int]] | None = None

    def measured(self, totals: Mapping[tuple[str, str], tuple[int, int, int]]) -> None:
        """Export ``{(source, reason): (adjustments, units in, units out)}`` from now on."""
        self._totals = totals

    def forget(self) -> None:
        """Export no sample until measured again."""
        self._totals = None

    def describe(self) -> Iterator[CounterMetricFamily]:
        """The two families, without samples (the registry learns the names)."""
        yield CounterMetricFamily(RECORDED_ADJUSTMENTS, RECORDED_ADJUSTMENTS_HELP)
        yield CounterMetricFamily(RECORDED_UNITS, RECORDED_UNITS_HELP)

    def collect(self) -> Iterator[CounterMetricFamily]:
        """The two families, every label set of the sources and reasons, unless forgotten."""
        adjustments = CounterMetricFamily(
            RECORDED_ADJUSTMENTS, RECORDED_ADJUSTMENTS_HELP, labels=["source", "reason"]
        )
        units = CounterMetricFamily(
            RECORDED_UNITS, RECORDED_UNITS_HELP, labels=["source", "reason", "direction"]
        )
        if self._totals is not None:
            reasons = sorted({*map(str, AdjustmentReason), *(reason for _, reason in self._totals)})
            for source in ADJUSTMENT_SOURCES:
                for reason in reasons:
                    count, units_in, units_out = self._totals.get((source, reason), (0, 0, 0))
                    adjustments.add_metric([source, reason], count)
                    units.add_metric([source, reason, "in"], units_in)
                    units.add_metric([source, reason, "out"], units_out)
        yield adjustments
        yield units


class _DeadLetterAge(Collector):
    """``fulfilment_dead_letters_oldest_age_seconds``: computed at each scrape, or absent.

    A custom collector because a ``Gauge`` without labels always exports a sample, and this
    one must have none while its monitor cannot read the DLQ (the family is still described,
    so the name is known, as for a labelled gauge without children).
    """

    def __init__(self) -> None:
        self._known = False
        self._oldest: float | None = None

    def measured(self, dead_lettered_at: float | None) -> None:
        self._known, self._oldest = True, dead_lettered_at

    def forget(self) -> None:
        self._known, self._oldest = False, None

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(DEAD_LETTER_AGE, DEAD_LETTER_AGE_HELP)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(DEAD_LETTER_AGE, DEAD_LETTER_AGE_HELP)
        if self._known:
            age = 0.0 if self._oldest is None else max(0.0, time.time() - self._oldest)
            family.add_metric([], age)
        yield family
