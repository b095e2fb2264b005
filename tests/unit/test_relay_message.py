"""The relay's messages: the properties it publishes through aiormq, byte for byte those of
the aio_pika.Message it built before, so that no consumer sees a change."""

from __future__ import annotations

import uuid

import aio_pika
import aiormq
import pytest
from opentelemetry.sdk.trace import TracerProvider
from pamqp.header import ContentHeader

from fulfilment.adapters.postgres.outbox import OutboxRow
from fulfilment.observability.tracing import context_of, traceparent_of
from fulfilment.relay.service import message_properties

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def a_row(traceparent: str | None) -> OutboxRow:
    return OutboxRow(
        id=7,
        event_id=str(uuid.uuid4()),
        order_id=str(uuid.uuid4()),
        routing_key="stock.released",
        body=b'{"version": 1}',
        traceparent=traceparent,
    )


@pytest.mark.parametrize("traceparent", [TRACEPARENT, None])
def test_the_properties_are_the_bytes_of_the_aio_pika_message_the_relay_built_before(
    traceparent: str | None,
) -> None:
    row = a_row(traceparent)
    before = aio_pika.Message(
        row.body,
        content_type="application/json",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        message_id=row.event_id,
        type=row.routing_key,
        correlation_id=row.subject,
        headers={"traceparent": row.traceparent} if row.traceparent else None,
        app_id="fulfilment-test",
    )

    properties = message_properties(row, "fulfilment-test")

    def header(props: aiormq.spec.Basic.Properties) -> bytes:
        return ContentHeader(body_size=len(row.body), properties=props).marshal()

    assert header(properties) == header(before.properties)
    assert properties.delivery_mode == 2  # persistent
    assert properties.message_type == "stock.released"


def test_with_a_publish_span_the_message_carries_the_span_s_context_in_the_row_s_trace() -> None:
    row = a_row(TRACEPARENT)
    span = (
        TracerProvider().get_tracer("test").start_span("publish", context=context_of(TRACEPARENT))
    )

    properties = message_properties(row, "fulfilment-test", span)

    traceparent = properties.headers["traceparent"]
    assert traceparent == traceparent_of(span.get_span_context())
    assert traceparent.split("-")[1] == TRACEPARENT.split("-")[1]  # the same trace
    assert traceparent != TRACEPARENT  # a child: the publish span, not the row's writer
