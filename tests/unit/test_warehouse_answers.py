"""classify: every row of the warehouse API's table, for both kinds of request."""

from __future__ import annotations

import email.utils
import json
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from fulfilment.adapters.warehouse.answers import (
    DEFAULT_RATE_LIMIT_SECONDS,
    classify,
    retry_after_seconds,
)
from fulfilment.domain.handoff import (
    Accepted,
    CredentialsRefused,
    Failed,
    RateLimited,
    Refused,
    RequestKind,
    Retry,
)

ORDER = RequestKind.FULFILMENT_ORDER
CANCELLATION = RequestKind.CANCELLATION
NOW = datetime(2026, 12, 2, 4, 30, tzinfo=UTC)


def body(**document: object) -> bytes:
    return json.dumps(document).encode()


@pytest.mark.parametrize("status", [200, 201])
def test_a_created_or_replayed_order_is_accepted_with_its_warehouse_id(status: int) -> None:
    answer = classify(ORDER, status, body(id="WH-1", status="received"), {})
    assert answer == Accepted(status, '{"id": "WH-1", "status": "received"}', "WH-1")


@pytest.mark.parametrize("status", [200, 201])
@pytest.mark.parametrize("outcome", ["cancelled", "partially_cancelled"])
def test_an_accepted_cancellation_is_accepted(status: int, outcome: str) -> None:
    answer = classify(CANCELLATION, status, body(status=outcome), {})
    assert isinstance(answer, Accepted)
    assert answer.status_code == status
    assert answer.warehouse_id is None


@pytest.mark.parametrize(
    ("kind", "answer_body"),
    [
        (ORDER, body(status="received")),
        (ORDER, body(id="")),
        (ORDER, body(id=17)),
        (ORDER, b"[]"),
        (ORDER, b"not json"),
        (ORDER, b""),
        (CANCELLATION, body(status="received")),
        (CANCELLATION, body(id="WH-1")),
        (CANCELLATION, b""),
    ],
)
@pytest.mark.parametrize("status", [200, 201])
def test_a_success_whose_body_is_not_the_apis_fails(
    kind: RequestKind, answer_body: bytes, status: int
) -> None:
    answer = classify(kind, status, answer_body, {})
    assert answer == Failed("unexpected_answer", answer_body.decode(), status)


@pytest.mark.parametrize("status", [202, 204, 206, 100, 301, 302, 304, 307])
def test_another_success_or_a_redirect_fails(status: int) -> None:
    answer = classify(ORDER, status, body(id="WH-1"), {})
    assert isinstance(answer, Failed)
    assert answer.status_code == status


@pytest.mark.parametrize("kind", [ORDER, CANCELLATION])
def test_in_flight_is_retried_with_its_retry_after_if_any(kind: RequestKind) -> None:
    assert classify(kind, 409, body(error="in_flight"), {}) == Retry('{"error": "in_flight"}', 409)
    answer = classify(kind, 409, body(error="in_flight"), {"retry-after": "2"})
    assert answer == Retry('{"error": "in_flight"}', 409, 2.0)


def test_a_duplicate_reference_adopts_the_existing_orders_id() -> None:
    answer = classify(ORDER, 409, body(error="duplicate_reference", id="WH-7"), {})
    assert answer == Accepted(409, '{"error": "duplicate_reference", "id": "WH-7"}', "WH-7")


@pytest.mark.parametrize(
    ("kind", "answer_body", "reason"),
    [
        (ORDER, body(error="duplicate_reference"), "duplicate_reference"),
        (ORDER, body(error="duplicate_reference", id=""), "duplicate_reference"),
        (CANCELLATION, body(error="duplicate_reference", id="WH-7"), "duplicate_reference"),
        (ORDER, body(error="too_late"), "too_late"),
        (ORDER, body(error="something_else"), "something_else"),
        (ORDER, b"", "http_409"),
        (CANCELLATION, b"<html>", "http_409"),
    ],
)
def test_another_conflict_fails(kind: RequestKind, answer_body: bytes, reason: str) -> None:
    assert classify(kind, 409, answer_body, {}) == Failed(reason, answer_body.decode(), 409)


def test_too_late_refuses_a_cancellation() -> None:
    assert classify(CANCELLATION, 409, body(error="too_late"), {}) == Refused(
        409, '{"error": "too_late"}'
    )


@pytest.mark.parametrize("kind", [ORDER, CANCELLATION])
@pytest.mark.parametrize("status", [401, 403])
def test_refused_credentials_are_credentials_refused(kind: RequestKind, status: int) -> None:
    answer = classify(kind, status, body(error="forbidden"), {})
    assert answer == CredentialsRefused(status, '{"error": "forbidden"}')


