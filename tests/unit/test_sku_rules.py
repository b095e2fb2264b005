"""One set of SKU rules: what the readers of files refuse is what the event contract refuses
(``contracts.order_placed.sku_problem`` against the ``Sku`` type of ``OrderLineV1``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from fulfilment.contracts.order_placed import (
    MAX_SKU_LENGTH,
    SKU_NUL_PROBLEM,
    OrderLineV1,
    shown_sku,
    sku_problem,
)

LINE = TypeAdapter(OrderLineV1)

PROBLEMS = {
    "is empty",
    f"is longer than {MAX_SKU_LENGTH} characters",
    "must not start or end with white space, nor contain a line feed",
    SKU_NUL_PROBLEM,
}


def contract_takes(sku: str) -> bool:
    try:
        LINE.validate_python({"sku": sku, "quantity": 1})
    except ValidationError:
        return False
    return True


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=MAX_SKU_LENGTH + 2))
def test_a_sku_is_refused_by_the_readers_exactly_when_the_event_contract_refuses_it(
    sku: str,
) -> None:
    problem = sku_problem(sku)

    assert (problem is None) == contract_takes(sku)
    assert problem is None or problem in PROBLEMS


@pytest.mark.parametrize(
    ("sku", "problem"),
    [
        ("", "is empty"),
        ("X" * (MAX_SKU_LENGTH + 1), f"is longer than {MAX_SKU_LENGTH} characters"),
        (" 85123A", "must not start or end with white space, nor contain a line feed"),
        ("85123A\u00a0", "must not start or end with white space, nor contain a line feed"),
        ("85\n123A", "must not start or end with white space, nor contain a line feed"),
        ("85\x00123A", SKU_NUL_PROBLEM),
        ("BANK CHARGES", None),
        ("gift_0001_40", None),
        ("85\t123A", None),
    ],
)
def test_each_rule_has_its_words(sku: str, problem: str | None) -> None:
    assert sku_problem(sku) == problem


def test_a_long_sku_is_shown_cut_at_the_longest_a_sku_may_be() -> None:
    assert shown_sku("85123A") == "'85123A'"
    assert shown_sku("X" * 70) == repr("X" * MAX_SKU_LENGTH) + "... (70 characters)"
