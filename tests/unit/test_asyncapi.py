"""The published AsyncAPI document: committed as the code generates it, complete, with schemas.

``test_the_committed_document_is_the_one_the_code_generates`` is CI's check that
``docs/asyncapi.json`` was regenerated (``make asyncapi``) after a change of a wire model or of
the topology.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from faststream.specification import AsyncAPI
from pydantic import ConfigDict

from fulfilment import asyncapi
from fulfilment.contracts.result_events import RESULT_EVENTS
from fulfilment.contracts.topology import EVENTS_EXCHANGE, SubscribedQueue
from fulfilment.entrypoints.worker import build_worker
from fulfilment.routes.table import SUBSCRIBED_QUEUES
from fulfilment.settings import Settings
from tests.support.builders import RESULT_EVENT_EXAMPLES, SKU_EVENT_EXAMPLES
from tests.support.deliveries import in_memory_dead_letters
from tests.support.fakes import FakeStock

COMMITTED = Path(__file__).parents[2] / "docs" / "asyncapi.json"

ORDER_PLACED_EXAMPLE = {
    "version": 1,
    "event_id": "6f1c0d2e-8f0b-4b7e-9a57-2f1f0c6b9e11",
    "order_id": "0b6e3c9a-55d4-4f7e-8a59-0c1d2e3f4a5b",
    "placed_at": "2010-12-01T08:26:00+00:00",
    "lines": [{"sku": "85123A", "quantity": 6}, {"sku": "71053", "quantity": 6}],
}
"""The product contract's example ``OrderPlaced``."""


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    """The AsyncAPI document the code generates, parsed."""
    parsed: dict[str, Any] = json.loads(asyncapi.asyncapi_document())
    return parsed


def _payload(document: dict[str, Any], channel: str) -> dict[str, Any]:
    """The payload schema of the one message of ``channel``, its ``$ref`` followed."""
    (reference,) = (m["$ref"] for m in document["channels"][channel]["messages"].values())
    message = _follow(document, reference)
    payload = message["payload"]
    return _follow(document, payload["$ref"]) if "$ref" in payload else payload


def _follow(document: dict[str, Any], reference: str) -> dict[str, Any]:
    node: Any = document
    for part in reference.removeprefix("#/").split("/"):
        node = node[part.replace("%20", " ").replace("~1", "/").replace("~0", "~")]
    return node  # type: ignore[no-any-return]


def _validator(document: dict[str, Any], channel: str) -> jsonschema.Draft202012Validator:
    """A validator of the payload of ``channel``, whose ``$ref`` resolve in the document."""
    (reference,) = (m["$ref"] for m in document["channels"][channel]["messages"].values())
    payload = _follow(document, reference)["payload"]
    return jsonschema.Draft202012Validator({**payload, "components": document["components"]})


def _consumed_channel(queue: SubscribedQueue) -> str:
    return queue.name


def test_the_committed_document_is_the_one_the_code_generates() -> None:
    generated = asyncapi.asyncapi_document()
    committed = COMMITTED.read_text(encoding="utf-8")

    difference = "".join(
        difflib.unified_diff(
            committed.splitlines(keepends=True),
            generated.splitlines(keepends=True),
            "docs/asyncapi.json (committed)",
            "generated",
            n=1,
        )
    )
    assert not difference, f"docs/asyncapi.json is stale: run `make asyncapi`\n{difference[:4000]}"


def test_the_make_target_writes_the_document(tmp_path: Path) -> None:
    out = tmp_path / "asyncapi.json"

    assert asyncapi.main([str(out)]) == 0
    assert out.read_text(encoding="utf-8") == asyncapi.asyncapi_document()
    assert asyncapi.main([]) == 2


def test_the_document_is_asyncapi_3_of_the_contract_version(document: dict[str, Any]) -> None:
    assert document["asyncapi"] == "3.0.0"
    assert document["info"]["version"] == asyncapi.CONTRACT_VERSION
    assert document["defaultContentType"] == "application/json"


