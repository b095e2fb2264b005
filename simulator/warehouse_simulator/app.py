"""The simulated warehouse: its orders, its idempotency keys, its faults, and its ASGI app.

It speaks the API of docs/design.md's "The API it calls" (``POST {base}/fulfilment-orders``,
``POST {base}/fulfilment-orders/{id}/cancellations``, ``GET {base}/fulfilment-orders/{id}``,
the order with its shipments and the warehouse's own cancellations, 404 for an id it does not
hold, and ``GET {base}/inventory?after=<sku>&limit=<n>``, its shelves a page at a time) behind
the same token, rate cap and faults; its POSTs have the semantics of the IETF draft
"The Idempotency-Key HTTP Header Field":

- a key is bound to the fingerprint of its first request (method, path and body bytes); the
  same key with another fingerprint is answered 422 ``idempotency_key_reused``;
- while the first request of a key is processed, the same key is answered 409 ``in_flight``;
- once it has an answer, the same key and body get that answer again, a 201 replayed as 200
  with the same body (a refusal is replayed as it was);
- an injected 5xx or a 429 stores nothing: the warehouse did nothing, so the key is free again;
  a "timeout after commit" stores the answer and then stalls, so the retry is a replay.

A reference (the service's order id) already created under another key is answered 409
``duplicate_reference`` with the warehouse's id. An order is "picked" ``pick_delay_seconds``
after it was created; from then on (or once the warehouse began shipping it) a cancellation is
answered 409 ``too_late``.

The admin endpoints under ``/_simulator/`` (no token) let a test or an operator read the orders
and the counts and change the knobs at run time; :class:`WarehouseSimulator` is the same for
in-process use.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import random
import time
import urllib.parse
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from warehouse_simulator.asgi import (
    Receive,
    Reply,
    Scope,
    Send,
    json_object,
    lifespan,
    order_lines,
    read_body,
    reply,
)
from warehouse_simulator.knobs import Faults
from warehouse_simulator.orders import Cancellation, Order
from warehouse_simulator.shipping import Floor
from warehouse_simulator.stock import DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT, RATE_KNOBS, Shelves
from warehouse_simulator.webhooks import WebhookSender

ORDERS_PATH = "/fulfilment-orders"
"""Path of the orders, under the base path (``--base-path``, ``/api/v1`` by default)."""

INVENTORY_PATH = "/inventory"
"""Path of the shelves' on-hand counts, under the base path."""

ADMIN_PATH = "/_simulator"
"""Path of the admin endpoints (orders, cancellations, stats, faults), outside the base."""

EARLY_GRACE_SECONDS = 0.05
"""A request that arrives within this long after a 429 was sent is not counted as sent before
its ``Retry-After`` ended: the client may have sent it before the 429 reached it."""


@dataclass
class Stored:
    """What the warehouse keeps per idempotency key: the fingerprint and, once done, the answer."""

    fingerprint: str
    status: int | None = None
    body: bytes = b""


