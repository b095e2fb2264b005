"""HTTP endpoints beside the worker: liveness, readiness and Prometheus metrics.

Liveness says only that the process serves HTTP: restarting a pod because the broker or the
database is down would not bring them back. Readiness says whether this replica is doing its
job: the broker connection is up (checked by value: FastStream's ``broker.ping`` returns a
bool and never raises), every consumer is attached to its queue, and PostgreSQL answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CollectorRegistry

from fulfilment.observability.probes import ASGIApp, probe_app

READINESS_CHECK_SECONDS = 2.0
"""Time each readiness check may take; the Kubernetes probe's own timeout must be larger."""


def health_app(
    *,
    broker_connected: Callable[[float], Awaitable[bool]],
    consumer_attached: Callable[[], bool],
    database_ping: Callable[[], Awaitable[None]],
    registry: CollectorRegistry,
) -> ASGIApp:
    """An ASGI app serving ``GET /health/live``, ``GET /health/ready`` and ``GET /metrics``.

    ``/health/ready`` answers 200 with ``{"broker": true, "consumer": true, "database": true}``
    when all hold, and 503 with the same shape otherwise; other paths answer 404
    (``observability.probes``).
    """

    async def readiness() -> tuple[bool, dict[str, Any]]:
        checks = {
            "broker": await broker_connected(READINESS_CHECK_SECONDS),
            "consumer": consumer_attached(),
            "database": await _answers(database_ping),
        }
        return all(checks.values()), checks

    return probe_app(readiness=readiness, registry=registry)


async def _answers(ping: Callable[[], Awaitable[None]]) -> bool:
    try:
        async with asyncio.timeout(READINESS_CHECK_SECONDS):
            await ping()
    except Exception:  # noqa: BLE001 - any failure of the check means "not ready", by value
        return False
    return True
