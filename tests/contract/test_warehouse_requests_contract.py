"""One suite, two stores of warehouse requests: the in-memory fake and PostgreSQL.

The requests are recorded by the stock store with the hand-off on (``handoff=True``); the
requests' store claims them for the dispatcher and records the warehouse system's answers
(``fulfilment.application.ports.WarehouseRequests``, ``fulfilment.domain.handoff``).
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
import sqlalchemy as sa
from pydantic import SecretStr
from sqlalchemy.engine import make_url

from fulfilment.adapters.postgres.engine import create_engine
from fulfilment.adapters.postgres.stock import PostgresStock
from fulfilment.adapters.postgres.warehouse_requests import PostgresWarehouseRequests
from fulfilment.contracts.warehouse_bodies import request_body
from fulfilment.domain.handoff import (
    Accepted,
    Answered,
    CredentialsRefused,
    Failed,
    RateLimited,
    Refused,
    RequestKind,
    RequestStatus,
    Retry,
)
from fulfilment.domain.lifecycle import CancelKind, ShipKind
from fulfilment.domain.model import OrderLine, StockLevel
from fulfilment.entrypoints.startup import database_options
from fulfilment.settings import DatabaseSettings, DeadlineSettings
from tests.support.builders import cancellation, in_trace, order, shipment
from tests.support.fakes import SHOP_RELEASE, FakeStock, FakeWarehouseRequests, RecordedEvent
from tests.support.warehouse_commands import warehouse_cancellation, warehouse_shipment
from tests.support.warehouse_event_rows import order_lines
from tests.support.warehouse_rows import requests_of

LEASE = 30.0
"""A lease no test outlives, unless it waits for one to end."""

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class Stores:
    """The stock store (hand-off on) and the requests' store over the same rows."""

    def __init__(self, stock, requests) -> None:
        self.stock = stock
        self.requests = requests

    async def placed(self, *lines, traceparent=None):
        await self.stock.put_stock({"A": 10, "B": 10, "C": 10})
        command = order(*lines)
        with in_trace(traceparent):
            await self.stock.apply(command)
        return command

    async def accepted(self, *lines, warehouse_id="WH-1"):
        """An order whose fulfilment order the warehouse accepted."""
        command = await self.placed(*lines)
        [sent] = await self.requests.claim(10, lease_seconds=LEASE)
        await self.requests.record(sent, Accepted(201, '{"status": "received"}', warehouse_id))
        return command

    async def levels_of(self):
        return await self.stock.levels_of(["A", "B", "C"])

    async def order(self, order_id):
        """The order's status and, per SKU, ``(quantity, shipped)`` of its lines."""
        if isinstance(self.stock, FakeStock):
            return (await order_lines(self.stock))[order_id]
        async with self.stock.engine.connect() as connection:
            raw = await connection.get_raw_connection()
            return (await order_lines(raw.driver_connection))[order_id]

    async def released_order_marks(self):
        """``released_order`` of every request, in the order recorded."""
        if isinstance(self.stock, FakeStock):
            return [r.released_order for r in self.stock.requests]
        async with self.stock.engine.connect() as connection:
            rows = await connection.execute(
                sa.text("SELECT released_order FROM warehouse_requests ORDER BY id")
            )
            return [marked for (marked,) in rows]

    async def result_events(self):
        """The result events written, in order, less event_id and occurred_at."""
        if isinstance(self.stock, FakeStock):
            return list(self.stock.result_events)
        async with self.stock.engine.connect() as connection:
            rows = await connection.execute(
                sa.text("SELECT routing_key, body, traceparent FROM outbox ORDER BY id")
            )
            events = []
            for routing_key, stored, traceparent in rows:
                body = dict(stored)
                del body["event_id"], body["occurred_at"]
                events.append(RecordedEvent(routing_key, body, traceparent))
            return events


@pytest.fixture
def memory_stores():
    stock = FakeStock(handoff=True)
    return Stores(stock, FakeWarehouseRequests(stock))


@pytest.fixture
async def postgres_stores(clean_database):
    engine = create_engine(
        database_options(DatabaseSettings(url=SecretStr(clean_database)), DeadlineSettings())
    )
    try:
        yield Stores(
            PostgresStock(engine, consumer="fulfilment", retry_budget_seconds=2.0, handoff=True),
            PostgresWarehouseRequests(engine, retry_budget_seconds=2.0),
        )
    finally:
        await engine.dispose()


