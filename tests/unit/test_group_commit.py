"""GroupCommit: concurrent calls of one kind share transactions, and each caller gets its own
answer."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.trace import SpanContext

from fulfilment.adapters.postgres.group_commit import GroupCommit, UnreadableOutcomesError
from fulfilment.application.ports import TransientError
from fulfilment.domain.model import (
    OutcomeKind,
    PlaceOrder,
    ReservationOutcome,
)
from fulfilment.observability.tracing import traceparent_of
from tests.support import builders


def order(sku: str = "A") -> PlaceOrder:
    return builders.order((sku, 1))


def reserved(command: PlaceOrder) -> ReservationOutcome:
    return ReservationOutcome(
        kind=OutcomeKind.RESERVED, order_id=command.order_id, event_id=command.event_id
    )


class Database:
    """A ``commit_batch`` that records its batches and how many ran at once."""

    def __init__(self, *, seconds: float = 0.01, failing_sku: str | None = None) -> None:
        self.batches: list[list[PlaceOrder]] = []
        self.spans: list[list[SpanContext]] = []
        self.running = 0
        self.most_running = 0
        self._seconds = seconds
        self._failing_sku = failing_sku
        self.error: Exception = ValueError("violates a check constraint")
        self.batch_started = asyncio.Event()

    async def commit_batch(self, commands, spans=()):
        self.batches.append(list(commands))
        self.spans.append(list(spans))
        self.batch_started.set()
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await asyncio.sleep(self._seconds)
            if any(line.sku == self._failing_sku for c in commands for line in c.lines):
                raise self.error
            return [reserved(command) for command in commands]
        finally:
            self.running -= 1


async def test_a_call_alone_commits_alone_without_waiting_for_company():
    database = Database()
    group = GroupCommit(pool_size=4, batch_max=32)
    command = order()

    outcome = await asyncio.wait_for(group.run(database.commit_batch, command), timeout=1)

    assert outcome == reserved(command)
    assert database.batches == [[command]]


async def test_calls_made_together_share_one_transaction_in_the_order_they_came():
    database = Database()
    group = GroupCommit(pool_size=4, batch_max=32)
    commands = [order() for _ in range(10)]

    outcomes = await asyncio.gather(
        *(group.run(database.commit_batch, command) for command in commands)
    )

    assert outcomes == [reserved(command) for command in commands]
    assert database.batches == [commands]


async def test_batches_hold_at_most_batch_max_orders_and_at_most_pool_size_run_at_once():
    database = Database()
    group = GroupCommit(pool_size=2, batch_max=4)
    commands = [order() for _ in range(20)]

    outcomes = await asyncio.gather(
        *(group.run(database.commit_batch, command) for command in commands)
    )

    assert outcomes == [reserved(command) for command in commands]
    assert [len(batch) for batch in database.batches] == [4, 4, 4, 4, 4]
    assert [c for batch in database.batches for c in batch] == commands
    assert database.most_running == 2


async def test_calls_arriving_while_all_transactions_run_wait_and_go_together():
    database = Database(seconds=0.05)
    group = GroupCommit(pool_size=1, batch_max=32)
    first = asyncio.create_task(group.run(database.commit_batch, order()))
    await asyncio.sleep(0.01)  # the first transaction is running
    later = [order() for _ in range(5)]
    tasks = [asyncio.create_task(group.run(database.commit_batch, command)) for command in later]
    for _ in range(3):
        await asyncio.sleep(0.005)
        tasks.append(asyncio.create_task(group.run(database.commit_batch, command := order())))
        later.append(command)

    await asyncio.gather(first, *tasks)

    assert [len(batch) for batch in database.batches] == [1, 8]
    assert database.batches[1] == later


async def test_a_transient_error_goes_to_every_order_of_the_batch():
    database = Database(failing_sku="X")
    database.error = TransientError("database unavailable for 5 s")
    group = GroupCommit(pool_size=1, batch_max=32)

    results = await asyncio.gather(
        group.run(database.commit_batch, order("A")),
        group.run(database.commit_batch, order("X")),
        return_exceptions=True,
    )

    assert results == [database.error, database.error]
    assert len(database.batches) == 1


async def test_another_error_is_narrowed_to_its_order_by_committing_the_batch_one_by_one():
    database = Database(failing_sku="X")
    group = GroupCommit(pool_size=1, batch_max=32)
    commands = [order("A"), order("X"), order("B")]

    results = await asyncio.gather(
        *(group.run(database.commit_batch, command) for command in commands), return_exceptions=True
    )

    assert results == [reserved(commands[0]), database.error, reserved(commands[2])]
    assert database.batches == [commands, [commands[0]], [commands[1]], [commands[2]]]


async def test_a_caller_cancelled_while_waiting_is_left_out_of_the_next_batch():
    database = Database(seconds=0.05)
    group = GroupCommit(pool_size=1, batch_max=32)
    first = asyncio.create_task(group.run(database.commit_batch, order()))
    await asyncio.sleep(0.01)
    gone, kept = order(), order()
    gone_task = asyncio.create_task(group.run(database.commit_batch, gone))
    kept_task = asyncio.create_task(group.run(database.commit_batch, kept))
    await asyncio.sleep(0)
    gone_task.cancel()

    await asyncio.gather(first, kept_task)

    assert gone_task.cancelled()
    assert database.batches[1] == [kept]


async def test_orders_a_batch_left_without_an_outcome_get_an_error_instead_of_waiting():
    batches = []

    async def answers_one(commands, _spans):
        batches.append(list(commands))
        return [reserved(commands[0])]

    group = GroupCommit(pool_size=1, batch_max=32)

    results = await asyncio.wait_for(
        asyncio.gather(
            group.run(answers_one, order()), group.run(answers_one, order()), return_exceptions=True
        ),
        timeout=1,
    )

    assert all(isinstance(result, UnreadableOutcomesError) for result in results), results
    assert "1 outcomes for 2" in str(results[0])
    assert len(batches) == 1, "a committed batch must not be committed again order by order"


async def test_callers_of_a_batch_cancelled_while_it_retries_one_by_one_are_cancelled_too():
    database = Database(seconds=0.05, failing_sku="X")
    group = GroupCommit(pool_size=1, batch_max=32)
    callers = [
        asyncio.create_task(group.run(database.commit_batch, order(sku))) for sku in ("X", "A", "B")
    ]
    while len(database.batches) < 3:  # the batch failed, X failed alone, A is committing
        await database.batch_started.wait()
        database.batch_started.clear()

    for task in list(group._running):  # the loop's shutdown, in miniature
        task.cancel()
    results = await asyncio.wait_for(asyncio.gather(*callers, return_exceptions=True), timeout=1)

    assert isinstance(results[0], ValueError)
    assert all(isinstance(result, asyncio.CancelledError) for result in results[1:]), results


@pytest.mark.parametrize(
    ("waiting", "most_running"),
    [
        (3, 1),  # fewer than a batch: they gather behind the running one, the free slot stays
        (4, 2),  # a whole batch: it takes the free slot beside the running one
    ],
)
async def test_while_a_batch_runs_a_second_starts_only_for_a_whole_batch(waiting, most_running):
    database = Database(seconds=0.05)
    group = GroupCommit(pool_size=2, batch_max=4)
    first = asyncio.create_task(group.run(database.commit_batch, order()))
    await database.batch_started.wait()
    later = [order() for _ in range(waiting)]
    tasks = [asyncio.create_task(group.run(database.commit_batch, command)) for command in later]

    await asyncio.gather(first, *tasks)

    assert database.batches == [database.batches[0], later]
    assert database.most_running == most_running


async def test_each_batch_holds_one_kind_in_the_order_it_came_and_the_kinds_share_the_slots():
    reservations, cancels = Database(seconds=0.02), Database(seconds=0.02)
    group = GroupCommit(pool_size=2, batch_max=3)
    calls = [
        (reservations if kind == "r" else cancels, order())
        for kind in ["r", "c", "r", "r", "c", "r", "c", "c", "r"]
    ]

    outcomes = await asyncio.gather(
        *(group.run(database.commit_batch, command) for database, command in calls)
    )

    assert outcomes == [reserved(command) for _, command in calls]
    reserved_calls = [command for database, command in calls if database is reservations]
    cancel_calls = [command for database, command in calls if database is cancels]
    assert reservations.batches == [reserved_calls[:3], reserved_calls[3:]]
    assert cancels.batches == [cancel_calls[:3], cancel_calls[3:]]


async def test_the_kinds_together_never_run_more_than_pool_size_batches():
    kinds = [Database(seconds=0.01) for _ in range(3)]
    running = most = 0
    group = GroupCommit(pool_size=2, batch_max=2)

    def counted(database):
        async def commit_batch(commands, spans):
            nonlocal running, most
            running += 1
            most = max(most, running)
            try:
                return await database.commit_batch(commands, spans)
            finally:
                running -= 1

        return commit_batch

    commits = [counted(database) for database in kinds]
    await asyncio.gather(*(group.run(commits[i % 3], order()) for i in range(30)))

    assert most == 2
    assert sum(len(database.batches) for database in kinds) == 15


@pytest.mark.parametrize(("pool_size", "batch_max"), [(0, 1), (1, 0)])
def test_a_pool_size_or_batch_max_below_one_is_refused(pool_size, batch_max):
    with pytest.raises(ValueError, match="must be >= 1"):
        GroupCommit(pool_size=pool_size, batch_max=batch_max)


async def test_each_command_goes_to_its_batch_with_the_span_context_current_at_its_call():
    database = Database()
    group = GroupCommit(pool_size=1, batch_max=32)
    traces = [f"00-{i:032x}-{i:016x}-01" for i in (1, 2, 3)]

    async def run(trace):
        with builders.in_trace(trace):
            return await group.run(database.commit_batch, order())

    await asyncio.wait_for(asyncio.gather(*map(run, [*traces, None])), timeout=1)

    assert [[traceparent_of(span) for span in batch] for batch in database.spans] == [
        [*traces, None]
    ]
