"""Side by side: the webhook intake, `fulfilment webhooks`, against a hand-written receiver.

``make bench-webhooks`` (or ``uv run python bench/webhooks.py --help``) does, in one run:

1. creates two PostgreSQL databases of its own (``FULFILMENT_BENCH_DATABASE_URL``, an admin
   URL), one for the intake and one for the reference receiver, migrates both, and drops both
   at the end;
2. plans a burst of N ``shipment.shipped`` webhooks (default 20,000): orders of 1 to 3 lines
   over the 1,000 SKUs of the Online Retail sample (``workload.py``), each shipped whole, in
   one shipment or, for about a third of the orders that have more than one unit, in two
   (by lines, or the units of a single line split), the shipments in a shuffled order; with
   ``--kind adjustments`` or ``both``, also a burst of N ``inventory.adjusted`` webhooks of
   the same SKUs, drawn uniformly (``workload.plan_adjustments``: receipts and small losses,
   each SKU's never taking more than its own receipts gave);
3. for each of ``--rounds`` rounds, alternately the intake then the reference (with
   ``--kind both``, the intake's shipment burst then its adjustment burst, then the
   reference's shipment burst: the reference takes shipments only): empties its database,
   loads the stock, reserves the orders through the service's own SQL (``place_orders()``
   with the hand-off on, in batches, then the fulfilment orders marked accepted by the
   warehouse, as the dispatcher leaves them; before an adjustment burst too, so that both
   kinds meet the same database), starts the receiver as a process of its own, signs every
   webhook with the ``standardwebhooks`` package (one secret), and sends them from
   ``--senders`` concurrent senders, each an ``httpx.AsyncClient`` keeping one connection
   alive, each sending its next webhook when the last was answered;
4. measures each burst: the webhooks answered per second from the 1st percentile of the
   answers to the last (the receivers' start-up left out, as ``run.py`` leaves out the
   worker's); answer time p50/p99/max (from the request's start to its answer, at the
   sender); the answers that were not 2xx; CPU seconds per 1,000 webhooks of the receiver, the
   senders (this process), PostgreSQL (the database's backends and the server's shared
   processes) and the rest of the machine over the same window (``measure.py``); the
   receiver's peak RSS; then, the receiver stopped, that nothing was lost: rows in
   ``warehouse_shipments`` and ``webhook_inbox`` and ``stock.shipped`` outbox rows equal to
   the shipments sent, every order shipped and holding nothing, every SKU's ``on_hand``,
   ``reserved`` and ``shipped`` exactly what the shipments took; after an adjustment burst,
   one ``warehouse_adjustments`` row per adjustment sent, each applied whole, one
   ``webhook_inbox`` row ``adjusted`` and one ``stock.adjusted`` outbox row for each, no
   ``stock.shortage`` and no discrepancy, every SKU's ``on_hand`` its level before the burst
   plus the deltas sent, ``reserved`` and ``shipped`` as they were;
5. prints the table burst by burst (each round: the intake, the reference, their ratio; the
   intake's adjustments over its shipments) and the medians with their ratios, and writes
   everything as JSON to ``--results``.

The reference (``webhook_reference.py``) is a bare ASGI app under uvicorn (httptools, as the
intake) with a pool of one asyncpg connection per sender, one transaction per webhook. It
takes shipments only: the adjustments' target compares the intake's adjustment with its own
shipment, and a hand-written adjustment path would be a second copy of ``record_adjustments()``
to keep in step for no target. Nothing here
runs a relay: the result events stay in the outbox and are counted there. The benchmark is not
run by CI: it takes minutes and its figures depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import random
import sys
import tempfile
import time
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from figures import markdown_table, median, number, percentile, ratio, times
from measure import CpuSampler, peak_rss_bytes
from run import WEBHOOK_SECRET as SECRET
from run import (
    Consumer,
    _free_port,
    adjustment_checks,
    checked,
    cpu_model,
    dedicated_database,
    reset_database,
    stock_levels,
)
from workload import (
    ON_HAND,
    Adjustment,
    Order,
    Workload,
    load_workload,
    net_deltas,
    plan_adjustments,
    signed,
)

from fulfilment.intake.app import WEBHOOK_PATH

ROOT = Path(__file__).resolve().parent.parent
SETUP_CONSUMER = "bench-setup"
"""``inbox_messages.consumer`` of the orders reserved before a burst."""
SETUP_BATCH = 1_000
"""Orders per ``place_orders()`` call while reserving them."""
SPLIT_SHARE = 1 / 3
"""Share of the orders of more than one unit shipped in two shipments."""
WARM_UP_SHARE = 0.01
"""Share of the first answers of a burst left out of its rate and CPU (start-up, warm-up)."""
SENDER_TIMEOUT_SECONDS = 30.0
"""A sender's wait for one answer; longer is counted as an error, not retried."""
RECEIVERS = ("intake", "reference")
SENT = ("shipments", "adjustments")
"""The kinds of burst: ``shipment.shipped`` or ``inventory.adjusted`` webhooks."""
KINDS = (*SENT, "both")
"""``--kind``: one kind of burst, or both in turn."""