@pytest.fixture(
    params=["memory_stores", pytest.param("postgres_stores", marks=pytest.mark.postgres)]
)
def stores(request):
    return request.getfixturevalue(request.param)


def released(command, *pairs, order_status, traceparent=None):
    return RecordedEvent(
        "stock.released",
        {
            "version": 1,
            "causation_id": str(command.event_id),
            "order_id": str(command.order_id),
            "lines": [{"sku": sku, "quantity": units} for sku, units in pairs],
            "order_status": order_status,
            **SHOP_RELEASE,
        },
        traceparent,
    )


# --- claim ------------------------------------------------------------------------------


async def test_a_claim_freezes_the_body_from_the_lines_and_marks_the_request_sending(stores):
    command = await stores.placed(("B", 2), ("A", 1), ("A", 2), traceparent=TRACEPARENT)

    [claimed] = await stores.requests.claim(10, lease_seconds=LEASE)

    record = await stores.requests.get(claimed.idempotency_key)
    assert record is not None
    expected = request_body(
        RequestKind.FULFILMENT_ORDER, command.order_id, {"A": 3, "B": 2}, record.created_at
    )
    assert claimed.body == record.body == expected
    assert json.loads(claimed.body) == {
        "reference": str(command.order_id),
        "lines": [{"sku": "A", "quantity": 3}, {"sku": "B", "quantity": 2}],
        "requested_at": record.created_at.astimezone(UTC).isoformat(timespec="microseconds"),
    }
    assert (claimed.kind, claimed.order_id, claimed.causation_id) == (
        RequestKind.FULFILMENT_ORDER,
        command.order_id,
        command.event_id,
    )
    assert (claimed.attempts, claimed.warehouse_id, claimed.traceparent) == (
        1,
        None,
        TRACEPARENT,
    )
    assert (record.status, record.attempts) == (RequestStatus.SENDING, 1)
    assert record.first_attempt_at == record.last_attempt_at == claimed.first_attempt_at
    assert record.next_attempt_at >= record.last_attempt_at + timedelta(seconds=LEASE - 1)


async def test_a_claimed_request_is_not_claimed_again_until_its_lease_ends(stores):
    await stores.placed(("A", 1))
    [first] = await stores.requests.claim(10, lease_seconds=0.5)

    assert await stores.requests.claim(10, lease_seconds=0.5) == []
    await asyncio.sleep(0.8)
    [again] = await stores.requests.claim(10, lease_seconds=LEASE)

    assert (again.idempotency_key, again.body, again.attempts) == (
        first.idempotency_key,
        first.body,
        2,
    )
    assert again.first_attempt_at == first.first_attempt_at


async def test_a_claim_takes_at_most_its_limit_oldest_first(stores):
    commands = [await stores.placed(("A", 1)) for _ in range(3)]

    first = await stores.requests.claim(2, lease_seconds=LEASE)
    rest = await stores.requests.claim(2, lease_seconds=LEASE)

    assert [r.order_id for r in first + rest] == [c.order_id for c in commands]


async def test_a_cancel_before_the_first_claim_shrinks_the_body(stores):
    command = await stores.placed(("A", 3), ("B", 2))
    await stores.stock.apply(cancellation(command.order_id, ("A", 1), ("B", 2)))

    [claimed] = await stores.requests.claim(10, lease_seconds=LEASE)

    assert json.loads(claimed.body)["lines"] == [{"sku": "A", "quantity": 2}]


async def test_a_withdrawn_request_is_never_claimed(stores):
    command = await stores.placed(("A", 3))
    await stores.stock.apply(cancellation(command.order_id))

    assert await stores.requests.claim(10, lease_seconds=LEASE) == []


