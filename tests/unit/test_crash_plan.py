"""The fault suite's crash plan (``tests/faults/crash_plan.py``), as its workers parse it."""

from __future__ import annotations

import pytest

from tests.faults.crash_plan import CrashPoint, parse_fault_plan


def test_the_relay_crash_points_are_accepted() -> None:
    plan = parse_fault_plan("before_publish:0.5,after_publish:1")

    assert plan.probabilities == {CrashPoint.BEFORE_PUBLISH: 0.5, CrashPoint.AFTER_PUBLISH: 1.0}
    assert plan.armed


def test_an_empty_plan_arms_nothing() -> None:
    assert not parse_fault_plan("").armed


@pytest.mark.parametrize("text", ["before_commit:0.1", "after_commit:2", "after_commit"])
def test_a_malformed_plan_is_refused_naming_the_item(text: str) -> None:
    with pytest.raises(ValueError, match=text.split(":", maxsplit=1)[0]):
        parse_fault_plan(text)
