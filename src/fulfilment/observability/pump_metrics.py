"""What every pump (``pump.leader``) measures: its process, its turn on the lock, its backlog.

Each pump's metrics (``relay_metrics``, ``dispatcher_metrics``) extend these on a registry of
its own, as the worker's do (``metrics``). The backlog gauges are set by every replica, active
or standing by, so that the alerts on them still fire when no replica holds the lock; they are
absent until the first read.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
)

from fulfilment.observability.metrics import build_info

Described = tuple[str, str]
"""A metric's ``(name, documentation)``."""


class PumpMetrics:
    """A new :attr:`registry` with the process's collectors and a pump's three gauges.

    Args:
        version: the service's version, exported as ``fulfilment_build_info{version}`` = 1,
            as the worker exports it (``metrics.build_info``).
        active: the gauge at 1 while this process holds the lock (:attr:`active`).
        backlog: the gauge of rows waiting (:attr:`backlog`).
        oldest_age: the gauge of the oldest waiting row's age in seconds, 0 when none
            (:attr:`oldest_age`).
    """

    def __init__(
        self, *, version: str, active: Described, backlog: Described, oldest_age: Described
    ) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.build_info = build_info(self.registry, version)
        self.active = Gauge(*active, registry=self.registry)
        self.backlog = Gauge(*backlog, registry=self.registry)
        self.oldest_age = Gauge(*oldest_age, registry=self.registry)

    def set_backlog(self, rows: int, oldest_age_seconds: float) -> None:
        """Set the backlog gauges: ``rows`` waiting, the oldest ``oldest_age_seconds`` old."""
        self.backlog.set(rows)
        self.oldest_age.set(oldest_age_seconds)