async def test_a_cancel_after_the_first_claim_keeps_the_body_and_records_a_cancellation(stores):
    command = await stores.placed(("A", 3))
    [claimed] = await stores.requests.claim(10, lease_seconds=0.3)
    cancel = cancellation(command.order_id, ("A", 1))

    outcome = await stores.stock.apply(cancel)
    await asyncio.sleep(0.5)
    [again] = await stores.requests.claim(10, lease_seconds=LEASE)

    assert outcome.kind is CancelKind.CANCEL_REQUESTED
    assert again.idempotency_key == claimed.idempotency_key
    assert again.body == claimed.body
    record = await stores.requests.get(claimed.idempotency_key)
    assert record is not None
    assert record.lines == (OrderLine("A", 3),)
    assert await stores.levels_of() == {
        "A": StockLevel(10, 3),
        "B": StockLevel(10),
        "C": StockLevel(10),
    }


# --- per-order order ----------------------------------------------------------------------


async def test_a_cancellation_is_not_claimable_before_its_order_is_accepted(stores):
    command = await stores.placed(("A", 3))
    [sent] = await stores.requests.claim(10, lease_seconds=0.3)
    cancel = cancellation(command.order_id)
    await stores.stock.apply(cancel)
    await asyncio.sleep(0.5)

    again = await stores.requests.claim(10, lease_seconds=LEASE)
    assert [r.kind for r in again] == [RequestKind.FULFILMENT_ORDER]
    await stores.requests.record(again[0], Accepted(201, '{"id": "WH-7"}', "WH-7"))
    [cancelling] = await stores.requests.claim(10, lease_seconds=LEASE)

    assert (cancelling.kind, cancelling.causation_id, cancelling.warehouse_id) == (
        RequestKind.CANCELLATION,
        cancel.event_id,
        "WH-7",
    )
    assert json.loads(cancelling.body) == {}
    assert sent.idempotency_key == again[0].idempotency_key


async def test_a_cancellation_first_sent_asks_only_what_the_order_still_holds(stores):
    # Two cancels recorded while the order is at the warehouse each ask what it held then: the
    # second, sent once the first was accepted, must not ask for the units the first took
    # (a warehouse refuses more than its order has).
    command = await stores.accepted(("A", 3), ("B", 2))
    first = cancellation(command.order_id, ("A", 1))
    second = cancellation(command.order_id, ("A", 5), ("B", 2))
    await stores.stock.apply(first)
    await stores.stock.apply(second)
    [cancelling] = await stores.requests.claim(10, lease_seconds=LEASE)
    assert json.loads(cancelling.body) == {"lines": [{"sku": "A", "quantity": 1}]}
    await stores.requests.record(cancelling, Accepted(201, '{"status": "partially_cancelled"}'))

    [cancelling] = await stores.requests.claim(10, lease_seconds=LEASE)

    assert cancelling.causation_id == second.event_id
    assert json.loads(cancelling.body) == {
        "lines": [{"sku": "A", "quantity": 2}, {"sku": "B", "quantity": 2}]
    }
    await stores.requests.record(cancelling, Accepted(201, '{"status": "cancelled"}'))
    assert await stores.levels_of() == {
        "A": StockLevel(10),
        "B": StockLevel(10),
        "C": StockLevel(10),
    }


@pytest.mark.parametrize("asked", [None, [("A", 1)]], ids=["whole", "lines"])
async def test_a_cancellation_that_finds_nothing_left_to_ask_is_withdrawn_unsent(stores, asked):
    # A whole cancel accepted first leaves nothing for the second to ask, whole or in part;
    # and a second asking only for a SKU the first took finds nothing of its lines.
    command = await stores.accepted(("A", 3), ("B", 2))
    await stores.stock.apply(cancellation(command.order_id))
    later = cancellation(command.order_id, *(asked or []))
    await stores.stock.apply(later)
    [whole] = await stores.requests.claim(10, lease_seconds=LEASE)
    await stores.requests.record(whole, Accepted(201, '{"status": "cancelled"}'))

    assert await stores.requests.claim(10, lease_seconds=LEASE) == []
    [record] = await stores.requests.find({RequestStatus.WITHDRAWN}, 10)
    assert (record.kind, record.attempts) == (RequestKind.CANCELLATION, 0)
    assert (await stores.levels_of())["A"] == StockLevel(10)


