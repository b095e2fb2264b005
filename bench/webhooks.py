"""Side by side: the webhook intake, `fulfilment webhooks`, against a hand-written receiver.

``make bench-webhooks`` (or ``uv run python bench/webhooks.py --help``) does, in one run:

1. creates two PostgreSQL databases of its own (``FULFILMENT_BENCH_DATABASE_URL``, an admin
   URL), one for the intake and one for the reference receiver, migrates both, and drops both
   at the end;
2. plans a burst of N ``shipment.shipped`` webhooks (default 20,000): orders of 1 to 3 lines
   over the 1,000 SKUs of the Online Retail sample (``workload.py``), each shipped whole, in
   one shipment or, for about a third of the orders that have more than one unit, in two
   (by lines, or the units of a single line split), the shipments in a shuffled order;
3. for each of ``--rounds`` rounds, alternately the intake then the reference: empties its
   database, loads the stock, reserves the orders through the service's own SQL
   (``place_orders()`` with the hand-off on, in batches, then the fulfilment orders marked
   accepted by the warehouse, as the dispatcher leaves them), starts the receiver as a process
   of its own, signs every webhook with the ``standardwebhooks`` package (one secret), and
   sends them from ``--senders`` concurrent senders, each an ``httpx.AsyncClient`` keeping one
   connection alive, each sending its next webhook when the last was answered;
4. measures each burst: the webhooks answered per second from the 1st percentile of the
   answers to the last (the receivers' start-up left out, as ``run.py`` leaves out the
   worker's); answer time p50/p99/max (from the request's start to its answer, at the
   sender); the answers that were not 2xx; CPU seconds per 1,000 webhooks of the receiver, the
   senders (this process), PostgreSQL (the database's backends and the server's shared
   processes) and the rest of the machine over the same window (``measure.py``); the
   receiver's peak RSS; then, the receiver stopped, that nothing was lost: rows in
   ``warehouse_shipments`` and ``webhook_inbox`` and ``stock.shipped`` outbox rows equal to
   the shipments sent, every order shipped and holding nothing, every SKU's ``on_hand``,
   ``reserved`` and ``shipped`` exactly what the shipments took;
5. prints the table burst by burst (each round: the intake, the reference, their ratio) and
   the medians with their ratio, and writes everything as JSON to ``--results``.

The reference (``webhook_reference.py``) is a bare ASGI app under uvicorn (httptools, as the
intake)
with a pool of one asyncpg connection per sender, one transaction per webhook. Nothing here
runs a relay: the result events stay in the outbox and are counted there. The benchmark is not
run by CI: it takes minutes and its figures depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from figures import markdown_table, median, number, percentile, times
from measure import CpuSampler, peak_rss_bytes
from run import WEBHOOK_SECRET as SECRET
from run import Consumer, _free_port, cpu_model, dedicated_database, reset_database
from standardwebhooks import Webhook
from workload import ON_HAND, Order, Workload, load_workload

ROOT = Path(__file__).resolve().parent.parent
WEBHOOK_PATH = "/webhooks/warehouse"
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


def signed(shipments: Sequence[Shipment]) -> list[tuple[dict[str, str], bytes]]:
    """Each shipment's headers and body, signed now by the ``standardwebhooks`` package."""
    webhook = Webhook(SECRET)
    now = datetime.now(UTC)
    requests = []
    for shipment in shipments:
        body = shipment.body(now)
        webhook_id = f"msg_{uuid.uuid4().hex}"
        requests.append(
            (
                {
                    "webhook-id": webhook_id,
                    "webhook-timestamp": str(int(now.timestamp())),
                    "webhook-signature": webhook.sign(webhook_id, now, body.decode()),
                    "content-type": "application/json",
                },
                body,
            )
        )
    return requests


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
    expected = {
        "shipments": len(shipments),
        "webhooks": len(shipments),
        "events": len(shipments),
        "orders_shipped": len(orders),
        "units_held": 0,
    }
    result: dict[str, Any] = {}
    for name, value in found.items():
        result[name] = value
        result[f"{name}_ok"] = value == expected[name]
    result["skus_wrong"] = len(wrong)
    result["stock_ok"] = not wrong
    return result


