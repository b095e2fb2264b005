"""The result events the service publishes to ``fulfilment.events``, version 1.

What the service decided about an order, one event per change of a reservation's status and
per partial cancel that releases stock (docs/design.md, "The outbox"), and one per
cancel the warehouse system refused (``stock.cancel_refused``); and about a SKU, one per
adjustment of its stock (``stock.adjusted``) and per change of its shortfall
(``stock.shortage``), which carry the SKU where the others carry the order. The bodies are
built in SQL by the functions that make the change (``place_orders()``, ``cancel_orders()``,
``ship_orders()``, ``record_adjustments()``, the trigger of ``stock_levels``; a refused
cancel's and an accepted one's by the dispatcher's store,
``adapters.postgres.warehouse_requests``), written to the outbox in the same transaction
and published by the relay as they were written, with the routing key of the event's model
(:data:`RESULT_EVENTS`).

These models are the published contract: consumers (and the service's own tests) validate a
body with :func:`parse_result_event`, and ``docs/asyncapi.json`` publishes their JSON schemas
(``fulfilment.asyncapi``). They are as strict as the input models (``contracts.order_placed``):
strict JSON, ``version`` the integer 1, ids that are minted UUIDs, ``occurred_at`` with a UTC
offset, lines and SKUs in the order the SQL writes them, each SKU once. Unknown fields are
ignored, so that the service can add one before every consumer knows it.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import pairwise
from typing import Annotated, ClassVar, Literal, TypeAlias

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field
from pydantic_core import PydanticCustomError

from fulfilment.contracts.order_placed import MintedUuid, Sku
from fulfilment.domain.model import RejectionReason
from fulfilment.domain.warehouse_events import AdjustmentReason

STOCK_RESERVED_ROUTING_KEY = "stock.reserved"
STOCK_REJECTED_ROUTING_KEY = "stock.rejected"
STOCK_RELEASED_ROUTING_KEY = "stock.released"
STOCK_SHIPPED_ROUTING_KEY = "stock.shipped"
STOCK_CANCEL_REFUSED_ROUTING_KEY = "stock.cancel_refused"
STOCK_ADJUSTED_ROUTING_KEY = "stock.adjusted"
STOCK_SHORTAGE_ROUTING_KEY = "stock.shortage"


def _ascending_skus(skus: list[str]) -> list[str]:
    # The SQL sorts with COLLATE "C", byte order, which for UTF-8 is the code point order that
    # Python compares strings by; strictly ascending also says each SKU is there once.
    if any(earlier >= later for earlier, later in pairwise(skus)):
        refusal = PydanticCustomError(
            "skus_not_ascending", "must be sorted by SKU (code point order), each SKU once"
        )
        raise refusal
    return skus


def _ascending_lines(lines: list[StockLineV1]) -> list[StockLineV1]:
    _ascending_skus([line.sku for line in lines])
    return lines


class StockLineV1(BaseModel):
    """Units of one SKU in a result event: reserved, released or shipped by it."""

    model_config = ConfigDict(
        strict=True,
        frozen=True,
        extra="ignore",
        title="StockLine v1",
        use_attribute_docstrings=True,
    )

    sku: Sku
    quantity: Annotated[int, Field(ge=1)]
    """Units, summed over the order's lines of the SKU; at least 1."""


StockLines = Annotated[list[StockLineV1], Field(min_length=1), AfterValidator(_ascending_lines)]
"""At least one line, one per SKU, sorted by SKU."""

Skus = Annotated[list[Sku], Field(min_length=1), AfterValidator(_ascending_skus)]
"""At least one SKU, each once, sorted."""


class ResultEventV1(BaseModel):
    """The fields every result event carries.

    The docstring under each field is its description in the published JSON schema
    (``use_attribute_docstrings``).
    """

    ROUTING_KEY: ClassVar[str]
    """The routing key on ``fulfilment.events``, also the message's AMQP ``type``."""

    model_config = ConfigDict(
        strict=True, frozen=True, extra="ignore", use_attribute_docstrings=True
    )

    version: Literal[1]
    """The contract's version: the integer 1."""
    event_id: MintedUuid
    """Minted with the event and the same on every publication of it (the relay publishes at
    least once): the consumer's idempotency key, also the AMQP ``message_id``."""
    causation_id: MintedUuid
    """The ``event_id`` of the input event (``OrderPlaced``, ``OrderCancelled``,
    ``OrderShipped``) whose change this event reports; for a shipment or a cancellation of the
    warehouse, the UUID derived from its ``shipment_id`` or ``cancellation_id`` (version 5,
    the same whichever webhook or poll brought it)."""
    order_id: MintedUuid
    """The order; also the AMQP ``correlation_id``."""
    occurred_at: AwareDatetime
    """When the change's transaction ran, ISO 8601 with a UTC offset."""


