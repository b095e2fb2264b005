"""``OrderPlaced`` version 1, as published by checkout to exchange ``orders`` (``order.placed``).

Validation is strict JSON (no string-to-number coercion) over the raw body; unknown fields are
ignored because producers add fields before consumers know them (docs/design.md, "How it
works"). Bounds: the largest order of the Online Retail data has 675 lines and its largest
quantity is 80,995 units (2,880 in its December 2010 files), well inside :data:`MAX_LINES`
and :data:`MAX_QUANTITY`.

Every value the model accepts is one PostgreSQL stores as it was sent, through asyncpg into the
columns ``place_orders()`` writes (``migrations/``): a SKU holds no NUL (``text`` cannot),
``placed_at`` is an instant the driver can send, the summed demand of a SKU fits ``integer``.
What storage cannot hold is refused here, so the worker dead-letters it as ``permanent`` on its
first delivery with the reason, instead of failing in the database as ``unexpected``.
``tests/integration/test_postgres_wire_values.py`` sends generated bodies through the real
database to hold the model to this.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal
from uuid import UUID

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
)
from pydantic_core import PydanticCustomError

from fulfilment.domain.model import OrderLine, PlaceOrder

MAX_LINES = 1_000
"""Lines per order; the real data's largest order has 675."""

MAX_QUANTITY = 1_000_000
"""Units per line; the largest line of the Online Retail data set (2010-2011) has 80,995."""

MAX_UNITS_PER_SKU = MAX_LINES * MAX_QUANTITY
"""Most units of one SKU an order can ask for (its lines of that SKU summed): 1,000,000,000.

It must fit PostgreSQL's ``integer`` (2,147,483,647), the type of ``reservation_lines.quantity``
and of the sums in ``place_orders()``; a unit test holds the two bounds together."""

MAX_SKU_LENGTH = 64
"""Characters per stock code; real codes run from ``D`` to ``gift_0001_40`` and ``BANK CHARGES``.

At most 256 bytes of UTF-8, far below what a btree index entry (the primary keys of
``stock_levels`` and ``reservation_lines``) may hold, about 2,700 bytes."""

EARLIEST_PLACED_AT = datetime.min.replace(tzinfo=UTC)
"""``placed_at`` must be later than this instant (0001-01-01T00:00:00Z), see :data:`PlacedAt`."""

LATEST_PLACED_AT = datetime.max.replace(tzinfo=UTC)
"""``placed_at`` must be earlier than this instant (9999-12-31T23:59:59.999999Z)."""

_PLACEHOLDER_UUIDS = frozenset({UUID(int=0), UUID(int=(1 << 128) - 1)})


SKU_NUL_PROBLEM = "must not contain NUL (U+0000): PostgreSQL text cannot store it"
"""Why a SKU with U+0000 is refused, wherever one is read (an event, a stock file, a data set):
PostgreSQL's ``text`` cannot hold that character in any encoding."""


def _storable_sku(sku: str) -> str:
    # Every other character of a Python string that JSON can carry (lone surrogates are
    # refused by the parser) PostgreSQL stores as is.
    if "\x00" in sku:
        refusal = PydanticCustomError("sku_nul", SKU_NUL_PROBLEM)
        raise refusal
    return sku


def _storable_instant(instant: datetime) -> datetime:
    # asyncpg sends a timestamptz as its UTC instant: one before year 1 or after year 9999
    # has no Python datetime and fails in the driver, and the first and the last Python
    # instants are sent as PostgreSQL's -infinity and infinity, another value than was sent.
    try:
        inside = EARLIEST_PLACED_AT < instant.astimezone(UTC) < LATEST_PLACED_AT
    except OverflowError:
        inside = False
    if not inside:
        refusal = PydanticCustomError(
            "instant_out_of_range",
            "must lie strictly between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59.999999Z"
            " in UTC, the instants the database driver can store",
        )
        raise refusal
    return instant


def _minted(identifier: UUID) -> UUID:
    # Storable, but never minted for one event: a producer sending a placeholder for every
    # event would see all but the first answered as duplicates, acknowledged and never reserved.
    if identifier in _PLACEHOLDER_UUIDS:
        refusal = PydanticCustomError(
            "uuid_placeholder",
            "must not be the nil or the max UUID, which are placeholders, not minted ids",
        )
        raise refusal
    return identifier


