"""The simulator speaks back: it ships and cancels on its own and sends signed webhooks.

Against a real receiver on a socket (``tests.support.webhook_receiver``) that verifies with
the ``standardwebhooks`` package; the bodies are read with the service's own models.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import standardwebhooks

from fulfilment.contracts.warehouse_events import (
    FulfilmentOrderV1,
    ShipmentV1,
    WarehouseCancellationV1,
    WebhookEnvelope,
)
from tests.support.simulated_warehouse import TOKEN, order_body
from tests.support.webhook_receiver import WebhookReceiver, serving
from warehouse_simulator import Faults, SimulatorServer, WarehouseSimulator
from warehouse_simulator.knobs import DEFAULT_WEBHOOK_SECRET

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
OTHER_SECRET = "whsec_" + "c2Vjb25kLXNlY3JldC1vZi10aGUtd2FyZWhvdXNl"
SIMULATOR = Path(__file__).parents[2] / "simulator"


@pytest.fixture
async def receiver() -> WebhookReceiver:
    return WebhookReceiver(secrets=(SECRET,))


@pytest.fixture
async def url(receiver: WebhookReceiver) -> AsyncIterator[str]:
    async with serving(receiver) as running:
        yield running


@pytest.fixture
async def server(url: str) -> AsyncIterator[SimulatorServer]:
    faults = Faults(
        token=TOKEN,
        ship_delay_seconds=0.0,
        split_rate=0.0,
        webhook_url=url,
        webhook_secrets=(SECRET,),
        webhook_retry_seconds=(0.05,),
    )
    async with SimulatorServer(WarehouseSimulator(faults, seed=7)) as running:
        yield running


@pytest.fixture
async def http(server: SimulatorServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5
    ) as client:
        yield client


async def create(http: httpx.AsyncClient, lines: list[tuple[str, int]]) -> str:
    """Create a fulfilment order; its warehouse id."""
    answer = await http.post(
        "/fulfilment-orders",
        content=order_body(uuid.uuid4(), lines),
        headers={"Idempotency-Key": str(uuid.uuid4())},
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def record(simulator: WarehouseSimulator) -> list[dict[str, Any]]:
    """The simulator's record of its webhooks."""
    return list(simulator.record()["webhooks"])


def shipment_of(document: dict[str, Any]) -> ShipmentV1:
    return ShipmentV1.model_validate_json(json.dumps(document))


async def test_a_shipment_is_a_webhook_verified_by_the_package_with_the_shipment_in_it(
    server: SimulatorServer, http: httpx.AsyncClient, receiver: WebhookReceiver
) -> None:
    order_id = await create(http, [("85123A", 6), ("22423", 2)])
    await server.simulator.settled()

    [request] = receiver.received
    assert request.verified
    envelope = WebhookEnvelope.model_validate_json(request.body)
    assert envelope.type == "shipment.shipped"
    assert set(request.document) == {"type", "timestamp", "data"}
    shipment = shipment_of(request.document["data"])
    assert shipment.fulfilment_order_id == order_id
    assert sorted((line.sku, line.quantity) for line in shipment.lines) == [
        ("22423", 2),
        ("85123A", 6),
    ]
    assert shipment.carrier
    assert shipment.tracking_numbers
    assert shipment.tracking_url is not None
    assert shipment.tracking_url.startswith("https://")
    assert request.webhook_id.startswith("msg_")


async def test_each_secret_signs_once_and_each_signature_verifies_alone(
    server: SimulatorServer, http: httpx.AsyncClient, receiver: WebhookReceiver
) -> None:
    server.simulator.faults.update({"webhook_secrets": f"{SECRET} {OTHER_SECRET}"})
    await create(http, [("85123A", 1)])
    await server.simulator.settled()

    [request] = receiver.received
    signatures = request.signature.split(" ")
    assert len(signatures) == 2
    for secret, signature in zip((SECRET, OTHER_SECRET), signatures, strict=True):
        headers = {
            "webhook-id": request.webhook_id,
            "webhook-timestamp": request.timestamp,
            "webhook-signature": signature,
        }
        standardwebhooks.Webhook(secret).verify(request.body, headers)