class StockReservedV1(ResultEventV1):
    """``stock.reserved``: the order's lines are reserved (its status became ``reserved``)."""

    ROUTING_KEY: ClassVar[str] = STOCK_RESERVED_ROUTING_KEY
    # The title names the event in a refusal's reason and in the AsyncAPI document.
    model_config = ConfigDict(title="StockReserved v1")

    lines: StockLines
    """What was reserved, merged per SKU."""


class StockRejectedV1(ResultEventV1):
    """``stock.rejected``: the order was rejected, nothing reserved (status ``rejected``)."""

    ROUTING_KEY: ClassVar[str] = STOCK_REJECTED_ROUTING_KEY
    model_config = ConfigDict(title="StockRejected v1")

    reason: RejectionReason
    """``insufficient_stock``, ``unknown_sku`` (which wins when both apply), or ``cancelled``:
    cancelled before it was placed, so that nothing remained to reserve."""
    skus: Skus
    """The SKUs short of stock or unknown; for ``cancelled``, the SKUs the order asked for."""


ReleaseReason = Literal["cancelled", "warehouse_cancelled"]
"""Who cancelled what a ``stock.released`` gave back: the shop (``OrderCancelled``) or the
warehouse (its own cancellation)."""


class StockReleasedV1(ResultEventV1):
    """``stock.released``: a cancel gave reserved units back, of the whole order or a part."""

    ROUTING_KEY: ClassVar[str] = STOCK_RELEASED_ROUTING_KEY
    model_config = ConfigDict(title="StockReleased v1")

    lines: StockLines
    """What this cancel released."""
    order_status: Literal["released", "reserved", "shipped"]
    """The order's status after it: ``released`` when it holds nothing any more and none of
    it shipped, ``shipped`` when it holds nothing and the warehouse shipped some of it,
    ``reserved`` when it still holds units (a partial cancel)."""
    reason: ReleaseReason | None = None
    """``cancelled`` (the shop's ``OrderCancelled``) or ``warehouse_cancelled`` (the
    warehouse's own cancellation); absent from events written before it was added."""
    warehouse_reason: str | None = None
    """The warehouse's reason (``unfulfillable``, ...), as it sent it, for
    ``warehouse_cancelled``; null otherwise."""


class StockShippedV1(ResultEventV1):
    """``stock.shipped``: units of the order left the warehouse, with a shipment or all it held.

    A shipment of the warehouse takes the units it shipped that the order held (the order
    stays ``reserved`` while it holds more); the upstream ``OrderShipped`` ships every unit the
    order still held.
    """

    ROUTING_KEY: ClassVar[str] = STOCK_SHIPPED_ROUTING_KEY
    model_config = ConfigDict(title="StockShipped v1")

    lines: StockLines
    """What was shipped: ``on_hand`` and ``reserved`` went down by these units."""
    shipment_id: str | None = None
    """The warehouse's id of the shipment; null for the upstream ``OrderShipped``, and absent
    from events written before it was added."""
    carrier: str | None = None
    """The carrier's name, when the warehouse gave one."""
    tracking_numbers: list[str] = []
    """The shipment's tracking numbers, one per package, in the warehouse's order; empty when
    it gave none (and for the upstream ``OrderShipped``)."""
    tracking_url: str | None = None
    """Where to follow the shipment, when the warehouse gave one."""
    order_status: Literal["reserved", "shipped"] | None = None
    """The order's status after it: ``reserved`` while it still holds units (a partial
    shipment), ``shipped`` when it holds none; absent from events written before it was
    added."""


class StockCancelRefusedV1(ResultEventV1):
    """``stock.cancel_refused``: the warehouse system refused a cancel (``too_late``).

    Picking had begun: nothing was released, the order stays ``reserved`` and will ship. Only
    with the hand-off to the warehouse system on (docs/design.md, "Warehouse hand-off"); the
    ``causation_id`` is the ``OrderCancelled`` refused.
    """

    ROUTING_KEY: ClassVar[str] = STOCK_CANCEL_REFUSED_ROUTING_KEY
    model_config = ConfigDict(title="StockCancelRefused v1")

    lines: StockLines | None
    """The units the cancel asked for (of those the order held), merged per SKU; null when
    it cancelled the whole order."""
    warehouse_id: Annotated[str, Field(min_length=1)]
    """The warehouse system's id of the order."""


Units = Annotated[int, Field(ge=0)]
"""A count of units of a SKU, 0 or more."""


class SkuEventV1(BaseModel):
    """The fields every result event about a SKU carries: ``stock.adjusted``, ``stock.shortage``.

    As :class:`ResultEventV1`'s, with the SKU in place of the order. The relay publishes the
    events of one SKU in the order they were written; the AMQP ``correlation_id`` is the SKU.
    """

    ROUTING_KEY: ClassVar[str]
    """The routing key on ``fulfilment.events``, also the message's AMQP ``type``."""

    model_config = ConfigDict(
        strict=True, frozen=True, extra="ignore", use_attribute_docstrings=True
    )

    version: Literal[1]
    """The contract's version: the integer 1."""
    event_id: MintedUuid
    """Minted with the event and the same on every publication of it: the consumer's
    idempotency key, also the AMQP ``message_id``."""
    occurred_at: AwareDatetime
    """When the change's transaction ran, ISO 8601 with a UTC offset."""
    sku: Sku
    """The SKU; also the AMQP ``correlation_id``."""
    on_hand: Units
    """Units of the SKU on hand after the change."""
    reserved: Units
    """Units of the SKU promised to orders after the change; more than ``on_hand`` when the
    SKU is short."""


