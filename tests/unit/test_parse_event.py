"""The shared parse of every event: a body two JSON parsers could read differently is refused.

``parse_event`` holds every event model to I-JSON (RFC 7493) on top of the model's own strict
rules; these cases are the kinds of ambiguity, each on ``OrderPlacedV1`` and on other models,
as a later event's would be.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict

from fulfilment.contracts.envelope import MAX_EXACT_INTEGER, find_ambiguity
from fulfilment.contracts.order_placed import OrderPlacedV1
from fulfilment.routes.handling import MalformedEventError, parse_event

VALID = (
    '{"version": 1, "event_id": "6f1c0d2e-8f0b-4b7e-9a57-2f1f0c6b9e11",'
    ' "order_id": "0b6e3c9a-55d4-4f7e-8a59-0c1d2e3f4a5b",'
    ' "placed_at": "2010-12-01T08:26:00+00:00",'
    ' "lines": [{"sku": "85123A", "quantity": 6}, {"sku": "71053", "quantity": 6}]'
)


def order(extra: str = "", *, version: str = "1", quantity: str = "6") -> bytes:
    """The contract's example order, with ``extra`` members appended to the object."""
    text = VALID.replace('"version": 1', f'"version": {version}', 1)
    text = text.replace('"quantity": 6}]', f'"quantity": {quantity}}}]', 1)
    return (text + extra + "}").encode()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        # The same key twice, at the top and deeper: the model's parser keeps the last.
        (order(', "lines": [{"sku": "85123A", "quantity": 900}]'), "'lines' appears twice"),
        (order(', "version": 1'), "'version' appears twice"),
        (
            order().replace(b'"quantity": 6}]', b'"quantity": 6, "quantity": 900}]'),
            "'quantity' appears twice",
        ),
        (order(', "note": {"a": 1, "a": 2}'), "'a' appears twice"),  # in an unknown field too
        # Not an integer where one is expected: strict pydantic takes these for Literal[1].
        (order(version="true"), "version: true where an integer is expected"),
        (order(version="1.0"), "version: 1.0 where an integer is expected"),
        (order(version="1e0"), "version: 1.0 where an integer is expected"),
        (order(version="10e-1"), "version: 1.0 where an integer is expected"),
        (order(quantity="1.0"), "quantity"),
        (order(quantity="true"), "quantity"),
        (order(quantity="1e2"), "quantity"),
        # Numbers other parsers read otherwise, or not at all.
        (order(', "x": NaN'), "NaN is not a JSON number"),
        (order(', "x": Infinity'), "Infinity is not a JSON number"),
        (order(', "x": -Infinity'), "-Infinity is not a JSON number"),
        (order(', "x": 1e400'), "1e400 is beyond the range of a double"),
        (order(f', "x": {MAX_EXACT_INTEGER + 1}'), "beyond +-(2**53 - 1)"),
        (order(f', "x": -{MAX_EXACT_INTEGER + 1}'), "beyond +-(2**53 - 1)"),
        (order(', "x": ' + "9" * 4_000), "(4000 digits)"),
        (order(quantity=str(MAX_EXACT_INTEGER + 1)), "quantity"),
        # Text: the model's own parser refuses these; pinned here as members of the kind.
        (b"\xef\xbb\xbf" + order(), "invalid OrderPlaced v1"),  # a byte-order mark
        (order(', "x": "?"').replace(b'"?"', b'"\xff"'), "invalid unicode"),  # not UTF-8
        (order(', "x": "\\ud800"'), "Invalid JSON"),  # a lone surrogate
        (order(', "x": "\\udc00"'), "surrogate"),
        (order(', "x": "\\ud800\\u0041"'), "surrogate"),
        (order() + b" {}", "trailing characters"),
        (order() + b"\x00", "trailing characters"),
        (b"[" + order() + b"]", "Input should be an object"),
        (json.dumps(order().decode()).encode(), "Input should be an object"),
    ],
)
def test_a_body_that_parsers_could_read_differently_is_refused_with_its_reason(
    body: bytes, reason: str
) -> None:
    with pytest.raises(MalformedEventError) as refused:
        parse_event(OrderPlacedV1, body)

    message = str(refused.value)
    assert message.startswith("invalid OrderPlaced v1: ")
    assert reason in message
    assert "\n" not in message


def test_the_ambiguity_check_alone_refuses_a_byte_order_mark_and_reads_each_body_afresh() -> None:
    # Its decoders are built once and shared by every call: one body must not leave anything
    # behind for the next, and a byte-order mark is refused as json.loads refuses it.
    assert find_ambiguity(b"\xef\xbb\xbf" + order(), OrderPlacedV1) == (
        "not JSON: Unexpected UTF-8 BOM (decode using utf-8-sig): line 1 column 1 (char 0)"
    )
    long_integer = order(f', "x": {MAX_EXACT_INTEGER + 1}')
    assert "beyond +-(2**53 - 1)" in (find_ambiguity(long_integer, OrderPlacedV1) or "")
    assert find_ambiguity(order(', "a": {"k": 1}'), OrderPlacedV1) is None
    assert find_ambiguity(order(', "a": {"k": 1, "k": 2}'), OrderPlacedV1) == (
        "key 'k' appears twice in one object"
    )
    assert find_ambiguity(order(), OrderPlacedV1) is None


@pytest.mark.parametrize(
    "extra",
    [
        ', "channel": "web", "gift": true, "total": 12.5, "tags": ["a", "b"]',
        ', "customer": {"id": 9007199254740991, "score": -0.0, "ratio": 1e-3}',
        ', "note": "caf\\u00e9 \\ud83d\\ude00 \\u2028 \\\\ud800"',  # a pair, and an escaped \\
        ', "nothing": null, "nested": [[[1]], {"deep": {"er": []}}]',
    ],
)
def test_unknown_fields_of_any_unambiguous_json_are_still_ignored(extra: str) -> None:
    event = parse_event(OrderPlacedV1, order(extra))

    assert event.version == 1
    assert [line.quantity for line in event.lines] == [6, 6]


class LaterEventV1(BaseModel):
    """A later event's model, as the reservation lifecycle adds them: the kind holds there."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore", title="Later v1")

    version: Literal[1]
    event_id: uuid.UUID
    kinds: list[Literal[1, 2]] = []
    parts: int | None = None
    weight: float | None = None


LATER = {"version": 1, "event_id": str(uuid.uuid4())}


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"version": True}, "version: true"),
        ({"kinds": [1, 2.0]}, "kinds.[]: 2.0"),
        ({"parts": False}, "parts"),
    ],
)
def test_every_event_model_is_held_to_integers_where_it_expects_them(
    changes: dict[str, Any], reason: str
) -> None:
    with pytest.raises(MalformedEventError) as refused:
        parse_event(LaterEventV1, json.dumps({**LATER, **changes}).encode())

    assert str(refused.value).startswith("invalid Later v1: ")
    assert reason in str(refused.value)


def test_a_number_is_accepted_where_a_model_expects_one() -> None:
    event = parse_event(LaterEventV1, json.dumps({**LATER, "weight": 2.5, "parts": 3}).encode())

    assert (event.weight, event.parts) == (2.5, 3)