class WarehouseSimulator:
    """The warehouse's state and its ASGI app (:meth:`__call__`).

    Args:
        faults: the knobs (a new :class:`Faults` when None).
        base_path: where the API lives, e.g. ``/api/v1`` (the service's
            ``FULFILMENT_WAREHOUSE_URL`` is the server's address plus this).
        seed: seed of the random choices of the fault knobs, the splits and the carriers.
        webhook_concurrency: most webhook attempts in flight at once.
    """

    def __init__(
        self,
        faults: Faults | None = None,
        *,
        base_path: str = "/api/v1",
        seed: int | None = None,
        webhook_concurrency: int = 8,
    ) -> None:
        self.faults = faults or Faults()
        self.base_path = base_path.rstrip("/")
        self.orders: dict[str, Order] = {}
        self.cancellations: list[Cancellation] = []
        self._by_reference: dict[str, str] = {}
        self._keys: dict[str, Stored] = {}
        self._random = random.Random(seed)  # noqa: S311 - fault injection, not cryptography
        self._recent: deque[float] = deque()
        self._retry_after_until = 0.0
        self._retry_after_sent_at = 0.0
        self.requests_per_second: Counter[int] = Counter()
        """API requests by the whole second (``int(time.time())``) they arrived in."""
        self.statuses: Counter[int] = Counter()
        """API answers by status code."""
        self.connections: set[tuple[str, int]] = set()
        """Client addresses (host, port) seen: one per TCP connection."""
        self.early_requests = 0
        """API requests that arrived while a ``Retry-After`` the warehouse gave had not ended
        (beyond :data:`EARLY_GRACE_SECONDS` after it was sent)."""
        self.requests_total = 0
        self.on_refuse: Callable[[float], None] | None = None
        """Called with the seconds of an outage in ``refuse`` mode (set by the server)."""
        self.webhooks = WebhookSender(self.faults, self._random, concurrency=webhook_concurrency)
        """The sender of the webhooks, and their record."""
        self.shelves = Shelves(self.faults, self._random, self.webhooks.emit)
        """The warehouse's stock: on hand per SKU kept, its adjustments and their record."""
        self.floor = Floor(
            self.faults, self.orders, self._random, self.webhooks.emit, self.shelves.take
        )
        """The warehouse's work: its shipments and cancellations, and their record."""

    # -- in-process API -----------------------------------------------------------------------

    def go_down(self, seconds: float, *, mode: Literal["503", "refuse"] = "503") -> None:
        """Be down for ``seconds``: answer 503, or refuse connections (``mode="refuse"``)."""
        self.faults.down_mode = mode
        self.faults.down_until = time.monotonic() + seconds
        if mode == "refuse" and self.on_refuse is not None:
            self.on_refuse(seconds)

    def order_by_reference(self, reference: str) -> Order | None:
        """The order created for ``reference`` (the service's order id), or None."""
        order_id = self._by_reference.get(reference)
        return self.orders[order_id] if order_id else None

    def load_stock(self, levels: dict[str, int]) -> None:
        """Set the on hand of SKUs (``POST /_simulator/inventory``), and start the adjustments.

        Raises:
            ValueError: a bad SKU or level (:meth:`~.stock.Shelves.load`).
        """
        self.shelves.load(levels)
        self.shelves.start()

    async def close(self) -> None:
        """Stop the warehouse's work, its adjustments and its webhooks."""
        await self.shelves.close()
        await self.floor.close()
        await self.webhooks.close()

    async def settled(self, timeout: float = 30.0) -> None:  # noqa: ASYNC109 - a test's wait
        """Wait until the warehouse has no work due and no webhook in flight.

        Raises:
            TimeoutError: it still has after ``timeout`` seconds.
        """
        async with asyncio.timeout(timeout):
            while self.floor.pending or self.webhooks.in_flight:
                await self.floor.idle()
                await self.webhooks.drained()

    def record(self) -> dict[str, Any]:
        """What the warehouse did and said: ``GET /_simulator/webhooks``.

        ``shipments``, ``cancellations`` and ``adjustments``: every one made (the webhooks'
        ``data``), sent or not; ``webhooks``: every webhook with its ``cause``, ``fate`` and
        attempts (each with its ``webhook-timestamp`` and the answer's status or error);
        ``counts``: webhooks by fate, and attempts; ``work_pending`` and ``in_flight``: steps
        of work not done yet and webhooks not finished (both 0: the warehouse has settled).
        """
        return {
            "shipments": self.floor.shipments,
            "cancellations": self.floor.cancellations,
            "adjustments": self.shelves.adjustments,
            "webhooks": self.webhooks.document(),
            "counts": self.webhooks.counts(),
            "work_pending": self.floor.pending,
            "in_flight": self.webhooks.in_flight,
        }

    def max_requests_per_second(self) -> int:
        """The most API requests that arrived within one whole second (0 before any)."""
        return max(self.requests_per_second.values(), default=0)

    def stats(self) -> dict[str, Any]:
        """The counts as JSON: requests, per second, statuses, connections, early requests."""
        return {
            "requests_total": self.requests_total,
            "requests_per_second": {
                str(second): count for second, count in sorted(self.requests_per_second.items())
            },
            "max_requests_per_second": self.max_requests_per_second(),
            "statuses": {str(status): count for status, count in sorted(self.statuses.items())},
            "connections": len(self.connections),
            "early_requests": self.early_requests,
            "orders": len(self.orders),
            "cancellations": len(self.cancellations),
            "shipments_made": len(self.floor.shipments),
            "warehouse_cancellations": len(self.floor.cancellations),
            "adjustments_made": len(self.shelves.adjustments),
            "webhooks": self.webhooks.counts(),
        }

    # -- the API ------------------------------------------------------------------------------

    async def handle(  # noqa: PLR0911 - one return per refusal, then one per route
        self, method: str, path: str, headers: dict[str, str], body: bytes, query: str = ""
    ) -> Reply:
        """Answer one API request (``headers`` with lower-case names, ``query`` undecoded)."""
        now = time.monotonic()
        self.requests_total += 1
        self.requests_per_second[int(time.time())] += 1
        if now < self._retry_after_until and now > self._retry_after_sent_at + EARLY_GRACE_SECONDS:
            self.early_requests += 1
        if now < self.faults.down_until:
            return reply(503, {"error": "unavailable"})
        if self.faults.latency_seconds > 0:
            await asyncio.sleep(self.faults.latency_seconds)
        refused = self._refusal(now, headers)
        if refused is not None:
            return refused
        route = self._route(path)
        if route is None:
            return reply(404, {"error": "not_found"})
        kind, order_id = route
        if method != ("GET" if kind in {"inventory", "order"} else "POST"):
            return reply(405, {"error": "method_not_allowed"})
        if kind == "inventory":
            return self._inventory(query)
        if kind == "order":
            return self._show(order_id)
        return await self._post(method, path, headers, body, order_id)

    async def _post(
        self, method: str, path: str, headers: dict[str, str], body: bytes, order_id: str
    ) -> Reply:
        """A creation (``order_id`` empty) or a cancellation, under its idempotency key."""
        key = headers.get("idempotency-key", "")
        if not key:
            return reply(400, {"error": "idempotency_key_missing"})
        fingerprint = hashlib.sha256(f"{method} {path}\n".encode() + body).hexdigest()
        stored = self._keys.get(key)
        if stored is not None:
            if stored.fingerprint != fingerprint:
                return reply(422, {"error": "idempotency_key_reused"})
            if stored.status is None:
                return reply(409, {"error": "in_flight"})
            return Reply(200 if stored.status == 201 else stored.status, stored.body)  # noqa: PLR2004 - a replay of a creation is 200
        return await self._first(key, Stored(fingerprint), order_id, body, headers)

    def _show(self, order_id: str) -> Reply:
        """``GET {base}/fulfilment-orders/{id}``: the order, its shipments and cancellations."""
        order = self.orders.get(order_id)
        if order is None:
            return reply(404, {"error": "not_found"})
        return reply(200, order.document(picked=self.picked(order)))

    def _inventory(self, query: str) -> Reply:
        """``GET {base}/inventory?after=<sku>&limit=<n>``: a page of the SKUs kept.

        ``after`` (default: from the first SKU) and ``limit`` (default
        :data:`~.stock.DEFAULT_PAGE_LIMIT`, 1 to :data:`~.stock.MAX_PAGE_LIMIT`); a ``limit``
        that is no such integer is answered 400 ``invalid_limit``.
        """
        asked = urllib.parse.parse_qs(query, keep_blank_values=True)
        after = asked.get("after", [""])[-1]
        limit_text = asked.get("limit", [str(DEFAULT_PAGE_LIMIT)])[-1]
        if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_PAGE_LIMIT:
            return reply(400, {"error": "invalid_limit", "max": MAX_PAGE_LIMIT})
        return reply(200, self.shelves.page(after, int(limit_text)))

    def picked(self, order: Order) -> bool:
        """Whether ``order`` was picked: ``pick_delay_seconds`` passed since its creation."""
        pick_delay = self.faults.pick_delay_seconds
        return pick_delay is not None and time.monotonic() - order.created_at >= pick_delay

    def _refusal(self, now: float, headers: dict[str, str]) -> Reply | None:
        """401/403 for the token, 429 above the rate, an injected 503; None: go on."""
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return reply(401, {"error": "unauthenticated"}, (b"www-authenticate", b"Bearer"))
        if token != self.faults.token:
            return reply(403, {"error": "forbidden"})
        limited = self._rate_limited(now)
        if limited is not None:
            return limited
        if self._random.random() < self.faults.error_rate:
            return reply(503, {"error": "unavailable"})
        return None

    async def _first(
        self, key: str, stored: Stored, order_id: str, body: bytes, headers: dict[str, str]
    ) -> Reply:
        """Do the work of a key's first request, store its answer, and answer."""
        self._keys[key] = stored
        try:
            # The work yields at least once, as a real warehouse's would, so that a second
            # request with the same key can find it in flight.
            await asyncio.sleep(self.faults.work_seconds)
            if not order_id:
                answer = self._create(key, body, headers.get("traceparent"))
            else:
                answer = self._cancel(key, order_id, body)
        except BaseException:
            del self._keys[key]
            raise
        stored.status, stored.body = answer.status, answer.body
        if self._random.random() < self.faults.stall_after_commit_rate:
            await asyncio.sleep(self.faults.stall_seconds)
        return answer

    def _route(self, path: str) -> tuple[str, str] | None:
        """``("orders" | "inventory", "")``, ``("order" | "cancellations", id)``; None: no route."""
        rest = path.removeprefix(self.base_path)
        if rest == path and self.base_path:
            return None
        if rest in {ORDERS_PATH, INVENTORY_PATH}:
            return (rest.removeprefix("/").removeprefix("fulfilment-"), "")
        if not rest.startswith(ORDERS_PATH + "/"):
            return None
        parts = rest.removeprefix(ORDERS_PATH + "/").split("/")
        if len(parts) == 1 and parts[0]:
            return ("order", parts[0])
        if len(parts) == 2 and parts[0] and parts[1] == "cancellations":  # noqa: PLR2004 - {id}/cancellations
            return ("cancellations", parts[0])
        return None

    def _rate_limited(self, now: float) -> Reply | None:
        faults = self.faults
        if faults.rate_limit_per_second is None:
            return None
        while self._recent and self._recent[0] <= now - 1.0:
            self._recent.popleft()
        if now >= self._retry_after_until and len(self._recent) < faults.rate_limit_per_second:
            self._recent.append(now)
            return None
        if now >= self._retry_after_until:
            self._retry_after_until = now + faults.retry_after_seconds
            self._retry_after_sent_at = now
        left = self._retry_after_until - now
        if faults.retry_after_format == "http-date":
            # An HTTP date has whole seconds: round up, so that it never ends early.
            value = email.utils.formatdate(time.time() + left + 1, usegmt=True)
        else:
            value = f"{max(left, 0.001):.3f}".rstrip("0").rstrip(".")
        return reply(429, {"error": "rate_limited"}, (b"retry-after", value.encode()))

    def _create(self, key: str, body: bytes, traceparent: str | None) -> Reply:
        document = json_object(body)
        if document is None:
            return reply(400, {"error": "malformed_json"})
        reference = document.get("reference")
        lines = order_lines(document.get("lines"))
        if not isinstance(reference, str) or not reference or not lines:
            return reply(422, {"error": "invalid_order"})
        if not isinstance(document.get("requested_at"), str):
            return reply(422, {"error": "invalid_order", "detail": "requested_at"})
        refused = sorted({line["sku"] for line in lines} & self.faults.refused_skus)
        if refused:
            return reply(422, {"error": "sku_not_stocked", "sku": refused[0]})
        existing = self._by_reference.get(reference)
        if existing is not None:
            return reply(409, {"error": "duplicate_reference", "id": existing})
        order_id = f"WH-{len(self.orders) + 1:06d}"
        remaining = Counter[str]()
        for line in lines:
            remaining[line["sku"]] += line["quantity"]
        order = Order(
            order_id, reference, lines, key, time.monotonic(), traceparent, dict(remaining)
        )
        self.orders[order_id] = order
        self._by_reference[reference] = order_id
        self.floor.received(order)
        return reply(201, {"id": order_id, "status": "received"})

    def _cancel(self, key: str, order_id: str, body: bytes) -> Reply:
        order = self.orders.get(order_id)
        if order is None:
            return reply(404, {"error": "not_found"})
        document = json_object(body) if body else {}
        if document is None:
            return reply(400, {"error": "malformed_json"})
        asked = document.get("lines")
        lines = None if asked is None else order_lines(asked)
        if asked is not None and not lines:
            return reply(422, {"error": "invalid_cancellation"})
        if self.picked(order) or order.started:
            self.cancellations.append(Cancellation(order_id, lines, key, "too_late"))
            return reply(409, {"error": "too_late"})
        if lines is None:
            order.remaining = {}
        else:
            if any(line["quantity"] > order.remaining.get(line["sku"], 0) for line in lines):
                return reply(422, {"error": "more_than_ordered"})
            for line in lines:
                order.remaining[line["sku"]] -= line["quantity"]
            order.remaining = {sku: q for sku, q in order.remaining.items() if q}
        status = "partially_cancelled" if order.remaining else "cancelled"
        self.cancellations.append(Cancellation(order_id, lines, key, status))
        return reply(201, {"status": status})

    # -- ASGI ---------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI app: the API under ``base_path`` and the admin endpoints."""
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        client = scope.get("client")
        if client:
            self.connections.add((client[0], client[1]))
        body = await read_body(receive)
        if body is None:
            return
        path: str = scope["path"]
        method: str = scope["method"]
        if path.startswith(ADMIN_PATH + "/"):
            answer = self._admin(method, path.removeprefix(ADMIN_PATH + "/"), body)
        else:
            headers = {
                name.decode("latin-1").lower(): value.decode("latin-1")
                for name, value in scope["headers"]
            }
            query = scope.get("query_string", b"").decode("latin-1")
            answer = await self.handle(method, path, headers, body, query)
            self.statuses[answer.status] += 1
        await send(
            {
                "type": "http.response.start",
                "status": answer.status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", b"%d" % len(answer.body)),
                    *answer.headers,
                ],
            }
        )
        await send({"type": "http.response.body", "body": answer.body})

    def _admin(self, method: str, name: str, body: bytes) -> Reply:
        changes = {
            "faults": self._change_faults,
            "inventory": self._load_stock,
            "adjustments": self._adjust,
        }
        if method == "POST" and name in changes:
            return changes[name](body)
        if method == "GET" and name == "orders":
            return reply(
                200,
                {
                    "orders": [asdict(order) for order in self.orders.values()],
                    "cancellations": [asdict(c) for c in self.cancellations],
                },
            )
        if method == "GET" and name == "stats":
            return reply(200, self.stats())
        if method == "GET" and name == "webhooks":
            return reply(200, self.record())
        if name == "faults" and method == "GET":
            return reply(200, self.faults.document())
        return reply(404, {"error": "not_found"})

    def _change_faults(self, body: bytes) -> Reply:
        changes = json_object(body)
        if changes is None:
            return reply(400, {"error": "malformed_json"})
        try:
            self.faults.update(changes)
        except (TypeError, ValueError) as error:
            return reply(400, {"error": str(error)})
        if "webhook_url" in changes:
            self.webhooks.reenable()
        if any(name in RATE_KNOBS for name in changes):
            self.shelves.start()
        if "work_held" in changes:
            self.floor.wake()
        if "down_for_seconds" in changes and self.faults.down_mode == "refuse":
            self.go_down(float(changes["down_for_seconds"]), mode="refuse")
        return reply(200, self.faults.document())

    def _load_stock(self, body: bytes) -> Reply:
        """``POST /_simulator/inventory`` ``{"levels": {"<sku>": <on hand>, ...}}``: no webhook."""
        document = json_object(body)
        levels = None if document is None else document.get("levels")
        if not isinstance(levels, dict):
            return reply(400, {"error": "levels must be an object of SKU to on hand"})
        try:
            self.load_stock(levels)
        except ValueError as error:
            return reply(400, {"error": str(error)})
        return reply(200, self.shelves.page("", len(self.shelves.on_hand) or 1))

    def _adjust(self, body: bytes) -> Reply:
        """``POST /_simulator/adjustments`` ``{"sku", "delta", "reason"}``: one adjustment now.

        201 with its ``data`` (its webhook is on its way); 400 when it cannot be made.
        """
        document = json_object(body)
        if document is None:
            return reply(400, {"error": "malformed_json"})
        try:
            # Shelves.adjust checks the values' types: a wrong one is a ValueError (400).
            data = self.shelves.adjust(
                document.get("sku", ""), document.get("delta", 0), document.get("reason", "")
            )
        except ValueError as error:
            return reply(400, {"error": str(error)})
        return reply(201, data)
