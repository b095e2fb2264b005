"""Warehouse requests and a client for the tests that talk to the warehouse simulator."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime

import httpx

from fulfilment.adapters.warehouse.client import (
    WarehouseClient,
    WarehouseClientOptions,
    build_http_client,
)
from fulfilment.domain.handoff import RequestKind, WarehouseRequest

TOKEN = "test-token"  # noqa: S105 - the simulator's token in tests


def order_body(order_id: uuid.UUID, lines: Iterable[tuple[str, int]]) -> bytes:
    """A fulfilment order's body, as the API shows it."""
    return json.dumps(
        {
            "reference": str(order_id),
            "lines": [{"sku": sku, "quantity": quantity} for sku, quantity in lines],
            "requested_at": "2026-12-02T04:30:00Z",
        },
        separators=(",", ":"),
    ).encode()


def an_order(
    lines: Iterable[tuple[str, int]] = (("85123A", 6),),
    *,
    order_id: uuid.UUID | None = None,
    key: uuid.UUID | None = None,
    body: bytes | None = None,
    attempts: int = 1,
    traceparent: str | None = None,
    request_id: int = 1,
) -> WarehouseRequest:
    order_id = order_id or uuid.uuid4()
    return WarehouseRequest(
        id=request_id,
        idempotency_key=key or uuid.uuid4(),
        kind=RequestKind.FULFILMENT_ORDER,
        order_id=order_id,
        causation_id=uuid.uuid4(),
        body=order_body(order_id, lines) if body is None else body,
        attempts=attempts,
        first_attempt_at=datetime.now(UTC),
        traceparent=traceparent,
    )


def a_cancellation(
    warehouse_id: str,
    lines: Iterable[tuple[str, int]] | None = None,
    *,
    order_id: uuid.UUID | None = None,
    request_id: int = 2,
) -> WarehouseRequest:
    document = (
        {}
        if lines is None
        else {"lines": [{"sku": sku, "quantity": quantity} for sku, quantity in lines]}
    )
    return WarehouseRequest(
        id=request_id,
        idempotency_key=uuid.uuid4(),
        kind=RequestKind.CANCELLATION,
        order_id=order_id or uuid.uuid4(),
        causation_id=uuid.uuid4(),
        body=json.dumps(document).encode(),
        attempts=1,
        first_attempt_at=datetime.now(UTC),
        warehouse_id=warehouse_id,
    )


def client_options(
    url: str, *, token: str = TOKEN, timeout_seconds: float = 5.0, max_connections: int = 4
) -> WarehouseClientOptions:
    return WarehouseClientOptions(
        url=url,
        token=token,
        timeout_seconds=timeout_seconds,
        ca_file=None,
        max_connections=max_connections,
        user_agent="fulfilment-tests",
    )


def a_client(url: str, **options: object) -> tuple[WarehouseClient, httpx.AsyncClient]:
    http = build_http_client(client_options(url, **options))  # type: ignore[arg-type]
    return WarehouseClient(http, timeout_seconds=http.timeout.read or 5.0), http
