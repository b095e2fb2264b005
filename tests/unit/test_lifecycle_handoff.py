"""The hand-off's rule (``fulfilment.domain.handoff``), cell by cell, and the request bodies.

A cancel by the status of the order's fulfilment-order request; what a cancellation's answer
and a fulfilment order's failure do to the order; the exact bytes ``request_body`` builds.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from uuid import UUID

import pytest

from fulfilment.contracts.warehouse_bodies import request_body
from fulfilment.domain.handoff import (
    SENT_STATUSES,
    CancellationToSend,
    RequestKind,
    RequestStatus,
    cancel_with_handoff,
    cancellation_accepted,
    cancellation_refused,
    cancellation_to_send,
    fulfilment_order_failed,
)
from fulfilment.domain.lifecycle import (
    CancelKind,
    OrderState,
    OrderStatus,
    Tombstone,
    apply_cancelled,
)

RESERVED = OrderState(OrderStatus.RESERVED, {"A": 3, "B": 2})
SHIPPED = OrderState(OrderStatus.SHIPPED, {"A": 3, "B": 2})
RELEASED = OrderState(OrderStatus.RELEASED)
ORDER_ID = UUID("5b59ca27-dcfc-425a-8229-adc71287a85b")


@pytest.mark.parametrize("request_status", [None, RequestStatus.FAILED], ids=["none", "failed"])
@pytest.mark.parametrize("cancelled", [None, {"A": 1}, {"Z": 1}], ids=["whole", "lines", "other"])
def test_without_a_request_or_after_a_failure_a_cancel_is_the_lifecycle_s(
    request_status, cancelled
):
    decided = cancel_with_handoff(RESERVED, cancelled, request_status)

    assert decided.cancellation == apply_cancelled(RESERVED, cancelled)
    assert (decided.ask, decided.fulfilment_lines, decided.withdrawn) == (False, None, False)


def test_a_partial_cancel_of_a_pending_request_releases_and_shrinks_it():
    decided = cancel_with_handoff(RESERVED, {"A": 1, "Z": 4}, RequestStatus.PENDING)

    assert decided.cancellation.kind is CancelKind.PARTIALLY_RELEASED
    assert decided.cancellation.lines == {"A": 1}
    assert decided.fulfilment_lines == {"A": 2, "B": 2}
    assert (decided.ask, decided.withdrawn) == (False, False)


@pytest.mark.parametrize("cancelled", [None, {"A": 5, "B": 2}], ids=["whole", "every_line"])
def test_a_cancel_of_everything_a_pending_request_holds_withdraws_it(cancelled):
    decided = cancel_with_handoff(RESERVED, cancelled, RequestStatus.PENDING)

    assert decided.cancellation.kind is CancelKind.RELEASED
    assert (decided.withdrawn, decided.ask, decided.fulfilment_lines) == (True, False, None)


@pytest.mark.parametrize("request_status", sorted(SENT_STATUSES))
@pytest.mark.parametrize(
    ("cancelled", "asked"),
    [(None, None), ({"A": 5, "Z": 1}, {"A": 3})],
    ids=["whole", "lines"],
)
def test_a_cancel_of_a_sent_order_releases_nothing_and_asks_the_warehouse(
    request_status, cancelled, asked
):
    decided = cancel_with_handoff(RESERVED, cancelled, request_status)

    assert decided.cancellation.kind is CancelKind.CANCEL_REQUESTED
    assert decided.cancellation.state == RESERVED
    assert decided.cancellation.lines == {}
    assert (decided.ask, decided.asked) == (True, asked)
    assert (decided.fulfilment_lines, decided.withdrawn) == (None, False)


@pytest.mark.parametrize("request_status", [None, *RequestStatus])
def test_a_cancel_that_would_release_nothing_asks_nothing(request_status):
    for state, cancelled in [
        (RESERVED, {"Z": 1}),
        (SHIPPED, None),
        (RELEASED, None),
        (None, None),
        (OrderState(OrderStatus.CANCELLED, {}, Tombstone({"A": 1})), {"A": 1}),
    ]:
        decided = cancel_with_handoff(state, cancelled, request_status)

        assert decided.cancellation == apply_cancelled(state, cancelled)
        assert not decided.ask


def test_an_accepted_cancellation_releases_what_the_order_holds_now():
    partly = cancellation_accepted(RESERVED, {"A": 5})
    whole = cancellation_accepted(RESERVED, None)

    assert (partly.kind, partly.lines, partly.state.lines) == (
        CancelKind.PARTIALLY_RELEASED,
        {"A": 3},
        {"B": 2},
    )
    assert (whole.kind, whole.lines, whole.state.status) == (
        CancelKind.RELEASED,
        {"A": 3, "B": 2},
        OrderStatus.RELEASED,
    )


def test_an_accepted_cancellation_of_an_order_shipped_meanwhile_releases_nothing():
    accepted = cancellation_accepted(SHIPPED, None)

    assert (accepted.kind, accepted.lines, accepted.state) == (
        CancelKind.CANCEL_AFTER_SHIP,
        {},
        SHIPPED,
    )


def test_a_refused_cancellation_leaves_the_order_reserved():
    refused = cancellation_refused(RESERVED)

    assert (refused.kind, refused.lines, refused.state) == (CancelKind.IGNORED, {}, RESERVED)


def test_a_failed_fulfilment_order_applies_its_waiting_cancellations_in_turn():
    state, results = fulfilment_order_failed(RESERVED, [{"A": 1}, {"A": 5}, None])

    assert [(r.kind, r.lines) for r in results] == [
        (CancelKind.PARTIALLY_RELEASED, {"A": 1}),
        (CancelKind.PARTIALLY_RELEASED, {"A": 2}),
        (CancelKind.RELEASED, {"B": 2}),
    ]
    assert state.status is OrderStatus.RELEASED


@pytest.mark.parametrize(
    ("asked", "lines"),
    [
        (None, None),
        ({"A": 1}, {"A": 1}),
        ({"A": 5, "B": 2}, {"A": 3, "B": 2}),
        ({"A": 5, "Z": 1}, {"A": 3}),
    ],
    ids=["whole", "held", "more-than-held", "a-sku-not-held"],
)
def test_a_cancellation_first_sent_asks_what_a_reserved_order_still_holds(asked, lines):
    assert cancellation_to_send(RESERVED, asked) == CancellationToSend(send=True, lines=lines)


@pytest.mark.parametrize(
    ("state", "asked"),
    [(RELEASED, None), (RELEASED, {"A": 1}), (RESERVED, {"Z": 1})],
    ids=["released-whole", "released-lines", "nothing-of-its-lines-held"],
)
def test_a_cancellation_with_nothing_left_to_ask_is_not_sent(state, asked):
    assert not cancellation_to_send(state, asked).send


@pytest.mark.parametrize("state", [SHIPPED, None], ids=["shipped", "no-row"])
@pytest.mark.parametrize("asked", [None, {"A": 5}], ids=["whole", "lines"])
def test_a_cancellation_of_an_order_not_reserved_is_sent_as_recorded(state, asked):
    # The warehouse answers it: too_late for an order that left.
    assert cancellation_to_send(state, asked) == CancellationToSend(send=True, lines=asked)


def test_a_fulfilment_order_s_body_is_compact_json_in_the_api_s_order():
    at = datetime(2026, 12, 2, 9, 30, 0, 12, tzinfo=timezone(timedelta(hours=1)))

    body = request_body(RequestKind.FULFILMENT_ORDER, ORDER_ID, {"b": 1, "B": 2, "A": 3}, at)

    assert body == (
        b'{"reference":"5b59ca27-dcfc-425a-8229-adc71287a85b","lines":'
        b'[{"sku":"A","quantity":3},{"sku":"B","quantity":2},{"sku":"b","quantity":1}],'
        b'"requested_at":"2026-12-02T08:30:00.000012+00:00"}'
    )
    assert datetime.fromisoformat(json.loads(body)["requested_at"]) == at


def test_a_cancellation_s_body_names_its_lines_or_nothing_for_the_whole_order():
    at = datetime(2026, 12, 2, tzinfo=UTC)

    assert request_body(RequestKind.CANCELLATION, ORDER_ID, None, at) == b"{}"
    assert (
        request_body(RequestKind.CANCELLATION, ORDER_ID, {"é": 2}, at)
        == '{"lines":[{"sku":"é","quantity":2}]}'.encode()
    )


def test_a_body_is_the_same_bytes_every_time():
    at = datetime(2026, 12, 2, tzinfo=UTC)

    bodies = {
        request_body(RequestKind.FULFILMENT_ORDER, ORDER_ID, dict(lines), at)
        for lines in ([("A", 1), ("B", 2)], [("B", 2), ("A", 1)])
    }

    assert len(bodies) == 1


def test_a_fulfilment_order_without_lines_or_with_a_naive_time_is_refused():
    with pytest.raises(ValueError, match="no lines"):
        request_body(RequestKind.FULFILMENT_ORDER, ORDER_ID, {}, datetime(2026, 12, 2, tzinfo=UTC))
    with pytest.raises(ValueError, match="offset"):
        request_body(RequestKind.FULFILMENT_ORDER, ORDER_ID, {"A": 1}, datetime(2026, 12, 2))  # noqa: DTZ001 - the naive time is what is refused
