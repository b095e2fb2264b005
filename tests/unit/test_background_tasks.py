"""The supervisor of the worker's background tasks: no task dies silently, none stays stale.

Tasks here are plain coroutines; the restart waits are shortened to milliseconds. The queue
monitor against a real broker is in ``tests/integration/test_queue_monitor.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import pytest
from structlog.testing import capture_logs

from fulfilment.observability.metrics import MONITOR_CHECKS, Metrics
from fulfilment.worker import monitors
from fulfilment.worker.monitors import BackgroundTask, background, supervise


@pytest.fixture(autouse=True)
def short_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(monitors, "FIRST_RESTART_SECONDS", 0.01)
    monkeypatch.setattr(monitors, "MAX_RESTART_SECONDS", 0.04)


def errors(metrics: Metrics, check: str) -> float | None:
    return metrics.registry.get_sample_value("fulfilment_monitor_errors_total", {"check": check})


async def until(condition: Callable[[], bool], timeout: float = 5) -> None:
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110 - state of the code under test, not an event
            await asyncio.sleep(0.001)


async def stopped(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


class Script:
    """A task that fails with each of ``failures`` in turn, then runs until cancelled."""

    def __init__(self, *failures: Exception, metrics: Metrics | None = None) -> None:
        self.failures = list(failures)
        self.runs = 0
        self.forgotten = 0
        self.metrics = metrics

    async def run(self) -> None:
        self.runs += 1
        if self.failures:
            raise self.failures.pop(0)
        if self.metrics is not None:
            self.metrics.queue_consumers.labels("q").set(1)
        await asyncio.Event().wait()

    def forget(self) -> None:
        self.forgotten += 1
        if self.metrics is not None:
            self.metrics.forget_queues()


async def test_a_task_that_raises_any_exception_is_counted_logged_forgotten_and_started_again() -> (
    None
):
    metrics = Metrics()
    script = Script(RuntimeError("<Connection> closed"), KeyError("not an I/O error"))

    with capture_logs() as logs:
        running = asyncio.create_task(
            supervise(BackgroundTask("queues", script.run, script.forget), metrics)
        )
        await until(lambda: script.runs == 3)
        await stopped(running)

    assert errors(metrics, "queues") == 2
    assert script.forgotten == 2
    failed = [line for line in logs if line["event"] == "monitor.failed"]
    assert [(line["check"], line["error"], line["log_level"]) for line in failed] == [
        ("queues", "RuntimeError: <Connection> closed", "warning"),
        ("queues", "KeyError: 'not an I/O error'", "warning"),
    ]


async def test_the_gauges_of_a_failed_task_are_absent_until_it_measures_again() -> None:
    metrics = Metrics()
    script = Script(metrics=metrics)
    consumers = ("fulfilment_queue_consumers", {"queue": "q"})
    running = asyncio.create_task(
        supervise(BackgroundTask("queues", script.run, script.forget), metrics)
    )
    await until(lambda: metrics.registry.get_sample_value(*consumers) == 1)
    await stopped(running)
    script.failures.append(ConnectionResetError())

    running = asyncio.create_task(
        supervise(BackgroundTask("queues", script.run, script.forget), metrics)
    )
    await until(lambda: errors(metrics, "queues") == 1)
    assert metrics.registry.get_sample_value(*consumers) is None
    await until(lambda: metrics.registry.get_sample_value(*consumers) == 1)
    await stopped(running)


async def test_restarts_wait_twice_as_long_after_each_failure_in_a_row_up_to_a_limit() -> None:
    metrics = Metrics()
    script = Script(*(OSError("refused") for _ in range(5)))

    with capture_logs() as logs:
        running = asyncio.create_task(supervise(BackgroundTask("queues", script.run), metrics))
        await until(lambda: script.runs == 6)
        await stopped(running)

    waits = [line["restart_in_seconds"] for line in logs if line["event"] == "monitor.failed"]
    assert waits == [0.01, 0.02, 0.04, 0.04, 0.04]


async def test_a_task_that_ran_well_for_a_while_restarts_after_the_first_wait_again() -> None:
    metrics = Metrics()
    runs = 0

    async def run() -> None:
        nonlocal runs
        runs += 1
        if runs == 3:
            await asyncio.sleep(0.05)  # longer than the longest wait: it had recovered
        raise OSError

    with capture_logs() as logs:
        running = asyncio.create_task(supervise(BackgroundTask("queues", run), metrics))
        await until(lambda: runs == 4)
        await stopped(running)

    waits = [line["restart_in_seconds"] for line in logs if line["event"] == "monitor.failed"]
    assert waits[:3] == [0.01, 0.02, 0.01]


async def test_a_task_that_returns_has_finished_and_is_not_started_again() -> None:
    metrics = Metrics()
    runs = 0

    async def gives_up() -> None:  # the consumer watchdog, once it stopped the worker
        nonlocal runs
        runs += 1

    await asyncio.wait_for(supervise(BackgroundTask("consumer", gives_up), metrics), 5)

    assert runs == 1
    assert errors(metrics, "consumer") == 0


async def test_stop_cancels_every_task_and_never_raises_even_when_a_clean_up_fails() -> None:
    metrics = Metrics()
    runs = 0

    async def fails_to_close() -> None:
        nonlocal runs
        runs += 1
        try:
            await asyncio.Event().wait()
        finally:
            message = "close failed"
            raise RuntimeError(message)

    healthy = Script()
    start, stop = background(
        [BackgroundTask("queues", fails_to_close), BackgroundTask("invariants", healthy.run)],
        metrics,
    )
    with capture_logs() as logs:
        await start()
        await until(lambda: runs == 1 and healthy.runs == 1)
        await asyncio.wait_for(stop(), 5)

    assert runs == 1  # not started again once shutdown began
    assert [(line["event"], line["check"], line["error"]) for line in logs] == [
        ("monitor.stop_failed", "queues", "RuntimeError: close failed")
    ]


async def test_stop_cancels_again_a_task_that_swallowed_the_first_cancellation() -> None:
    runs = 0

    async def swallows_once() -> None:  # as aiormq 7.2 may, in the middle of an RPC
        nonlocal runs
        runs += 1
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()
        await asyncio.Event().wait()

    start, stop = background([BackgroundTask("queues", swallows_once)], Metrics())
    with capture_logs() as logs:
        await start()
        await until(lambda: runs == 1)
        await asyncio.wait_for(stop(), 1)

    assert logs == []
    assert runs == 1


async def test_stop_gives_up_on_a_task_that_will_not_end_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(monitors, "STOP_SECONDS", 0.2)
    released = asyncio.Event()
    runs = 0

    async def never_ends() -> None:
        nonlocal runs
        runs += 1
        while not released.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await released.wait()

    start, stop = background([BackgroundTask("invariants", never_ends)], Metrics())
    await start()
    await until(lambda: runs == 1)
    with capture_logs() as logs:
        await asyncio.wait_for(stop(), 2)
    released.set()  # let it end, so the test leaves no task behind
    await asyncio.sleep(0.01)

    assert [(line["event"], line["check"]) for line in logs] == [
        ("monitor.stop_timed_out", "invariants")
    ]


async def test_stop_before_start_does_nothing() -> None:
    script = Script(RuntimeError("would be counted if it ran"))
    metrics = Metrics()
    start, stop = background([BackgroundTask("queues", script.run, script.forget)], metrics)

    with capture_logs() as logs:
        await asyncio.wait_for(stop(), 5)

    assert (script.runs, script.forgotten, logs, errors(metrics, "queues")) == (0, 0, [], 0)
    # Nothing is left behind that a later start would have to clean up: it starts as usual.
    await start()
    await until(lambda: script.runs == 2)
    await asyncio.wait_for(stop(), 5)
    assert errors(metrics, "queues") == 1


async def test_a_poll_that_hangs_fails_after_its_time_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Connection:
        is_closed = False

        async def close(self) -> None:
            self.is_closed = True

    connection = Connection()

    async def connect(*_: object, **__: object) -> Connection:
        return connection

    async def hangs(*_: object) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(monitors.aio_pika, "connect", connect)
    monkeypatch.setattr(monitors, "poll_once", hangs)
    monkeypatch.setattr(monitors, "QUEUE_POLL_TIME_LIMIT_SECONDS", 0.05)

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(monitors.poll_queues("amqp://", Metrics(), interval_seconds=1), 5)
    assert connection.is_closed


def test_every_background_task_of_the_worker_has_its_error_series_at_zero() -> None:
    metrics = Metrics()

    assert {check: errors(metrics, check) for check in MONITOR_CHECKS} == {
        "queues": 0,
        "invariants": 0,
        "consumer": 0,
    }
