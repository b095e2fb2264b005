"""The HTTP endpoints beside the worker: liveness, readiness by value, metrics."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter

from fulfilment.worker import health as http
from fulfilment.worker.health import health_app


async def call(app: Any, path: str) -> tuple[int, bytes]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "GET",
        "path": path,
        "query_string": b"",
        "headers": [],
    }
    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, body


def an_app(
    *, broker: bool = True, consumer: bool = True, database: Any = None
) -> tuple[Any, CollectorRegistry]:
    registry = CollectorRegistry()
    Counter("fulfilment_events_total", "events", ["outcome"], registry=registry).labels("x")

    async def broker_connected(timeout: float) -> bool:
        assert timeout == http.READINESS_CHECK_SECONDS
        return broker

    async def database_ping() -> None:
        if database is not None:
            await database()

    app = health_app(
        broker_connected=broker_connected,
        consumer_attached=lambda: consumer,
        database_ping=database_ping,
        registry=registry,
    )
    return app, registry


async def test_liveness_answers_whatever_the_dependencies_say() -> None:
    app, _ = an_app(broker=False, consumer=False)

    status, body = await call(app, "/health/live")

    assert status == 200
    assert json.loads(body) == {"status": "ok"}


@pytest.mark.parametrize("path", ["/health/live", "/health/ready", "/nowhere"])
async def test_each_json_answer_is_one_line_ending_in_a_newline(path: str) -> None:
    app, _ = an_app()

    _, body = await call(app, path)

    assert body.endswith(b"}\n")
    assert body.count(b"\n") == 1


async def test_readiness_is_200_when_broker_consumer_and_database_answer() -> None:
    app, _ = an_app()

    status, body = await call(app, "/health/ready")

    assert status == 200
    assert json.loads(body) == {"broker": True, "consumer": True, "database": True}


async def failing_database() -> None:
    raise ConnectionRefusedError


@pytest.mark.parametrize(
    ("options", "failing"),
    [
        ({"broker": False}, "broker"),
        ({"consumer": False}, "consumer"),
        ({"database": failing_database}, "database"),
    ],
    ids=["broker-ping-false", "no-consumer", "database-refuses"],
)
async def test_readiness_is_503_naming_the_check_that_failed(options, failing) -> None:
    app, _ = an_app(**options)

    status, body = await call(app, "/health/ready")

    assert status == 503
    checks = json.loads(body)
    assert [name for name, ok in checks.items() if not ok] == [failing]


async def test_a_database_that_hangs_makes_readiness_fail_within_its_time_limit(
    monkeypatch,
) -> None:
    monkeypatch.setattr(http, "READINESS_CHECK_SECONDS", 0.1)

    async def hangs() -> None:
        await asyncio.sleep(60)

    app, _ = an_app(database=hangs)
    started = asyncio.get_running_loop().time()

    status, body = await call(app, "/health/ready")

    assert status == 503
    assert json.loads(body)["database"] is False
    assert asyncio.get_running_loop().time() - started < 5


async def test_metrics_serves_the_registry_in_the_prometheus_text_format() -> None:
    app, _ = an_app()

    status, body = await call(app, "/metrics")

    assert status == 200
    assert b'fulfilment_events_total{outcome="x"} 0.0' in body


async def test_other_paths_are_not_found() -> None:
    app, _ = an_app()

    status, _ = await call(app, "/health")

    assert status == 404
