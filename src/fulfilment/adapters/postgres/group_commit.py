"""Group commit: the events of one kind waiting at the same moment share one transaction.

One transaction per event costs PostgreSQL a commit, a snapshot and the function's statements
for every event, and costs the worker a round trip. :class:`GroupCommit` lets at most
``pool_size`` transactions run at once; calls arriving while they run wait, and the next
free slot takes the oldest waiting call and every call of the same kind waiting behind it, up
to ``batch_max``, into one transaction of that kind (one call of the SQL function its route
names: ``place_orders()``, ``cancel_orders()``, ``ship_orders()``). Under light load a call
finds no transaction running and commits alone, so nothing waits for a batch to fill; under
load the batches grow by themselves (docs/performance.md).

While one transaction runs, another starts only once a whole batch (``batch_max`` calls)
waits: the calls behind a running transaction gather into the next one, as large as the
transaction took time. Two transactions at once whenever a slot was free made small batches
(4 to 5 orders each in the benchmark: the second slot took whatever had arrived since the
first started), each paying its own round trip, commit and function call; the later slots are
for a backlog that one transaction at a time cannot keep up with, or a transaction that waits
(on a lock another replica holds, on a slow disk). The kinds share the slots, so the
transactions running at once never outnumber the connections of the pool.

Each batch is a span of its own (``group commit``), linked to the span of every call it
carries (the deliveries' spans, current at :meth:`GroupCommit.run`) and child of the first
of them, with the batch size (none where the first is not sampled, as a parent-based sampler
would drop it: ``observability.tracing.current_span``); the span contexts go to
``commit_batch`` beside the commands, one per command, for the adapter to write into the
rows each command causes.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from opentelemetry import trace
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind

from fulfilment.application.ports import TransientError
from fulfilment.observability.tracing import current_span

__all__ = ["CommitBatch", "GroupCommit", "UnreadableOutcomesError"]

CommandT = TypeVar("CommandT")
OutcomeT = TypeVar("OutcomeT")

CommitBatch = Callable[[Sequence[CommandT], Sequence[SpanContext]], Awaitable[Sequence[OutcomeT]]]
"""Applies the given commands of one kind in one transaction; one outcome per command, in
their order (e.g. ``CommitBatch[ReserveStock, ReservationOutcome]``). The second argument is
the span context current at each command's :meth:`GroupCommit.run` (invalid without one)."""

tracer = trace.get_tracer("fulfilment.group_commit")


class UnreadableOutcomesError(RuntimeError):
    """A batch committed, but its outcomes could not be read (a bug, not a database failure).

    Every command of the batch gets this error. It is not retried command by command: the
    batch is already committed, and committing it again would only answer ``duplicate``.
    """


@dataclass(slots=True)
class _Waiting(Generic[CommandT, OutcomeT]):
    commit_batch: CommitBatch[CommandT, OutcomeT]
    command: CommandT
    answer: asyncio.Future[OutcomeT]
    span_context: SpanContext