@pytest.mark.parametrize("queue", SUBSCRIBED_QUEUES, ids=lambda q: q.event)
def test_every_consumed_event_is_on_its_queue_bound_to_orders(
    document: dict[str, Any], queue: SubscribedQueue
) -> None:
    channel = document["channels"][_consumed_channel(queue)]
    [model] = [route.model for route in asyncapi.QUEUE_ROUTES if route.transport == queue]
    operation = document["operations"][f"receive{model.__name__}"]

    assert channel["address"] == queue.routing_key
    assert channel["bindings"]["amqp"]["queue"]["name"] == queue.name
    assert f"bound to the topic exchange orders with {queue.routing_key}" in channel["description"]
    assert operation["action"] == "receive"
    assert operation["bindings"]["amqp"]["cc"] == [queue.routing_key]
    payload = _payload(document, _consumed_channel(queue))
    assert payload["title"] == model.model_config.get("title")
    assert set(payload["properties"]) == set(model.model_fields)


@pytest.mark.parametrize("routing_key", list(RESULT_EVENTS))
def test_every_result_event_is_published_to_the_events_exchange(
    document: dict[str, Any], routing_key: str
) -> None:
    channel = document["channels"][routing_key]
    model = RESULT_EVENTS[routing_key]
    operation = document["operations"][f"send{model.__name__}"]

    assert channel["address"] == routing_key
    assert channel["bindings"]["amqp"]["exchange"] == {
        "name": EVENTS_EXCHANGE,
        "type": "topic",
        "durable": True,
        "autoDelete": False,
        "vhost": "/",
    }
    assert operation["action"] == "send"
    assert operation["bindings"]["amqp"]["cc"] == [routing_key]
    assert operation["bindings"]["amqp"]["deliveryMode"] == 2  # persistent
    assert operation["bindings"]["amqp"]["mandatory"] is True
    payload = _payload(document, routing_key)
    assert payload["title"] == model.model_config.get("title")
    assert set(payload["properties"]) == set(model.model_fields)


def test_the_document_names_no_other_channel(document: dict[str, Any]) -> None:
    assert set(document["channels"]) == {
        *(_consumed_channel(queue) for queue in SUBSCRIBED_QUEUES),
        *RESULT_EVENTS,
    }


EVENT_NAMES = {
    "fulfilment.order-placed": ("OrderPlacedV1", "OrderPlaced v1"),
    "fulfilment.order-cancelled": ("OrderCancelledV1", "OrderCancelled v1"),
    "fulfilment.order-shipped": ("OrderShippedV1", "OrderShipped v1"),
    "stock.reserved": ("StockReservedV1", "StockReserved v1"),
    "stock.rejected": ("StockRejectedV1", "StockRejected v1"),
    "stock.released": ("StockReleasedV1", "StockReleased v1"),
    "stock.shipped": ("StockShippedV1", "StockShipped v1"),
    "stock.cancel_refused": ("StockCancelRefusedV1", "StockCancelRefused v1"),
    "stock.adjusted": ("StockAdjustedV1", "StockAdjusted v1"),
    "stock.shortage": ("StockShortageV1", "StockShortage v1"),
}
"""Each channel's message as another team reads it: its name and its title."""


def test_every_message_is_named_and_titled_for_its_event_with_a_summary(
    document: dict[str, Any],
) -> None:
    named = {}
    for key, channel in document["channels"].items():
        ((message_key, reference),) = channel["messages"].items()
        message = _follow(document, reference["$ref"])
        assert message_key == message["name"], key
        assert message["summary"], key
        assert "``" not in message["summary"], key
        named[key] = (message["name"], message["title"])

    # The events above are pinned; a route added since is named by its model.
    added = {
        route.transport.name: (route.model.__name__, route.model.model_config["title"])
        for route in asyncapi.QUEUE_ROUTES
        if route.transport.name not in EVENT_NAMES
    }
    assert named == {**EVENT_NAMES, **added}
    assert set(document["components"]["messages"]) == {name for name, _ in named.values()}
    assert set(document["operations"]) == {
        *(f"receive{route.model.__name__}" for route in asyncapi.QUEUE_ROUTES),
        *(f"send{model.__name__}" for model in RESULT_EVENTS.values()),
    }
    for key, operation in document["operations"].items():
        (reference,) = operation["messages"]
        message = _follow(document, reference["$ref"])
        assert _follow(document, message["$ref"])["name"] == key.removeprefix(operation["action"])