ACCEPT_FULFILMENT_ORDERS = """
UPDATE warehouse_requests
   SET status = 'accepted', attempts = 1, body = convert_to('{}', 'UTF8'),
       first_attempt_at = now(), last_attempt_at = now(), answered_at = now(),
       last_status_code = 201, warehouse_id = 'FO-' || left(replace(order_id::text, '-', ''), 8)
 WHERE kind = 'fulfilment_order'
"""


# --- the workload ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Shipment:
    """One ``shipment.shipped`` of the burst: what it ships of which order."""

    order_id: uuid.UUID
    shipment_id: str
    lines: tuple[tuple[str, int], ...]

    def body(self, sent_at: datetime) -> bytes:
        """The webhook's UTF-8 JSON body (``WebhookEnvelope`` with a ``ShipmentV1``)."""
        tracking = f"JD{uuid.uuid5(self.order_id, self.shipment_id).int % 10**18:018d}"
        return json.dumps(
            {
                "type": "shipment.shipped",
                "timestamp": sent_at.isoformat(),
                "data": {
                    "shipment_id": self.shipment_id,
                    "fulfilment_order_id": f"FO-{self.order_id.hex[:8]}",
                    "reference": str(self.order_id),
                    "shipped_at": sent_at.isoformat(),
                    "carrier": "DHL",
                    "tracking_numbers": [tracking],
                    "tracking_url": f"https://track.example/{tracking}",
                    "lines": [{"sku": sku, "quantity": quantity} for sku, quantity in self.lines],
                },
            },
            separators=(",", ":"),
        ).encode()


def plan_shipments(workload: Workload, count: int, seed: int) -> tuple[list[Order], list[Shipment]]:
    """The orders to reserve and ``count`` shipments that ship them whole, shuffled.

    An order of more than one unit is shipped in two shipments with probability
    :data:`SPLIT_SHARE` (its lines split in two groups, or its one line's units), else in one.
    """
    rng = random.Random(seed)
    orders: list[Order] = []
    shipments: list[Shipment] = []
    for order in workload.make_orders(count, seed=seed, namespace="shipped"):
        left = count - len(shipments)
        if left == 0:
            break
        units = sum(quantity for _, quantity in order.lines)
        parts: list[tuple[tuple[str, int], ...]] = [order.lines]
        if left >= 2 and units > 1 and rng.random() < SPLIT_SHARE:
            if len(order.lines) > 1:
                cut = rng.randint(1, len(order.lines) - 1)
                parts = [order.lines[:cut], order.lines[cut:]]
            else:
                ((sku, quantity),) = order.lines
                first = rng.randint(1, quantity - 1)
                parts = [((sku, first),), ((sku, quantity - first),)]
        orders.append(order)
        shipments += [
            Shipment(order.order_id, f"SHP-{order.order_id.hex[:12]}-{index}", lines)
            for index, lines in enumerate(parts, 1)
        ]
    rng.shuffle(shipments)
    return orders, shipments


