"""HTTP endpoints beside the relay: liveness, readiness and Prometheus metrics.

The same paths as the worker's (``worker.health``), so both Deployments probe alike. Liveness
says only that the process serves HTTP. Readiness says that the relay is connected to RabbitMQ
and PostgreSQL and is either publishing (it holds the advisory lock) or standing by for it: a
standby replica is ready, since it is doing its job, which is to wait.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from prometheus_client import CollectorRegistry, make_asgi_app

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def relay_health_app(
    *,
    readiness: Callable[[], dict[str, bool | str]],
    ready: Callable[[], bool],
    registry: CollectorRegistry,
) -> ASGIApp:
    """An ASGI app serving ``GET /health/live``, ``GET /health/ready`` and ``GET /metrics``.

    ``/health/ready`` answers 200 when ``ready()``, else 503, with ``readiness()`` as its body
    (``{"broker": true, "database": true, "role": "standby"}``); other paths answer 404.
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
            await _json(send, 200 if ready() else 503, readiness())
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
