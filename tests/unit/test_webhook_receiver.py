"""The intake's answers (``intake.receiver``) with stand-ins for the stock store and the keeper.

What needs no database: the bound on the database wait, which errors become 503 or 422, what
is counted and what is kept. The same rows end to end over a socket are
tests/integration/test_webhook_intake.py.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

from structlog.testing import capture_logs

from fulfilment.adapters.postgres.invalid_webhooks import InvalidWebhook
from fulfilment.application.ports import TransientError
from fulfilment.domain.lifecycle import OrderStatus
from fulfilment.domain.model import OrderLine
from fulfilment.domain.warehouse_events import (
    Discrepancy,
    DiscrepancyKind,
    RecordShipment,
    ShipmentKind,
    ShipmentOutcome,
)
from fulfilment.intake.receiver import Answer, SenderGoneError, WebhookReceiver
from fulfilment.intake.signatures import Refusal, WebhookVerifier
from fulfilment.observability.intake_metrics import IntakeMetrics
from tests.support.webhooks import SECRET, shipment_body, signed_headers


class StandInStock:
    """Answers ``apply`` with ``answer()``; records the commands."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.commands: list[Any] = []

    async def apply(self, command: Any) -> Any:
        self.commands.append(command)
        return await self.answer(command)


class Keeper:
    def __init__(self, error: Exception | None = None) -> None:
        self.kept: list[InvalidWebhook] = []
        self.error = error

    async def keep(self, webhook: InvalidWebhook) -> bool:
        if self.error is not None:
            raise self.error
        self.kept.append(webhook)
        return True


def receiver(stock: Any, keeper: Keeper | None = None) -> tuple[WebhookReceiver, IntakeMetrics]:
    metrics = IntakeMetrics(version="test", refusals=tuple(str(r) for r in Refusal))
    return (
        WebhookReceiver(
            verifier=WebhookVerifier([SECRET], tolerance_seconds=300),
            stock=stock,
            keep_invalid=(keeper or Keeper()).keep,
            metrics=metrics,
            max_body_bytes=4096,
            database_wait_seconds=0.2,
        ),
        metrics,
    )


async def chunks(body: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(body), 100):
        yield body[start : start + 100]


async def send(intake: WebhookReceiver, body: bytes, **extra_headers: str) -> Answer:
    headers = {**signed_headers(body), **extra_headers}
    raw = [(name.encode(), value.encode()) for name, value in headers.items()]
    return await intake.receive(raw, chunks(body))


def value(metrics: IntakeMetrics, name: str, **labels: str) -> float:
    found = metrics.registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def shipped(command: RecordShipment) -> ShipmentOutcome:
    return ShipmentOutcome(
        ShipmentKind.SHIPPED,
        command.order_id,
        command.event_id,
        lines=command.lines,
        status=OrderStatus.RESERVED,
    )


async def test_an_applied_shipment_is_a_204_counted_by_type_and_outcome() -> None:
    async def answer(command: RecordShipment) -> ShipmentOutcome:
        return shipped(command)

    stock = StandInStock(answer)
    intake, metrics = receiver(stock)

    result = await send(intake, shipment_body(uuid.uuid4(), [("A", 2)], shipment_id="SHP-9"))

    assert result == Answer(204)
    (command,) = stock.commands
    assert command.shipment_id == "SHP-9"
    assert command.webhook_id is not None
    assert command.source == "webhook"
    labels = {"type": "shipment.shipped", "outcome": "shipped"}
    assert value(metrics, "fulfilment_webhooks_received_total", **labels) == 1
    assert (
        value(
            metrics,
            "fulfilment_warehouse_events_total",
            event="shipment",
            source="webhook",
            outcome="shipped",
        )
        == 1
    )
    assert value(metrics, "fulfilment_webhook_answer_seconds_count", status="204") == 1


async def test_a_database_that_does_not_answer_in_time_is_a_503_and_nothing_is_kept() -> None:
    async def never(command: RecordShipment) -> ShipmentOutcome:
        await asyncio.sleep(60)
        return shipped(command)

    intake, metrics = receiver(StandInStock(never))

    started = asyncio.get_running_loop().time()
    result = await send(intake, shipment_body(uuid.uuid4(), [("A", 2)]))

    assert asyncio.get_running_loop().time() - started < 1
    assert result.status == 503
    assert result.headers["retry-after"] == "5"
    assert value(metrics, "fulfilment_webhook_refusals_total", reason="database_unavailable") == 1


async def test_a_spent_retry_budget_is_a_503() -> None:
    async def failing(command: RecordShipment) -> ShipmentOutcome:
        raise TransientError(str(command.event_id))

    intake, _ = receiver(StandInStock(failing))

    assert (await send(intake, shipment_body(uuid.uuid4(), [("A", 2)]))).status == 503