async def test_a_retry_keeps_the_webhook_id_and_changes_the_timestamp(
    server: SimulatorServer, http: httpx.AsyncClient, receiver: WebhookReceiver
) -> None:
    # Whole seconds apart, so that the Unix-second timestamps must differ.
    server.simulator.faults.update({"webhook_retry_seconds": [1.0]})
    receiver.answers.extend([500, 503])
    await create(http, [("85123A", 6)])
    await server.simulator.settled()

    assert [request.status for request in receiver.received] == [500, 503, 204]
    assert len({request.webhook_id for request in receiver.received}) == 1
    timestamps = [int(request.timestamp) for request in receiver.received]
    assert timestamps == sorted(set(timestamps))
    [webhook] = record(server.simulator)
    assert webhook["fate"] == "delivered"
    assert [attempt["status"] for attempt in webhook["attempts"]] == [500, 503, 204]


async def test_a_timeout_is_retried(
    server: SimulatorServer, http: httpx.AsyncClient, receiver: WebhookReceiver
) -> None:
    server.simulator.faults.update({"webhook_timeout_seconds": 0.2})
    receiver.stalls, receiver.stall_seconds = 1, 1.0
    await create(http, [("85123A", 6)])
    await server.simulator.settled()

    [webhook] = record(server.simulator)
    assert [attempt["error"] for attempt in webhook["attempts"]] == ["timeout", None]
    assert webhook["fate"] == "delivered"
    assert receiver.applied == Counter({webhook["subject"]: 1})


async def test_a_receiver_that_never_answers_is_given_up_after_the_cap(
    server: SimulatorServer, http: httpx.AsyncClient, unused_port: int
) -> None:
    server.simulator.faults.update(
        {
            "webhook_url": f"http://127.0.0.1:{unused_port}/webhooks/warehouse",
            "webhook_retry_seconds": [0.05, 0.1],
            "webhook_give_up_seconds": 0.5,
        }
    )
    started = time.monotonic()
    await create(http, [("85123A", 6)])
    await server.simulator.settled()

    [webhook] = record(server.simulator)
    assert webhook["fate"] == "gave_up"
    assert len(webhook["attempts"]) >= 4
    assert {attempt["error"] for attempt in webhook["attempts"]} == {"ConnectError"}
    assert time.monotonic() - started < 2


async def test_a_410_stops_the_retries_and_disables_the_endpoint(
    server: SimulatorServer, http: httpx.AsyncClient, receiver: WebhookReceiver, url: str
) -> None:
    receiver.answers.append(410)
    await create(http, [("85123A", 6)])
    await server.simulator.settled()
    await create(http, [("85123A", 1)])
    await server.simulator.settled()

    gone, disabled = record(server.simulator)
    assert (gone["fate"], len(gone["attempts"])) == ("gone", 1)
    assert (disabled["fate"], disabled["attempts"]) == ("endpoint_disabled", [])
    assert len(receiver.received) == 1

    # Setting the URL again enables it.
    async with httpx.AsyncClient(base_url=server.admin_url) as admin:
        assert (await admin.post("/faults", json={"webhook_url": url})).status_code == 200
    await create(http, [("85123A", 2)])
    await server.simulator.settled()
    assert record(server.simulator)[-1]["fate"] == "delivered"


async def test_the_duplicate_fault_sends_a_delivered_webhook_again_under_the_same_id(
    server: SimulatorServer, http: httpx.AsyncClient, receiver: WebhookReceiver
) -> None:
    server.simulator.faults.update({"webhook_duplicate_rate": 1.0})
    await create(http, [("85123A", 6)])
    await server.simulator.settled()

    first, again = receiver.received
    assert (first.webhook_id, first.body) == (again.webhook_id, again.body)
    assert [webhook["cause"] for webhook in record(server.simulator)] == ["change", "duplicate"]
    assert list(receiver.applied.values()) == [1]


async def test_the_resend_fault_sends_the_change_again_under_a_new_id(
    server: SimulatorServer, http: httpx.AsyncClient, receiver: WebhookReceiver
) -> None:
    server.simulator.faults.update({"webhook_resend_rate": 1.0})
    await create(http, [("85123A", 6)])
    await server.simulator.settled()

    first, again = receiver.received
    assert first.webhook_id != again.webhook_id
    assert first.document["data"] == again.document["data"]
    assert [webhook["cause"] for webhook in record(server.simulator)] == ["change", "resend"]
    assert receiver.applied == Counter({first.subject: 1, f"again:{first.subject}": 1})


