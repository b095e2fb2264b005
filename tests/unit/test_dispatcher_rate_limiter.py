"""The dispatcher's rate cap (``rate_limiter``): never above the cap, late wake-ups caught up.

Driven on the real event loop while a task keeps the loop busy a few milliseconds at a time,
as the dispatcher's claims, sends and records do on a busy process, so that the limiter's
wake-ups come late.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import time

import pytest

from fulfilment.dispatcher.service import rate_limiter


async def admitted_times(rate: float, seconds: float, *, busy_seconds: float) -> list[float]:
    """The loop times at which ``rate_limiter(rate)`` admitted requests for ``seconds``.

    Eight tasks acquire in turn, as the dispatcher's concurrency slots do, while another
    task holds the loop ``busy_seconds`` at a time, as claims, sends and records do on a busy
    process: a limiter's wake-up that falls in such a stretch runs at its end, late.
    """
    limiter = rate_limiter(rate)
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    times: list[float] = []

    async def sender() -> None:
        while loop.time() < end:
            await limiter.acquire()
            times.append(loop.time())

    async def busy() -> None:
        while loop.time() < end:
            time.sleep(busy_seconds)  # noqa: ASYNC251 - the point: the loop held, as by CPU work
            await asyncio.sleep(0)

    await asyncio.gather(busy(), *(sender() for _ in range(8)))
    return sorted(times)


_RUNS: dict[float, list[float]] = {}
"""One busy run per rate, read by both tests of that rate (each run takes 2.5 s)."""


async def a_busy_run(rate: float) -> list[float]:
    """``admitted_times(rate, 2.5 s)`` with the loop held 4 ms at a time, run once per rate."""
    if rate not in _RUNS:
        _RUNS[rate] = await admitted_times(rate, 2.5, busy_seconds=0.004)
    return _RUNS[rate]


def most_in_one_second(times: list[float]) -> int:
    """The most of ``times`` in any half-open window of one second."""
    return max(bisect.bisect_left(times, start + 1.0) - i for i, start in enumerate(times))


@pytest.mark.parametrize("rate", [2.5, 100, 200])
async def test_no_second_holds_more_than_the_cap_even_when_every_wake_up_is_late(
    rate: float,
) -> None:
    times = await a_busy_run(rate)

    assert most_in_one_second(times) <= math.ceil(rate)


@pytest.mark.parametrize("rate", [100, 200])
async def test_a_high_cap_catches_up_late_wake_ups_and_is_held_within_a_tenth(rate: float) -> None:
    # A bucket of one loses each late wake-up for good (it admitted 47 a second of 100 and 60
    # of 200 in this run); a deeper bucket admits the next request at once instead.
    times = await a_busy_run(rate)

    steady = [t for t in times if times[0] + 0.5 <= t < times[0] + 2.5]
    assert len(steady) / 2.0 >= 0.9 * rate, len(steady)


def test_up_to_fifty_a_second_requests_go_one_interval_apart() -> None:
    limiter = rate_limiter(50)

    assert limiter.max_rate == 1
    assert limiter.time_period == pytest.approx(1 / 50)


def test_above_fifty_a_second_the_bucket_deepens_and_leaks_what_keeps_the_cap() -> None:
    limiter = rate_limiter(100)

    assert limiter.max_rate == 2
    # Fewer than depth + leak per second are admitted in any second: 2 + 99 - 1 = 100.
    assert limiter.max_rate / limiter.time_period == pytest.approx(99)
