"""``fulfilment webhooks`` over a real socket on the real PostgreSQL: product.md's answer table.

One intake process (the installed program) serves the module, on the session's database; each
test empties the tables first (``clean_database``). One test per row of the table, then the
signature's edge cases end to end, the body limit while reading, and what the process says.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import asyncpg
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fulfilment.adapters.postgres.stock import PostgresStock
from fulfilment.domain.model import OutcomeKind
from tests.support.builders import order
from tests.support.webhooks import (
    SECOND_SECRET,
    SECRET,
    UNKNOWN_SECRET,
    IntakeProcess,
    adjustment_body,
    cancellation_body,
    running_intake,
    shipment_body,
    signed_headers,
)

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def intake(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[IntakeProcess]:
    """The module's intake process on the session database, knowing two secrets."""
    with running_intake(
        database_url, tmp_path_factory.mktemp("intake"), FULFILMENT_WEBHOOKS_MAX_BODY_BYTES="4096"
    ) as process:
        yield process


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10) as http:
        yield http


@pytest.fixture
async def reserved(stock: PostgresStock) -> uuid.UUID:
    """An order holding 4 of A and 2 of B."""
    await stock.put_stock({"A": 10, "B": 10})
    placed = order(("A", 4), ("B", 2))
    outcome = await stock.apply(placed)
    assert outcome.kind is OutcomeKind.RESERVED
    return placed.order_id


async def post(
    client: httpx.AsyncClient, intake: IntakeProcess, body: bytes, **signing: object
) -> httpx.Response:
    headers = signed_headers(body, **signing)  # type: ignore[arg-type]
    return await client.post(intake.url, content=body, headers=headers)


async def recorded(db: asyncpg.Connection) -> dict[str, int]:
    """Rows of every table a webhook may write."""
    tables = (
        "webhook_inbox",
        "warehouse_shipments",
        "warehouse_cancellations",
        "warehouse_discrepancies",
        "invalid_webhooks",
        "inbox_messages",
        "outbox",
    )
    return {table: await db.fetchval(f"SELECT count(*) FROM {table}") for table in tables}  # noqa: S608


NOTHING = dict.fromkeys(
    (
        "webhook_inbox",
        "warehouse_shipments",
        "warehouse_cancellations",
        "warehouse_discrepancies",
        "invalid_webhooks",
        "inbox_messages",
        "outbox",
    ),
    0,
)


# --- One test per row of the answer table ------------------------------------------------------


async def test_a_signed_shipment_is_applied_and_committed_before_the_204(
    intake, client, db, reserved
) -> None:
    answer = await post(client, intake, shipment_body(reserved, [("A", 3)], shipment_id="SHP-1"))

    assert answer.status_code == 204
    # Read at once: the answer came after the commit.
    row = await db.fetchrow(
        "SELECT order_id, source, carrier, tracking_numbers, outcome FROM warehouse_shipments"
        " WHERE shipment_id = 'SHP-1'"
    )
    assert dict(row) == {
        "order_id": reserved,
        "source": "webhook",
        "carrier": "DHL",
        "tracking_numbers": ["JD014600003828392019"],
        "outcome": "shipped",
    }
    level = await db.fetchrow("SELECT on_hand, reserved FROM stock_levels WHERE sku = 'A'")
    assert dict(level) == {"on_hand": 7, "reserved": 1}


async def test_the_same_webhook_id_again_is_a_204_that_changes_nothing(
    intake, client, db, reserved
) -> None:
    body = shipment_body(reserved, [("A", 1)])
    first = await post(client, intake, body, webhook_id="msg_repeat")
    before = await recorded(db)

    again = await post(client, intake, body, webhook_id="msg_repeat")

    assert (first.status_code, again.status_code) == (204, 204)
    assert await recorded(db) == before
    assert await db.fetchval("SELECT on_hand FROM stock_levels WHERE sku = 'A'") == 9


async def test_the_same_shipment_under_another_webhook_id_is_a_204_applied_once(
    intake, client, db, reserved
) -> None:
    body = shipment_body(reserved, [("A", 1)], shipment_id="SHP-twice")

    answers = [(await post(client, intake, body)).status_code for _ in range(2)]

    assert answers == [204, 204]
    assert await db.fetchval("SELECT count(*) FROM warehouse_shipments") == 1
    assert await db.fetchval("SELECT count(*) FROM webhook_inbox") == 2
    assert await db.fetchval("SELECT on_hand FROM stock_levels WHERE sku = 'A'") == 9