async def test_the_reorder_fault_holds_one_back_so_a_later_one_overtakes_it(
    server: SimulatorServer, http: httpx.AsyncClient, receiver: WebhookReceiver
) -> None:
    server.simulator.faults.update({"webhook_reorder_rate": 1.0, "webhook_hold_seconds": 1.0})
    held = await create(http, [("85123A", 6)])
    await asyncio.sleep(0.2)
    server.simulator.faults.update({"webhook_reorder_rate": 0.0})
    later = await create(http, [("85123A", 1)])
    await server.simulator.settled()

    order = [request.document["data"]["fulfilment_order_id"] for request in receiver.received]
    assert order == [later, held]


async def test_the_delay_fault_delays_every_webhook(
    server: SimulatorServer, http: httpx.AsyncClient, receiver: WebhookReceiver
) -> None:
    server.simulator.faults.update({"webhook_delay_seconds": 0.6})
    started = time.monotonic()
    await create(http, [("85123A", 6)])
    await asyncio.sleep(0.4)
    nothing_yet = list(receiver.received)
    await server.simulator.settled()

    assert nothing_yet == []
    assert len(receiver.received) == 1
    assert time.monotonic() - started >= 0.6


async def test_changes_never_sent_are_listed_by_the_order_and_the_record(
    server: SimulatorServer, http: httpx.AsyncClient, receiver: WebhookReceiver
) -> None:
    server.simulator.faults.update({"webhook_never_rate": 1.0})
    order_id = await create(http, [("85123A", 6)])
    await server.simulator.settled()

    answer = await http.get(f"/fulfilment-orders/{order_id}")
    order = FulfilmentOrderV1.model_validate_json(answer.content)
    [webhook] = record(server.simulator)
    assert receiver.received == []
    assert (webhook["fate"], webhook["attempts"]) == ("never_sent", [])
    assert order.status == "shipped"
    assert [shipment.shipment_id for shipment in order.shipments] == [webhook["subject"]]


async def test_an_attempt_signed_with_a_wrong_secret_is_refused_and_a_retry_signed_right_applies(
    server: SimulatorServer, http: httpx.AsyncClient, receiver: WebhookReceiver
) -> None:
    faults = server.simulator.faults
    faults.update({"webhook_wrong_secret_rate": 1.0, "webhook_retry_seconds": [0.5]})
    await create(http, [("85123A", 6)])
    await _until(lambda: receiver.received)
    faults.update({"webhook_wrong_secret_rate": 0.0})
    await server.simulator.settled()

    wrong, right = receiver.received
    assert (wrong.verified, wrong.status, right.verified) == (False, 401, True)
    assert wrong.webhook_id == right.webhook_id
    [webhook] = record(server.simulator)
    assert [attempt["wrong_secret"] for attempt in webhook["attempts"]] == [True, False]


async def test_a_stale_timestamp_is_signed_right_and_refused_for_its_age_only(
    server: SimulatorServer, http: httpx.AsyncClient, receiver: WebhookReceiver
) -> None:
    faults = server.simulator.faults
    faults.update({"webhook_stale_rate": 1.0, "webhook_retry_seconds": [0.5]})
    await create(http, [("85123A", 6)])
    await _until(lambda: receiver.received)
    faults.update({"webhook_stale_rate": 0.0})
    await server.simulator.settled()

    stale, fresh = receiver.received
    assert (stale.verified, stale.status, fresh.verified) == (False, 401, True)
    assert time.time() - int(stale.timestamp) >= 600
    signed_at = datetime.fromtimestamp(int(stale.timestamp), UTC)
    expected = standardwebhooks.Webhook(SECRET).sign(
        stale.webhook_id, signed_at, stale.body.decode()
    )
    assert stale.signature == expected