class StockAdjustedV1(SkuEventV1):
    """``stock.adjusted``: the warehouse (or an operator) changed the SKU's ``on_hand``.

    A receipt, a return, units found or counted, damaged or lost, once per ``adjustment_id``.
    ``on_hand`` never goes below 0: a loss of more than was on hand takes it to 0
    (``applied``), and the rest is kept as a discrepancy. ``reserved`` is unchanged, so a loss
    may leave the SKU short (``stock.shortage`` says so).
    """

    ROUTING_KEY: ClassVar[str] = STOCK_ADJUSTED_ROUTING_KEY
    model_config = ConfigDict(title="StockAdjusted v1")

    causation_id: MintedUuid
    """The UUID derived from the ``adjustment_id`` (version 5, the same whichever webhook
    brought it)."""
    adjustment_id: Annotated[str, Field(min_length=1)]
    """The warehouse's id of the adjustment (an operator's: ``op-<uuid>``)."""
    delta: int
    """The units of the adjustment, as sent: positive onto the shelf, negative off it."""
    applied: int
    """The units ``on_hand`` changed by: ``delta``, or less of a loss than ``delta`` when
    fewer units were on hand."""
    reason: AdjustmentReason
    """``received``, ``returned``, ``found``, ``counted``, ``damaged`` or ``lost``."""
    source: Literal["webhook", "operator"]
    """Who reported it: the warehouse's webhook, or an operator (``fulfilment stock
    adjust``)."""
    available: Units
    """What can still be promised after it: ``max(0, on_hand - reserved)``."""


class StockShortageV1(SkuEventV1):
    """``stock.shortage``: the SKU's shortfall changed (``short`` 0: settled).

    A reported loss may leave more units reserved than on hand; the SKU is then short by
    ``reserved - on_hand`` and no new order reserves it until the warehouse's cancellations,
    shipments or a receipt settle it. One event per change of the shortfall, whichever change
    made it; no ``causation_id``.
    """

    ROUTING_KEY: ClassVar[str] = STOCK_SHORTAGE_ROUTING_KEY
    model_config = ConfigDict(title="StockShortage v1")

    short: Units
    """Units reserved beyond ``on_hand``: ``max(0, reserved - on_hand)``; 0 when it settled."""


OrderResultEvent: TypeAlias = (
    StockReservedV1 | StockRejectedV1 | StockReleasedV1 | StockShippedV1 | StockCancelRefusedV1
)
"""A result event about an order."""

ResultEvent: TypeAlias = OrderResultEvent | StockAdjustedV1 | StockShortageV1
"""Any result event."""

RESULT_EVENTS: Mapping[str, type[ResultEvent]] = {
    model.ROUTING_KEY: model
    for model in (
        StockReservedV1,
        StockRejectedV1,
        StockReleasedV1,
        StockShippedV1,
        StockCancelRefusedV1,
        StockAdjustedV1,
        StockShortageV1,
    )
}
"""Every result event's model by its routing key, in the order docs/events.md lists them."""

RESULT_ROUTING_KEYS: tuple[str, ...] = tuple(RESULT_EVENTS)
"""The routing keys of the result events on ``fulfilment.events``, also each message's AMQP
``type``: the models' ``ROUTING_KEY``, in the same order."""


class UnknownRoutingKeyError(ValueError):
    """A routing key that names no result event; ``str(error)`` names it and the known ones."""


def parse_result_event(routing_key: str, body: bytes | str) -> ResultEvent:
    """Validate a published body (UTF-8 JSON) as the result event its routing key names.

    For consumers of ``fulfilment.events`` and the service's tests: the routing key (equal to
    the AMQP ``type``) picks the model of :data:`RESULT_EVENTS`.

    Raises:
        UnknownRoutingKeyError: ``routing_key`` is none of ``stock.reserved``,
            ``stock.rejected``, ``stock.released``, ``stock.shipped``,
            ``stock.cancel_refused``, ``stock.adjusted``, ``stock.shortage``.
        pydantic.ValidationError: the body breaks that event's contract (a missing field, a
            time without offset, an unknown reason, a quantity of 0, unsorted lines ...).
    """
    model = RESULT_EVENTS.get(routing_key)
    if model is None:
        known = ", ".join(RESULT_EVENTS)
        msg = f"routing key {routing_key!r} names no result event (known: {known})"
        raise UnknownRoutingKeyError(msg)
    return model.model_validate_json(body)


def subject_of(event: ResultEvent) -> str:
    """What ``event`` reports on, as its message's ``correlation_id``: order id or SKU."""
    if isinstance(event, SkuEventV1):
        return event.sku
    return str(event.order_id)
