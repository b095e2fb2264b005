"""The relay's HTTP endpoints: liveness, readiness by role and connections, its metrics."""

from __future__ import annotations

import json

from test_health import call

from builders import a_relay
from fulfilment.contracts.result_events import RESULT_ROUTING_KEYS
from fulfilment.observability.probes import probe_app
from fulfilment.observability.relay_metrics import RelayMetrics
from fulfilment.pump.leader import Role
from fulfilment.relay.service import Relay


def an_app(relay: Relay, metrics: RelayMetrics):
    return probe_app(readiness=relay.probe, registry=metrics.registry)


async def test_a_relay_that_is_not_connected_is_live_but_not_ready() -> None:
    relay, metrics = a_relay()
    app = an_app(relay, metrics)

    assert (await call(app, "/health/live"))[0] == 200
    status, body = await call(app, "/health/ready")
    assert status == 503
    assert json.loads(body) == {"broker": False, "database": False, "role": "connecting"}


async def test_a_standing_by_relay_without_its_connections_is_not_ready() -> None:
    relay, metrics = a_relay()
    relay.role = Role.STANDBY  # connected would also need both connections open

    status, _ = await call(an_app(relay, metrics), "/health/ready")
    assert status == 503


async def test_metrics_start_with_every_routing_key_and_failure_reason_at_zero() -> None:
    relay, metrics = a_relay()

    status, body = await call(an_app(relay, metrics), "/metrics")

    text = body.decode()
    assert status == 200
    for key in RESULT_ROUTING_KEYS:
        assert f'fulfilment_outbox_published_total{{routing_key="{key}"}} 0.0' in text
    for reason in ("returned", "nacked", "connection"):
        assert f'fulfilment_outbox_publish_failures_total{{reason="{reason}"}} 0.0' in text
    assert "fulfilment_relay_active 0.0" in text


async def test_an_unknown_path_is_not_found() -> None:
    relay, metrics = a_relay()
    assert (await call(an_app(relay, metrics), "/nowhere"))[0] == 404
