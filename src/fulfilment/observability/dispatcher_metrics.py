"""The dispatcher's Prometheus metrics: a pump's (``pump_metrics``), its requests' and its polls'.

Labels are small and fixed: the request kind (2 values), the class of answer (6 values), the
class of a poll's answer (6 values), and the warehouse events' (``warehouse_event_metrics``),
all bound at 0 so that ``rate()`` and the alerts see the zero.

The drift check's gauges (``dispatcher.drift``) are set by the active dispatcher alone, and
absent elsewhere and before its first check (a standby's would be stale): the SKUs and units
by ``kind`` (``in_flight``, ``unexplained``) and the time of the last completed check. Every
replica exports the check's interval (its setting; 0 when off), which the alerts read.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from fulfilment.domain.handoff import (
    Accepted,
    Answer,
    CredentialsRefused,
    Failed,
    RateLimited,
    Refused,
    RequestKind,
    Retry,
)
from fulfilment.domain.polls import NotFound, PollAnswer, Polled
from fulfilment.domain.warehouse_events import Source
from fulfilment.observability.metrics import MeasuredGauge
from fulfilment.observability.pump_metrics import PumpMetrics
from fulfilment.observability.warehouse_event_metrics import WarehouseEventMetrics

ANSWER_BUCKETS_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
"""Send-to-answer buckets, 5 ms to the longest timeout a warehouse API should need."""

ANSWER_OUTCOMES: dict[type[Answer], str] = {
    Accepted: "accepted",
    Refused: "refused",
    Retry: "retry",
    RateLimited: "rate_limited",
    Failed: "failed",
    CredentialsRefused: "credentials_refused",
}
"""The ``outcome`` label of each class of answer."""

POLL_OUTCOMES: dict[type[PollAnswer], str] = {
    Polled: "answered",
    NotFound: "not_found",
    Retry: "retry",
    RateLimited: "rate_limited",
    CredentialsRefused: "credentials_refused",
    Failed: "failed",
}
"""The ``outcome`` label of each class of a poll's answer."""

DRIFT_KINDS = ("in_flight", "unexplained")
"""The ``kind`` of the drift gauges: the states of a SKU that differs
(``adapters.warehouse.drift.DriftState``, but ``agrees``)."""

DRIFT_CHECK_OUTCOMES = ("completed", "failed")
"""The ``outcome`` of ``fulfilment_stock_drift_checks_total``."""