async def test_a_shipment_of_an_unknown_order_is_a_204_kept_as_a_discrepancy(
    intake, client, db
) -> None:
    unknown = uuid.uuid4()

    answer = await post(client, intake, shipment_body(unknown, [("A", 1)]))

    assert answer.status_code == 204
    kinds = await db.fetch("SELECT kind, order_id FROM warehouse_discrepancies")
    assert [(row["kind"], row["order_id"]) for row in kinds] == [("unknown_order", unknown)]


async def test_a_shipment_of_an_order_shipped_already_is_a_204_recorded_as_already_shipped(
    intake, client, db, reserved
) -> None:
    whole = await post(client, intake, shipment_body(reserved, [("A", 4), ("B", 2)]))

    late = await post(client, intake, shipment_body(reserved, [("A", 1)], shipment_id="SHP-late"))

    assert (whole.status_code, late.status_code) == (204, 204)
    outcome = await db.fetchval(
        "SELECT outcome FROM warehouse_shipments WHERE shipment_id = 'SHP-late'"
    )
    assert outcome == "already_shipped"
    assert await db.fetchval("SELECT count(*) FROM warehouse_discrepancies") == 0
    assert await db.fetchval("SELECT on_hand FROM stock_levels WHERE sku = 'A'") == 6


def discrepancies_counted(intake: IntakeProcess) -> dict[str, float]:
    """``fulfilment_warehouse_discrepancies_total`` of the intake, by kind."""
    return {
        sample.labels["kind"]: sample.value
        for family in text_string_to_metric_families(intake.metrics())
        if family.name == "fulfilment_warehouse_discrepancies"
        for sample in family.samples
        if sample.name.endswith("_total")
    }


async def test_the_discrepancies_counted_after_a_mixed_burst_are_the_rows_kept_by_kind(
    intake, client, db, stock, reserved
) -> None:
    # The reserved order ships all its A first: a later shipment of A names a SKU the order
    # holds a line of but no unit, which its row calls more_than_held.
    first = await post(client, intake, shipment_body(reserved, [("A", 4)]))
    assert first.status_code == 204
    partly = order(("A", 2))
    rejected = order(("B", 50))
    await stock.apply(partly)
    await stock.apply(rejected)
    unknown = uuid.uuid4()
    bodies = [
        shipment_body(reserved, [("A", 1), ("C", 2)]),
        shipment_body(partly.order_id, [("A", 3)]),
        shipment_body(unknown, [("X", 1), ("Y", 2)]),
        shipment_body(rejected.order_id, [("B", 1)]),
        cancellation_body(unknown, None),
        cancellation_body(rejected.order_id, [("B", 1), ("A", 2)]),
    ]
    before = discrepancies_counted(intake)

    # Each webhook twice at once under its webhook id (the sender's retry), and once more
    # under another (the same change sent again): only the first application keeps rows.
    answers = await asyncio.gather(
        *(
            post(client, intake, body, webhook_id=webhook_id)
            for number, body in enumerate(bodies)
            for webhook_id in (f"msg_burst_{number}", f"msg_burst_{number}", f"msg_again_{number}")
        )
    )

    assert {answer.status_code for answer in answers} == {204}
    after = discrepancies_counted(intake)
    counted = {kind: after[kind] - before.get(kind, 0.0) for kind in after}
    rows = {
        row["kind"]: row["count"]
        for row in await db.fetch(
            "SELECT kind, count(*) FROM warehouse_discrepancies GROUP BY kind"
        )
    }
    assert rows == {
        "unknown_order": 3,
        "order_not_reserved": 3,
        "more_than_held": 2,
        "sku_not_held": 1,
    }
    assert {kind: count for kind, count in counted.items() if count} == rows


async def test_a_cancellation_by_the_warehouse_is_applied_before_the_204(
    intake, client, db, reserved
) -> None:
    answer = await post(client, intake, cancellation_body(reserved, None))

    assert answer.status_code == 204
    assert await db.fetchval("SELECT sum(reserved) FROM stock_levels") == 0
    assert await db.fetchval("SELECT count(*) FROM warehouse_cancellations") == 1


@pytest.mark.usefixtures("reserved")
async def test_an_adjustment_is_applied_once_before_the_204_and_counted(intake, client, db) -> None:
    # 4 of the 10 A are held: losing 7 leaves the SKU short by 1.
    body = adjustment_body("A", -7, "damaged")

    first = await post(client, intake, body)
    again = await post(client, intake, body)

    assert (first.status_code, again.status_code) == (204, 204)
    assert await db.fetchval("SELECT on_hand FROM stock_levels WHERE sku = 'A'") == 3
    assert await db.fetchval("SELECT count(*) FROM warehouse_adjustments") == 1
    assert [
        tuple(row) for row in await db.fetch("SELECT routing_key, sku FROM outbox WHERE sku = 'A'")
    ] == [("stock.shortage", "A"), ("stock.adjusted", "A")]
    metrics = intake.metrics()
    assert (
        'fulfilment_webhooks_received_total{outcome="adjusted",type="inventory.adjusted"} 1.0'
        in (metrics)
    )
    assert 'fulfilment_stock_adjustments_total{reason="damaged"} 1.0' in metrics
    assert 'fulfilment_stock_adjusted_units_total{direction="out",reason="damaged"} 7.0' in metrics


