"""The benchmark's orders: real SKUs of the Online Retail data, 1 to 3 lines each, and publishing.

Also the warehouse's side: its ``inventory.adjusted`` webhooks (receipts and small losses of
the same SKUs), signed as the warehouse signs them, and sent at a steady rate.

Orders are made, not replayed: the data's invoices have up to 675 lines and the issue's
reference figures are for orders of 1 to 3 lines over 1,000 SKUs. So the workload takes the
1,000 SKUs that appear on most invoices of the given files and draws each order's lines (distinct
SKUs, each with a quantity the shop really sold of it) with a seeded generator: the same
arguments give the same orders, byte for byte, for the worker and the reference consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import random
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Generic, Protocol, TypeVar

import aio_pika
import httpx
from standardwebhooks import Webhook

from fulfilment.dataset.online_retail import csv_files, read_orders
from fulfilment.domain.warehouse_events import AdjustmentReason

SKU_COUNT = 1_000
"""SKUs the orders draw from (the issue's reference figures use 1,000)."""

MAX_LINES_PER_ORDER = 3
"""Each order has 1 to this many lines, uniformly (the reference figures use 1 to 3)."""

ON_HAND = 1_000_000_000
"""Units of every SKU: enough that no order of a run is rejected for insufficient stock."""

PLACED_AT = datetime(2010, 12, 1, 8, 26, tzinfo=UTC)
"""``placed_at`` of backlog orders (their latency is not measured)."""


@dataclass(frozen=True, slots=True)
class Order:
    """One ``OrderPlaced`` of the workload; ``lines`` are ``(sku, quantity)`` with distinct SKUs."""

    event_id: uuid.UUID
    order_id: uuid.UUID
    lines: tuple[tuple[str, int], ...]
    traceparent: str | None = None
    """The producer's W3C trace context, sent as the ``traceparent`` header; None: no header."""

    def body(self, placed_at: datetime = PLACED_AT) -> bytes:
        """The UTF-8 JSON body of the product contract (``version`` 1)."""
        return json.dumps(
            {
                "version": 1,
                "event_id": str(self.event_id),
                "order_id": str(self.order_id),
                "placed_at": placed_at.isoformat(),
                "lines": [{"sku": sku, "quantity": quantity} for sku, quantity in self.lines],
            },
            separators=(",", ":"),
        ).encode()


@dataclass(frozen=True, slots=True)
class Workload:
    """The SKUs with their stock, and ``make_orders`` to draw orders from them."""

    skus: tuple[str, ...]
    quantities: dict[str, tuple[int, ...]]

    def stock(self) -> dict[str, int]:
        """``on_hand`` per SKU: :data:`ON_HAND` each."""
        return dict.fromkeys(self.skus, ON_HAND)

    def make_orders(
        self, count: int, *, seed: int, namespace: str, traceparent_sampled: float | None = None
    ) -> list[Order]:
        """``count`` orders drawn with ``seed``; ids are UUIDv5 of ``namespace`` and the index.

        With ``traceparent_sampled`` (0 to 1) each order also gets a ``traceparent`` of a trace
        of its own, sampled with that probability, as a traced producer sends it; its own
        random stream, so the orders' lines are the same with it as without.
        """
        rng = random.Random(seed)
        traces = random.Random(f"{seed}:{namespace}:traceparent")
        space = uuid.uuid5(uuid.NAMESPACE_URL, f"fulfilment-bench:{namespace}")
        orders = []
        for index in range(count):
            skus = rng.sample(self.skus, rng.randint(1, MAX_LINES_PER_ORDER))
            orders.append(
                Order(
                    event_id=uuid.uuid5(space, f"event:{index}"),
                    order_id=uuid.uuid5(space, f"order:{index}"),
                    lines=tuple((sku, rng.choice(self.quantities[sku])) for sku in skus),
                    traceparent=None
                    if traceparent_sampled is None
                    else producer_traceparent(
                        traces, sampled=traces.random() < traceparent_sampled
                    ),
                )
            )
        return orders


def producer_traceparent(rng: random.Random, *, sampled: bool) -> str:
    """A W3C ``traceparent`` (version 00) of a new trace: random non-zero ids, the flag given."""
    trace_id = rng.getrandbits(128) or 1
    span_id = rng.getrandbits(64) or 1
    return f"00-{trace_id:032x}-{span_id:016x}-{int(sampled):02x}"


def load_workload(data: Path) -> Workload:
    """The :data:`SKU_COUNT` SKUs on most invoices of the Online Retail files in ``data``.

    Quantities per SKU are the positive quantities the files hold for it, each capped at 100
    so that a rare wholesale line does not dominate a SKU's demand.

    Raises:
        SystemExit: the files hold fewer than :data:`SKU_COUNT` distinct SKUs.
        fulfilment.dataset.online_retail.OnlineRetailError: a file cannot be read.
    """
    result = read_orders(csv_files(data))
    invoices: Counter[str] = Counter()
    quantities: defaultdict[str, list[int]] = defaultdict(list)
    for order in result.orders:
        invoices.update({sku for sku, _ in order.lines})
        for sku, quantity in order.lines:
            quantities[sku].append(min(quantity, 100))
    if len(invoices) < SKU_COUNT:
        msg = f"{data}: {len(invoices)} distinct SKUs, the benchmark needs {SKU_COUNT}"
        raise SystemExit(msg)
    # Ties are broken by code point, so the choice does not depend on file order.
    ranked = sorted(invoices, key=lambda sku: (-invoices[sku], sku))[:SKU_COUNT]
    return Workload(
        skus=tuple(sorted(ranked)),
        quantities={sku: tuple(quantities[sku]) for sku in ranked},
    )


PUBLISH_WINDOW = 500
"""Publishes awaiting their confirm at once while filling a backlog."""


async def publish_backlog(
    connection: aio_pika.abc.AbstractConnection,
    *,
    exchange: str,
    routing_key: str,
    orders: Sequence[Order],
) -> float:
    """Publish ``orders`` persistently, confirmed, ``mandatory``; return the seconds it took.

    Raises:
        aio_pika.exceptions.DeliveryError: the broker refused or could not route a message.
    """
    started = time.perf_counter()
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    try:
        target = await channel.get_exchange(exchange, ensure=False)
        window = asyncio.Semaphore(PUBLISH_WINDOW)

        async def one(order: Order) -> None:
            try:
                await target.publish(
                    _message(order.body(), order.traceparent),
                    routing_key=routing_key,
                    mandatory=True,
                )
            finally:
                window.release()

        async with asyncio.TaskGroup() as group:
            for order in orders:
                await window.acquire()
                group.create_task(one(order))
    finally:
        await channel.close()
    return time.perf_counter() - started


@dataclass(frozen=True, slots=True)
class SteadyPublish:
    """What :func:`publish_steadily` did: its rate and how long the broker took to confirm."""

    rate: float
    """Messages per second achieved over the whole schedule."""
    placed: list[float]
    """Per message, when it was stamped ``placed_at``, in seconds of the event loop's clock."""
    confirmed: list[float]
    """Per message, in the same order and clock, when the broker confirmed it: its own write of
    the order into its quorum queue, which the order's delivery to the worker cannot precede."""


async def publish_steadily(  # noqa: PLR0913 - the schedule's parts, each by name
    connection: aio_pika.abc.AbstractConnection,
    *,
    exchange: str,
    routing_key: str,
    orders: Sequence[Order],
    rate: float,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> SteadyPublish:
    """Publish ``orders`` at ``rate`` messages per second, each stamped ``placed_at`` = now.

    Messages are sent on schedule (the i-th at ``start + i / rate``), not after the previous
    confirm, so a slow consumer or broker shows up as latency rather than as a slower rate.
    """
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    placed: list[float] = []
    confirmed: list[float] = []
    try:
        target = await channel.get_exchange(exchange, ensure=False)
        loop = asyncio.get_running_loop()

        async def publish(body: bytes, traceparent: str | None, index: int) -> None:
            await target.publish(
                _message(body, traceparent), routing_key=routing_key, mandatory=True
            )
            confirmed[index] = loop.time()

        started = loop.time()
        async with asyncio.TaskGroup() as group:
            for index, order in enumerate(orders):
                delay = started + index / rate - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                placed.append(loop.time())
                confirmed.append(math.nan)
                body = order.body(placed_at=clock())
                group.create_task(publish(body, order.traceparent, index))
        elapsed = loop.time() - started
    finally:
        await channel.close()
    return SteadyPublish(
        rate=len(orders) / elapsed if elapsed > 0 else float("nan"),
        placed=placed,
        confirmed=confirmed,
    )


def _message(body: bytes, traceparent: str | None) -> aio_pika.Message:
    return aio_pika.Message(
        body,
        content_type="application/json",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        headers={"traceparent": traceparent} if traceparent else None,
    )


# --- the warehouse's webhooks ---------------------------------------------------------------

RECEIPT_UNITS = (1, 24)
"""Units of one receipt (``received``), the least and the most."""
RETURN_UNITS = (1, 2)
"""Units of one return (``returned``)."""
LOSS_UNITS = (1, 3)
"""Units of one loss (``damaged`` or ``lost``): small, as a shelf's breakage is."""
LOSS_SHARE = 0.4
"""Share of the adjustments that are losses, where the SKU's own receipts cover them."""
RETURN_SHARE = 0.2
"""Share of the gains that are returns rather than receipts."""


class Signable(Protocol):
    """Something the warehouse sends as a webhook: its body at the moment it is sent."""

    def body(self, sent_at: datetime) -> bytes:
        """The webhook's UTF-8 JSON body, stamped ``sent_at``."""
        ...


@dataclass(frozen=True, slots=True)
class Adjustment:
    """One ``inventory.adjusted`` of the warehouse: ``delta`` units of ``sku`` for ``reason``."""

    adjustment_id: str
    sku: str
    delta: int
    reason: str

    def body(self, sent_at: datetime) -> bytes:
        """The webhook's UTF-8 JSON body (``WebhookEnvelope`` with an ``InventoryAdjustmentV1``)."""
        return json.dumps(
            {
                "type": "inventory.adjusted",
                "timestamp": sent_at.isoformat(),
                "data": {
                    "adjustment_id": self.adjustment_id,
                    "sku": self.sku,
                    "delta": self.delta,
                    "reason": self.reason,
                    "occurred_at": sent_at.isoformat(),
                },
            },
            separators=(",", ":"),
        ).encode()


def plan_adjustments(skus: Sequence[str], *, seed: int, namespace: str) -> Iterator[Adjustment]:
    """Adjustments of ``skus`` drawn with ``seed``, without end: receipts and small losses.

    Each names a SKU drawn uniformly from ``skus``. With probability :data:`LOSS_SHARE` it is
    a loss (``damaged`` or ``lost``, :data:`LOSS_UNITS`) if the SKU's adjustments so far have
    added at least as many units, else a gain (``received``, :data:`RECEIPT_UNITS`, or with
    probability :data:`RETURN_SHARE` ``returned``, :data:`RETURN_UNITS`). So at every point
    of the sequence each SKU's deltas add up to 0 or more: the stock it started with is never
    taken, and orders reserved from it meet at least as much. ``adjustment_id`` is
    ``ADJ-`` and a UUIDv5 of ``namespace`` and the index.
    """
    rng = random.Random(seed)
    space = uuid.uuid5(uuid.NAMESPACE_URL, f"fulfilment-bench:{namespace}")
    net: Counter[str] = Counter()
    for index in itertools.count():
        sku = rng.choice(skus)
        loss = rng.randint(*LOSS_UNITS)
        if rng.random() < LOSS_SHARE and net[sku] >= loss:
            reason = rng.choice((AdjustmentReason.DAMAGED, AdjustmentReason.LOST))
            delta = -loss
        elif rng.random() < RETURN_SHARE:
            reason, delta = AdjustmentReason.RETURNED, rng.randint(*RETURN_UNITS)
        else:
            reason, delta = AdjustmentReason.RECEIVED, rng.randint(*RECEIPT_UNITS)
        net[sku] += delta
        yield Adjustment(f"ADJ-{uuid.uuid5(space, str(index))}", sku, delta, str(reason))


def hot_skus(orders: Iterable[Order], count: int) -> list[str]:
    """The ``count`` SKUs of which ``orders`` take the most units, most first.

    Ties are broken by code point, so the choice does not depend on the orders' order.
    """
    units: Counter[str] = Counter()
    for order in orders:
        for sku, quantity in order.lines:
            units[sku] += quantity
    return sorted(units, key=lambda sku: (-units[sku], sku))[:count]


def net_deltas(adjustments: Iterable[Adjustment]) -> Counter[str]:
    """Units per SKU that ``adjustments`` add to ``on_hand`` together (losses negative)."""
    net: Counter[str] = Counter()
    for adjustment in adjustments:
        net[adjustment.sku] += adjustment.delta
    return net


def signed_request(webhook: Webhook, item: Signable, now: datetime) -> tuple[dict[str, str], bytes]:
    """``item``'s headers and body, signed by ``webhook`` (``standardwebhooks``) at ``now``.

    A new ``webhook-id`` each time: a request sent again is a new delivery.
    """
    body = item.body(now)
    webhook_id = f"msg_{uuid.uuid4().hex}"
    return (
        {
            "webhook-id": webhook_id,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": webhook.sign(webhook_id, now, body.decode()),
            "content-type": "application/json",
        },
        body,
    )


def signed(items: Iterable[Signable], secret: str) -> list[tuple[dict[str, str], bytes]]:
    """Each item's headers and body, signed now with ``secret`` (``whsec_...``)."""
    webhook = Webhook(secret)
    now = datetime.now(UTC)
    return [signed_request(webhook, item, now) for item in items]


SignableT = TypeVar("SignableT", bound=Signable)

STEADY_LANES = 16
"""Connections :func:`post_steadily` sends over, each one request at a time (kept alive, as
the bursts' senders): 16 answers of 100 ms each keep up with 160 a second. A request due while
every lane is busy waits in a queue (its answer time counts from when it was due), not in an
HTTP client's pool: through one ``AsyncClient`` of 100 connections, once requests waited, the
benchmark's own process fell behind (its depth reads 300 ms apart instead of 100, seconds
of answer time at the sender where the intake logged 40 ms), and took CPU from the drain."""


@dataclass
class SteadyPost(Generic[SignableT]):
    """What :func:`post_steadily` did: what it sent, how each was answered, and its rate."""

    sent: list[SignableT] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    """Per item sent, in the same order, the HTTP status; 0 when the request failed."""
    answer_ms: list[float] = field(default_factory=list)
    """Per item sent, in the same order, from when it was due to its answer (or failure), ms."""
    seconds: float = math.nan
    """From the schedule's start to the moment it stopped sending."""

    @property
    def rate(self) -> float:
        """Webhooks sent per second over :attr:`seconds`; ``nan`` when none was sent."""
        return len(self.sent) / self.seconds if self.sent and self.seconds > 0 else math.nan

    @property
    def answered(self) -> dict[str, int]:
        """The answers by HTTP status (``"0"``: the request failed)."""
        return dict(Counter(str(status) for status in self.statuses))


def _one_connection() -> httpx.AsyncBaseTransport:
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    return httpx.AsyncHTTPTransport(limits=limits)


async def post_steadily(  # noqa: PLR0913 - the schedule's parts, each by name
    url: str,
    items: Iterable[SignableT],
    *,
    rate: float,
    secret: str,
    stop: asyncio.Event,
    answer_seconds: float = 30,
    transport: Callable[[], httpx.AsyncBaseTransport] = _one_connection,
) -> SteadyPost[SignableT]:
    """POST ``items``, each signed when due, to ``url`` at ``rate`` per second until ``stop``.

    On schedule (the i-th is due at ``start + i / rate``), not after the previous answer, so
    a slow receiver shows up as answer time (from when a request was due to its answer)
    rather than as a lower rate. :data:`STEADY_LANES` lanes send them, each over a transport
    of its own (``transport()``: one kept-alive connection; tests give another), as
    ``webhooks.burst`` sends, through the transport without the client's cookies, redirects
    and hooks. The answers are awaited once ``stop`` is set (or ``items`` run out). A request
    that fails, or is not answered within ``answer_seconds``, is recorded with status 0, not
    sent again.
    """
    webhook = Webhook(secret)
    loop = asyncio.get_running_loop()
    posted: SteadyPost[SignableT] = SteadyPost()
    due: asyncio.Queue[tuple[int, float, httpx.Request] | None] = asyncio.Queue()
    timeout = httpx.Timeout(answer_seconds).as_dict()

    async def lane() -> None:
        async with transport() as connection:
            while (job := await due.get()) is not None:
                index, when, request = job
                try:
                    response = await connection.handle_async_request(request)
                    await response.aread()
                    await response.aclose()
                    posted.statuses[index] = response.status_code
                except httpx.HTTPError:
                    posted.statuses[index] = 0
                posted.answer_ms[index] = (loop.time() - when) * 1000

    async with asyncio.TaskGroup() as group:
        for _ in range(STEADY_LANES):
            group.create_task(lane())
        started = loop.time()
        for index, item in enumerate(items):
            when = started + index / rate
            if when > loop.time():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), when - loop.time())
            if stop.is_set():
                break
            headers, body = signed_request(webhook, item, datetime.now(UTC))
            request = httpx.Request(
                "POST", url, content=body, headers=headers, extensions={"timeout": timeout}
            )
            posted.sent.append(item)
            posted.statuses.append(0)
            posted.answer_ms.append(math.nan)
            due.put_nowait((index, when, request))
        posted.seconds = loop.time() - started
        for _ in range(STEADY_LANES):
            due.put_nowait(None)
    return posted
