"""HTTP endpoints beside the worker: liveness, readiness and Prometheus metrics.

Liveness says only that the process serves HTTP: restarting a pod because the broker or the
database is down would not bring them back. Readiness says whether this replica is doing its
job: the broker connection is up (checked by value: FastStream's ``broker.ping`` returns a
bool and never raises), every consumer is attached to its queue, and PostgreSQL answers.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from prometheus_client import CollectorRegistry, make_asgi_app

READINESS_CHECK_SECONDS = 2.0
"""Time each readiness check may take; the Kubernetes probe's own timeout must be larger."""

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def health_app(
    *,
    broker_connected: Callable[[float], Awaitable[bool]],
    consumer_attached: Callable[[], bool],
    database_ping: Callable[[], Awaitable[None]],
    registry: CollectorRegistry,
) -> ASGIApp:
    """An ASGI app serving ``GET /health/live``, ``GET /health/ready`` and ``GET /metrics``.

    ``/health/ready`` answers 200 with ``{"broker": true, "consumer": true, "database": true}``
    when all hold, and 503 with the same shape otherwise; other paths answer 404.
    """
    metrics = make_asgi_app(registry)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path == "/metrics":
            await metrics(scope, receive, send)
        elif path == "/health/live":
            await _json(send, 200, {"status": "ok"})
        elif path == "/health/ready":
            checks = {
                "broker": await broker_connected(READINESS_CHECK_SECONDS),
                "consumer": consumer_attached(),
                "database": await _answers(database_ping),
            }
            await _json(send, 200 if all(checks.values()) else 503, checks)
        else:
            await _json(send, 404, {"error": "not found"})

    return app


async def _json(send: Send, status: int, document: dict[str, Any]) -> None:
    body = json.dumps(document).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(body)),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _answers(ping: Callable[[], Awaitable[None]]) -> bool:
    try:
        async with asyncio.timeout(READINESS_CHECK_SECONDS):
            await ping()
    except Exception:  # noqa: BLE001 - any failure of the check means "not ready", by value
        return False
    return True