async def test_an_adjustment_of_no_units_is_a_422_kept_for_an_operator(intake, client, db) -> None:
    answer = await post(client, intake, adjustment_body("A", 0))

    assert answer.status_code == 422
    assert "delta" in answer.json()["reason"]
    assert await db.fetchval("SELECT type FROM invalid_webhooks") == "inventory.adjusted"


@pytest.mark.parametrize("webhook_type", ["order.created", "x" * 200])
async def test_a_type_not_taken_is_a_204_counted_and_not_kept(
    intake, client, db, webhook_type
) -> None:
    body = json.dumps({"type": webhook_type, "timestamp": "2026-12-06T10:00:00Z", "data": {}})

    answer = await post(client, intake, body.encode())

    assert answer.status_code == 204
    assert await recorded(db) == NOTHING
    assert (
        'fulfilment_webhooks_received_total{outcome="type_not_taken",type="other"}'
        in intake.metrics()
    )


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"not json", "invalid warehouse webhook"),
        (
            b'{"type": "shipment.shipped", "timestamp": "2026-12-06T10:00:00Z", "data": {}}',
            "shipment_id",
        ),
        (shipment_body(uuid.uuid4(), [("A", 0)]), "quantity"),
        (shipment_body(uuid.uuid4(), [("A", 1)], version=2), "version"),
        (
            shipment_body(uuid.uuid4(), [("A", 1)]).replace(b'"DHL"', b'"DHL", "carrier": "UPS"'),
            "twice",
        ),
    ],
    ids=["not-json", "missing-field", "quantity-0", "unknown-version", "key-twice"],
)
async def test_an_invalid_event_is_a_422_with_the_reason_kept_once_per_webhook_id(
    intake, client, db, body, reason
) -> None:
    headers = signed_headers(body, webhook_id="msg_invalid")
    headers["x-forwarded-for"] = "203.0.113.9"

    first = await client.post(intake.url, content=body, headers=headers)
    retried = await client.post(
        intake.url, content=body, headers=signed_headers(body, webhook_id="msg_invalid")
    )

    assert (first.status_code, retried.status_code) == (422, 422)
    assert reason in first.json()["reason"]
    kept = await db.fetch("SELECT webhook_id, headers, body, reason FROM invalid_webhooks")
    assert len(kept) == 1
    assert kept[0]["webhook_id"] == "msg_invalid"
    assert bytes(kept[0]["body"]) == body
    assert kept[0]["reason"] == first.json()["reason"]
    stored_headers = json.loads(kept[0]["headers"])
    assert stored_headers["x-forwarded-for"] == "203.0.113.9"
    assert "webhook-signature" not in stored_headers
    assert {**(await recorded(db)), "invalid_webhooks": 0} == NOTHING


async def test_an_unsigned_request_is_a_401_and_nothing_is_recorded(
    intake, client, db, reserved
) -> None:
    body = shipment_body(reserved, [("A", 1)])
    before = await recorded(db)

    answer = await client.post(intake.url, content=body)

    assert answer.status_code == 401
    assert answer.json() == {"error": "missing_header"}
    assert await recorded(db) == before


async def test_a_body_over_the_limit_is_a_413_and_nothing_is_recorded(
    intake, client, db, reserved
) -> None:
    body = shipment_body(reserved, [("A", 1)], padding="x" * 5000)
    before = await recorded(db)

    answer = await post(client, intake, body)

    assert answer.status_code == 413
    assert await recorded(db) == before


# The 503 of a database that does not answer: tests/integration/test_webhook_intake_database.py


# --- Signatures end to end ---------------------------------------------------------------------