class GroupCommit:
    """Runs concurrent :meth:`run` calls as few transactions, one kind of command in each.

    Args:
        pool_size: most batches committing at once (>= 1), of all kinds; each holds one
            connection of the reservations' pool (``FULFILMENT_DATABASE_POOL_SIZE``). A batch
            beside a running one starts only when ``batch_max`` calls wait (module text).
        batch_max: most commands in one batch (>= 1); 1 turns batching off
            (``FULFILMENT_RESERVATION_BATCH_MAX``).

    Raises:
        ValueError: ``pool_size`` or ``batch_max`` is below 1.

    A kind is a ``commit_batch`` function: the calls passing the same one (``==``) may share
    a batch, in the order they came. Each caller gets the outcome of its own command, or the
    error of its own command:

    * ``TransientError``, :class:`UnreadableOutcomesError`, and any error of a batch of one
      go to every command of the batch;
    * any other error of a larger batch may come from one command's data, so its commands are
      committed again one by one and each gets its own outcome or error.

    A caller cancelled while waiting is dropped from the batch; one cancelled while its batch
    commits may still have its command applied, which the inbox turns into a ``duplicate`` on
    redelivery.
    """

    def __init__(self, *, pool_size: int, batch_max: int) -> None:
        if pool_size < 1 or batch_max < 1:
            msg = f"pool_size and batch_max must be >= 1, not {pool_size}, {batch_max}"
            raise ValueError(msg)
        self._pool_size = pool_size
        self._batch_max = batch_max
        self._waiting: deque[_Waiting[Any, Any]] = deque()
        self._running: set[asyncio.Task[None]] = set()
        self._start_scheduled = False

    async def run(
        self, commit_batch: CommitBatch[CommandT, OutcomeT], command: CommandT
    ) -> OutcomeT:
        """Apply ``command`` in the next batch of ``commit_batch``.

        Returns its outcome; raises what its batch (or it alone) raised, see the class.
        """
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[OutcomeT] = loop.create_future()
        span_context = trace.get_current_span().get_span_context()
        self._waiting.append(_Waiting(commit_batch, command, answer, span_context))
        if not self._start_scheduled and len(self._running) < self._pool_size:
            # Deliveries read from one socket read run in this same loop iteration; starting
            # on the next one lets them share the transaction instead of the first going alone.
            self._start_scheduled = True
            loop.call_soon(self._start)
        return await answer

    def _start(self) -> None:
        self._start_scheduled = False
        while self._waiting and len(self._running) < self._pool_size:
            if self._running and len(self._waiting) < self._batch_max:
                return  # they gather behind the running batch (module text)
            batch = self._next_batch()
            if not batch:
                return
            task = asyncio.create_task(self._commit(batch))
            self._running.add(task)
            task.add_done_callback(self._finished)

    def _next_batch(self) -> list[_Waiting[Any, Any]]:
        """The oldest waiting call and those of its kind behind it, up to ``batch_max``.

        Calls of other kinds keep their places in the queue.
        """
        batch: list[_Waiting[Any, Any]] = []
        others: list[_Waiting[Any, Any]] = []
        while self._waiting and len(batch) < self._batch_max:
            waiting = self._waiting.popleft()
            if waiting.answer.done():
                continue
            if not batch or waiting.commit_batch == batch[0].commit_batch:
                batch.append(waiting)
            else:
                others.append(waiting)
        self._waiting.extendleft(reversed(others))
        return batch

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._start()

    async def _commit(self, batch: list[_Waiting[Any, Any]]) -> None:
        try:
            await self._answer(batch)
        except asyncio.CancelledError:
            # The loop is shutting down: whoever still waits must not wait forever.
            for waiting in batch:
                waiting.answer.cancel()
            raise

    async def _answer(self, batch: list[_Waiting[Any, Any]]) -> None:
        contexts = [waiting.span_context for waiting in batch]
        with current_span(
            tracer,
            "group commit",
            kind=SpanKind.INTERNAL,
            parent=trace.set_span_in_context(NonRecordingSpan(contexts[0])),
            links=lambda: [Link(context) for context in contexts if context.is_valid],
            attributes=lambda: {"fulfilment.group_commit.size": len(batch)},
        ):
            await self._commit_batch(batch, contexts)

    async def _commit_batch(
        self, batch: list[_Waiting[Any, Any]], contexts: list[SpanContext]
    ) -> None:
        try:
            outcomes = await batch[0].commit_batch([waiting.command for waiting in batch], contexts)
        except (TransientError, UnreadableOutcomesError) as error:
            _fail(batch, error)
            return
        except Exception as error:  # noqa: BLE001 - handed to the callers, who classify it
            if len(batch) == 1:
                _fail(batch, error)
                return
            # One command's data (a constraint it breaks) fails the whole transaction; alone,
            # each command gets its own outcome or error. This runs in the batch's slot, so it
            # takes no more connections than the batch did.
            for waiting in batch:
                if not waiting.answer.done():
                    await self._answer([waiting])
            return
        if len(outcomes) != len(batch):
            _fail(batch, UnreadableOutcomesError(f"{len(outcomes)} outcomes for {len(batch)}"))
            return
        for waiting, outcome in zip(batch, outcomes, strict=True):
            if not waiting.answer.done():
                waiting.answer.set_result(outcome)


def _fail(batch: Sequence[_Waiting[Any, Any]], error: BaseException) -> None:
    for waiting in batch:
        if not waiting.answer.done():
            waiting.answer.set_exception(error)
