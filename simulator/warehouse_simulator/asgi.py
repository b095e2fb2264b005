"""The plain ASGI and JSON pieces of the simulator's HTTP answers.

No web framework: the simulator answers a handful of routes, and stays a small test tool.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class Reply:
    """An answer of the API: status, JSON body, extra headers."""

    status: int
    body: bytes
    headers: tuple[tuple[bytes, bytes], ...] = ()


def reply(status: int, document: dict[str, Any], *headers: tuple[bytes, bytes]) -> Reply:
    """An answer with ``document`` as compact JSON."""
    return Reply(status, json.dumps(document, separators=(",", ":")).encode(), headers)


def json_object(body: bytes) -> dict[str, Any] | None:
    """``body`` as a JSON object; None when it is not JSON or not an object."""
    with contextlib.suppress(ValueError):
        document = json.loads(body)
        if isinstance(document, dict):
            return document
    return None


def order_lines(value: object) -> list[dict[str, Any]] | None:
    """``[{"sku": str, "quantity": int > 0}, ...]`` (non-empty), or None when it is not."""
    if not isinstance(value, list) or not value:
        return None
    lines = []
    for line in value:
        if not isinstance(line, dict):
            return None
        sku, quantity = line.get("sku"), line.get("quantity")
        if not isinstance(sku, str) or not sku or type(quantity) is not int or quantity <= 0:
            return None
        lines.append({"sku": sku, "quantity": quantity})
    return lines


async def read_body(receive: Receive) -> bytes | None:
    """The request's whole body; None when the client went away before sending all of it.

    A server handles a request only once its body is complete: one cut off (a client killed
    between writing its headers and its body) was never sent, and must neither create an
    order nor bind its idempotency key to the part that arrived.
    """
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def lifespan(receive: Receive, send: Send) -> None:
    """Answer the ASGI lifespan messages (nothing to start or stop)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
