"""The service's Prometheus metrics, on a registry of its own (never the global one).

Label sets are small and fixed: an outcome and a reason drawn from closed lists, never an
order id, event id or SKU (each label value is a time series kept forever by Prometheus).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
"""Handler and end-to-end latency buckets, 5 ms to 30 s (the handler deadline is 10 s)."""


class Metrics:
    """Collectors of one worker process, registered on :attr:`registry` (a new one by default)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.events = Counter(
            "fulfilment_events_total",
            "OrderPlaced deliveries by final outcome: reserved, rejected, duplicate or "
            "dead_lettered, with the rejection reason, duplicate kind or failure class.",
            ["outcome", "reason"],
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
            buckets=LATENCY_BUCKETS_SECONDS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "fulfilment_messages_in_flight",
            "Deliveries being handled by this process right now.",
            registry=self.registry,
        )
        self.database_retries = Counter(
            "fulfilment_database_retries_total",
            "Database attempts that failed with a transient error and were retried.",
            ["error"],
            registry=self.registry,
        )
