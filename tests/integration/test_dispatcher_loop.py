"""The dispatcher's loop against the warehouse simulator over a real socket.

The store is the small in-memory one of ``tests/support/memory_requests.py``; the caps, gates
and the circuit are the loop's, and the simulator counts what reached it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest

from fulfilment.application.ports import TransientError
from fulfilment.dispatcher import service
from fulfilment.dispatcher.service import Dispatcher, DispatcherOptions, Halt
from fulfilment.domain.handoff import Failed, RequestKind, RequestStatus, Retry, WarehouseRequest
from fulfilment.observability.dispatcher_metrics import DispatcherMetrics
from tests.support.memory_requests import MemoryWarehouseRequests
from tests.support.simulated_warehouse import TOKEN, a_client
from warehouse_simulator import Faults, SimulatorServer, WarehouseSimulator


@pytest.fixture
async def server() -> AsyncIterator[SimulatorServer]:
    async with SimulatorServer(WarehouseSimulator(Faults(token=TOKEN), seed=1)) as running:
        yield running


class Running:
    def __init__(self, dispatcher: Dispatcher, metrics: DispatcherMetrics) -> None:
        self.dispatcher = dispatcher
        self.metrics = metrics

    def metric(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels)
        assert value is not None, name
        return value


async def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        await asyncio.sleep(0.02)


async def run_until(
    store: MemoryWarehouseRequests,
    server: SimulatorServer,
    condition: Callable[[], bool],
    *,
    timeout: float,
    what: str,
    rate: float = 50.0,
    concurrency: int = 4,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[Running, float]:
    client, http = a_client(server.url, timeout_seconds=2.0, max_connections=concurrency)
    metrics = DispatcherMetrics()
    options = DispatcherOptions(
        rate_per_second=rate, concurrency=concurrency, timeout_seconds=2.0, poll_seconds=0.05
    )
    dispatcher = Dispatcher(store, client, options, metrics, clock=clock)
    started = time.monotonic()
    task = asyncio.create_task(dispatcher.run())
    try:
        await until(condition, timeout, what)
    finally:
        dispatcher.stop()
        await asyncio.wait_for(task, 10)
        await http.aclose()
    return Running(dispatcher, metrics), time.monotonic() - started


def all_answered(store: MemoryWarehouseRequests) -> Callable[[], bool]:
    return lambda: all(
        row.status not in {RequestStatus.PENDING, RequestStatus.SENDING} for row in store.rows
    )


async def test_the_backlog_is_sent_once_each_over_fewer_connections_than_requests(
    server: SimulatorServer,
) -> None:
    store = MemoryWarehouseRequests()
    rows = store.add_orders(40)
    running, _ = await run_until(store, server, all_answered(store), timeout=20, what="drained")
    assert [row.status for row in rows] == [RequestStatus.ACCEPTED] * 40
    assert len(server.simulator.orders) == 40
    assert server.simulator.requests_total == 40
    assert len(server.simulator.connections) <= 4
    assert (
        running.metric(
            "fulfilment_warehouse_requests_total", kind="fulfilment_order", outcome="accepted"
        )
        == 40
    )


async def test_a_cancellation_is_sent_after_its_order_is_accepted_with_its_id(
    server: SimulatorServer,
) -> None:
    store = MemoryWarehouseRequests()
    order = store.add_order([("85123A", 6)])
    cancellation = store.add_cancellation(order.request.order_id)
    await run_until(store, server, all_answered(store), timeout=10, what="both answered")
    assert order.status is RequestStatus.ACCEPTED
    assert cancellation.status is RequestStatus.ACCEPTED
    assert cancellation.claimed_at[0] > order.claimed_at[0]
    assert [c.order_id for c in server.simulator.cancellations] == [order.request.warehouse_id]


async def test_a_429_storm_sends_nothing_before_retry_after_and_never_above_the_cap(
    server: SimulatorServer,
) -> None:
    server.simulator.faults.update({"rate_limit_per_second": 4, "retry_after_seconds": 1})
    store = MemoryWarehouseRequests()
    store.add_orders(24)
    running, _ = await run_until(
        store, server, all_answered(store), timeout=40, what="drained", rate=10, concurrency=4
    )
    assert len(store.with_status(RequestStatus.ACCEPTED)) == 24
    assert len(server.simulator.orders) == 24
    assert server.simulator.statuses[429] > 0
    assert server.simulator.early_requests == 0
    assert server.simulator.max_requests_per_second() <= 10
    assert (
        running.metric("fulfilment_warehouse_rate_limit_waits_total")
        == server.simulator.statuses[429]
    )


async def test_the_measured_rate_holds_the_cap(server: SimulatorServer) -> None:
    store = MemoryWarehouseRequests()
    store.add_orders(45)
    _, seconds = await run_until(
        store, server, all_answered(store), timeout=30, what="drained", rate=15, concurrency=8
    )
    assert server.simulator.max_requests_per_second() <= 15
    assert seconds >= 44 / 15


async def test_a_poison_order_fails_and_the_orders_after_it_are_accepted(
    server: SimulatorServer,
) -> None:
    server.simulator.faults.refused_skus = frozenset({"POISON"})
    store = MemoryWarehouseRequests()
    first = store.add_order([("85123A", 1)])
    poison = store.add_order([("POISON", 1)])
    after = [store.add_order([("85123A", 2)]) for _ in range(5)]
    await run_until(store, server, all_answered(store), timeout=10, what="all answered")
    assert poison.status is RequestStatus.FAILED
    assert isinstance(poison.answers[-1], Failed)
    assert poison.answers[-1].reason == "sku_not_stocked"
    assert [row.status for row in [first, *after]] == [RequestStatus.ACCEPTED] * 6
    assert poison.request.attempts == 1


async def test_an_outage_opens_the_circuit_costs_few_probes_then_the_backlog_drains(
    server: SimulatorServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The backoff of the requests that failed before the circuit opened would outlast the
    # test's short outage; the probes' intervals are the circuit's, and are kept.
    monkeypatch.setattr(service, "backoff_seconds", lambda _attempts: 0.5)
    outage = 4.0
    server.simulator.go_down(outage)
    store = MemoryWarehouseRequests()
    store.add_orders(30)
    opened: list[float] = []

    async def watch(running_dispatcher: Dispatcher) -> None:
        while True:
            if running_dispatcher.halt is Halt.CIRCUIT_OPEN and not opened:
                opened.append(time.monotonic())
            await asyncio.sleep(0.01)

    client, http = a_client(server.url, timeout_seconds=2.0, max_connections=4)
    metrics = DispatcherMetrics()
    dispatcher = Dispatcher(
        store,
        client,
        DispatcherOptions(rate_per_second=50, concurrency=4, timeout_seconds=2, poll_seconds=0.05),
        metrics,
    )
    task = asyncio.create_task(dispatcher.run())
    watcher = asyncio.create_task(watch(dispatcher))
    try:
        await asyncio.sleep(outage - 0.2)
        during = server.simulator.requests_total
        assert dispatcher.halt is Halt.CIRCUIT_OPEN
        assert metrics.registry.get_sample_value("fulfilment_warehouse_circuit_open") == 1
        await until(all_answered(store), 30, "drained after the outage")
    finally:
        watcher.cancel()
        dispatcher.stop()
        await asyncio.wait_for(task, 10)
        await http.aclose()
    # Up to the threshold (and the requests in flight beside them), then a probe at a time:
    # 1 s, 2 s ... apart.
    assert during <= service.CIRCUIT_THRESHOLD + 4 + 3
    assert len(store.with_status(RequestStatus.ACCEPTED)) == 30
    assert len(server.simulator.orders) == 30
    assert dispatcher.halt is Halt.NONE
    assert metrics.registry.get_sample_value("fulfilment_warehouse_circuit_open") == 0


async def test_refused_credentials_stop_sending_until_they_work_and_fail_nothing(
    server: SimulatorServer,
) -> None:
    server.simulator.faults.token = "rotated"  # noqa: S105 - the simulator's token
    store = MemoryWarehouseRequests()
    store.add_orders(10)
    client, http = a_client(server.url, timeout_seconds=2.0, max_connections=4)
    metrics = DispatcherMetrics()
    dispatcher = Dispatcher(
        store,
        client,
        DispatcherOptions(rate_per_second=50, concurrency=4, timeout_seconds=2, poll_seconds=0.05),
        metrics,
    )
    task = asyncio.create_task(dispatcher.run())
    try:
        await until(lambda: dispatcher.halt is Halt.CREDENTIALS_REFUSED, 5, "credentials halt")
        await asyncio.sleep(2.5)
        refused = server.simulator.statuses[403]
        assert dispatcher.readiness() == {"sending": False, "halt": "credentials_refused"}
        assert metrics.registry.get_sample_value("fulfilment_warehouse_credentials_refused") == 1
        assert store.with_status(RequestStatus.FAILED) == []
        assert server.simulator.orders == {}
        server.simulator.faults.token = TOKEN
        await until(all_answered(store), 30, "drained once the token works")
    finally:
        dispatcher.stop()
        await asyncio.wait_for(task, 10)
        await http.aclose()
    # The requests in flight when the first 403 came, then one probe at a time.
    assert refused <= 4 + 3
    assert len(store.with_status(RequestStatus.ACCEPTED)) == 10
    assert dispatcher.halt is Halt.NONE
    assert metrics.registry.get_sample_value("fulfilment_warehouse_credentials_refused") == 0


async def test_requests_first_attempted_before_the_key_retention_expire(
    server: SimulatorServer,
) -> None:
    server.simulator.faults.error_rate = 1.0
    store = MemoryWarehouseRequests()
    row = store.add_order([("85123A", 1)])
    client, http = a_client(server.url, timeout_seconds=2.0)
    metrics = DispatcherMetrics()
    options = DispatcherOptions(
        rate_per_second=50,
        concurrency=1,
        timeout_seconds=2,
        poll_seconds=0.05,
        key_retention_seconds=0.5,
        expire_interval_seconds=0.2,
    )
    dispatcher = Dispatcher(store, client, options, metrics)
    task = asyncio.create_task(dispatcher.run())
    try:
        await until(lambda: row.status is RequestStatus.EXPIRED, 10, "expired")
    finally:
        dispatcher.stop()
        await asyncio.wait_for(task, 10)
        await http.aclose()
    assert metrics.registry.get_sample_value("fulfilment_warehouse_requests_expired_total") == 1
    assert row.request.kind is RequestKind.FULFILMENT_ORDER


async def test_a_timeout_after_the_warehouse_committed_ends_as_a_replay_of_one_order(
    server: SimulatorServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service, "backoff_seconds", lambda _attempts: 0.2)
    server.simulator.faults.update({"stall_after_commit_rate": 1.0, "stall_seconds": 3})
    store = MemoryWarehouseRequests()
    row = store.add_order([("85123A", 1)])

    def first_timed_out() -> bool:
        if row.answers and server.simulator.faults.stall_after_commit_rate:
            server.simulator.faults.stall_after_commit_rate = 0.0
        return row.status is RequestStatus.ACCEPTED

    await run_until(store, server, first_timed_out, timeout=20, what="accepted")
    assert row.request.attempts == 2
    assert row.answers[0].status_code is None
    assert row.answers[-1].status_code == 200
    assert len(server.simulator.orders) == 1


async def test_a_retry_after_longer_than_the_timeout_hands_the_waiting_requests_back_unsent(
    server: SimulatorServer,
) -> None:
    server.simulator.faults.update({"rate_limit_per_second": 2, "retry_after_seconds": 4})
    store = MemoryWarehouseRequests()
    store.add_orders(8)

    def handed_back() -> bool:
        return any(
            isinstance(answer, Retry) and answer.answer == "not sent: Retry-After"
            for row in store.rows
            for answer in row.answers
        )

    await run_until(store, server, handed_back, timeout=10, what="a request handed back", rate=20)
    assert server.simulator.statuses[429] >= 1
    assert server.simulator.early_requests == 0
    back = next(
        (row, retry_in)
        for row in store.rows
        for answer, retry_in in zip(row.answers, row.retry_ins, strict=True)
        if isinstance(answer, Retry) and answer.status_code is None
    )
    assert back[1] is not None
    assert back[1] > 2.0  # due when the gate opens, not at the next claim


async def test_a_cap_of_a_hundred_a_second_is_held_within_a_twentieth_and_never_exceeded(
    server: SimulatorServer,
) -> None:
    store = MemoryWarehouseRequests()
    store.add_orders(400)
    await run_until(
        store, server, all_answered(store), timeout=30, what="drained", rate=100, concurrency=8
    )

    per_second = [count for _, count in sorted(server.simulator.requests_per_second.items())]
    assert max(per_second) <= 100, per_second
    # The whole seconds between the first and the last, which are partial.
    assert min(per_second[1:-1]) >= 95, per_second


async def test_a_claim_takes_requests_for_the_next_slots_so_claims_are_few(
    server: SimulatorServer,
) -> None:
    server.simulator.faults.update({"latency_seconds": 0.01})
    store = MemoryWarehouseRequests()
    store.add_orders(200)
    await run_until(
        store, server, all_answered(store), timeout=30, what="drained", rate=1000, concurrency=4
    )

    assert len(server.simulator.orders) == 200
    assert all(row.request.attempts == 1 for row in store.rows)
    fruitful = [claimed for _, claimed in store.claims if claimed]
    # Each claim asks for its free slots and four more: at most 200 / 5 claims find requests,
    # where a claim per freed slot would take 100 or more.
    assert len(fruitful) <= 200 // 5, store.claims
    assert all(limit > 4 for limit, _ in store.claims), store.claims


async def test_a_request_held_past_its_hold_is_handed_back_unsent_then_sent_once(
    server: SimulatorServer,
) -> None:
    server.simulator.faults.update({"latency_seconds": 0.3})
    store = MemoryWarehouseRequests()
    first = store.add_order([("85123A", 1)])
    second = store.add_order([("85123A", 2)])
    # One slot: the claim takes both, the second waits at hand while the first is sent.
    # The clock jumps past the hold while the first is at the warehouse.
    offset = 0.0

    def clock() -> float:
        return time.monotonic() + offset

    async def jump_once_the_first_is_at_the_warehouse() -> None:
        nonlocal offset
        await until(lambda: server.simulator.requests_total >= 1, 5, "the first request sent")
        offset = 60.0

    jumping = asyncio.create_task(jump_once_the_first_is_at_the_warehouse())
    await run_until(
        store,
        server,
        all_answered(store),
        timeout=15,
        what="both answered",
        concurrency=1,
        clock=clock,
    )
    await jumping

    assert store.claims[0] == (2, 2)
    assert [type(answer).__name__ for answer in first.answers] == ["Accepted"]
    held, sent = second.answers
    assert held == Retry(answer="not sent: held too long")
    assert second.retry_ins[0] == 0.0
    assert sent.status_code == 201
    assert len(server.simulator.orders) == 2


async def test_requests_at_hand_when_stopped_are_handed_back_due_now(
    server: SimulatorServer,
) -> None:
    server.simulator.faults.update({"latency_seconds": 0.2})
    store = MemoryWarehouseRequests()
    store.add_orders(20)

    await run_until(
        store,
        server,
        # Stopped right after the first claim: two sent, two at hand.
        lambda: bool(store.claims),
        timeout=10,
        what="a first claim",
        concurrency=2,
    )

    stopped_at = time.monotonic()
    left = [row for row in store.rows if row.status is RequestStatus.SENDING]
    assert left, "the claims took requests ahead of the slots"
    assert all(row.due <= stopped_at for row in left), [row.due - stopped_at for row in left]
    handed_back = [row for row in left if not any(a.status_code for a in row.answers)]
    assert handed_back
    assert all(row.answers == [Retry(answer="not sent: stopping")] for row in handed_back)


class FailingClaims(MemoryWarehouseRequests):
    """Claims that fail (the store's ``TransientError``) the first ``failures`` times."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def claim(self, limit: int, *, lease_seconds: float) -> list[WarehouseRequest]:
        if self.failures:
            self.failures -= 1
            msg = "the database does not answer"
            raise TransientError(msg)
        return await super().claim(limit, lease_seconds=lease_seconds)


async def test_a_claim_that_fails_gives_its_slots_back(server: SimulatorServer) -> None:
    # More failures than slots: a slot kept by each would leave none to send with.
    store = FailingClaims(failures=3)
    store.add_orders(5)
    await run_until(store, server, all_answered(store), timeout=20, what="drained", concurrency=2)
    assert store.failures == 0
    assert len(store.with_status(RequestStatus.ACCEPTED)) == 5
