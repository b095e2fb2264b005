"""The simulator keeps stock: on hand per SKU, shipments take from it, adjustments are webhooks.

Against a real receiver on a socket (``tests.support.webhook_receiver``) that verifies with
the ``standardwebhooks`` package, and the simulator's API over HTTP.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from fulfilment.contracts.warehouse_events import INVENTORY_ADJUSTED, WebhookEnvelope
from tests.support.simulated_warehouse import TOKEN, order_body
from tests.support.webhook_receiver import WebhookReceiver, serving
from warehouse_simulator import Faults, SimulatorServer, WarehouseSimulator

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
ADJUSTMENT_FIELDS = {"adjustment_id", "sku", "delta", "reason", "occurred_at"}


@pytest.fixture
async def receiver() -> WebhookReceiver:
    return WebhookReceiver(secrets=(SECRET,))


@pytest.fixture
async def server(receiver: WebhookReceiver) -> AsyncIterator[SimulatorServer]:
    async with serving(receiver) as url:
        faults = Faults(
            token=TOKEN,
            ship_delay_seconds=0.0,
            split_rate=0.0,
            webhook_url=url,
            webhook_secrets=(SECRET,),
            webhook_retry_seconds=(0.05,),
        )
        async with SimulatorServer(WarehouseSimulator(faults, seed=11)) as running:
            yield running


@pytest.fixture
async def http(server: SimulatorServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5
    ) as client:
        yield client


@pytest.fixture
async def admin(server: SimulatorServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.admin_url, timeout=5) as client:
        yield client


async def load(admin: httpx.AsyncClient, levels: dict[str, int]) -> None:
    answer = await admin.post("/inventory", json={"levels": levels})
    assert answer.status_code == 200, answer.text


async def create(http: httpx.AsyncClient, lines: list[tuple[str, int]]) -> str:
    answer = await http.post(
        "/fulfilment-orders",
        content=order_body(uuid.uuid4(), lines),
        headers={"Idempotency-Key": str(uuid.uuid4())},
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


async def on_hand(http: httpx.AsyncClient) -> dict[str, int]:
    """Every SKU's on hand, read a page of 2 at a time as a client would."""
    levels: dict[str, int] = {}
    after = ""
    while True:
        answer = await http.get("/inventory", params={"after": after, "limit": 2})
        assert answer.status_code == 200, answer.text
        page = answer.json()
        levels.update({item["sku"]: item["on_hand"] for item in page["items"]})
        if page["next"] is None:
            return levels
        after = page["next"]


def adjustments_received(receiver: WebhookReceiver) -> list[dict[str, Any]]:
    """The ``data`` of the verified ``inventory.adjusted`` webhooks, in arrival order."""
    return [
        request.document["data"]
        for request in receiver.verified()
        if request.document["type"] == INVENTORY_ADJUSTED
    ]


async def test_the_inventory_is_paged_in_sku_order_with_next_until_the_last_page(
    http: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    await load(admin, {"C-3": 3, "A-1": 1, "B-2": 0, "D-4": 4, "E-5": 5})

    first = (await http.get("/inventory", params={"limit": 2})).json()
    second = (await http.get("/inventory", params={"after": first["next"], "limit": 2})).json()
    last = (await http.get("/inventory", params={"after": second["next"], "limit": 2})).json()

    assert first["items"] == [{"sku": "A-1", "on_hand": 1}, {"sku": "B-2", "on_hand": 0}]
    assert (first["next"], second["next"], last["next"]) == ("B-2", "D-4", None)
    assert [item["sku"] for item in last["items"]] == ["E-5"]
    assert first["as_of"].endswith("Z")


@pytest.mark.parametrize("limit", ["0", "1001", "x", "-1"])
async def test_a_limit_out_of_range_is_refused(http: httpx.AsyncClient, limit: str) -> None:
    answer = await http.get("/inventory", params={"limit": limit})

    assert (answer.status_code, answer.json()["error"]) == (400, "invalid_limit")


async def test_the_inventory_asks_for_the_token_and_keeps_the_rate_cap_and_faults(
    server: SimulatorServer, http: httpx.AsyncClient
) -> None:
    async with httpx.AsyncClient(base_url=server.url) as anonymous:
        assert (await anonymous.get("/inventory")).status_code == 401
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": "Bearer another"}
    ) as stranger:
        assert (await stranger.get("/inventory")).status_code == 403
    assert (await http.post("/inventory")).status_code == 405
    server.simulator.faults.update({"rate_limit_per_second": 1, "retry_after_seconds": 0.3})
    statuses = [(await http.get("/inventory")).status_code for _ in range(3)]
    assert statuses == [200, 429, 429]
    server.simulator.faults.update({"rate_limit_per_second": None, "error_rate": 1.0})
    await asyncio.sleep(0.4)
    assert (await http.get("/inventory")).status_code == 503


