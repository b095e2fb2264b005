"""What every input event of the contract shares, whatever its type (product contract).

Every event (``OrderPlaced``, and the events of the reservation lifecycle after it) is a JSON
object in UTF-8 carrying its own ``event_id``, the idempotency key, and the ``order_id`` it is
about. Each event type has its strict model beside this module (``order_placed``); the
envelope is read leniently, for what the worker needs before or without that model.
"""

from __future__ import annotations

from uuid import UUID

from pydantic import BaseModel, ConfigDict, ValidationError

JSON_CONTENT_TYPES = frozenset({"", "application/json", "text/json"})
"""Content types accepted for an event body; empty means the producer sent none."""

MAX_BODY_BYTES = 1_048_576
"""A body larger than 1 MiB is refused before parsing, whatever the event; the largest
``OrderPlaced`` the contract allows (1,000 lines) fits in about 60 KiB."""


class EventEnvelope(BaseModel):
    """The ids of an event, read without the event type's own rules (unknown fields ignored)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    event_id: UUID
    order_id: UUID | None = None


def read_envelope(body: bytes) -> EventEnvelope | None:
    """The envelope of ``body``, or None when ``body`` is not a JSON object with an event id."""
    try:
        return EventEnvelope.model_validate_json(body)
    except ValidationError:
        return None