class DispatcherMetrics(PumpMetrics):
    """Collectors of one dispatcher process, registered on :attr:`registry` (a new one).

    Args:
        version: the service's version (``fulfilment_build_info``).
    """

    def __init__(self, *, version: str = "") -> None:
        super().__init__(
            version=version,
            active=(
                "fulfilment_dispatcher_active",
                "1 while this dispatcher holds the advisory lock and sends, 0 while it stands by.",
            ),
            backlog=(
                "fulfilment_warehouse_requests_open",
                "Requests to the warehouse system not yet answered (pending or sending).",
            ),
            oldest_age=(
                "fulfilment_warehouse_oldest_open_request_age_seconds",
                "Age of the oldest request not yet answered, in seconds; 0 when none.",
            ),
        )
        requests = Counter(
            "fulfilment_warehouse_requests",
            "Requests sent to the warehouse system, by kind and class of answer.",
            ["kind", "outcome"],
            registry=self.registry,
        )
        self.requests = {
            (kind, outcome): requests.labels(kind=str(kind), outcome=outcome)
            for kind in RequestKind
            for outcome in ANSWER_OUTCOMES.values()
        }
        self.answer_seconds = Histogram(
            "fulfilment_warehouse_answer_seconds",
            "Seconds from sending a request to its answer (or its timeout), by kind.",
            ["kind"],
            buckets=ANSWER_BUCKETS_SECONDS,
            registry=self.registry,
        )
        for kind in RequestKind:
            self.answer_seconds.labels(kind=str(kind))
        self.circuit_open = Gauge(
            "fulfilment_warehouse_circuit_open",
            "1 while the warehouse system looks down and only probes are sent, else 0.",
            registry=self.registry,
        )
        self.credentials_refused = Gauge(
            "fulfilment_warehouse_credentials_refused",
            "1 while the warehouse system refuses the token (401/403) and nothing is sent.",
            registry=self.registry,
        )
        self.rate_limit_waits = Counter(
            "fulfilment_warehouse_rate_limit_waits",
            "429 answers: each stops every request until its Retry-After ends.",
            registry=self.registry,
        )
        self.rate_limit_wait_seconds = Counter(
            "fulfilment_warehouse_rate_limit_wait_seconds",
            "Seconds of Retry-After the warehouse system asked for, summed.",
            registry=self.registry,
        )
        self.expired = Counter(
            "fulfilment_warehouse_requests_expired",
            "Requests given up unanswered when their key's retention at the warehouse ended.",
            registry=self.registry,
        )
        polls = Counter(
            "fulfilment_warehouse_polls",
            "Fulfilment orders asked about (GET /fulfilment-orders/{id}), by class of answer.",
            ["outcome"],
            registry=self.registry,
        )
        self.polls = {outcome: polls.labels(outcome=outcome) for outcome in POLL_OUTCOMES.values()}
        self.orders_without_news = Gauge(
            "fulfilment_warehouse_orders_without_news",
            "Accepted fulfilment orders that hold units and have had no shipment or"
            " cancellation for FULFILMENT_WAREHOUSE_RECONCILE_AFTER_SECONDS.",
            registry=self.registry,
        )
        self.warehouse_events = WarehouseEventMetrics(self.registry, Source.POLL)
        self.drift_skus = Gauge(
            "fulfilment_stock_drift_skus",
            "SKUs whose on hand differs from the warehouse's at the last drift check, by kind:"
            " in_flight (orders the warehouse has may explain it), unexplained; set by the"
            " active dispatcher only.",
            ["kind"],
            registry=self.registry,
        )
        self.drift_units = Gauge(
            "fulfilment_stock_drift_units",
            "Units by which those SKUs differ at the last drift check (the differences'"
            " absolute values summed), by kind; set by the active dispatcher only.",
            ["kind"],
            registry=self.registry,
        )
        self.drift_checked_at = MeasuredGauge(
            "fulfilment_stock_drift_checked_timestamp_seconds",
            "Unix time of the last completed drift check; set by the active dispatcher only.",
        )
        self.registry.register(self.drift_checked_at)
        self.drift_interval_seconds = Gauge(
            "fulfilment_stock_drift_interval_seconds",
            "Seconds between two drift checks (FULFILMENT_WAREHOUSE_DRIFT_INTERVAL_SECONDS);"
            " 0: no check.",
            registry=self.registry,
        )
        checks = Counter(
            "fulfilment_stock_drift_checks",
            "Drift checks the active dispatcher ended, by outcome (completed, failed).",
            ["outcome"],
            registry=self.registry,
        )
        self.drift_checks = {
            outcome: checks.labels(outcome=outcome) for outcome in DRIFT_CHECK_OUTCOMES
        }

    def record_answer(self, kind: RequestKind, answer: Answer, seconds: float) -> None:
        """Count one answer (or failure to get one) and its latency in seconds."""
        self.requests[kind, ANSWER_OUTCOMES[type(answer)]].inc()
        self.answer_seconds.labels(kind=str(kind)).observe(seconds)

    def record_poll(self, answer: PollAnswer) -> None:
        """Count one poll by the class of its answer (or failure to get one)."""
        self.polls[POLL_OUTCOMES[type(answer)]].inc()

    def set_drift(self, skus: dict[str, int], units: dict[str, int], checked_at: float) -> None:
        """Export a completed check: SKUs and units by kind (:data:`DRIFT_KINDS`), its Unix time."""
        for kind in DRIFT_KINDS:
            self.drift_skus.labels(kind=kind).set(skus.get(kind, 0))
            self.drift_units.labels(kind=kind).set(units.get(kind, 0))
        self.drift_checked_at.measured(checked_at)
        self.drift_checks["completed"].inc()

    def forget_drift(self) -> None:
        """Remove the drift gauges (not the interval) until the next completed check."""
        self.drift_skus.clear()
        self.drift_units.clear()
        self.drift_checked_at.forget()
