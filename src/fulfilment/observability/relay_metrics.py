"""The relay's Prometheus metrics: a pump's (``pump_metrics``) and its publishes'.

Counters are bound at 0 for every label value they can take (the routing keys of the result
events, the failure reasons), so ``rate()`` and the alerts see the zero. A routing key this
release does not know (a row a later release wrote, during a rolling update) is published all
the same and counted under :data:`UNKNOWN_ROUTING_KEY`: the relay never stops on one.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Counter, Histogram

from fulfilment.observability.pump_metrics import PumpMetrics

PUBLISH_LAG_BUCKETS_SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600)
"""Commit-to-confirm buckets, 10 ms to an hour: a broker outage holds events back for as long
as it lasts."""

RETURNED = "returned"
"""``reason`` of a message the broker could not route (``mandatory``: no queue bound)."""
NACKED = "nacked"
"""``reason`` of a message the broker refused (``basic.nack``, e.g. a queue's length limit)."""
CONNECTION = "connection"
"""``reason`` of a batch lost with its broker or database connection (counted per batch)."""
FAILURE_REASONS = (RETURNED, NACKED, CONNECTION)

UNKNOWN_ROUTING_KEY = "unknown"
"""``routing_key`` label of a published row whose routing key this release does not know."""


class RelayMetrics(PumpMetrics):
    """Collectors of one relay process, registered on :attr:`registry` (a new one).

    Args:
        routing_keys: every routing key the relay publishes, bound at 0 in
            ``fulfilment_outbox_published_total``.
        version: the service's version (``fulfilment_build_info``).
    """

    def __init__(self, routing_keys: Iterable[str], *, version: str = "") -> None:
        super().__init__(
            version=version,
            active=(
                "fulfilment_relay_active",
                "1 while this relay holds the advisory lock and publishes, 0 while it stands by.",
            ),
            backlog=("fulfilment_outbox_unpublished", "Outbox rows not yet published (rows)."),
            oldest_age=(
                "fulfilment_outbox_oldest_unpublished_age_seconds",
                "Age of the oldest unpublished outbox row, in seconds; 0 when none.",
            ),
        )
        self.publish_lag = Histogram(
            "fulfilment_outbox_publish_lag_seconds",
            "Seconds from an outbox row's commit (created_at) to its confirm (published_at).",
            buckets=PUBLISH_LAG_BUCKETS_SECONDS,
            registry=self.registry,
        )
        published = Counter(
            "fulfilment_outbox_published",
            "Result events published and confirmed by the broker, per routing key.",
            ["routing_key"],
            registry=self.registry,
        )
        self.published = {
            key: published.labels(routing_key=key) for key in (*routing_keys, UNKNOWN_ROUTING_KEY)
        }
        failures = Counter(
            "fulfilment_outbox_publish_failures",
            "Publishes that failed and will be retried: returned, nacked, or connection lost.",
            ["reason"],
            registry=self.registry,
        )
        self.failures = {reason: failures.labels(reason=reason) for reason in FAILURE_REASONS}

    def record_published(self, marked: Iterable[tuple[str, float]]) -> None:
        """Count rows marked published: ``(routing_key, commit-to-confirm seconds)`` each.

        A routing key not bound at the start counts as :data:`UNKNOWN_ROUTING_KEY`.
        """
        for routing_key, lag in marked:
            counter = self.published.get(routing_key, self.published[UNKNOWN_ROUTING_KEY])
            counter.inc()
            self.publish_lag.observe(lag)
