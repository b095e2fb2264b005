"""HTTP endpoints beside the relay: liveness, readiness and Prometheus metrics.

The same paths as the worker's (``worker.health``), so both Deployments probe alike. Liveness
says only that the process serves HTTP. Readiness says that the relay is connected to RabbitMQ
and PostgreSQL and is either publishing (it holds the advisory lock) or standing by for it: a
standby replica is ready, since it is doing its job, which is to wait.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from fulfilment.observability.probes import ASGIApp, probe_app


def relay_health_app(
    *,
    readiness: Callable[[], dict[str, bool | str]],
    ready: Callable[[], bool],
    registry: CollectorRegistry,
) -> ASGIApp:
    """An ASGI app serving ``GET /health/live``, ``GET /health/ready`` and ``GET /metrics``.

    ``/health/ready`` answers 200 when ``ready()``, else 503, with ``readiness()`` as its body
    (``{"broker": true, "database": true, "role": "standby"}``); other paths answer 404
    (``observability.probes``).
    """

    async def relay_readiness() -> tuple[bool, dict[str, Any]]:
        return ready(), dict(readiness())

    return probe_app(readiness=relay_readiness, registry=registry)