async def test_a_cancellation_of_lines_taken_by_an_earlier_one_is_withdrawn_unsent(stores):
    command = await stores.accepted(("A", 3), ("B", 2))
    await stores.stock.apply(cancellation(command.order_id, ("A", 3)))
    await stores.stock.apply(cancellation(command.order_id, ("A", 1)))
    [first] = await stores.requests.claim(10, lease_seconds=LEASE)
    await stores.requests.record(first, Accepted(201, '{"status": "partially_cancelled"}'))

    assert await stores.requests.claim(10, lease_seconds=LEASE) == []
    assert await stores.levels_of() == {
        "A": StockLevel(10),
        "B": StockLevel(10, 2),
        "C": StockLevel(10),
    }
    assert [r.kind for r in await stores.requests.find({RequestStatus.WITHDRAWN}, 10)] == [
        RequestKind.CANCELLATION
    ]


async def test_a_later_request_of_an_order_waits_until_the_earlier_one_is_answered(stores):
    command = await stores.accepted(("A", 3))
    first = cancellation(command.order_id, ("A", 1))
    second = cancellation(command.order_id, ("A", 2))
    await stores.stock.apply(first)
    await stores.stock.apply(second)
    other = await stores.placed(("B", 1))

    claimed = await stores.requests.claim(10, lease_seconds=LEASE)
    assert [(r.order_id, r.causation_id) for r in claimed] == [
        (command.order_id, first.event_id),
        (other.order_id, other.event_id),
    ]
    assert json.loads(claimed[0].body) == {"lines": [{"sku": "A", "quantity": 1}]}
    await stores.requests.record(claimed[0], Accepted(201, '{"status": "cancelled"}'))
    [then] = await stores.requests.claim(10, lease_seconds=LEASE)

    assert then.causation_id == second.event_id


async def test_a_failing_order_holds_up_no_other_order(stores):
    stuck = await stores.placed(("A", 1))
    [sent] = await stores.requests.claim(10, lease_seconds=LEASE)
    await stores.requests.record(sent, Retry("503", 503), retry_in_seconds=60)
    other = await stores.placed(("B", 1))

    assert [r.order_id for r in await stores.requests.claim(10, lease_seconds=LEASE)] == [
        other.order_id
    ]
    assert sent.order_id == stuck.order_id


# --- answers --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        Retry("timed out"),
        Retry('{"error": "in_flight"}', 409),
        RateLimited(30.0, '{"error": "rate_limited"}'),
        CredentialsRefused(401, "unauthorized"),
    ],
    ids=["timeout", "in_flight", "rate_limited", "credentials"],
)
async def test_an_answer_to_retry_keeps_the_request_sending_until_its_time(stores, answer):
    await stores.placed(("A", 1))
    [sent] = await stores.requests.claim(10, lease_seconds=LEASE)
    before = datetime.now(UTC)

    await stores.requests.record(sent, answer, retry_in_seconds=60)

    record = await stores.requests.get(sent.idempotency_key)
    assert record is not None
    assert (record.status, record.last_status_code, record.last_answer) == (
        RequestStatus.SENDING,
        answer.status_code,
        answer.answer,
    )
    assert record.answered_at is None
    assert before + timedelta(seconds=55) < record.next_attempt_at
    assert record.next_attempt_at < before + timedelta(seconds=65)
    assert await stores.requests.claim(10, lease_seconds=LEASE) == []


async def test_an_accepted_fulfilment_order_keeps_the_warehouse_id(stores):
    await stores.placed(("A", 1))
    [sent] = await stores.requests.claim(10, lease_seconds=LEASE)

    await stores.requests.record(sent, Accepted(201, '{"id": "WH-9"}', "WH-9"))

    record = await stores.requests.get(sent.idempotency_key)
    assert record is not None
    assert (record.status, record.warehouse_id, record.last_status_code) == (
        RequestStatus.ACCEPTED,
        "WH-9",
        201,
    )
    assert record.answered_at is not None