async def test_splits_and_cancellations_never_take_more_than_the_order_has(
    server: SimulatorServer, http: httpx.AsyncClient, receiver: WebhookReceiver
) -> None:
    server.simulator.faults.update({"split_rate": 1.0, "max_shipments": 5, "cancel_rate": 0.3})
    wanted = {}
    for number in range(40):
        lines = [(f"SKU-{sku}", 1 + (number * sku) % 7) for sku in range(1 + number % 4)]
        wanted[await create(http, lines)] = Counter(dict(lines))
    await server.simulator.settled()

    shipments_per_order = Counter[str]()
    for order_id, ordered in wanted.items():
        answer = await http.get(f"/fulfilment-orders/{order_id}")
        order = FulfilmentOrderV1.model_validate_json(answer.content)
        taken = Counter[str]()
        for shipment in order.shipments:
            taken.update({line.sku: line.quantity for line in shipment.lines})
        for cancellation in order.cancellations:
            assert cancellation.reason == "unfulfillable"
            cancelled = (
                ordered - taken
                if cancellation.lines is None
                else Counter({line.sku: line.quantity for line in cancellation.lines})
            )
            taken.update(cancelled)
        assert taken == ordered, order_id
        assert order.status in {"shipped", "cancelled"}
        assert len(order.shipments) <= 5
        shipments_per_order[order_id] = len(order.shipments)
    made = server.simulator.record()
    assert max(shipments_per_order.values()) > 1
    assert made["cancellations"], "the cancel rate cancelled nothing in 40 orders"
    for data in made["cancellations"]:
        WarehouseCancellationV1.model_validate_json(json.dumps(data))
    assert len(receiver.verified()) == len(made["shipments"]) + len(made["cancellations"])


async def test_what_the_shop_cancelled_before_the_work_is_never_shipped(
    server: SimulatorServer, http: httpx.AsyncClient, receiver: WebhookReceiver
) -> None:
    server.simulator.faults.update({"ship_delay_seconds": 0.5, "split_rate": 1.0})
    order_id = await create(http, [("85123A", 6), ("22423", 2)])
    cancelled = await http.post(
        f"/fulfilment-orders/{order_id}/cancellations",
        content=b'{"lines":[{"sku":"85123A","quantity":4},{"sku":"22423","quantity":2}]}',
        headers={"Idempotency-Key": str(uuid.uuid4())},
    )
    await server.simulator.settled()

    assert cancelled.status_code == 201
    shipped = Counter[str]()
    for request in receiver.verified():
        shipped.update(
            {line.sku: line.quantity for line in shipment_of(request.document["data"]).lines}
        )
    assert shipped == Counter({"85123A": 2})


async def test_shipments_leave_an_interval_apart_and_the_order_is_partially_shipped_between(
    server: SimulatorServer, http: httpx.AsyncClient
) -> None:
    server.simulator.faults.update(
        {"split_rate": 1.0, "max_shipments": 2, "shipment_interval_seconds": 2.0}
    )
    order_id = await create(http, [("85123A", 6)])
    await asyncio.sleep(0.3)
    between = FulfilmentOrderV1.model_validate_json(
        (await http.get(f"/fulfilment-orders/{order_id}")).content
    )
    await server.simulator.settled()
    after = FulfilmentOrderV1.model_validate_json(
        (await http.get(f"/fulfilment-orders/{order_id}")).content
    )

    assert (between.status, len(between.shipments)) == ("partially_shipped", 1)
    assert (after.status, len(after.shipments)) == ("shipped", 2)


async def test_the_shops_cancellation_once_the_work_began_is_too_late(
    server: SimulatorServer, http: httpx.AsyncClient
) -> None:
    order_id = await create(http, [("85123A", 6)])
    await server.simulator.settled()

    answer = await http.post(
        f"/fulfilment-orders/{order_id}/cancellations",
        content=b"{}",
        headers={"Idempotency-Key": str(uuid.uuid4())},
    )

    assert (answer.status_code, answer.json()) == (409, {"error": "too_late"})