async def test_a_shipment_takes_its_units_off_the_shelf_when_it_is_made(
    server: SimulatorServer, http: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    server.simulator.faults.update({"ship_delay_seconds": 0.5})
    await load(admin, {"85123A": 10, "22423": 4})
    await create(http, [("85123A", 6), ("22423", 1)])
    received = await on_hand(http)
    await server.simulator.settled()

    assert received == {"85123A": 10, "22423": 4}
    assert await on_hand(http) == {"85123A": 4, "22423": 3}


async def test_units_beyond_the_shelf_are_cancelled_and_the_rest_ships(
    server: SimulatorServer,
    http: httpx.AsyncClient,
    admin: httpx.AsyncClient,
    receiver: WebhookReceiver,
) -> None:
    await load(admin, {"85123A": 4})
    order_id = await create(http, [("85123A", 6), ("SKU-NOT-KEPT", 50)])
    await server.simulator.settled()

    made = server.simulator.record()
    [cancellation] = made["cancellations"]
    [shipment] = made["shipments"]
    assert cancellation["fulfilment_order_id"] == order_id
    assert (cancellation["reason"], cancellation["lines"]) == (
        "unfulfillable",
        [{"sku": "85123A", "quantity": 2}],
    )
    assert sorted((line["sku"], line["quantity"]) for line in shipment["lines"]) == [
        ("85123A", 4),
        ("SKU-NOT-KEPT", 50),
    ]
    assert await on_hand(http) == {"85123A": 0}
    types = [request.document["type"] for request in receiver.verified()]
    assert types == ["fulfilment_order.cancelled", "shipment.shipped"]


async def test_held_work_waits_so_a_damage_meets_its_orders_unshipped_then_is_cancelled(
    server: SimulatorServer, http: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    await load(admin, {"85123A": 6})
    held = await admin.post("/faults", json={"work_held": True})
    await create(http, [("85123A", 5)])
    await asyncio.sleep(0.3)  # past its ship delay (0 s): due, yet held

    shipped_while_held = list(server.simulator.record()["shipments"])
    damage = await admin.post(
        "/adjustments", json={"sku": "85123A", "delta": -2, "reason": "damaged"}
    )
    released = await admin.post("/faults", json={"work_held": False})
    await server.simulator.settled()

    assert (held.json()["work_held"], released.json()["work_held"]) == (True, False)
    assert shipped_while_held == []
    assert damage.status_code == 201, damage.text
    made = server.simulator.record()
    [cancellation] = made["cancellations"]
    [shipment] = made["shipments"]
    assert cancellation["lines"] == [{"sku": "85123A", "quantity": 1}]
    assert shipment["lines"] == [{"sku": "85123A", "quantity": 4}]
    assert await on_hand(http) == {"85123A": 0}


async def test_work_held_takes_only_true_or_false(admin: httpx.AsyncClient) -> None:
    answer = await admin.post("/faults", json={"work_held": 1})

    assert (answer.status_code, answer.json()["error"]) == (400, "work_held must be true or false")


async def test_an_adjustment_is_a_signed_webhook_with_the_products_body(
    server: SimulatorServer,
    http: httpx.AsyncClient,
    admin: httpx.AsyncClient,
    receiver: WebhookReceiver,
) -> None:
    await load(admin, {"85123A": 10})
    answer = await admin.post(
        "/adjustments", json={"sku": "85123A", "delta": -3, "reason": "damaged"}
    )
    await server.simulator.settled()

    assert answer.status_code == 201
    [request] = receiver.received
    assert request.verified
    assert request.webhook_id.startswith("msg_")
    envelope = WebhookEnvelope.model_validate_json(request.body)
    assert envelope.type == INVENTORY_ADJUSTED
    data = request.document["data"]
    assert set(data) == ADJUSTMENT_FIELDS
    assert data == answer.json()
    assert (data["sku"], data["delta"], data["reason"]) == ("85123A", -3, "damaged")
    assert data["adjustment_id"].startswith("ADJ-")
    assert await on_hand(http) == {"85123A": 7}
    [webhook] = server.simulator.record()["webhooks"]
    assert (webhook["type"], webhook["subject"], webhook["reference"]) == (
        INVENTORY_ADJUSTED,
        data["adjustment_id"],
        None,
    )
    assert server.simulator.record()["adjustments"] == [data]


async def test_a_receipt_of_a_sku_not_kept_starts_keeping_it(
    http: httpx.AsyncClient, admin: httpx.AsyncClient
) -> None:
    answer = await admin.post(
        "/adjustments", json={"sku": "NEW-1", "delta": 5, "reason": "received"}
    )

    assert answer.status_code == 201
    assert await on_hand(http) == {"NEW-1": 5}


@pytest.mark.parametrize(
    "asked",
    [
        {"sku": "85123A", "delta": -11, "reason": "lost"},
        {"sku": "85123A", "delta": 0, "reason": "counted"},
        {"sku": "85123A", "delta": 1.5, "reason": "found"},
        {"sku": "85123A", "delta": 2, "reason": "stolen"},
        {"sku": "", "delta": 2, "reason": "received"},
    ],
    ids=str,
)
async def test_an_adjustment_that_cannot_be_made_is_refused_and_nothing_is_sent(
    server: SimulatorServer,
    http: httpx.AsyncClient,
    admin: httpx.AsyncClient,
    receiver: WebhookReceiver,
    asked: dict[str, object],
) -> None:
    await load(admin, {"85123A": 10})
    answer = await admin.post("/adjustments", json=asked)
    await server.simulator.settled()

    assert answer.status_code == 400
    assert await on_hand(http) == {"85123A": 10}
    assert receiver.received == []


@pytest.mark.parametrize(
    "levels", [{"A": -1}, {"A": 1.5}, {"": 3}, ["A", 1]], ids=["negative", "float", "empty", "list"]
)
async def test_a_bad_level_is_refused_and_nothing_is_loaded(
    http: httpx.AsyncClient, admin: httpx.AsyncClient, levels: object
) -> None:
    answer = await admin.post("/inventory", json={"levels": levels})

    assert answer.status_code == 400
    assert await on_hand(http) == {}


async def test_the_rate_knobs_make_each_reason_and_the_shelf_follows_their_deltas(
    server: SimulatorServer,
    http: httpx.AsyncClient,
    admin: httpx.AsyncClient,
    receiver: WebhookReceiver,
) -> None:
    await load(admin, {"A": 3, "B": 0, "C": 40})
    knobs = {
        "receipts_per_second": 40,
        "returns_per_second": 40,
        "damages_per_second": 40,
        "losses_per_second": 40,
        "counts_per_second": 40,
        "adjustment_max_units": 4,
    }
    assert (await admin.post("/faults", json=knobs)).status_code == 200
    await _until(lambda: len(server.simulator.shelves.adjustments) >= 60)
    stop = dict.fromkeys(knobs, 0) | {"adjustment_max_units": 1}
    assert (await admin.post("/faults", json=stop)).status_code == 200
    await server.simulator.settled()

    made = server.simulator.record()["adjustments"]
    assert {adjustment["reason"] for adjustment in made} == {
        "received",
        "returned",
        "damaged",
        "lost",
        "counted",
    }
    for adjustment in made:
        assert 1 <= abs(adjustment["delta"]) <= 4
        if adjustment["reason"] in {"received", "returned"}:
            assert adjustment["delta"] > 0
        if adjustment["reason"] in {"damaged", "lost"}:
            assert adjustment["delta"] < 0
    levels = Counter[str]({"A": 3, "B": 0, "C": 40})
    for adjustment in made:
        levels[adjustment["sku"]] += adjustment["delta"]
        assert levels[adjustment["sku"]] >= 0, adjustment
    assert await on_hand(http) == dict(levels)
    assert adjustments_received(receiver) == made


async def test_every_adjustment_is_applied_once_under_the_webhook_faults(
    server: SimulatorServer, admin: httpx.AsyncClient, receiver: WebhookReceiver
) -> None:
    server.simulator.faults.update(
        {
            "webhook_duplicate_rate": 0.3,
            "webhook_resend_rate": 0.3,
            "webhook_reorder_rate": 0.3,
            "webhook_hold_seconds": 0.3,
            "webhook_never_rate": 0.2,
            "webhook_wrong_secret_rate": 0.2,
            "webhook_stale_rate": 0.2,
        }
    )
    receiver.answers.extend([500, 503] * 5)
    await load(admin, {"85123A": 1000})
    for number in range(40):
        reason = "received" if number % 2 else "damaged"
        delta = 1 + number % 3
        answer = await admin.post(
            "/adjustments",
            json={"sku": "85123A", "delta": delta if number % 2 else -delta, "reason": reason},
        )
        assert answer.status_code == 201
    await server.simulator.settled()

    made = server.simulator.record()
    never = {w["subject"] for w in made["webhooks"] if w["fate"] == "never_sent"}
    assert never, "the never-sent rate sent everything"
    assert {w["cause"] for w in made["webhooks"]} == {"change", "duplicate", "resend"}
    assert {w["fate"] for w in made["webhooks"]} == {"delivered", "never_sent"}
    for adjustment in made["adjustments"]:
        subject = adjustment["adjustment_id"]
        assert receiver.applied[subject] == (0 if subject in never else 1), subject
    assert sum(1 for request in receiver.received if not request.verified) > 0


async def _until(condition: Callable[[], object], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110 - state of the code under test, not an event
            await asyncio.sleep(0.02)