async def test_a_command_the_store_refuses_is_a_422_kept_with_its_reason() -> None:
    async def refusing(command: RecordShipment) -> ShipmentOutcome:
        msg = f"a shipment of {command.shipment_id} names no lines"
        raise ValueError(msg)

    keeper = Keeper()
    intake, metrics = receiver(StandInStock(refusing), keeper)

    result = await send(
        intake,
        shipment_body(uuid.uuid4(), [("A", 2)], shipment_id="SHP-1"),
        authorization="Bearer proxy-token",
    )

    assert result.status == 422
    assert result.body == {"error": "invalid_event", "reason": "a shipment of SHP-1 names no lines"}
    (kept,) = keeper.kept
    assert kept.type == "shipment.shipped"
    assert kept.reason == "a shipment of SHP-1 names no lines"
    assert {"webhook-id", "webhook-timestamp", "content-type"} <= set(kept.headers)
    assert "webhook-signature" not in kept.headers
    assert "authorization" not in kept.headers
    labels = {"type": "shipment.shipped", "outcome": "invalid"}
    assert value(metrics, "fulfilment_webhooks_received_total", **labels) == 1


async def test_an_invalid_webhook_that_cannot_be_kept_is_a_503_for_the_sender_to_retry() -> None:
    async def unused(command: RecordShipment) -> ShipmentOutcome:
        raise AssertionError(command)

    intake, metrics = receiver(StandInStock(unused), Keeper(TransientError("down")))

    result = await send(intake, b'{"type": "shipment.shipped"}')

    assert result.status == 503
    labels = {"type": "shipment.shipped", "outcome": "invalid"}
    assert value(metrics, "fulfilment_webhooks_received_total", **labels) == 0


async def test_a_type_with_a_nul_is_kept_without_its_type() -> None:
    async def unused(command: RecordShipment) -> ShipmentOutcome:
        raise AssertionError(command)

    keeper = Keeper()
    intake, _ = receiver(StandInStock(unused), keeper)

    result = await send(intake, b'{"type": "shipment.shipped", "data": {"\\u0000": 1}}')
    other = await send(intake, b'{"type": 7}')

    assert (result.status, other.status) == (422, 422)
    assert [kept.type for kept in keeper.kept] == ["shipment.shipped", None]
    assert all("\x00" not in kept.reason for kept in keeper.kept)


async def test_the_discrepancies_counted_are_those_the_outcome_says_were_kept() -> None:
    # A SKU whose held units all shipped before is more_than_held as its row says, though the
    # outcome took none of it: the count comes from the kept rows, not from the taken lines.
    async def partly(command: RecordShipment) -> ShipmentOutcome:
        return ShipmentOutcome(
            ShipmentKind.SHIPPED,
            command.order_id,
            command.event_id,
            lines=(OrderLine("B", 1),),
            discrepancies=(
                Discrepancy(DiscrepancyKind.MORE_THAN_HELD, "A", 2, OrderStatus.RESERVED),
                Discrepancy(DiscrepancyKind.MORE_THAN_HELD, "B", 1, OrderStatus.RESERVED),
                Discrepancy(DiscrepancyKind.SKU_NOT_HELD, "C", 3, OrderStatus.RESERVED),
            ),
            status=OrderStatus.SHIPPED,
        )

    intake, metrics = receiver(StandInStock(partly))

    result = await send(intake, shipment_body(uuid.uuid4(), [("A", 2), ("B", 2), ("C", 3)]))

    assert result.status == 204
    counted = {
        str(kind): value(metrics, "fulfilment_warehouse_discrepancies_total", kind=kind)
        for kind in DiscrepancyKind
    }
    assert {kind: count for kind, count in counted.items() if count} == {
        "more_than_held": 2.0,
        "sku_not_held": 1.0,
    }


async def test_a_bug_is_a_500_with_its_trace_logged_and_the_answer_still_counted() -> None:
    async def broken(command: RecordShipment) -> ShipmentOutcome:
        raise RuntimeError(str(command.event_id))

    intake, metrics = receiver(StandInStock(broken))

    body = shipment_body(uuid.uuid4(), [("A", 2)])
    headers = signed_headers(body)
    raw = [(name.encode(), value.encode()) for name, value in headers.items()]

    with capture_logs() as logs:
        result = await intake.receive(raw, chunks(body))

    assert result == Answer(500, {"error": "internal_error"})
    assert [log["event"] for log in logs] == ["webhooks.failed", "webhooks.answered"]
    assert "RuntimeError" in logs[0]["trace"]
    signature = headers["webhook-signature"].removeprefix("v1,")
    assert signature not in repr(logs)
    assert value(metrics, "fulfilment_webhook_answer_seconds_count", status="500") == 1


async def test_a_sender_gone_mid_body_is_answered_for_no_one_and_nothing_is_recorded() -> None:
    stock = StandInStock(None)
    keeper = Keeper()
    intake, _ = receiver(stock, keeper)
    body = shipment_body(uuid.uuid4(), [("A", 2)])

    async def cut_off() -> AsyncIterator[bytes]:
        yield body[:50]
        raise SenderGoneError

    raw = [(name.encode(), value.encode()) for name, value in signed_headers(body).items()]
    result = await intake.receive(raw, cut_off())

    assert result.status == 400
    assert stock.commands == []
    assert keeper.kept == []
