"""The wire model accepts only values PostgreSQL stores as they were sent.

Each refusal is a ``pydantic.ValidationError``, which the worker turns into a one-line
``permanent`` dead letter on the first delivery (``parse_order_placed``), instead of a database
error after the fact (``unexpected``). ``tests/integration/test_postgres_wire_values.py`` sends
generated bodies through the real database to hold the model to this.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import ValidationError

from fulfilment.adapters.postgres.tables.base import INTEGER_MAX
from fulfilment.contracts.order_placed import (
    MAX_LINES,
    MAX_QUANTITY,
    MAX_SKU_LENGTH,
    MAX_UNITS_PER_SKU,
    OrderPlacedV1,
)
from fulfilment.routes.handling import MalformedEventError
from tests.support.builders import parse_order_placed

NIL_UUID = "00000000-0000-0000-0000-000000000000"
MAX_UUID = "ffffffff-ffff-ffff-ffff-ffffffffffff"


def event(**changes: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "version": 1,
        "event_id": str(uuid.uuid4()),
        "order_id": str(uuid.uuid4()),
        "placed_at": "2010-12-01T08:26:00+00:00",
        "lines": [{"sku": "85123A", "quantity": 6}],
    }
    document.update(changes)
    return document


def python_event(**changes: Any) -> dict[str, Any]:
    """The same event as Python objects, for ``model_validate`` (strict: no strings for ids)."""
    document = event(event_id=uuid.uuid4(), order_id=uuid.uuid4())
    document["placed_at"] = datetime(2010, 12, 1, 8, 26, tzinfo=UTC)
    document.update(changes)
    return document


def body(**changes: Any) -> bytes:
    return json.dumps(event(**changes)).encode()


def with_sku(sku: str) -> bytes:
    return body(lines=[{"sku": "71053", "quantity": 1}, {"sku": sku, "quantity": 1}])


def refusal(raw: bytes) -> str:
    with pytest.raises(MalformedEventError) as refused:
        parse_order_placed(raw, "application/json")
    reason = str(refused.value)
    assert "\n" not in reason
    return reason


@pytest.mark.parametrize("sku", ["85123A\x00", "\x00", "85\x00123A", "\x00BANK CHARGES"])
def test_a_sku_with_a_nul_character_is_refused_because_postgresql_text_cannot_hold_it(
    sku: str,
) -> None:
    reason = refusal(with_sku(sku))

    assert "lines.1.sku" in reason
    assert "NUL" in reason


def test_a_sku_with_a_nul_character_is_refused_when_the_model_is_built_in_python_too() -> None:
    with pytest.raises(ValidationError, match="NUL") as refused:
        OrderPlacedV1.model_validate(python_event(lines=[{"sku": "85123A\x00", "quantity": 1}]))
    assert refused.value.error_count() == 1


@pytest.mark.parametrize("escape", ["\\ud800", "\\udfff", "\\udbff\\u0041", "A\\udc00"])
def test_a_lone_surrogate_escape_in_a_sku_is_refused_as_invalid_json(escape: str) -> None:
    raw = body().replace(b'"85123A"', f'"{escape}"'.encode())

    assert "Invalid JSON" in refusal(raw)


@pytest.mark.parametrize("sku", ["\ud800", "A\udfff", "\udbffA"])
def test_a_lone_surrogate_in_a_sku_is_refused_when_the_model_is_built_in_python(
    sku: str,
) -> None:
    with pytest.raises(ValidationError, match=r"lines\.0\.sku") as refused:
        OrderPlacedV1.model_validate(python_event(lines=[{"sku": sku, "quantity": 1}]))
    assert refused.value.error_count() == 1


@pytest.mark.parametrize(
    "sku",
    [
        "85123A",
        "15056bl",
        "gift_0001_40",
        "BANK CHARGES",
        "D",
        "A\ud83d\ude00B",  # a pair of surrogate escapes is one character, U+1F600
        "\U0010ffff" * MAX_SKU_LENGTH,  # the longest SKU in bytes: 256 bytes of UTF-8
    ],
)
def test_real_and_longest_skus_are_accepted(sku: str) -> None:
    raw = json.dumps(event(lines=[{"sku": sku, "quantity": 1}]), ensure_ascii=True).encode()

    expected = sku.encode("utf-16", "surrogatepass").decode("utf-16")
    assert parse_order_placed(raw, "application/json").lines[0].sku == expected


@pytest.mark.parametrize(
    "placed_at",
    [
        "0001-01-01T00:00:00+01:00",  # 0000-12-31T23:00Z: before Python's first datetime
        "0001-01-01T00:59:59.999999+01:00",
        "9999-12-31T23:59:59-01:00",  # 10000-01-01T00:59:59Z: after its last
        "9999-12-31T23:30:00-00:31",
    ],
)
def test_a_placed_at_outside_the_years_1_to_9999_in_utc_is_refused(placed_at: str) -> None:
    reason = refusal(body(placed_at=placed_at))

    assert reason.startswith("invalid OrderPlaced v1: placed_at: ")
    assert "9999" in reason


@pytest.mark.parametrize(
    "placed_at",
    [
        "0001-01-01T00:00:00+00:00",
        "0001-01-01T01:00:00+01:00",
        "9999-12-31T23:59:59.999999Z",
        "9999-12-31T22:59:59.999999-01:00",
    ],
)
def test_a_placed_at_at_the_first_or_last_python_instant_is_refused(placed_at: str) -> None:
    # asyncpg writes these two instants as PostgreSQL's -infinity and infinity, so they would be
    # stored as another value than the one sent.
    assert "placed_at" in refusal(body(placed_at=placed_at))


@pytest.mark.parametrize(
    "placed_at",
    [
        "0001-01-01T00:00:00.000001+00:00",
        "0001-01-01T00:00:00-23:59",
        "9999-12-31T23:59:59.999998Z",
        "9999-12-31T23:59:59.999999+23:59",
        "2010-12-01T08:26:00+23:59",
        "2010-12-01T08:26:00-23:59",
        "2010-12-01T08:26:00+05:45",
    ],
)
def test_a_placed_at_inside_the_range_is_accepted_whatever_its_offset(placed_at: str) -> None:
    parsed = parse_order_placed(body(placed_at=placed_at), "application/json").placed_at

    assert parsed.utcoffset() is not None


@pytest.mark.parametrize("placed_at", ["2010-12-01T08:26:00+24:00", "2010-12-01T08:26:00+05:30:15"])
def test_an_offset_of_a_day_or_with_seconds_is_refused(placed_at: str) -> None:
    assert "placed_at" in refusal(body(placed_at=placed_at))


def test_a_placed_at_built_in_python_is_held_to_the_same_range() -> None:
    first = datetime.min.replace(tzinfo=UTC)
    before_first = datetime.min.replace(tzinfo=timezone(timedelta(hours=1)))

    for placed_at in (first, before_first):
        with pytest.raises(ValidationError, match="placed_at") as refused:
            OrderPlacedV1.model_validate(python_event(placed_at=placed_at))
        assert refused.value.error_count() == 1
    accepted = OrderPlacedV1.model_validate(
        python_event(placed_at=first + timedelta(microseconds=1))
    )
    assert accepted.placed_at == first + timedelta(microseconds=1)


@pytest.mark.parametrize("field", ["event_id", "order_id"])
@pytest.mark.parametrize("value", [NIL_UUID, MAX_UUID, NIL_UUID.replace("-", "")])
def test_the_nil_and_max_uuids_are_refused_as_ids(field: str, value: str) -> None:
    reason = refusal(body(**{field: value}))

    assert f"{field}: " in reason
    assert "UUID" in reason


def test_any_other_uuid_is_accepted_as_an_id_whatever_its_version() -> None:
    ids = {"event_id": "00000000-0000-0000-0000-000000000001", "order_id": str(uuid.uuid1())}

    parsed = parse_order_placed(body(**ids), "application/json")

    assert str(parsed.event_id) == ids["event_id"]


def test_the_largest_demand_of_one_sku_fits_the_integer_columns() -> None:
    # place_orders() sums an order's lines of one SKU into an integer (reservation_lines.
    # quantity); an order of MAX_LINES lines of the same SKU, each at MAX_QUANTITY, must fit.
    assert MAX_LINES * MAX_QUANTITY == MAX_UNITS_PER_SKU <= INTEGER_MAX
    lines = [{"sku": "85123A", "quantity": MAX_QUANTITY}] * MAX_LINES

    command = parse_order_placed(body(lines=lines), "application/json").to_command()

    assert command.demand() == {"85123A": MAX_UNITS_PER_SKU}


@pytest.mark.parametrize("quantity", [0, -1, MAX_QUANTITY + 1, INTEGER_MAX + 1, 2**63])
def test_a_quantity_outside_1_to_max_quantity_is_refused(quantity: int) -> None:
    assert "lines.0.quantity" in refusal(body(lines=[{"sku": "85123A", "quantity": quantity}]))