@pytest.mark.usefixtures("clean_database")
@pytest.mark.parametrize("secrets", [(SECRET,), (SECOND_SECRET,), (UNKNOWN_SECRET, SECOND_SECRET)])
async def test_a_signature_of_either_secret_passes(intake, client, secrets) -> None:
    body = json.dumps({"type": "order.created", "timestamp": "2026-12-06T10:00:00Z", "data": {}})

    answer = await post(client, intake, body.encode(), secrets=secrets)

    assert answer.status_code == 204


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda _: {"webhook-signature": "v1,bm90IHRoZSBzaWduYXR1cmU="}, "no_matching_signature"),
        (lambda now: {"webhook-timestamp": str(now - 330)}, "timestamp_outside_tolerance"),
        (lambda now: {"webhook-timestamp": str(now + 330)}, "timestamp_outside_tolerance"),
        (lambda now: {"webhook-timestamp": f"{now}.5"}, "malformed_timestamp"),
        (lambda _: {"webhook-id": ""}, "missing_header"),
    ],
    ids=["forged", "stale", "future", "fractional", "no-id"],
)
async def test_a_refused_signature_is_a_401_with_its_reason_and_nothing_recorded(
    intake, client, db, reserved, change, error
) -> None:
    body = shipment_body(reserved, [("A", 1)])
    headers = {**signed_headers(body), **change(int(time.time()))}
    before = await recorded(db)

    answer = await client.post(intake.url, content=body, headers=headers)

    assert answer.status_code == 401
    assert answer.json() == {"error": error}
    assert await recorded(db) == before
    assert f'fulfilment_webhook_refusals_total{{reason="{error}"}}' in intake.metrics()


async def test_a_timestamp_near_the_tolerance_either_way_passes(intake, client) -> None:
    body = json.dumps({"type": "order.created", "timestamp": "2026-12-06T10:00:00Z", "data": {}})
    now = int(time.time())

    # A few seconds inside the edges: the exact edges are unit tests with a fixed clock.
    answers = [
        (await post(client, intake, body.encode(), timestamp=now + offset)).status_code
        for offset in (-295, 295)
    ]

    assert answers == [204, 204]


# --- The body limit while reading --------------------------------------------------------------


async def test_a_content_length_over_the_limit_is_refused_before_the_body_is_sent(intake) -> None:
    body = b"x" * 10_000
    headers = signed_headers(body)
    request = (
        f"POST /webhooks/warehouse HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {len(body)}\r\n"
        + "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        + "\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", intake.port)
    try:
        writer.write(request)  # the headers alone: the body is never sent
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), timeout=5)
    finally:
        writer.close()

    assert status_line.startswith(b"HTTP/1.1 413")


async def test_a_chunked_body_is_refused_once_it_passes_the_limit(intake) -> None:
    body = b"y" * 3000
    headers = signed_headers(body * 100)
    request = (
        "POST /webhooks/warehouse HTTP/1.1\r\nhost: 127.0.0.1\r\ntransfer-encoding: chunked\r\n"
        + "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        + "\r\n"
    ).encode()
    chunk = b"%x\r\n%s\r\n" % (len(body), body)
    reader, writer = await asyncio.open_connection("127.0.0.1", intake.port)
    try:
        writer.write(request + chunk + chunk)  # 6,000 bytes of a body that never ends
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), timeout=5)
    finally:
        writer.close()

    assert status_line.startswith(b"HTTP/1.1 413")


# --- What the process says ---------------------------------------------------------------------


async def test_one_log_line_per_webhook_without_secret_or_signature(intake, client) -> None:
    body = json.dumps({"type": "order.created", "timestamp": "2026-12-06T10:00:00Z", "data": {}})
    headers = signed_headers(body.encode(), webhook_id="msg_logged")

    await client.post(intake.url, content=body, headers=headers)
    await asyncio.sleep(0.2)

    lines = [line for line in intake.log_lines() if line.get("webhook_id") == "msg_logged"]
    assert len(lines) == 1
    assert lines[0]["event"] == "webhooks.answered"
    assert lines[0]["type"] == "other"
    assert lines[0]["outcome"] == "type_not_taken"
    assert lines[0]["status"] == 204
    assert isinstance(lines[0]["ms"], float)
    log = intake.log_path.read_text()
    signature = headers["webhook-signature"].split(",", 1)[1]
    for secret in (SECRET, SECOND_SECRET, signature):
        assert secret not in log
        assert secret.removeprefix("whsec_") not in log


async def test_the_probes_and_metrics_are_on_their_own_port(intake, client) -> None:
    ready = await client.get(f"http://127.0.0.1:{intake.http_port}/health/ready")
    not_here = await client.get(f"http://127.0.0.1:{intake.port}/metrics")

    assert ready.status_code == 200
    assert ready.json() == {"database": True}
    assert not_here.status_code == 404
    metrics = intake.metrics()
    for name in (
        "fulfilment_webhooks_received_total",
        "fulfilment_webhook_refusals_total",
        "fulfilment_webhook_answer_seconds_bucket",
        "fulfilment_warehouse_events_total",
        "fulfilment_warehouse_discrepancies_total",
    ):
        assert name in metrics
