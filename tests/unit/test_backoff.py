"""``fulfilment.backoff``: the doubling waits the hand-written loops used to compute."""

from __future__ import annotations

from fulfilment.backoff import Backoff


def test_the_waits_double_from_the_first_up_to_the_cap() -> None:
    backoff = Backoff(1.0, 15.0)

    assert [backoff.next() for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 15.0, 15.0]


def test_reset_starts_again_at_the_first_wait() -> None:
    backoff = Backoff(0.5, 30.0)
    assert [backoff.next() for _ in range(3)] == [0.5, 1.0, 2.0]

    backoff.reset()
    assert backoff.next() == 0.5


def test_the_relays_batch_back_off_is_the_one_it_computed_by_hand() -> None:
    backoff = Backoff(1.0, 30.0)

    assert [backoff.next() for _ in range(1, 12)] == [
        min(30.0, 0.5 * 2 ** min(failed, 6)) for failed in range(1, 12)
    ]
