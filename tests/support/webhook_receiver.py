"""A receiver of the warehouse's webhooks for the tests: uvicorn on a real socket.

It verifies each request with the ``standardwebhooks`` package (its fixed 5-minute tolerance:
a stale timestamp is refused), answers what the test scripted (:attr:`WebhookReceiver.answers`,
then 204), and keeps every request (:class:`Received`). Like an intake, it applies a verified
webhook once per ``webhook-id`` and once per shipment, cancellation or adjustment id
(:attr:`WebhookReceiver.applied`), so a test can say "every change applied once".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections import Counter, deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import standardwebhooks
import uvicorn

PATH = "/webhooks/warehouse"


@dataclass(frozen=True)
class Received:
    """One request: its headers, body, whether it verified, and the status answered."""

    webhook_id: str
    timestamp: str
    signature: str
    body: bytes
    verified: bool
    status: int

    @property
    def document(self) -> dict[str, Any]:
        """The body as JSON."""
        document: dict[str, Any] = json.loads(self.body)
        return document

    @property
    def subject(self) -> str:
        """The shipment's, cancellation's or adjustment's id."""
        data = self.document["data"]
        return str(
            data.get("shipment_id") or data.get("cancellation_id") or data.get("adjustment_id")
        )


@dataclass
class WebhookReceiver:
    """The ASGI app: ``POST /webhooks/warehouse``, verified with ``secrets``.

    Attributes:
        answers: statuses to answer the next verified requests with, in turn (then 204).
        stall_seconds: how long the next ``stalls`` verified requests wait before answering.
    """

    secrets: tuple[str, ...]
    answers: deque[int] = field(default_factory=deque)
    stalls: int = 0
    stall_seconds: float = 0.0
    received: list[Received] = field(default_factory=list)
    applied: Counter[str] = field(default_factory=Counter)
    """Verified webhooks applied, by shipment, cancellation or adjustment id (once per webhook
    id)."""
    _ids: set[str] = field(default_factory=set)

    def verified(self) -> list[Received]:
        """The requests that verified."""
        return [request for request in self.received if request.verified]

    def verify(self, body: bytes, headers: dict[str, str]) -> bool:
        """Whether ``body`` and ``headers`` verify with one of the secrets (the package's way)."""
        for secret in self.secrets:
            try:
                standardwebhooks.Webhook(secret).verify(body, headers, json_parse=False)
            # The package raises ValueError (and its binascii.Error, UnicodeDecodeError) on
            # malformed headers or bodies, not only its own error.
            except (standardwebhooks.WebhookVerificationError, ValueError):
                continue
            return True
        return False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        headers = {name.decode().lower(): value.decode() for name, value in scope["headers"]}
        status = self._answer(scope["method"], scope["path"], body, headers)
        if status < 400 and self.stalls > 0:
            self.stalls -= 1
            await asyncio.sleep(self.stall_seconds)
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    def _answer(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> int:
        if method != "POST" or path != PATH:
            return 404
        verified = self.verify(body, headers)
        status = 401
        if verified:
            status = self.answers.popleft() if self.answers else 204
        self.received.append(
            Received(
                headers.get("webhook-id", ""),
                headers.get("webhook-timestamp", ""),
                headers.get("webhook-signature", ""),
                body,
                verified,
                status,
            )
        )
        if verified and 200 <= status < 300 and headers["webhook-id"] not in self._ids:
            self._ids.add(headers["webhook-id"])
            subject = self.received[-1].subject
            if subject not in self.applied:
                self.applied[subject] += 1
            else:
                # A change seen again under a new webhook id: counted apart, never applied.
                self.applied[f"again:{subject}"] += 1
        return status


class _QuietServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def serving(receiver: WebhookReceiver) -> AsyncIterator[str]:
    """Serve ``receiver`` on a free port of 127.0.0.1; yield its webhook URL."""
    listening = socket.create_server(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    server = _QuietServer(
        uvicorn.Config(
            receiver,
            lifespan="off",
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=1,
        )
    )
    task = asyncio.create_task(server.serve(sockets=[listening]))
    try:
        while not server.started:
            if task.done():
                await task
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}{PATH}"
    finally:
        server.should_exit = True
        await task