@pytest.mark.parametrize("kind", [ORDER, CANCELLATION])
@pytest.mark.parametrize(
    ("answer_body", "reason"),
    [
        (body(error="sku_not_stocked", sku="X"), "sku_not_stocked"),
        (body(error="idempotency_key_reused"), "idempotency_key_reused"),
        (b"", "http_422"),
        (body(error=""), "http_422"),
        (body(detail="no error field"), "http_422"),
    ],
)
def test_unprocessable_fails_with_the_warehouses_reason(
    kind: RequestKind, answer_body: bytes, reason: str
) -> None:
    assert classify(kind, 422, answer_body, {}) == Failed(reason, answer_body.decode(), 422)


@pytest.mark.parametrize("status", [400, 402, 404, 405, 406, 410, 413, 415, 418, 451, 499])
@pytest.mark.parametrize("kind", [ORDER, CANCELLATION])
def test_every_other_client_error_fails(kind: RequestKind, status: int) -> None:
    answer = classify(kind, status, b"", {})
    assert answer == Failed(f"http_{status}", "", status)


@pytest.mark.parametrize("kind", [ORDER, CANCELLATION])
def test_rate_limited_waits_the_retry_after_in_seconds(kind: RequestKind) -> None:
    answer = classify(kind, 429, body(error="rate_limited"), {"retry-after": "7"})
    assert answer == RateLimited(7.0, '{"error": "rate_limited"}')


def test_rate_limited_waits_until_an_http_date() -> None:
    date = email.utils.format_datetime(NOW + timedelta(seconds=30), usegmt=True)
    answer = classify(ORDER, 429, b"", {"retry-after": date}, now=NOW)
    assert answer == RateLimited(30.0, "")


def test_httpx_headers_are_read_whatever_the_case_of_the_name() -> None:
    headers = httpx.Headers({"Retry-After": "3"})
    assert classify(ORDER, 429, b"", headers) == RateLimited(3.0, "")


@pytest.mark.parametrize("header", [None, "", "soon", "-1", "nan", "inf"])
def test_rate_limited_without_a_readable_retry_after_waits_the_default(
    header: str | None,
) -> None:
    headers = {} if header is None else {"retry-after": header}
    answer = classify(ORDER, 429, b"", headers)
    assert answer == RateLimited(DEFAULT_RATE_LIMIT_SECONDS, "")


@pytest.mark.parametrize("status", [500, 502, 503, 504, 507, 599])
@pytest.mark.parametrize("kind", [ORDER, CANCELLATION])
def test_a_server_error_is_retried(kind: RequestKind, status: int) -> None:
    assert classify(kind, status, b"oops", {}) == Retry("oops", status)
    assert classify(kind, status, b"", {"retry-after": "5"}) == Retry("", status, 5.0)


@pytest.mark.parametrize(
    "error",
    [
        httpx.ConnectError("connection refused"),
        httpx.ReadTimeout("timed out"),
        httpx.ConnectTimeout("timed out"),
        httpx.RemoteProtocolError("server disconnected"),
        httpx.ReadError("reset"),
        TimeoutError(),
    ],
    ids=lambda error: type(error).__name__,
)
@pytest.mark.parametrize("kind", [ORDER, CANCELLATION])
def test_no_answer_is_retried(kind: RequestKind, error: Exception) -> None:
    answer = classify(kind, None, None, {}, error)
    assert answer == Retry(f"{type(error).__name__}: {error}")


def test_a_long_answer_is_kept_to_a_thousand_characters() -> None:
    answer = classify(ORDER, 500, b"x" * 5000, {})
    assert isinstance(answer, Retry)
    assert len(answer.answer) == 1000


def test_a_body_that_is_not_utf8_is_kept_readable() -> None:
    answer = classify(ORDER, 400, b"\xff\xfe", {})
    assert answer == Failed("http_400", "\ufffd\ufffd", 400)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("0", 0.0),
        ("120", 120.0),
        ("1.5", 1.5),
        (" 3 ", 3.0),
        (email.utils.format_datetime(NOW + timedelta(minutes=2), usegmt=True), 120.0),
        ("Wed, 02 Dec 2026 04:31:00 GMT", 60.0),
        ("Wednesday, 02-Dec-26 04:31:00 GMT", 60.0),  # RFC 850: RFC 9110 says accept it
        (email.utils.format_datetime(NOW - timedelta(minutes=2), usegmt=True), 0.0),
        ("Wed, 02 Dec 2026 04:31:00 -0000", 60.0),
        (None, None),
        ("", None),
        ("tomorrow", None),
        ("-5", None),
    ],
)
def test_retry_after_reads_seconds_or_an_http_date(
    value: str | None, seconds: float | None
) -> None:
    assert retry_after_seconds(value, now=NOW) == seconds