Sku = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_SKU_LENGTH, pattern=r"^\S(?:.*\S)?$"),
    AfterValidator(_storable_sku),
]
"""A stock code: case-sensitive, inner spaces allowed, no leading or trailing white space
(Unicode's), no line feed, no NUL; :func:`sku_problem` says which rule a string breaks."""

_SKU = TypeAdapter(Sku)

_SKU_PROBLEMS = {
    "string_too_short": "is empty",
    "string_too_long": f"is longer than {MAX_SKU_LENGTH} characters",
    # The pattern's "." takes any character but a line feed, and "\S" is Unicode's.
    "string_pattern_mismatch": "must not start or end with white space, nor contain a line feed",
    "sku_nul": SKU_NUL_PROBLEM,
}


def sku_problem(sku: str) -> str | None:
    """Why the event contract refuses ``sku`` (:data:`Sku`), in words, or None when it takes it.

    The readers of stock files and data sets check their SKUs with it, so that a file never
    loads a SKU that no event could name, and never refuses one that an event could: one set of
    rules, the contract's. The words fit after "sku" or "StockCode": ``is empty``, ``is longer
    than 64 characters``, ``must not start or end with white space, nor contain a line feed``,
    :data:`SKU_NUL_PROBLEM`.
    """
    try:
        _SKU.validate_python(sku)
    except ValidationError as error:
        first = error.errors()[0]
        return _SKU_PROBLEMS.get(first["type"], first["msg"])
    return None


def shown_sku(sku: str) -> str:
    """``sku`` quoted for a message, cut after :data:`MAX_SKU_LENGTH` characters when longer."""
    if len(sku) <= MAX_SKU_LENGTH:
        return repr(sku)
    return f"{sku[:MAX_SKU_LENGTH]!r}... ({len(sku)} characters)"


EventTime = Annotated[AwareDatetime, AfterValidator(_storable_instant)]
"""When something happened to an order (``placed_at``, ``cancelled_at``, ``shipped_at``): with
a UTC offset (any, below 24 hours), and strictly between :data:`EARLIEST_PLACED_AT` and
:data:`LATEST_PLACED_AT` once converted to UTC."""

PlacedAt = EventTime
"""When the order was placed (:data:`EventTime`)."""

MintedUuid = Annotated[UUID, AfterValidator(_minted)]
"""An id the producer minted: any UUID but the nil and the max one (RFC 9562, 5.9 and 5.10)."""


class OrderLineV1(BaseModel):
    """One order line on the wire."""

    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")

    sku: Sku
    quantity: Annotated[int, Field(ge=1, le=MAX_QUANTITY)]


OrderLines = Annotated[list[OrderLineV1], Field(min_length=1, max_length=MAX_LINES)]
"""The lines of an event: at least one, at most :data:`MAX_LINES`; a SKU may repeat."""


class OrderPlacedV1(BaseModel):
    """The ``OrderPlaced`` event, version 1 (an example: docs/events.md, "Example messages")."""

    # The title names the event in a refusal's reason ("invalid OrderPlaced v1: ...").
    model_config = ConfigDict(strict=True, frozen=True, extra="ignore", title="OrderPlaced v1")

    version: Literal[1]
    event_id: MintedUuid
    order_id: MintedUuid
    placed_at: PlacedAt
    lines: OrderLines

    def to_command(self) -> PlaceOrder:
        """Translate to the domain command (pydantic does not cross into the application)."""
        return PlaceOrder(
            event_id=self.event_id,
            order_id=self.order_id,
            placed_at=self.placed_at,
            lines=tuple(OrderLine(line.sku, line.quantity) for line in self.lines),
        )


def order_placed_body(
    *,
    event_id: UUID,
    order_id: UUID,
    placed_at: datetime,
    lines: list[tuple[str, int]],
) -> bytes:
    """Serialise an ``OrderPlaced`` v1 body (UTF-8 JSON), as producers send it.

    Raises:
        pydantic.ValidationError: the event would break the contract (e.g. a naive ``placed_at``).
    """
    event = OrderPlacedV1(
        version=1,
        event_id=event_id,
        order_id=order_id,
        placed_at=placed_at,
        lines=[OrderLineV1(sku=sku, quantity=quantity) for sku, quantity in lines],
    )
    return event.model_dump_json().encode()