async def run_burst(  # noqa: PLR0913 - one burst's parts, each by name
    kind: str,
    database_url: str,
    workload: Workload,
    orders: Sequence[Order],
    shipments: Sequence[Shipment],
    *,
    senders: int,
    logs: Path,
    label: str,
) -> Burst:
    """Prepare the database, start the receiver, send the burst, stop it, measure and check."""
    await prepare(database_url, workload, orders)
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
            requests = signed(shipments)
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
    return Burst(
        kind=kind,
        webhooks=len(shipments),
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
        checks=await checks(database_url, orders, shipments),
    )


# --- the report -----------------------------------------------------------------------------

CPU_GROUPS = ("receiver", "senders", "postgres")


def _cells(label: str, burst: Burst) -> list[str]:
    cpu = burst.cpu_per_1000
    return [
        label,
        number(burst.rate),
        number(burst.answer_ms["p50"], 1),
        number(burst.answer_ms["p99"], 1),
        number(burst.answer_ms["max"], 1),
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
        answer_ms={q: median([b.answer_ms[q] for b in bursts]) for q in ("p50", "p99", "max")},
        statuses=dict(sum((Counter(b.statuses) for b in bursts), Counter())),
        cpu_per_1000={
            group: median([b.cpu_per_1000[group] for b in bursts])
            for group in bursts[0].cpu_per_1000
        },
        peak_rss_mib=median([b.peak_rss_mib for b in bursts]),
        checks={"all_ok": not any(b.lost for b in bursts)},
    )


def _ratio_cells(label: str, intake: Burst, reference: Burst) -> list[str]:
    def over(a: float, b: float) -> str:
        return times(a / b) if b else "-"

    return [
        label,
        f"**{over(intake.rate, reference.rate)}**",
        over(intake.answer_ms["p50"], reference.answer_ms["p50"]),
        over(intake.answer_ms["p99"], reference.answer_ms["p99"]),
        over(intake.answer_ms["max"], reference.answer_ms["max"]),
        "",
        "",
        *(over(intake.cpu_per_1000[group], reference.cpu_per_1000[group]) for group in CPU_GROUPS),
        "",
        "",
    ]


def report(bursts: Sequence[Burst], senders: int) -> str:
    """The table, round by round, then the medians and their ratio, as Markdown."""
    intake = [b for b in bursts if b.kind == "intake"]
    reference = [b for b in bursts if b.kind == "reference"]
    rows: list[list[str]] = []
    for index in range(max(len(intake), len(reference))):
        if index < len(intake):
            rows.append(_cells(f"round {index + 1}: intake", intake[index]))
        if index < len(reference):
            rows.append(_cells(f"round {index + 1}: reference", reference[index]))
        if index < len(intake) and index < len(reference):
            rows.append(_ratio_cells(f"round {index + 1}: ratio", intake[index], reference[index]))
    medians = {
        kind: _median_burst(of) for kind, of in (("intake", intake), ("reference", reference)) if of
    }
    for kind, burst in medians.items():
        rows.append(_cells(f"**median: {kind}**", burst))
    if len(medians) == 2:
        rows.append(_ratio_cells("**median: ratio**", medians["intake"], medians["reference"]))
        round_ratios = [i.rate / r.rate for i, r in zip(intake, reference, strict=False)]
        rows.append(["**median of the rounds' ratios**", f"**{times(median(round_ratios))}**"])
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
    lead = (
        f"webhooks per burst: {bursts[0].webhooks:,} `shipment.shipped`; {senders} senders"
        " (httpx, keep-alive); rate and CPU from the 1st percentile of the answers to the last;"
        " answer time at the sender; lost: any of the checks after the burst failed"
    )
    padded = [row + [""] * (len(header) - len(row)) for row in rows]
    return "\n".join([lead, "", *markdown_table(header, padded)])


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
        help="burst into this receiver only (repeat for both; default: both)",
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
    return parser.parse_args(argv)


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
    kinds = [kind for kind in RECEIVERS if kind in (args.receiver or RECEIVERS)]
    workload = load_workload(args.data)
    orders, shipments = plan_shipments(workload, args.webhooks, args.seed)
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
            f" ({len(shipments) - len(orders):,} orders in two)",
            flush=True,
        )
        for round_number in range(1, args.rounds + 1):
            for kind in kinds:
                result = asyncio.run(
                    run_burst(
                        kind,
                        urls[kind],
                        workload,
                        orders,
                        shipments,
                        senders=args.senders,
                        logs=logs,
                        label=f"round{round_number}",
                    )
                )
                bursts.append(result)
                print(f"round {round_number} {kind}: {asdict(result)}", flush=True)
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
