"""The dispatcher's loop: claim due warehouse requests, send them within the caps, record answers.

Every request goes through three gates before it is sent, in this order: a slot of the
concurrency cap (a semaphore of ``concurrency``), the global ``Retry-After`` gate (no request
before the warehouse's last 429 asked, for any request), and the rate cap (``aiolimiter``'s
leaky bucket, shaped by :func:`rate_limiter` so that no second holds more than the cap).

Retries are not made here but recorded: the answer goes to the store with the seconds until
the next attempt (``WarehouseRequests.record``), a doubling wait with jitter for
the request's ``attempts``, or the warehouse's ``Retry-After``. So a failing request waits in
the table, not in this process, and never holds up the others.

The circuit: after :data:`CIRCUIT_THRESHOLD` consecutive transport failures or 5xx answers
the warehouse is taken for down, and only one request at a time is sent (a probe), at an
interval that doubles from :data:`PROBE_INITIAL_SECONDS` to :data:`PROBE_MAX_SECONDS` (an hour
down costs about three requests a minute). The first answer that is not a 5xx closes it, and
the backlog drains at the caps. A 401 or 403 stops sending the same way (probes at the same
intervals, the state on ``/health/ready`` and in a metric) until a probe is answered otherwise;
its request is not failed. A request claimed while a gate closed behind it is handed back
unsent (a ``Retry`` recorded for when the gate opens), so its lease never runs out in memory.

The polls (``dispatcher.poll``): with a :class:`~fulfilment.dispatcher.poll.Poller`, the slots
that no due request takes ask the warehouse about fulfilment orders with no news
(``GET /fulfilment-orders/{id}``), a few at a time (:attr:`PollOptions.in_flight_max`), so the
sends come first and the polls get the budget they leave. A poll goes through the same gates
(a token of the rate cap, the ``Retry-After`` gate, the circuit, the credentials) and its
answer moves them as a request's does (a 5xx counts towards the circuit, a 429 closes the
gate, a 401 halts); while halted, a poll is the probe when no request is due.

The drift check (``dispatcher.drift``), given a :class:`~fulfilment.dispatcher.drift.DriftCheck`,
runs beside the loop while it runs and reads the warehouse's inventory through
:meth:`Dispatcher.inventory_gate`: a page is asked for only when the last turn left a slot
that no request and no poll took, it holds that slot, passes the ``Retry-After`` gate and
takes a token of the rate cap; while halted, the check fails at once and waits for its next
interval.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import math
import time
from collections.abc import Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import structlog
from aiolimiter import AsyncLimiter

from fulfilment.adapters.warehouse.client import WarehouseClient
from fulfilment.application.ports import TransientError, WarehouseRequests
from fulfilment.backoff import doubling_wait
from fulfilment.dispatcher.drift import DriftCheck, WarehouseHaltedError
from fulfilment.dispatcher.poll import Poller
from fulfilment.domain.handoff import (
    Accepted,
    Answer,
    Answered,
    CredentialsRefused,
    Failed,
    RateLimited,
    Refused,
    Retry,
    WarehouseRequest,
)
from fulfilment.domain.polls import FulfilmentOrderToPoll, NotFound, PollAnswer, Polled
from fulfilment.observability.dispatcher_metrics import DispatcherMetrics
from fulfilment.pump.leader import sleep_unless

logger = structlog.get_logger("fulfilment.dispatcher")

BACKOFF_INITIAL_SECONDS = 1.0
"""First wait before a request answered ``Retry`` is sent again (plus up to 1 s of jitter)."""

BACKOFF_MAX_SECONDS = 300.0
"""Longest wait between two attempts of one request."""

BACKOFF_JITTER_SECONDS = 1.0
"""Most seconds drawn at random and added to a request's wait, so that requests that failed
together are not all due again together."""

CIRCUIT_THRESHOLD = 5
"""Consecutive transport failures or 5xx answers after which only probes are sent."""

PROBE_INITIAL_SECONDS = 1.0
"""First wait before a probe once the circuit opened or the credentials were refused."""

PROBE_MAX_SECONDS = 20.0
"""Longest wait between two probes: an hour of downtime costs about 180 requests."""

LEASE_MARGIN_SECONDS = 10.0
"""Added to the longest time a claimed request may wait and be sent, for its lease."""


class Halt(enum.StrEnum):
    """Why the dispatcher only probes: it does not (``none``), a down warehouse, or the token."""

    NONE = "none"
    CIRCUIT_OPEN = "circuit_open"
    CREDENTIALS_REFUSED = "credentials_refused"


@dataclass(frozen=True, slots=True)
class DispatcherOptions:
    """What the loop needs, built by its root from the settings.

    Attributes:
        rate_per_second: most requests sent per second.
        concurrency: most requests in flight: claimed, and not yet answered by the warehouse
            (or held back at a gate).
        timeout_seconds: one request's timeout (the client's).
        poll_seconds: how long the loop waits when nothing is due before it looks again.
        key_retention_seconds: how long the warehouse keeps a key; older unanswered requests
            are expired every ``expire_interval_seconds``.
        expire_interval_seconds: how often the loop expires requests.
    """

    rate_per_second: float
    concurrency: int
    timeout_seconds: float
    poll_seconds: float = 1.0
    key_retention_seconds: float = 24 * 3600.0
    expire_interval_seconds: float = 60.0

    @property
    def hold_seconds(self) -> float:
        """Longest a claimed request waits in the dispatcher for a slot; then it is handed back.

        A claim takes up to ``concurrency`` requests more than there are free slots, so that
        the next slots to free find a request at hand instead of a round trip to the
        database. Those wait behind at most ``concurrency`` others at the rate cap
        (``concurrency / rate_per_second``) and for slots held at most ``timeout_seconds``
        by a send.
        """
        return self.concurrency / self.rate_per_second + self.timeout_seconds

    @property
    def lease_seconds(self) -> float:
        """Seconds a claimed request is kept from other claims: its waits, then its send.

        A claimed request may wait up to :attr:`hold_seconds` for a slot (a longer wait hands
        it back unsent), then up to ``timeout_seconds`` for a ``Retry-After`` gate (a longer
        one hands it back), then up to ``concurrency / rate_per_second`` for the rate cap,
        then ``timeout_seconds`` for its answer; :data:`LEASE_MARGIN_SECONDS` covers the
        record.
        """
        return (
            self.hold_seconds
            + self.concurrency / self.rate_per_second
            + 2 * self.timeout_seconds
            + LEASE_MARGIN_SECONDS
        )


CATCH_UP_RATE_PER_SECOND = 50.0
"""Rate caps above this many requests per second get a bucket deeper than one request."""


def rate_limiter(rate_per_second: float) -> AsyncLimiter:
    """The rate cap's limiter: at most ``rate_per_second`` (rounded up) requests in any second.

    A leaky bucket of depth ``k`` that leaks ``rho`` per second admits fewer than ``k + rho``
    requests in any second (right after the last request of the second the level is at most
    ``k``, and at least ``n - rho`` for its ``n`` requests: one for the first, one more for
    each after it, less under ``rho`` leaked between them); so ``rho = rate - k + 1`` admits
    fewer than ``rate + 1``.

    With a bucket of one, requests go at least ``1 / rate`` seconds apart, and a wake-up that
    comes late on a busy event loop is time lost for good: at 100 requests a second, 3 ms late
    per wake-up is a quarter of the cap. A deeper bucket lets the next requests catch that up
    (up to ``(k - 1) / rho`` seconds late), at the price of ``k - 1`` requests a second. So:
    ``k = ceil(rate / 50)`` (:data:`CATCH_UP_RATE_PER_SECOND`), one up to 50 requests a second
    (the product's caps, 2.5 a second, lose well under 1 % to late wake-ups), and the cost at
    most 2 % of the cap above it (100 a second: ``k = 2``, 99 leaked a second, 10 ms of
    lateness caught up).
    """
    depth = max(1, math.ceil(rate_per_second / CATCH_UP_RATE_PER_SECOND))
    leak_per_second = rate_per_second - depth + 1
    return AsyncLimiter(depth, depth / leak_per_second)


BACKLOG_INTERVAL_SECONDS = 15.0
"""How often the active dispatcher counts the open requests for its gauges (the scrape
interval): the count reads the table, so not at every claim."""


async def read_backlog(
    requests: WarehouseRequests, metrics: DispatcherMetrics, poller: Poller | None = None
) -> None:
    """Set the backlog gauges from the store, and the orders without news with a ``poller``.

    A standby does it too, so that the alerts on them hold when no dispatcher sends.

    Raises:
        TransientError: the store failed.
    """
    backlog = await requests.backlog()
    metrics.set_backlog(backlog.open_count, backlog.oldest_open_age_seconds or 0.0)
    if poller is not None:
        await poller.read_without_news()


def backoff_seconds(attempts: int) -> float:
    """Seconds before the next attempt of a request attempted ``attempts`` times.

    1 s, 2 s, 4 s ... up to 300 s, plus up to 1 s of jitter (``backoff.doubling_wait``): the
    wait a retry loop would sleep, recorded in the store instead.
    """
    return doubling_wait(
        max(0, attempts - 1),
        first=BACKOFF_INITIAL_SECONDS,
        cap=BACKOFF_MAX_SECONDS,
        jitter=BACKOFF_JITTER_SECONDS,
    )


def probe_interval_seconds(failed_probes: int) -> float:
    """Seconds before the next probe after ``failed_probes`` failed ones.

    1 s doubled per failed probe up to 20 s, plus up to 1 s of jitter
    (``backoff.doubling_wait``).
    """
    return doubling_wait(
        failed_probes,
        first=PROBE_INITIAL_SECONDS,
        cap=PROBE_MAX_SECONDS,
        jitter=PROBE_INITIAL_SECONDS,
    )


class Dispatcher:
    """One dispatcher's loop over the store's requests; :meth:`run` until :meth:`stop`.

    Args:
        requests: the store (``WarehouseRequests``).
        client: the warehouse system's client.
        options: the caps and intervals.
        metrics: the process's collectors.
        poller: the polls of fulfilment orders with no news; None: no polls.
        drift: the scheduled drift check; None: no check.
        clock: monotonic seconds (``time.monotonic``).
    """

    def __init__(  # noqa: PLR0913 - the root passes each collaborator by name
        self,
        requests: WarehouseRequests,
        client: WarehouseClient,
        options: DispatcherOptions,
        metrics: DispatcherMetrics,
        *,
        poller: Poller | None = None,
        drift: DriftCheck | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._requests = requests
        self._client = client
        self._options = options
        self._metrics = metrics
        self._clock = clock
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(options.concurrency)
        self._limiter = rate_limiter(options.rate_per_second)
        self._in_flight: set[asyncio.Task[None]] = set()
        # Claimed, not yet given a slot: (request, when it was claimed).
        self._ready: collections.deque[tuple[WarehouseRequest, float]] = collections.deque()
        self._gate_until = 0.0
        self._failures = 0
        self._failed_probes = 0
        self._probe_at = 0.0
        self._expired_at = float("-inf")
        self._backlog_read_at = float("-inf")
        self._answers: list[tuple[Answered, asyncio.Future[None]]] = []
        self._recording = False
        self._poller = poller
        # The fulfilment orders (request ids) being asked about, left out of the next looks.
        self._polling: set[int] = set()
        self._polls_look_at = float("-inf")
        self._drift = drift
        # Set while the last turn left slots unused (nothing due), or while halted: when a
        # drift check's request may go.
        self._spare = asyncio.Event()
        self.halt = Halt.NONE

    def stop(self) -> None:
        """Ask :meth:`run` to return once the requests in flight are recorded."""
        self._stopping.set()
        self._wake.set()

    def readiness(self) -> dict[str, bool | str]:
        """``{"sending": bool, "halt": "none"|"circuit_open"|"credentials_refused"}``."""
        return {"sending": self.halt is Halt.NONE, "halt": str(self.halt)}

    async def run(self) -> None:
        """Claim, send and record until stopped; then hand back, wait for those in flight.

        Stopped, the requests claimed and not yet sent are handed back unsent and due now.

        A store that fails (``TransientError``) is logged and tried again after
        ``poll_seconds``; the claimed rows' leases bring them back. The drift check, if any,
        runs beside it and is cancelled first when it stops.
        """
        drift = (
            asyncio.create_task(self._drift.run(self.inventory_gate()))
            if self._drift is not None
            else None
        )
        try:
            while not self._stopping.is_set():
                try:
                    await self._housekeeping()
                    await self._turn()
                except TransientError as error:
                    logger.warning("dispatcher.store_failed", error=str(error))
                    await self._pause(self._options.poll_seconds)
            try:
                await self._hand_back_ready("not sent: stopping", 0.0)
            except TransientError as error:
                # Their leases bring them back, later.
                logger.warning("dispatcher.store_failed", error=str(error))
        finally:
            if drift is not None:
                drift.cancel()
                await asyncio.gather(drift, return_exceptions=True)
            if self._in_flight:
                await asyncio.gather(*self._in_flight, return_exceptions=True)

    def inventory_gate(self) -> AbstractAsyncContextManager[object]:
        """The gate of the drift check's requests (:class:`_InventoryGate`), entered per request."""
        return _InventoryGate(self)

    async def _turn(self) -> None:
        """A probe while halted; else a request for each free slot, claimed when none is at hand.

        A claim takes the free slots' requests and up to ``concurrency`` more, held for the
        next slots to free (:attr:`DispatcherOptions.hold_seconds`): a claim per
        ``concurrency`` requests or so instead of one per freed slot, and a freed slot sends
        without waiting for the database. The slots no due request takes go to polls.
        """
        if self.halt is not Halt.NONE:
            await self._probe()
            return
        await self._pause(self._gate_until - self._clock())
        # Wait for a free slot, take every free one, and a request for each.
        await self._slots.acquire()
        free = 1
        while free < self._options.concurrency and not self._slots.locked():
            await self._slots.acquire()
            free += 1
        if self._stopping.is_set():
            # Stopped while waiting for the slots: nothing more is sent.
            for _ in range(free):
                self._slots.release()
            return
        used = 0
        try:
            if len(self._ready) < free:
                claimed_at = self._clock()
                batch = await self._requests.claim(
                    free - len(self._ready) + self._options.concurrency,
                    lease_seconds=self._options.lease_seconds,
                )
                self._ready.extend((request, claimed_at) for request in batch)
            while used < free and self._ready:
                request, claimed_at = self._ready.popleft()
                self._start(self._send(request, probe=False, claimed_at=claimed_at))
                used += 1
            if used < free:
                # No request is due now: the slots left may ask about fulfilment orders.
                used += await self._start_polls(free - used)
        finally:
            # The slots nothing took, also when the store failed: a slot lost would be lost
            # for good.
            for _ in range(free - used):
                self._slots.release()
        if used < free:
            self._spare.set()
            await self._wait(self._options.poll_seconds)
        else:
            self._spare.clear()

    def _start(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` (a send or a poll, holding a slot) as a task the stop waits for."""
        task = asyncio.create_task(work)
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    async def _start_polls(self, slots: int) -> int:
        """Start polls of the fulfilment orders due, with up to ``slots`` slots; how many.

        At most :attr:`PollOptions.in_flight_max` polls in flight. The store is looked at
        again at once after a look that found as many as it asked for (more may be due),
        else after :attr:`PollOptions.check_seconds`.

        Raises:
            TransientError: the store failed.
        """
        if self._poller is None or self._clock() < self._polls_look_at:
            return 0
        limit = min(slots, self._poller.options.in_flight_max - len(self._polling))
        if limit < 1:
            return 0
        looked_at = self._clock()
        due = await self._poller.due(limit, excluding=self._polling)
        if len(due) < limit:
            self._polls_look_at = looked_at + self._poller.options.check_seconds
        for order in due:
            self._polling.add(order.request_id)
            self._start(self._poll(self._poller, order, probe=False))
        return len(due)

    async def _probe(self) -> None:
        """While halted: hand back the requests at hand, then send one when the probe is due."""
        await self._hand_back_ready(
            f"not sent: {self.halt}", max(0.0, self._probe_at - self._clock())
        )
        await self._pause(self._probe_at - self._clock())
        if self._stopping.is_set():
            return
        batch = await self._requests.claim(1, lease_seconds=self._options.lease_seconds)
        if batch:
            await self._slots.acquire()
            await self._send(batch[0], probe=True)
            return
        if self._poller is not None:
            # No request to probe with: a fulfilment order due to be asked about is the probe.
            due = await self._poller.due(1, excluding=self._polling)
            if due:
                self._polling.add(due[0].request_id)
                await self._slots.acquire()
                await self._poll(self._poller, due[0], probe=True)
                return
        await self._wait(self._options.poll_seconds)

    async def _hand_back_ready(self, reason: str, due_in_seconds: float) -> None:
        """Record the requests at hand unsent, due in ``due_in_seconds``: a halt or a stop.

        Raises:
            TransientError: the store failed (their leases bring them back).
        """
        if not self._ready:
            return
        ready, self._ready = self._ready, collections.deque()
        await self._requests.record_answers(
            [Answered(request, Retry(answer=reason), due_in_seconds) for request, _ in ready]
        )

    async def _send(
        self, request: WarehouseRequest, *, probe: bool, claimed_at: float | None = None
    ) -> None:
        """Send one claimed request through the gates and record its answer.

        A request that waited for its slot longer than
        :attr:`DispatcherOptions.hold_seconds` since ``claimed_at`` is handed back unsent,
        due now: what is left of its lease may not cover the gates and the send.

        Its slot is freed once the warehouse answered (or the request was held back), before
        the answer is recorded: the cap bounds the requests at the warehouse, and a slot held
        through the record would leave the warehouse's connections idle while the database
        commits.
        """
        slot = True

        def free_slot() -> None:
            nonlocal slot
            if slot:
                slot = False
                self._slots.release()
                self._wake.set()

        try:
            if not probe:
                held: tuple[Retry, float] | None
                if claimed_at is not None and (
                    self._clock() - claimed_at > self._options.hold_seconds
                ):
                    held = Retry(answer="not sent: held too long"), 0.0
                else:
                    held = await self._through_gates()
                if held is not None:
                    free_slot()
                    await self._record(Answered(request, held[0], held[1]))
                    return
            else:
                async with self._limiter:
                    pass
            answer, seconds = await self._client.send(request)
            free_slot()
            self._metrics.record_answer(request.kind, answer, seconds)
            retry_in = self._react(request, answer, probe=probe)
            await self._record(Answered(request, answer, retry_in))
            _log_answer(request, answer, retry_in)
        except TransientError as error:
            # The lease brings the request back; the answer, if any, is sent again.
            logger.warning(
                "dispatcher.record_failed", key=str(request.idempotency_key), error=str(error)
            )
        finally:
            free_slot()

    async def _poll(self, poller: Poller, order: FulfilmentOrderToPoll, *, probe: bool) -> None:
        """Ask about ``order`` through the gates, holding a slot; apply and record the answer.

        A poll the gates hold back (a halt, a long ``Retry-After``) is not sent and not
        recorded: the order stays due. Its slot is freed once the warehouse answered, before
        the answer is applied, as a send's.
        """
        slot = True

        def free_slot() -> None:
            nonlocal slot
            if slot:
                slot = False
                self._slots.release()
                self._wake.set()

        try:
            if probe:
                async with self._limiter:
                    pass
            elif await self._through_gates() is not None:
                return
            answer, _ = await self._client.fetch(order)
            free_slot()
            self._watch(answer, probe=probe)
            await poller.settle(order, answer)
        except TransientError as error:
            # Not recorded: the order is due again, and what was applied is a duplicate then.
            logger.warning(
                "dispatcher.poll_store_failed", order_id=str(order.order_id), error=str(error)
            )
        except Exception:
            # A poll that cannot be applied (a bug, a change the database refuses) must stop
            # neither the loop nor the other polls: logged whole, asked again an interval
            # later rather than at every turn.
            logger.exception("dispatcher.poll_failed", order_id=str(order.order_id))
            with contextlib.suppress(TransientError):
                await poller.postpone(order)
        finally:
            free_slot()
            self._polling.discard(order.request_id)

    async def _record(self, answered: Answered) -> None:
        """Record ``answered`` with the answers that came while the last batch was written.

        The first sender to find no batch being written writes the queue
        (``record_answers``), again while answers keep coming; the others wait for theirs.
        A send answered while a write is under way so costs no transaction of its own.

        Raises:
            TransientError: the store failed on the batch (part of it may be recorded; the
                leases bring back the rest).
        """
        recorded: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._answers.append((answered, recorded))
        if not self._recording:
            self._recording = True
            try:
                while self._answers:
                    batch, self._answers = self._answers, []
                    await self._write(batch)
            except BaseException:
                # Cancelled while writing: no one is left to write the answers queued since.
                for _, waiting in self._answers:
                    waiting.cancel()
                self._answers = []
                raise
            finally:
                self._recording = False
        await recorded

    async def _write(self, batch: list[tuple[Answered, asyncio.Future[None]]]) -> None:
        """One ``record_answers`` call for ``batch``; each waiter learns its outcome."""
        try:
            await self._requests.record_answers([answered for answered, _ in batch])
        except Exception as error:  # noqa: BLE001 - handed to every waiter, which raises it
            for _, recorded in batch:
                recorded.set_exception(error)
        except BaseException:
            for _, recorded in batch:
                recorded.cancel()
            raise
        else:
            for _, recorded in batch:
                recorded.set_result(None)

    async def _through_gates(self) -> tuple[Retry, float] | None:
        """Wait for the ``Retry-After`` gate and the rate cap; or the reason to hand back.

        Returns None when the request may be sent now, else a ``Retry`` to record unsent and
        the seconds until it is due again (a 429, the circuit or the credentials closed the
        way while it waited). The gates' waits together stay within ``timeout_seconds``, so
        that the request's lease (:attr:`DispatcherOptions.lease_seconds`) outlasts them.
        """
        gates_end = self._clock() + self._options.timeout_seconds
        while True:
            if self.halt is not Halt.NONE:
                return Retry(answer=f"not sent: {self.halt}"), max(
                    0.0, self._probe_at - self._clock()
                )
            gate = self._gate_until - self._clock()
            if gate > 0 and self._gate_until > gates_end:
                return Retry(answer="not sent: Retry-After"), gate
            if gate > 0:
                await asyncio.sleep(gate)
                continue
            await self._limiter.acquire()
            if self._gate_until <= self._clock() and self.halt is Halt.NONE:
                return None

    def _react(self, request: WarehouseRequest, answer: Answer, *, probe: bool) -> float | None:
        """Update the gates for ``answer``; the seconds until ``request`` is due (None: final)."""
        now = self._clock()
        down = self._watch(answer, probe=probe)
        match answer:
            case RateLimited(after_seconds=after):
                return after
            case CredentialsRefused():
                return max(0.0, self._probe_at - now)
            case Retry(after_seconds=after) if down:
                return max(after or 0.0, self._probe_at - now, backoff_seconds(request.attempts))
            case Retry(after_seconds=after):
                return after if after is not None else backoff_seconds(request.attempts)
            case Accepted() | Refused() | Failed():
                return None

    def _watch(self, answer: Answer | PollAnswer, *, probe: bool) -> bool:
        """Update the gates for ``answer`` to a request or a poll; whether the circuit opened.

        A 429 closes the ``Retry-After`` gate, a 401/403 halts, a 5xx or no answer counts
        towards the circuit (a probe's opens it again at once); any other answer closes the
        circuit.
        """
        match answer:
            case RateLimited(after_seconds=after):
                self._gate_until = max(self._gate_until, self._clock() + after)
                self._metrics.rate_limit_waits.inc()
                self._metrics.rate_limit_wait_seconds.inc(after)
                self._alive()
            case CredentialsRefused():
                self._halt(Halt.CREDENTIALS_REFUSED, probe=probe)
            case Retry(status_code=status) if status is None or status >= 500:  # noqa: PLR2004 - a 5xx
                self._failures += 1
                if probe or self._failures >= CIRCUIT_THRESHOLD:
                    self._halt(Halt.CIRCUIT_OPEN, probe=probe)
                    return True
            case Retry() | Accepted() | Refused() | Failed() | Polled() | NotFound():
                self._alive()
        return False

    def _halt(self, halt: Halt, *, probe: bool) -> None:
        """Send only probes: the first halt, a failed probe (a longer interval), or neither."""
        if self.halt is Halt.NONE:
            self._failed_probes = 0
            logger.warning("dispatcher.halted", halt=str(halt))
        elif probe:
            self._failed_probes += 1
        else:
            return  # a request sent before the halt: the probe's interval stands
        self.halt = halt
        self._spare.set()  # a drift check waiting for a slot learns of the halt
        self._probe_at = self._clock() + probe_interval_seconds(self._failed_probes)
        self._metrics.circuit_open.set(1 if halt is Halt.CIRCUIT_OPEN else 0)
        self._metrics.credentials_refused.set(1 if halt is Halt.CREDENTIALS_REFUSED else 0)

    def _alive(self) -> None:
        """The warehouse answered, with the token accepted: close the circuit."""
        self._failures = 0
        self._failed_probes = 0
        if self.halt is not Halt.NONE:
            logger.info("dispatcher.resumed", after=str(self.halt))
        self.halt = Halt.NONE
        self._metrics.circuit_open.set(0)
        self._metrics.credentials_refused.set(0)

    async def _housekeeping(self) -> None:
        """Read the backlog every :data:`BACKLOG_INTERVAL_SECONDS`; expire every interval."""
        now = self._clock()
        if now - self._backlog_read_at >= BACKLOG_INTERVAL_SECONDS:
            self._backlog_read_at = now
            await read_backlog(self._requests, self._metrics, self._poller)
        if now - self._expired_at < self._options.expire_interval_seconds:
            return
        self._expired_at = now
        expired = await self._requests.expire(self._options.key_retention_seconds)
        if expired:
            self._metrics.expired.inc(expired)
            logger.warning("dispatcher.requests_expired", count=expired)

    async def _wait(self, seconds: float) -> None:
        """Wait ``seconds``, or less when a request finished or the loop is stopped."""
        await sleep_unless(self._wake, seconds)
        self._wake.clear()

    async def _pause(self, seconds: float) -> None:
        """Sleep ``seconds`` (nothing when not positive), or less when stopped."""
        await sleep_unless(self._stopping, seconds)


class _InventoryGate:
    """Entered around each request of the drift check: the dispatcher's gates, after its work.

    Entering waits until the dispatcher's last turn left a slot unused (no request due, the
    polls served), takes a slot and passes the sends' gates (:meth:`Dispatcher._through_gates`:
    the ``Retry-After`` gate, a token of the rate cap, the halts); the slot is held until the
    request is answered. So the check's pages come out of the budget the requests and polls
    leave, and count towards the cap and the concurrency as theirs do.

    Raises:
        WarehouseHaltedError: on entering while the dispatcher only probes (the warehouse is
            down or refuses the token), or when a ``Retry-After`` outlasts the gates' wait:
            the check gives up until its next interval.
    """

    def __init__(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher

    async def __aenter__(self) -> None:
        dispatcher = self._dispatcher
        if dispatcher.halt is not Halt.NONE:
            msg = f"not sent: {dispatcher.halt}"
            raise WarehouseHaltedError(msg)
        await dispatcher._spare.wait()  # noqa: SLF001 - the dispatcher's own gate
        await dispatcher._slots.acquire()  # noqa: SLF001
        try:
            # The sends' own gates, so that a page meets the same rules as a request.
            closed = await dispatcher._through_gates()  # noqa: SLF001
        except BaseException:
            self._release()
            raise
        if closed is not None:
            self._release()
            retry, _ = closed
            raise WarehouseHaltedError(retry.answer)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._release()

    def _release(self) -> None:
        self._dispatcher._slots.release()  # noqa: SLF001
        self._dispatcher._wake.set()  # noqa: SLF001


def _log_answer(request: WarehouseRequest, answer: Answer, retry_in: float | None) -> None:
    fields = {
        "key": str(request.idempotency_key),
        "kind": str(request.kind),
        "order_id": str(request.order_id),
        "attempts": request.attempts,
        "outcome": type(answer).__name__,
        "status_code": answer.status_code,
    }
    if isinstance(answer, Failed | Retry | RateLimited | CredentialsRefused):
        logger.warning(
            "dispatcher.answer", retry_in_seconds=retry_in, answer=answer.answer, **fields
        )
    else:
        logger.info("dispatcher.answer", **fields)