def test_a_new_result_event_is_named_by_its_model(monkeypatch: pytest.MonkeyPatch) -> None:
    class StockCancelRefusedV1(RESULT_EVENTS["stock.released"]):
        """``stock.cancel_refused``: the cancel came after the order shipped."""

        model_config = ConfigDict(title="StockCancelRefused v1")

    monkeypatch.setattr(
        asyncapi, "RESULT_EVENTS", {**RESULT_EVENTS, "stock.cancel_refused": StockCancelRefusedV1}
    )
    document = json.loads(asyncapi.asyncapi_document())

    ((name, reference),) = document["channels"]["stock.cancel_refused"]["messages"].items()
    message = _follow(document, reference["$ref"])
    assert (name, message["name"], message["title"]) == (
        "StockCancelRefusedV1",
        "StockCancelRefusedV1",
        "StockCancelRefused v1",
    )
    assert message["summary"] == "stock.cancel_refused: the cancel came after the order shipped."
    assert document["operations"]["sendStockCancelRefusedV1"]["action"] == "send"


def test_every_message_has_a_payload_with_properties(document: dict[str, Any]) -> None:
    for channel in document["channels"]:
        payload = _payload(document, channel)

        assert payload.get("type") == "object", channel
        assert payload.get("properties"), f"{channel} has an empty payload"
        assert {"version", "event_id"} <= set(payload["properties"]), channel
        # What it reports on: an order, or for an event about a SKU, the SKU.
        assert len({"order_id", "sku"} & set(payload["required"])) >= 1, channel


EXAMPLES = RESULT_EVENT_EXAMPLES | SKU_EVENT_EXAMPLES


@pytest.mark.parametrize("routing_key", list(EXAMPLES))
def test_the_example_result_events_are_valid_by_the_published_schema(
    document: dict[str, Any], routing_key: str
) -> None:
    validator = _validator(document, routing_key)

    validator.validate(EXAMPLES[routing_key])
    without_version = {k: v for k, v in EXAMPLES[routing_key].items() if k != "version"}
    assert not validator.is_valid(without_version)


def test_the_example_order_is_valid_by_the_published_schema(document: dict[str, Any]) -> None:
    validator = _validator(document, "fulfilment.order-placed")

    validator.validate(ORDER_PLACED_EXAMPLE)
    assert not validator.is_valid({**ORDER_PLACED_EXAMPLE, "lines": []})


def test_the_rejection_reasons_are_published_as_an_enumeration(document: dict[str, Any]) -> None:
    validator = _validator(document, "stock.rejected")
    rejected = RESULT_EVENT_EXAMPLES["stock.rejected"]

    for reason in ("insufficient_stock", "unknown_sku", "cancelled"):
        validator.validate({**rejected, "reason": reason})
    assert not validator.is_valid({**rejected, "reason": "out_of_stock"})


async def _no_database() -> None:
    return None


async def test_the_documented_queues_are_the_ones_the_worker_subscribes(
    document: dict[str, Any],
) -> None:
    worker = build_worker(
        Settings(),
        stock=FakeStock(),
        database_ping=_no_database,
        dead_letter_publisher=in_memory_dead_letters,
    )
    subscribed = AsyncAPI(worker.broker).to_specification().to_jsonable()

    def queues(spec: dict[str, Any]) -> set[tuple[str, str]]:
        return {
            (channel["bindings"]["amqp"]["queue"]["name"], channel["address"])
            for channel in spec["channels"].values()
            if channel["bindings"]["amqp"]["is"] == "queue"
        }

    assert queues(subscribed) == queues(document)
    assert queues(document) == {(queue.name, queue.routing_key) for queue in SUBSCRIBED_QUEUES}


def test_a_new_route_is_in_the_document_with_its_model(monkeypatch: pytest.MonkeyPatch) -> None:
    new_queue = SubscribedQueue(
        "order_returned", "order.returned", "fulfilment.order-returned", "x.dlq"
    )
    new_route = replace(asyncapi.QUEUE_ROUTES[0], transport=new_queue, summary="Returned.")
    monkeypatch.setattr(asyncapi, "QUEUE_ROUTES", (*asyncapi.QUEUE_ROUTES, new_route))

    document = json.loads(asyncapi.asyncapi_document())

    channel = document["channels"]["fulfilment.order-returned"]
    assert channel["bindings"]["amqp"]["queue"]["name"] == "fulfilment.order-returned"
    assert "fulfilment.order-returned" in {m.channel for m in asyncapi.documented_messages()}