async def prepare(database_url: str, workload: Workload, orders: Sequence[Order]) -> None:
    """Empty the database, load the stock, reserve ``orders`` with the hand-off on, checkpoint.

    Raises:
        RuntimeError: an order was not reserved.
    """
    await reset_database(database_url, workload)
    connection = await asyncpg.connect(database_url)
    try:
        placed_at = datetime.now(UTC)
        for start in range(0, len(orders), SETUP_BATCH):
            batch = orders[start : start + SETUP_BATCH]
            line_orders = [i for i, order in enumerate(batch, 1) for _ in order.lines]
            lines = [line for order in batch for line in order.lines]
            await connection.fetch(
                "SELECT * FROM place_orders($1, $2, $3, $4, $5, $6, $7, NULL, true)",
                SETUP_CONSUMER,
                [order.event_id for order in batch],
                [order.order_id for order in batch],
                [placed_at] * len(batch),
                line_orders,
                [sku for sku, _ in lines],
                [quantity for _, quantity in lines],
            )
        await connection.execute(ACCEPT_FULFILMENT_ORDERS)
        reserved = await connection.fetchval(
            "SELECT count(*) FROM reservations WHERE status = 'reserved'"
        )
        if reserved != len(orders):
            msg = f"{reserved} of {len(orders)} orders reserved before the burst"
            raise RuntimeError(msg)
        await connection.execute("VACUUM ANALYZE")
        await connection.execute("CHECKPOINT")
    finally:
        await connection.close()


# --- the receivers --------------------------------------------------------------------------


def receiver(
    kind: str, database_url: str, logs: Path, label: str, connections: int
) -> tuple[Consumer, int]:
    """The receiver of ``kind`` (not started) and the port of its endpoint.

    ``connections`` is the reference's pool (one per sender); the intake pools as its settings
    say (``FULFILMENT_DATABASE_POOL_SIZE``, its default).
    """
    port = _free_port()
    log = logs / f"{label}-{kind}.log"
    if kind == "intake":
        http_port = _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("FULFILMENT_")} | {
            "FULFILMENT_DATABASE_URL": database_url.replace(
                "postgresql://", "postgresql+asyncpg://", 1
            ),
            "FULFILMENT_WAREHOUSE_WEBHOOK_SECRETS": SECRET,
            "FULFILMENT_WEBHOOKS_PORT": str(port),
            "FULFILMENT_WEBHOOKS_HTTP_PORT": str(http_port),
            "FULFILMENT_HTTP_HOST": "127.0.0.1",
            "FULFILMENT_LOG_FORMAT": "json",
        }
        command = [str(Path(sys.executable).parent / "fulfilment"), "webhooks"]
        return Consumer("intake", command, env, log, http_port=http_port), port
    command = [
        sys.executable,
        str(ROOT / "bench" / "webhook_reference.py"),
        "--port",
        str(port),
        "--database-url",
        database_url,
        "--secret",
        SECRET,
        "--connections",
        str(connections),
    ]
    return Consumer("reference", command, dict(os.environ), log), port


# --- the burst ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Answer:
    """One webhook sent: when it started and was answered (epoch seconds), and its status."""

    started: float
    answered: float
    status: int
    """The HTTP status; 0 when the request failed (timeout, connection lost)."""


async def burst(
    url: str, requests: Sequence[tuple[dict[str, str], bytes]], senders: int
) -> list[Answer]:
    """Send ``requests`` from ``senders`` concurrent senders; one answer per request, in order.

    Each sender is an httpx transport (``AsyncHTTPTransport``, what an ``AsyncClient`` sends
    through) keeping one connection alive, sending its next request once its last was answered;
    a request that fails is counted with status 0, not sent again. The requests are built
    before the first is sent (``build_request``) and sent through the transport without the
    client's cookies, redirects and hooks, so that the senders' CPU, which shares the machine
    with the receiver, is little more than that of HTTP itself.
    """
    answers: list[Answer | None] = [None] * len(requests)
    pending = iter(range(len(requests)))
    async with httpx.AsyncClient(timeout=SENDER_TIMEOUT_SECONDS) as builder:
        built = [
            builder.build_request("POST", url, content=body, headers=headers)
            for headers, body in requests
        ]

    async def sender() -> None:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncHTTPTransport(limits=limits) as transport:
            for index in pending:
                started = time.time()
                try:
                    response = await transport.handle_async_request(built[index])
                    await response.aread()
                    await response.aclose()
                    status = response.status_code
                except httpx.HTTPError:
                    status = 0
                answers[index] = Answer(started, time.time(), status)

    await asyncio.gather(*(sender() for _ in range(senders)))
    return [answer for answer in answers if answer is not None]