async def test_a_batch_of_answers_records_each_as_record_would(stores):
    cancelled = await stores.accepted(("A", 3))
    await stores.stock.apply(cancellation(cancelled.order_id))
    orders = [order(("B", 1)), order(("C", 1)), order(("B", 2))]
    for command in orders:
        await stores.stock.apply(command)
    cancelling, accepted, retried, failed = await stores.requests.claim(10, lease_seconds=LEASE)
    assert cancelling.kind is RequestKind.CANCELLATION
    before = datetime.now(UTC)

    await stores.requests.record_answers(
        [
            Answered(accepted, Accepted(201, '{"id": "WH-2"}', "WH-2")),
            Answered(cancelling, Accepted(201, '{"status": "cancelled"}')),
            Answered(retried, Retry("timed out"), 60),
            Answered(failed, Failed("unknown_sku", "422 unknown_sku", 422)),
            # The same request answered again (a send whose lease ran out): changes nothing.
            Answered(accepted, Failed("late", "422 late", 422)),
        ]
    )

    records = [await stores.requests.get(r.idempotency_key) for r in (accepted, retried, failed)]
    assert [(r.status, r.warehouse_id, r.last_answer) for r in records if r is not None] == [
        (RequestStatus.ACCEPTED, "WH-2", '{"id": "WH-2"}'),
        (RequestStatus.SENDING, None, "timed out"),
        (RequestStatus.FAILED, None, "422 unknown_sku"),
    ]
    assert records[1] is not None
    assert before + timedelta(seconds=55) < records[1].next_attempt_at
    assert records[1].next_attempt_at < before + timedelta(seconds=65)
    cancel_record = await stores.requests.get(cancelling.idempotency_key)
    assert cancel_record is not None
    assert cancel_record.status is RequestStatus.ACCEPTED
    assert (await stores.levels_of())["A"] == StockLevel(10, 0)
    assert [event.routing_key for event in await stores.result_events()][-1] == "stock.released"


async def test_an_answer_to_a_request_answered_already_changes_nothing(stores):
    await stores.placed(("A", 1))
    [sent] = await stores.requests.claim(10, lease_seconds=LEASE)
    await stores.requests.record(sent, Accepted(201, "first", "WH-1"))

    await stores.requests.record(sent, Failed("late", "422 late", 422))

    record = await stores.requests.get(sent.idempotency_key)
    assert record is not None
    assert (record.status, record.last_answer) == (RequestStatus.ACCEPTED, "first")


@pytest.mark.parametrize(
    ("asked", "expected_status", "held"),
    [
        ((("A", 1),), "reserved", StockLevel(10, 2)),
        ((), "released", StockLevel(10, 0)),
    ],
    ids=["lines", "whole"],
)
async def test_an_accepted_cancellation_releases_then_with_its_event(
    stores, asked, expected_status, held
):
    command = await stores.accepted(("A", 3))
    cancel = cancellation(command.order_id, *asked)
    with in_trace(TRACEPARENT):
        await stores.stock.apply(cancel)
    assert (await stores.levels_of())["A"] == StockLevel(10, 3)
    [cancelling] = await stores.requests.claim(10, lease_seconds=LEASE)

    await stores.requests.record(cancelling, Accepted(201, '{"status": "cancelled"}'))

    assert (await stores.levels_of())["A"] == held
    events = await stores.result_events()
    units = 1 if asked else 3
    assert events[1:] == [
        released(cancel, ("A", units), order_status=expected_status, traceparent=TRACEPARENT)
    ]
    record = await stores.requests.get(cancelling.idempotency_key)
    assert record is not None
    assert record.status is RequestStatus.ACCEPTED
    # Only the cancellation that leaves the order released is marked as its release.
    assert await stores.released_order_marks() == [False, expected_status == "released"]
    again = await stores.stock.apply(cancellation(command.order_id, ("A", 1)))
    assert again.kind is (CancelKind.CANCEL_REQUESTED if asked else CancelKind.IGNORED)


async def test_an_accepted_cancellation_of_an_order_shipped_meanwhile_releases_nothing(stores):
    command = await stores.accepted(("A", 3))
    await stores.stock.apply(cancellation(command.order_id))
    [cancelling] = await stores.requests.claim(10, lease_seconds=LEASE)
    await stores.stock.apply(shipment(command.order_id))

    await stores.requests.record(cancelling, Accepted(200, '{"status": "cancelled"}'))

    assert (await stores.levels_of())["A"] == StockLevel(7, 0)
    assert [e.routing_key for e in await stores.result_events()] == [
        "stock.reserved",
        "stock.shipped",
    ]
    assert await stores.released_order_marks() == [False, False]


