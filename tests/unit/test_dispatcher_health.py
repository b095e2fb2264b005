"""The dispatcher's HTTP endpoints: readiness by role and by what the warehouse says."""

from __future__ import annotations

import json

import httpx
from test_health import call

from fulfilment.adapters.warehouse_system.client import WarehouseClient
from fulfilment.dispatcher.pump import DispatcherPump
from fulfilment.dispatcher.service import Dispatcher, DispatcherOptions, Halt
from fulfilment.observability.dispatcher_metrics import DispatcherMetrics
from fulfilment.observability.probes import probe_app
from fulfilment.pump.leader import LockOptions, Role
from memory_requests import MemoryWarehouseRequests


def a_pump(role: Role, halt: Halt | None = None) -> tuple[DispatcherPump, DispatcherMetrics]:
    metrics = DispatcherMetrics()
    requests = MemoryWarehouseRequests()
    client = WarehouseClient(httpx.AsyncClient(), timeout_seconds=1)
    options = DispatcherOptions(rate_per_second=1, concurrency=1, timeout_seconds=1)
    lock = LockOptions("postgresql://nowhere/", key=1, connect_timeout_seconds=1, poll_seconds=1)
    pump = DispatcherPump(lock, requests, client, options, metrics)
    pump.role = role
    if halt is not None:
        pump.dispatcher = Dispatcher(requests, client, options, metrics)
        pump.dispatcher.halt = halt
    return pump, metrics


async def ready(pump: DispatcherPump, metrics: DispatcherMetrics) -> tuple[int, dict]:
    status, body = await call(
        probe_app(readiness=pump.probe, registry=metrics.registry), "/health/ready"
    )
    return status, json.loads(body)


async def test_a_dispatcher_not_connected_is_not_ready() -> None:
    assert await ready(*a_pump(Role.CONNECTING)) == (
        503,
        {"database": False, "role": "connecting", "halt": "none"},
    )


async def test_a_standby_is_ready() -> None:
    assert (await ready(*a_pump(Role.STANDBY)))[0] == 200


async def test_an_active_dispatcher_probing_a_down_warehouse_is_ready() -> None:
    assert await ready(*a_pump(Role.ACTIVE, Halt.CIRCUIT_OPEN)) == (
        200,
        {"database": True, "role": "active", "halt": "circuit_open"},
    )


async def test_refused_credentials_make_it_not_ready_and_say_so() -> None:
    assert await ready(*a_pump(Role.ACTIVE, Halt.CREDENTIALS_REFUSED)) == (
        503,
        {"database": True, "role": "active", "halt": "credentials_refused"},
    )


async def test_metrics_start_with_every_kind_and_outcome_at_zero() -> None:
    pump, metrics = a_pump(Role.STANDBY)
    app = probe_app(readiness=pump.probe, registry=metrics.registry)
    status, body = await call(app, "/metrics")
    text = body.decode()
    assert status == 200
    for kind in ("fulfilment_order", "cancellation"):
        for outcome in ("accepted", "refused", "retry", "rate_limited", "failed"):
            line = f'fulfilment_warehouse_requests_total{{kind="{kind}",outcome="{outcome}"}} 0.0'
            assert line in text
    assert "fulfilment_warehouse_credentials_refused 0.0" in text
    assert "fulfilment_warehouse_circuit_open 0.0" in text
    assert "fulfilment_dispatcher_active 0.0" in text