# --- measurements ---------------------------------------------------------------------------


@dataclass
class Burst:
    """One burst into one receiver: rates per second, times in ms, CPU in s per 1,000 webhooks."""

    kind: str
    """The receiver: ``intake`` or ``reference``."""
    webhooks: int
    rate: float
    """Webhooks answered per second from the warm-up share of the answers to the last."""
    overall_rate: float
    """Webhooks over the time from the first request to the last answer."""
    answer_ms: dict[str, float]
    statuses: dict[str, int]
    cpu_per_1000: dict[str, float]
    peak_rss_mib: float
    checks: dict[str, Any] = field(default_factory=dict)
    sent: str = "shipments"
    """What the burst was made of: ``shipments`` or ``adjustments`` (:data:`SENT`)."""

    @property
    def not_2xx(self) -> int:
        """Answers that were not 2xx, failed requests included."""
        return sum(n for status, n in self.statuses.items() if not status.startswith("2"))

    @property
    def lost(self) -> bool:
        """Whether any check after the burst failed."""
        return not all(value is True for key, value in self.checks.items() if key.endswith("ok"))


async def checks(
    database_url: str, orders: Sequence[Order], shipments: Sequence[Shipment]
) -> dict[str, Any]:
    """Counts after a burst, each with an ``_ok`` beside it: nothing lost, nothing applied twice."""
    shipped: Counter[str] = Counter()
    for shipment in shipments:
        for sku, quantity in shipment.lines:
            shipped[sku] += quantity
    connection = await asyncpg.connect(database_url)
    try:
        found = {
            "shipments": await connection.fetchval("SELECT count(*) FROM warehouse_shipments"),
            "webhooks": await connection.fetchval("SELECT count(*) FROM webhook_inbox"),
            "events": await connection.fetchval(
                "SELECT count(*) FROM outbox WHERE routing_key = 'stock.shipped'"
            ),
            "orders_shipped": await connection.fetchval(
                "SELECT count(*) FROM reservations WHERE status = 'shipped'"
            ),
            "units_held": await connection.fetchval(
                "SELECT coalesce(sum(quantity - shipped), 0) FROM reservation_lines"
            ),
        }
        stock = await connection.fetch("SELECT sku, on_hand, reserved, shipped FROM stock_levels")
    finally:
        await connection.close()
    wrong = [
        row["sku"]
        for row in stock
        if (row["on_hand"], row["reserved"], row["shipped"])
        != (ON_HAND - shipped[row["sku"]], 0, shipped[row["sku"]])
    ]
    result = checked(
        found,
        {
            "shipments": len(shipments),
            "webhooks": len(shipments),
            "events": len(shipments),
            "orders_shipped": len(orders),
            "units_held": 0,
        },
    )
    result["skus_wrong"] = len(wrong)
    result["stock_ok"] = not wrong
    return result