@pytest.mark.parametrize(
    ("asked", "given_back", "status", "lines", "b_reserved"),
    [
        ((("A", 3),), (("A", 1),), "reserved", {"A": (2, 2), "B": (2, 0)}, 2),
        ((), (("A", 1), ("B", 2)), "shipped", {"A": (2, 2)}, 0),
    ],
    ids=["lines", "whole"],
)
async def test_an_accepted_cancellation_of_a_partly_shipped_order_releases_what_it_holds(
    stores, asked, given_back, status, lines, b_reserved
):
    command = await stores.accepted(("A", 3), ("B", 2))
    cancel = cancellation(command.order_id, *asked)
    await stores.stock.apply(cancel)
    [cancelling] = await stores.requests.claim(10, lease_seconds=LEASE)
    await stores.stock.apply(warehouse_shipment(command.order_id, ("A", 2)))

    await stores.requests.record(cancelling, Accepted(201, '{"status": "cancelled"}'))

    assert await stores.levels_of() == {
        "A": StockLevel(8, 0),
        "B": StockLevel(10, b_reserved),
        "C": StockLevel(10, 0),
    }
    assert (await stores.result_events())[-1] == released(cancel, *given_back, order_status=status)
    assert await stores.order(command.order_id) == (status, lines)


@pytest.mark.parametrize("last", ["shipment", "cancellation", "upstream shipment"])
async def test_a_cancellation_not_sent_is_withdrawn_when_nothing_is_left_held(stores, last):
    # product.md: a cancellation request of the shop's for the same order that is not sent
    # yet is withdrawn when nothing is left to cancel, whichever change left nothing held.
    command = await stores.accepted(("A", 3), ("B", 1))
    waiting = await stores.stock.apply(cancellation(command.order_id, ("A", 1)))
    assert waiting.kind is CancelKind.CANCEL_REQUESTED
    await stores.stock.apply(warehouse_shipment(command.order_id, ("A", 1)))

    if last == "shipment":
        await stores.stock.apply(warehouse_shipment(command.order_id, ("A", 2), ("B", 1)))
    elif last == "cancellation":
        await stores.stock.apply(warehouse_cancellation(command.order_id))
    else:
        shipped = await stores.stock.apply(shipment(command.order_id))
        assert shipped.kind is ShipKind.SHIPPED

    assert [row[4] for row in await requests_of(stores.stock)] == ["accepted", "withdrawn"]
    assert await stores.requests.claim(10, lease_seconds=LEASE) == []


async def test_a_cancellation_not_sent_waits_while_the_order_still_holds_units(stores):
    command = await stores.accepted(("A", 3))
    await stores.stock.apply(cancellation(command.order_id, ("A", 1)))

    await stores.stock.apply(warehouse_shipment(command.order_id, ("A", 2)))

    assert [row[4] for row in await requests_of(stores.stock)] == ["accepted", "pending"]


@pytest.mark.parametrize(
    ("asked", "lines"),
    [((("A", 5),), [{"sku": "A", "quantity": 3}]), ((), None)],
    ids=["lines", "whole"],
)
async def test_a_refused_cancellation_keeps_the_order_reserved_and_says_so(stores, asked, lines):
    command = await stores.accepted(("A", 3), warehouse_id="WH-3")
    cancel = cancellation(command.order_id, *asked)
    with in_trace(TRACEPARENT):
        await stores.stock.apply(cancel)
    [cancelling] = await stores.requests.claim(10, lease_seconds=LEASE)

    await stores.requests.record(cancelling, Refused(409, '{"error": "too_late"}'))

    assert (await stores.levels_of())["A"] == StockLevel(10, 3)
    assert (await stores.result_events())[1:] == [
        RecordedEvent(
            "stock.cancel_refused",
            {
                "version": 1,
                "causation_id": str(cancel.event_id),
                "order_id": str(command.order_id),
                "lines": lines,
                "warehouse_id": "WH-3",
            },
            TRACEPARENT,
        )
    ]
    record = await stores.requests.get(cancelling.idempotency_key)
    assert record is not None
    assert (record.status, record.last_status_code) == (RequestStatus.REFUSED, 409)
    assert (await stores.stock.apply(shipment(command.order_id))).lines == (OrderLine("A", 3),)


