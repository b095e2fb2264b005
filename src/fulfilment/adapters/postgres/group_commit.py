"""Group commit: the reservations waiting at the same moment share one transaction.

One transaction per order costs PostgreSQL a commit, a snapshot and the function's statements
for every order, and costs the worker a round trip. :class:`GroupCommit` lets at most
``pool_size`` transactions run at once; calls arriving while they run wait, and the next
free slot takes every waiting call, up to ``batch_max``, into one ``reserve_orders()``
transaction. Under light load a call finds a free slot and runs alone, so nothing waits for a
batch to fill; under load the batches grow by themselves (README, "Performance").
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from fulfilment.application.ports import TransientError
from fulfilment.domain.model import ReservationOutcome, ReserveStock

__all__ = ["CommitBatch", "GroupCommit", "UnreadableOutcomesError"]

CommitBatch = Callable[[Sequence[ReserveStock]], Awaitable[Sequence[ReservationOutcome]]]
"""Reserves the given orders in one transaction; one outcome per order, in their order."""


class UnreadableOutcomesError(RuntimeError):
    """A batch committed, but its outcomes could not be read (a bug, not a database failure).

    Every order of the batch gets this error. It is not retried order by order: the orders
    are already committed, and committing them again would only answer ``duplicate``.
    """


@dataclass(slots=True)
class _Waiting:
    command: ReserveStock
    answer: asyncio.Future[ReservationOutcome]


class GroupCommit:
    """Runs concurrent :meth:`reserve` calls as few transactions of ``commit_batch``.

    Args:
        commit_batch: commits a batch and returns its outcomes (see :data:`CommitBatch`); it
            retries transient errors itself and then raises ``TransientError``.
        pool_size: most batches committing at once (>= 1); each holds one connection of the
            reservations' pool (``FULFILMENT_DATABASE_POOL_SIZE``).
        batch_max: most orders in one batch (>= 1); 1 turns batching off
            (``FULFILMENT_RESERVATION_BATCH_MAX``).

    Raises:
        ValueError: ``pool_size`` or ``batch_max`` is below 1.

    Each caller gets the outcome of its own order, or the error of its own order:

    * ``TransientError``, :class:`UnreadableOutcomesError`, and any error of a batch of one
      go to every order of the batch;
    * any other error of a larger batch may come from one order's data, so its orders are
      committed again one by one and each gets its own outcome or error.

    A caller cancelled while waiting is dropped from the batch; one cancelled while its batch
    commits may still have its order reserved, which the inbox turns into a ``duplicate`` on
    redelivery.
    """

    def __init__(self, commit_batch: CommitBatch, *, pool_size: int, batch_max: int) -> None:
        if pool_size < 1 or batch_max < 1:
            msg = f"pool_size and batch_max must be >= 1, not {pool_size}, {batch_max}"
            raise ValueError(msg)
        self._commit_batch = commit_batch
        self._pool_size = pool_size
        self._batch_max = batch_max
        self._waiting: deque[_Waiting] = deque()
        self._running: set[asyncio.Task[None]] = set()
        self._start_scheduled = False

    async def reserve(self, command: ReserveStock) -> ReservationOutcome:
        """Reserve ``command`` in the next batch; raises what its batch (or it alone) raised."""
        loop = asyncio.get_running_loop()
        waiting = _Waiting(command, loop.create_future())
        self._waiting.append(waiting)
        if not self._start_scheduled and len(self._running) < self._pool_size:
            # Deliveries read from one socket read run in this same loop iteration; starting
            # on the next one lets them share the transaction instead of the first going alone.
            self._start_scheduled = True
            loop.call_soon(self._start)
        return await waiting.answer

    def _start(self) -> None:
        self._start_scheduled = False
        while self._waiting and len(self._running) < self._pool_size:
            batch: list[_Waiting] = []
            while self._waiting and len(batch) < self._batch_max:
                waiting = self._waiting.popleft()
                if not waiting.answer.done():
                    batch.append(waiting)
            if not batch:
                return
            task = asyncio.create_task(self._commit(batch))
            self._running.add(task)
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._start()

    async def _commit(self, batch: list[_Waiting]) -> None:
        try:
            await self._answer(batch)
        except asyncio.CancelledError:
            # The loop is shutting down: whoever still waits must not wait forever.
            for waiting in batch:
                waiting.answer.cancel()
            raise

    async def _answer(self, batch: list[_Waiting]) -> None:
        try:
            outcomes = await self._commit_batch([waiting.command for waiting in batch])
        except (TransientError, UnreadableOutcomesError) as error:
            _fail(batch, error)
            return
        except Exception as error:  # noqa: BLE001 - handed to the callers, who classify it
            if len(batch) == 1:
                _fail(batch, error)
                return
            # One order's data (a constraint it breaks) fails the whole transaction; alone,
            # each order gets its own outcome or error. This runs in the batch's slot, so it
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


def _fail(batch: Sequence[_Waiting], error: BaseException) -> None:
    for waiting in batch:
        if not waiting.answer.done():
            waiting.answer.set_exception(error)