async def run_burst(  # noqa: PLR0913 - one burst's parts, each by name
    kind: str,
    database_url: str,
    workload: Workload,
    orders: Sequence[Order],
    webhooks: Sequence[Shipment] | Sequence[Adjustment],
    *,
    senders: int,
    logs: Path,
    label: str,
) -> Burst:
    """Prepare the database, start the receiver, send the burst, stop it, measure and check.

    ``webhooks`` are the shipments of ``orders``, or adjustments (``orders`` are reserved
    before them too, so that both kinds of burst meet the same database).
    """
    await prepare(database_url, workload, orders)
    before = await stock_levels(database_url)
    process, port = receiver(kind, database_url, logs, label, senders)
    database = urllib.parse.urlsplit(database_url).path.lstrip("/")
    with CpuSampler(
        {
            "receiver": lambda: [process.process.pid] if process.process else [],
            "senders": lambda: [os.getpid()],
        },
        database,
    ) as sampler:
        process.start()
        try:
            process.wait_ready()
            requests = signed(webhooks, SECRET)
            answers = await burst(f"http://127.0.0.1:{port}{WEBHOOK_PATH}", requests, senders)
            assert process.process is not None  # noqa: S101 - started above
            rss = peak_rss_bytes(process.process.pid) / 2**20
        finally:
            process.stop()
    ends = sorted(answer.answered for answer in answers)
    skip = max(1, int(len(ends) * WARM_UP_SHARE))
    start, end, counted = ends[skip], ends[-1], len(ends) - skip - 1
    durations = [(answer.answered - answer.started) * 1000 for answer in answers]
    cpu = sampler.between(start, end)
    adjustments = [webhook for webhook in webhooks if isinstance(webhook, Adjustment)]
    shipments = [webhook for webhook in webhooks if isinstance(webhook, Shipment)]
    return Burst(
        kind=kind,
        webhooks=len(webhooks),
        rate=counted / (end - start),
        overall_rate=len(answers) / (end - min(answer.started for answer in answers)),
        answer_ms={
            "p50": percentile(durations, 0.5),
            "p99": percentile(durations, 0.99),
            "max": max(durations),
        },
        statuses=dict(Counter(str(answer.status) for answer in answers)),
        cpu_per_1000={group: seconds / counted * 1000 for group, seconds in cpu.items()},
        peak_rss_mib=round(rss, 1),
        checks=await adjustment_checks(database_url, before, adjustments)
        if adjustments
        else await checks(database_url, orders, shipments),
        sent="adjustments" if adjustments else "shipments",
    )


# --- the report -----------------------------------------------------------------------------

CPU_GROUPS = ("receiver", "senders", "postgres")
ANSWER_QUANTILES = ("p50", "p99", "max")

Group = tuple[str, str]
"""The bursts of one receiver and one kind of webhook: ``(kind, sent)``."""

COMPARED: tuple[tuple[Group, Group, str], ...] = (
    (("intake", "shipments"), ("reference", "shipments"), "intake / reference, shipments"),
    (("intake", "adjustments"), ("intake", "shipments"), "adjustments / shipments, intake"),
)
"""The ratios the table gives when both sides ran: each group over the other, and its name."""


def _group(burst: Burst) -> Group:
    return burst.kind, burst.sent


def _cells(label: str, burst: Burst) -> list[str]:
    cpu = burst.cpu_per_1000
    return [
        label,
        number(burst.rate),
        *(number(burst.answer_ms[q], 1) for q in ANSWER_QUANTILES),
        f"{burst.not_2xx:,}",
        "no" if not burst.lost else "**yes**",
        *(f"{cpu[group]:.3f}" for group in CPU_GROUPS),
        f"{cpu['rest']:.3f}",
        number(burst.peak_rss_mib, 1),
    ]


def _median_burst(bursts: Sequence[Burst]) -> Burst:
    return Burst(
        kind=bursts[0].kind,
        webhooks=bursts[0].webhooks,
        rate=median([b.rate for b in bursts]),
        overall_rate=median([b.overall_rate for b in bursts]),
        answer_ms={q: median([b.answer_ms[q] for b in bursts]) for q in ANSWER_QUANTILES},
        statuses=dict(sum((Counter(b.statuses) for b in bursts), Counter())),
        cpu_per_1000={
            group: median([b.cpu_per_1000[group] for b in bursts])
            for group in bursts[0].cpu_per_1000
        },
        peak_rss_mib=median([b.peak_rss_mib for b in bursts]),
        checks={"all_ok": not any(b.lost for b in bursts)},
        sent=bursts[0].sent,
    )


def ratios(burst: Burst, other: Burst) -> dict[str, float]:
    """``burst`` over ``other``: the rate, each answer time and each CPU group's per 1,000."""
    return (
        {"rate": ratio(burst.rate, other.rate)}
        | {q: ratio(burst.answer_ms[q], other.answer_ms[q]) for q in ANSWER_QUANTILES}
        | {
            group: ratio(burst.cpu_per_1000[group], other.cpu_per_1000[group])
            for group in CPU_GROUPS
        }
    )