async def test_a_failed_fulfilment_order_applies_its_waiting_cancellations_locally(stores):
    command = await stores.placed(("A", 3), ("B", 2))
    [sent] = await stores.requests.claim(10, lease_seconds=LEASE)
    first = cancellation(command.order_id, ("A", 1))
    second = cancellation(command.order_id, ("A", 5))
    await stores.stock.apply(first)
    await stores.stock.apply(second)

    await stores.requests.record(sent, Failed("unknown_sku", '{"error": "unknown sku"}', 422))

    assert await stores.levels_of() == {
        "A": StockLevel(10, 0),
        "B": StockLevel(10, 2),
        "C": StockLevel(10),
    }
    assert (await stores.result_events())[1:] == [
        released(first, ("A", 1), order_status="reserved"),
        released(second, ("A", 2), order_status="reserved"),
    ]
    statuses = [r.status for r in await stores.requests.find(list(RequestStatus), 10)]
    assert statuses == [RequestStatus.FAILED, RequestStatus.WITHDRAWN, RequestStatus.WITHDRAWN]
    assert await stores.requests.claim(10, lease_seconds=LEASE) == []
    after = await stores.stock.apply(cancellation(command.order_id))
    assert (after.kind, after.lines) == (CancelKind.RELEASED, (OrderLine("B", 2),))
    # Released by the inbox's cancel, not by a request: none is marked.
    assert await stores.released_order_marks() == [False, False, False]


async def test_a_failed_fulfilment_order_marks_the_waiting_cancel_that_released_it(stores):
    command = await stores.placed(("A", 3))
    [sent] = await stores.requests.claim(10, lease_seconds=LEASE)
    for cancel in (cancellation(command.order_id), cancellation(command.order_id, ("A", 1))):
        assert (await stores.stock.apply(cancel)).kind is CancelKind.CANCEL_REQUESTED

    await stores.requests.record(sent, Failed("unknown_sku", '{"error": "unknown sku"}', 422))

    assert (await stores.levels_of())["A"] == StockLevel(10, 0)
    assert await stores.released_order_marks() == [False, True, False]


async def test_a_failed_cancellation_releases_nothing(stores):
    command = await stores.accepted(("A", 3))
    await stores.stock.apply(cancellation(command.order_id))
    [cancelling] = await stores.requests.claim(10, lease_seconds=LEASE)

    await stores.requests.record(cancelling, Failed("not_found", "404", 404))

    assert (await stores.levels_of())["A"] == StockLevel(10, 3)
    record = await stores.requests.get(cancelling.idempotency_key)
    assert record is not None
    assert record.status is RequestStatus.FAILED


# --- expiry, backlog, operators ---------------------------------------------------------------


async def test_expire_stops_requests_first_attempted_before_the_retention(stores):
    await stores.placed(("A", 1))
    [sent] = await stores.requests.claim(10, lease_seconds=0.1)
    never_sent = await stores.placed(("B", 1))
    await asyncio.sleep(0.3)

    assert await stores.requests.expire(3600.0) == 0
    assert await stores.requests.expire(0.2) == 1

    record = await stores.requests.get(sent.idempotency_key)
    assert record is not None
    assert record.status is RequestStatus.EXPIRED
    [claimed] = await stores.requests.claim(10, lease_seconds=LEASE)
    assert claimed.order_id == never_sent.order_id


async def test_the_backlog_counts_open_requests_and_the_oldest_age(stores):
    assert (await stores.requests.backlog()).open_count == 0
    assert (await stores.requests.backlog()).oldest_open_age_seconds is None
    await stores.placed(("A", 1))
    await stores.placed(("B", 1))
    [sent, _] = await stores.requests.claim(10, lease_seconds=LEASE)
    await stores.requests.record(sent, Accepted(201, "{}", "WH-1"))
    await asyncio.sleep(0.2)

    backlog = await stores.requests.backlog()

    assert backlog.open_count == 1
    assert backlog.oldest_open_age_seconds is not None
    assert 0.2 <= backlog.oldest_open_age_seconds < 30
    assert backlog.by_kind_and_status == {
        (RequestKind.FULFILMENT_ORDER, RequestStatus.ACCEPTED): 1,
        (RequestKind.FULFILMENT_ORDER, RequestStatus.SENDING): 1,
    }


