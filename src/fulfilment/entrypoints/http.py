"""HTTP endpoints beside the worker: liveness, readiness and Prometheus metrics.

Liveness says only that the process serves HTTP: restarting a pod because the broker or the
database is down would not bring them back. Readiness says whether this replica is doing its
job: the broker connection is up (checked by value: ``broker.ping`` returns a bool and never
raises), the consumer is attached to the queue, and PostgreSQL answers.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from faststream.asgi import AsgiResponse, get
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

if TYPE_CHECKING:
    from faststream.asgi.handlers import HttpHandler
    from faststream.asgi.types import ASGIApp

READINESS_CHECK_SECONDS = 2.0
"""Time each readiness check may take; the Kubernetes probe's own timeout must be larger."""


def health_routes(
    *,
    broker_connected: Callable[[float], Awaitable[bool]],
    consumer_attached: Callable[[], bool],
    database_ping: Callable[[], Awaitable[None]],
    registry: CollectorRegistry,
) -> list[tuple[str, ASGIApp]]:
    """Routes ``/health/live``, ``/health/ready`` and ``/metrics``.

    ``/health/ready`` answers 200 with ``{"broker": true, "consumer": true, "database": true}``
    when all hold and 503 with the same shape otherwise.
    """

    @get(include_in_schema=False)
    async def live(_scope: object) -> AsgiResponse:
        return AsgiResponse(b'{"status": "ok"}', 200, headers={"content-type": "application/json"})

    @get(include_in_schema=False)
    async def ready(_scope: object) -> AsgiResponse:
        checks = {
            "broker": await broker_connected(READINESS_CHECK_SECONDS),
            "consumer": consumer_attached(),
            "database": await _answers(database_ping),
        }
        status = 200 if all(checks.values()) else 503
        body = json.dumps(checks).encode()
        return AsgiResponse(body, status, headers={"content-type": "application/json"})

    @get(include_in_schema=False)
    async def metrics(_scope: object) -> AsgiResponse:
        return AsgiResponse(
            generate_latest(registry), 200, headers={"content-type": CONTENT_TYPE_LATEST}
        )

    routes: list[tuple[str, HttpHandler]] = [
        ("/health/live", live),
        ("/health/ready", ready),
        ("/metrics", metrics),
    ]
    return list(routes)


async def _answers(ping: Callable[[], Awaitable[None]]) -> bool:
    try:
        async with asyncio.timeout(READINESS_CHECK_SECONDS):
            await ping()
    except Exception:  # noqa: BLE001 - any failure of the check means "not ready", by value
        return False
    return True
