"""``fulfilment.backoff``: the doubling waits of the loops that are not a call retried."""

from __future__ import annotations

import pytest

from fulfilment.backoff import doubling_wait


def test_the_waits_double_from_the_first_up_to_the_cap() -> None:
    waits = [doubling_wait(failures, first=1.0, cap=15.0) for failures in range(6)]

    assert waits == [1.0, 2.0, 4.0, 8.0, 15.0, 15.0]


def test_the_relays_batch_back_off_is_the_one_it_computed_by_hand() -> None:
    assert [doubling_wait(failed - 1, first=1.0, cap=30.0) for failed in range(1, 12)] == [
        min(30.0, 0.5 * 2 ** min(failed, 6)) for failed in range(1, 12)
    ]


@pytest.mark.parametrize("failures", [0, 1, 3, 8])
def test_jitter_adds_at_most_its_seconds_and_never_passes_the_cap(failures: int) -> None:
    base = min(1.0 * 2**failures, 20.0)
    for _ in range(200):
        wait = doubling_wait(failures, first=1.0, cap=20.0, jitter=1.0)
        assert base <= wait <= min(base + 1.0, 20.0)


def test_a_long_run_of_failures_waits_the_cap() -> None:
    assert doubling_wait(10_000, first=0.5, cap=30.0) == 30.0