async def test_find_lists_by_status_oldest_first_and_get_by_key(stores):
    first = await stores.placed(("A", 1))
    second = await stores.placed(("B", 1))
    await stores.requests.claim(1, lease_seconds=LEASE)

    pending = await stores.requests.find([RequestStatus.PENDING], 10)
    both = await stores.requests.find([RequestStatus.PENDING, RequestStatus.SENDING], 1)

    assert [r.order_id for r in pending] == [second.order_id]
    assert [r.order_id for r in both] == [first.order_id]
    assert pending[0].body is None
    assert pending[0].lines == (OrderLine("B", 1),)
    assert await stores.requests.get(pending[0].idempotency_key) == pending[0]
    assert await stores.requests.get(first.event_id) is None


async def test_resend_sends_a_failed_request_again_with_its_key_and_body(stores):
    await stores.placed(("A", 1))
    [sent] = await stores.requests.claim(10, lease_seconds=LEASE)
    await stores.requests.record(sent, Failed("refused", "422", 422))

    assert await stores.requests.resend(sent.idempotency_key, operator="ops") is True
    [again] = await stores.requests.claim(10, lease_seconds=LEASE)

    assert (again.idempotency_key, again.body, again.attempts) == (
        sent.idempotency_key,
        sent.body,
        2,
    )
    assert await stores.requests.resend(sent.idempotency_key, operator="ops") is False
    assert await audit_of(stores) == [(sent.idempotency_key, "failed", "ops")]


async def test_resend_refuses_an_open_request_an_unknown_key_and_an_order_cancelled_since(
    stores,
):
    open_one = await stores.placed(("A", 1))
    [pending] = await stores.requests.find([RequestStatus.PENDING], 10)
    [sent] = await stores.requests.claim(10, lease_seconds=LEASE)
    await stores.stock.apply(cancellation(open_one.order_id, ("A", 1)))
    await stores.requests.record(sent, Failed("refused", "422", 422))

    assert await stores.requests.resend(open_one.event_id, operator="ops") is False
    assert await stores.requests.resend(pending.idempotency_key, operator="ops") is False
    assert await audit_of(stores) == []


async def audit_of(stores):
    if isinstance(stores.requests, FakeWarehouseRequests):
        return [(key, str(status), who) for key, status, who in stores.requests.audit]
    async with stores.stock.engine.connect() as connection:
        rows = await connection.execute(
            sa.text(
                "SELECT idempotency_key, status_before, operator FROM warehouse_request_audit"
                " ORDER BY id"
            )
        )
        return [tuple(row) for row in rows]


# --- concurrency (PostgreSQL) ---------------------------------------------------------------


@pytest.mark.postgres
async def test_two_claimers_take_disjoint_requests_and_never_wait_for_each_other(
    postgres_stores, clean_database
):
    for _ in range(10):
        await postgres_stores.placed(("A", 1))
    url = make_url(clean_database).set(drivername="postgresql")
    holder = await asyncpg.connect(url.render_as_string(hide_password=False))
    try:
        async with holder.transaction():
            held = [
                row["id"]
                for row in await holder.fetch(
                    "SELECT id FROM warehouse_requests ORDER BY id LIMIT 4 FOR UPDATE"
                )
            ]
            # Were the claim to wait for the locked rows, this would time out.
            claimed = await asyncio.wait_for(
                postgres_stores.requests.claim(10, lease_seconds=LEASE), timeout=5
            )
        assert {r.id for r in claimed}.isdisjoint(held)
        assert len(claimed) == 6
    finally:
        await holder.close()

    # The 4 rows released, and 10 more: two claimers at once share the 14, none twice.
    for _ in range(10):
        await postgres_stores.placed(("B", 1))
    first, second = await asyncio.gather(
        postgres_stores.requests.claim(10, lease_seconds=LEASE),
        postgres_stores.requests.claim(10, lease_seconds=LEASE),
    )
    first_keys = {r.idempotency_key for r in first}
    second_keys = {r.idempotency_key for r in second}
    assert first_keys.isdisjoint(second_keys)
    assert len(first_keys | second_keys) == 10 + 4
