"""HTTP endpoints beside the dispatcher: liveness, readiness and Prometheus metrics.

The same paths as the worker's and the relay's. Readiness says that the dispatcher is
connected to PostgreSQL and either sending (it holds the advisory lock) or standing by, and
that the warehouse system accepts its credentials: with a token refused it answers 503 with
``"halt": "credentials_refused"``, so the pod shows what an operator must fix. A warehouse that
is down (the circuit open) leaves it ready: it is doing its job, probing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from fulfilment.observability.probes import ASGIApp, probe_app


def dispatcher_health_app(
    *,
    readiness: Callable[[], dict[str, bool | str]],
    ready: Callable[[], bool],
    registry: CollectorRegistry,
) -> ASGIApp:
    """An ASGI app serving ``GET /health/live``, ``GET /health/ready`` and ``GET /metrics``.

    ``/health/ready`` answers 200 when ``ready()``, else 503, with ``readiness()`` as its body
    (``{"database": true, "role": "active", "halt": "none"}``).
    """

    async def dispatcher_readiness() -> tuple[bool, dict[str, Any]]:
        return ready(), dict(readiness())

    return probe_app(readiness=dispatcher_readiness, registry=registry)
