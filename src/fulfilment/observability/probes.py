"""The HTTP endpoints every process of the service serves: liveness, readiness and metrics.

The worker (``worker.health``), the relay and the dispatcher (``Pump.probe``) serve the same
paths, so their Deployments probe alike; each says what "ready" means for it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry, make_asgi_app

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

Readiness = Callable[[], Awaitable[tuple[bool, dict[str, Any]]]]
"""Whether the process is ready, and the body that says why (``{"broker": true, ...}``)."""


def probe_app(*, readiness: Readiness, registry: CollectorRegistry) -> ASGIApp:
    """An ASGI app serving ``GET /health/live``, ``GET /health/ready`` and ``GET /metrics``.

    ``/health/live`` always answers 200 ``{"status": "ok"}``: it says only that the process
    serves HTTP. ``/health/ready`` answers 200 when ``readiness()`` says ready, else 503, with
    its body as JSON. ``/metrics`` is ``registry`` in Prometheus' text format. Other paths
    answer 404. Each JSON answer is one line ending in a newline.
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
            ready, body = await readiness()
            await _json(send, 200 if ready else 503, body)
        else:
            await _json(send, 404, {"error": "not found"})

    return app


async def _json(send: Send, status: int, document: dict[str, Any]) -> None:
    # One line, newline-terminated: `curl /health/ready` in a terminal leaves the prompt on
    # a line of its own.
    body = json.dumps(document).encode() + b"\n"
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


class ProbeServer(uvicorn.Server):
    """uvicorn without signal handlers of its own: the process's root owns SIGTERM and SIGINT.

    The worker's FastStream app must see the signal first, so that it starts the broker's
    drain while the probes still answer; the relay finishes its batch in flight. Each root
    stops the server (``should_exit``) once its own work is done.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Install no signal handler (uvicorn's own would take SIGTERM from the root)."""
        yield