def _median_ratios(of: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Each ratio's median over ``of``, the rounds' own."""
    return {key: median([each[key] for each in of]) for key in of[0]}


def _ratio_cells(label: str, figures: Mapping[str, float]) -> list[str]:
    return [
        label,
        f"**{times(figures['rate'])}**",
        *(times(figures[q]) for q in ANSWER_QUANTILES),
        "",
        "",
        *(times(figures[group]) for group in CPU_GROUPS),
        "",
        "",
    ]


def report(bursts: Sequence[Burst], senders: int) -> str:
    """The table, round by round, then the medians and their ratios, as Markdown.

    A round is each group's burst (:data:`Group`, in the order they ran) and the ratios of
    :data:`COMPARED` whose both sides ran; then each group's medians, the ratios of the
    medians, and the medians of the rounds' ratios (which pair bursts of the same round).
    """
    groups: dict[Group, list[Burst]] = {}
    for each in bursts:
        groups.setdefault(_group(each), []).append(each)
    compared = [(a, b, name) for a, b, name in COMPARED if a in groups and b in groups]
    rows: list[list[str]] = []
    round_ratios: dict[str, list[dict[str, float]]] = {name: [] for _, _, name in compared}
    for index in range(max(len(of) for of in groups.values())):
        for (kind, sent), of in groups.items():
            if index < len(of):
                rows.append(_cells(f"round {index + 1}: {kind}, {sent}", of[index]))
        for a, b, name in compared:
            if index < len(groups[a]) and index < len(groups[b]):
                round_ratios[name].append(ratios(groups[a][index], groups[b][index]))
                rows.append(_ratio_cells(f"round {index + 1}: {name}", round_ratios[name][-1]))
    medians = {group: _median_burst(of) for group, of in groups.items()}
    for (kind, sent), burst in medians.items():
        rows.append(_cells(f"**median: {kind}, {sent}**", burst))
    for a, b, name in compared:
        rows.append(_ratio_cells(f"**median: {name}**", ratios(medians[a], medians[b])))
    for _, _, name in compared:
        rows.append(
            _ratio_cells(f"**median of the rounds: {name}**", _median_ratios(round_ratios[name]))
        )
    header = [
        "burst",
        "webhooks/s",
        "answer p50 ms",
        "p99 ms",
        "max ms",
        "not 2xx",
        "lost",
        *(f"CPU s/1k {group}" for group in CPU_GROUPS),
        "rest",
        "peak RSS MiB",
    ]
    made_of = " or ".join(
        f"`{'shipment.shipped' if sent == 'shipments' else 'inventory.adjusted'}`"
        for sent in dict.fromkeys(sent for _, sent in groups)
    )
    lead = (
        f"webhooks per burst: {bursts[0].webhooks:,} {made_of}; {senders} senders"
        " (httpx, keep-alive); rate and CPU from the 1st percentile of the answers to the last;"
        " answer time at the sender; lost: any of the checks after the burst failed"
    )
    return "\n".join([lead, "", *markdown_table(header, rows)])


# --- main -----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line; every option has a default that ``make bench-webhooks`` uses."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--webhooks", "-n", type=int, default=20_000, help="webhooks per burst")
    parser.add_argument("--senders", type=int, default=32, help="concurrent senders")
    parser.add_argument("--rounds", type=int, default=3, help="bursts per receiver, alternating")
    parser.add_argument(
        "--receiver",
        choices=RECEIVERS,
        action="append",
        help="burst into this receiver only (repeat for both; default: both, or the intake"
        " alone with --kind adjustments)",
    )
    parser.add_argument(
        "--kind",
        choices=KINDS,
        default="shipments",
        help="the bursts' webhooks: shipment.shipped, inventory.adjusted, or both, a burst of"
        " each in turn into the intake in every round (the reference takes shipments only)",
    )
    parser.add_argument(
        "--data", type=Path, default=ROOT / "data/sample/online-retail", help="Online Retail CSVs"
    )
    parser.add_argument("--seed", type=int, default=36)
    parser.add_argument("--results", type=Path, default=ROOT / "bench/results")
    parser.add_argument("--keep-logs", action="store_true", help="keep the receivers' logs")
    parser.add_argument(
        "--admin-database-url",
        default=os.environ.get(
            "FULFILMENT_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
        help="PostgreSQL URL allowed to create databases (env FULFILMENT_BENCH_DATABASE_URL)",
    )
    args = parser.parse_args(argv)
    if args.kind == "adjustments" and "reference" in (args.receiver or ()):
        parser.error("--kind adjustments: the reference takes shipments only (--receiver intake)")
    return args


def round_plan(receivers: Sequence[str] | None, kind: str) -> list[Group]:
    """The bursts of one round, in order: ``(receiver, sent)``.

    Each receiver of ``receivers`` (None: both, as :data:`RECEIVERS` orders them) in turn, the
    intake with a burst of each kind of ``kind`` (shipments first), the reference with
    shipments only (none when ``kind`` is ``adjustments``).
    """
    sent = SENT if kind == "both" else (kind,)
    return [
        (receiver, each)
        for receiver in RECEIVERS
        if receiver in (receivers or RECEIVERS)
        for each in sent
        if receiver == "intake" or each == "shipments"
    ]


async def postgres_version(database_url: str) -> str:
    """The server's ``server_version``."""
    connection = await asyncpg.connect(database_url)
    try:
        return str(await connection.fetchval("SHOW server_version"))
    finally:
        await connection.close()


@contextlib.contextmanager
def databases(admin_url: str, kinds: Sequence[str]) -> Iterator[dict[str, str]]:
    """A migrated database of its own per receiver, dropped at the end."""
    with contextlib.ExitStack() as stack:
        yield {kind: stack.enter_context(dedicated_database(admin_url)) for kind in kinds}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the table; return the exit code (1 when anything was lost)."""
    args = parse_args(argv)
    plan = round_plan(args.receiver, args.kind)
    kinds = list(dict.fromkeys(kind for kind, _ in plan))
    workload = load_workload(args.data)
    orders, shipments = plan_shipments(workload, args.webhooks, args.seed)
    adjustments = list(
        itertools.islice(
            plan_adjustments(workload.skus, seed=args.seed, namespace="burst"), args.webhooks
        )
    )
    args.results.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    bursts: list[Burst] = []
    with (
        tempfile.TemporaryDirectory(prefix="fulfilment-bench-webhooks-") as temporary,
        databases(args.admin_database_url, kinds) as urls,
    ):
        logs = args.results / f"logs-webhooks-{stamp}" if args.keep_logs else Path(temporary)
        logs.mkdir(exist_ok=True)
        server = asyncio.run(postgres_version(next(iter(urls.values()))))
        print(
            f"{len(shipments):,} shipments of {len(orders):,} orders"
            f" ({len(shipments) - len(orders):,} orders in two)"
            + (
                f"; {len(adjustments):,} adjustments, {sum(net_deltas(adjustments).values()):+,}"
                " units together"
                if any(sent == "adjustments" for _, sent in plan)
                else ""
            ),
            flush=True,
        )
        for round_number in range(1, args.rounds + 1):
            for kind, sent in plan:
                result = asyncio.run(
                    run_burst(
                        kind,
                        urls[kind],
                        workload,
                        orders,
                        shipments if sent == "shipments" else adjustments,
                        senders=args.senders,
                        logs=logs,
                        label=f"round{round_number}-{sent}",
                    )
                )
                bursts.append(result)
                print(f"round {round_number} {kind}, {sent}: {asdict(result)}", flush=True)
    table = report(bursts, args.senders)
    machine = (
        f"{os.cpu_count()} CPUs ({cpu_model()}), PostgreSQL {server},"
        f" Python {platform.python_version()},"
        f" {platform.system()} {platform.release()}"
    )
    print(f"\n{machine}\n{table}")
    out = args.results / f"webhooks-{stamp}.json"
    out.write_text(
        json.dumps(
            {
                "when": stamp,
                "machine": machine,
                "arguments": {k: str(v) for k, v in vars(args).items()},
                "bursts": [asdict(b) for b in bursts],
                "table": table,
            },
            indent=2,
        )
    )
    print(f"\nresults: {out}")
    return 1 if any(b.lost or b.not_2xx for b in bursts) else 0


if __name__ == "__main__":
    sys.exit(main())