async def test_every_change_is_applied_once_under_every_fault_at_once(
    server: SimulatorServer, http: httpx.AsyncClient, receiver: WebhookReceiver
) -> None:
    server.simulator.faults.update(
        {
            "split_rate": 0.5,
            "cancel_rate": 0.2,
            "webhook_duplicate_rate": 0.3,
            "webhook_resend_rate": 0.3,
            "webhook_reorder_rate": 0.3,
            "webhook_hold_seconds": 0.3,
            "webhook_never_rate": 0.2,
            "webhook_wrong_secret_rate": 0.2,
            "webhook_stale_rate": 0.2,
        }
    )
    receiver.answers.extend([500, 502, 503] * 5)
    for number in range(30):
        await create(http, [("85123A", 1 + number % 5), ("22423", 2)])
    await server.simulator.settled()

    made = server.simulator.record()
    webhooks = made["webhooks"]
    never = {w["subject"] for w in webhooks if w["fate"] == "never_sent"}
    subjects = [s["shipment_id"] for s in made["shipments"]]
    subjects += [c["cancellation_id"] for c in made["cancellations"]]
    assert never, "the never-sent rate sent everything"
    assert {w["fate"] for w in webhooks} == {"delivered", "never_sent"}
    for subject in subjects:
        assert receiver.applied[subject] == (0 if subject in never else 1), subject
    assert sum(1 for request in receiver.received if not request.verified) > 0


async def test_the_record_is_served_to_the_demo_and_the_tests(
    server: SimulatorServer, http: httpx.AsyncClient
) -> None:
    await create(http, [("85123A", 6)])
    await server.simulator.settled()

    async with httpx.AsyncClient(base_url=server.admin_url) as admin:
        document = (await admin.get("/webhooks")).json()
        stats = (await admin.get("/stats")).json()

    [shipment] = document["shipments"]
    [webhook] = document["webhooks"]
    assert webhook["subject"] == shipment["shipment_id"]
    assert webhook["attempts"][0]["status"] == 204
    assert document["counts"] == {"attempts": 1, "delivered": 1}
    assert (document["work_pending"], document["in_flight"]) == (0, 0)
    assert (stats["shipments_made"], stats["webhooks"]["delivered"]) == (1, 1)


@pytest.mark.parametrize(
    "changes",
    [
        {"webhook_secrets": ["not-a-secret"]},
        {"webhook_secrets": "whsec_!!!"},
        {"webhook_duplicate_rate": 1.5},
        {"max_shipments": 0},
        {"webhook_retry_seconds": []},
        {"webhook_url": "ftp://example"},
    ],
    ids=str,
)
async def test_a_wrong_knob_value_is_refused_and_nothing_changes(
    server: SimulatorServer, changes: dict[str, object]
) -> None:
    async with httpx.AsyncClient(base_url=server.admin_url) as admin:
        answer = await admin.post("/faults", json={"split_rate": 0.9, **changes})
        knobs = (await admin.get("/faults")).json()

    assert answer.status_code == 400
    assert knobs["split_rate"] == 0.0


async def test_the_command_line_ships_and_signs_with_the_secrets_it_is_given(
    receiver: WebhookReceiver, url: str, unused_port: int
) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "warehouse_simulator",
        *("--port", str(unused_port), "--token", TOKEN, "--ship-delay-seconds", "0"),
        *("--split-rate", "0"),
        *("--webhook-url", url, "--webhook-secret", OTHER_SECRET, "--webhook-secret", SECRET),
        env={**os.environ, "PYTHONPATH": str(SIMULATOR)},
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        await process.stdout.readline()
        line = (await process.stdout.readline()).decode()
        assert f"webhooks to {url}" in line
        assert f"FULFILMENT_WAREHOUSE_WEBHOOK_SECRETS={OTHER_SECRET} {SECRET}" in line
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{unused_port}/api/v1",
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as http:
            await create(http, [("85123A", 6)])
        await _until(lambda: receiver.received)
    finally:
        process.terminate()
        assert await process.wait() == 0

    [request] = receiver.received
    assert request.verified
    assert len(request.signature.split(" ")) == 2


def test_the_default_secret_is_a_secret_the_package_takes() -> None:
    signer = standardwebhooks.Webhook(DEFAULT_WEBHOOK_SECRET)
    assert signer.sign("msg_1", datetime.now(UTC), "{}").startswith("v1,")


async def _until(condition: Callable[[], object], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110 - state of the code under test, not an event
            await asyncio.sleep(0.02)


@pytest.fixture
def unused_port() -> int:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return int(free.getsockname()[1])
