"""What a route's handler uses: how it parses a body, what it returns, and what it raises.

A handler (one per input event, in its route: ``fulfilment.routes.table``) is a plain function
of the raw body: it parses the body (:func:`parse_event`), applies the event's command and
returns what it made of the event (:class:`Handled`), or raises :class:`MalformedEventError`
or :class:`EventRefusedError`. These are the transport's to act on: the worker's delivery
policy (``fulfilment.worker.delivery``), which runs every handler the same way, imports them
too; a handler never imports the policy.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar
from uuid import UUID

from pydantic import BaseModel, ValidationError

from fulfilment.contracts.envelope import JSON_CONTENT_TYPES, MAX_BODY_BYTES, find_ambiguity

EventT = TypeVar("EventT", bound=BaseModel)


class MalformedEventError(Exception):
    """The body can never become the subscription's event; ``str(error)`` says why, in one line."""


class EventRefusedError(Exception):
    """A well-formed event that the handler refuses as things stand: dead-lettered ``permanent``.

    Unlike a malformed body, the event may apply later, once what it needs exists, and then an
    operator replays it (the shipment of an order that is not reserved yet is the example).
    Raised after the use case ran and changed nothing.

    Args:
        reason: a fixed label from the handler's closed list (``order_not_reserved``): the
            ``reason`` of ``fulfilment_events_total{outcome="dead_lettered"}`` and the start of
            the dead letter's ``x-fulfilment-reason``.
        detail: the rest of that header, one line for operators (which order, in which state).
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Handled:
    """What a handler made of one event: the policy logs it and counts it, once.

    ``outcome`` is the log line's label (``reserved``, ``rejected:unknown_sku``,
    ``duplicate:event``); ``labels`` are the ``(outcome, reason)`` of
    ``fulfilment_events_total`` (its ``event`` label is the subscription's name), from the
    route's fixed list (``Route.outcomes``), bound at 0 by ``observability.metrics``;
    ``latency_since`` is the moment the event happened, from which the end-to-end latency is
    observed, or None to observe none (a duplicate); ``log_fields`` are more fields of the log
    line, such as the SKUs an order was rejected for. ``order_id`` is the order the event
    named; None for an event about a SKU (an adjustment of the warehouse's stock).
    """

    event_id: UUID
    order_id: UUID | None
    outcome: str
    labels: tuple[str, str]
    latency_since: datetime | None = None
    log_fields: Mapping[str, object] = field(default_factory=dict)


Handler = Callable[[bytes], Awaitable[Handled]]
"""An event's handler: the raw body in, what it made of the event out. It runs in the
delivery's span, whose context the stock adapter writes beside the result events the
event causes (``outbox.traceparent``) and beside the warehouse requests it records
(``warehouse_requests.traceparent``).

It raises :class:`MalformedEventError` for a body that can never be its event,
:class:`EventRefusedError` for an event it refuses as things stand, and
:class:`~fulfilment.application.ports.TransientError` when the store failed past its retry
budget; anything else it raises is dead-lettered as ``unexpected``.
"""


def check_body(body: bytes, content_type: str | None) -> None:
    """Refuse a body that no event of the contract can be, before it is parsed.

    Raises:
        MalformedEventError: the content type is not JSON, or the body is larger than
            :data:`MAX_BODY_BYTES`.
    """
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    if media_type not in JSON_CONTENT_TYPES:
        msg = f"content type {content_type!r} is not JSON"
        raise MalformedEventError(msg)
    if len(body) > MAX_BODY_BYTES:
        msg = f"body of {len(body)} bytes exceeds the limit of {MAX_BODY_BYTES}"
        raise MalformedEventError(msg)


def parse_event(model: type[EventT], body: bytes) -> EventT:
    """Validate ``body`` (UTF-8 JSON) as ``model``, under the model's own (strict) config.

    A body the model accepts is refused all the same when another JSON parser could read it
    differently (``contracts.envelope.find_ambiguity``: a key twice, ``NaN``, an integer
    beyond 2**53, ``true`` or ``1.0`` where an integer is expected): what the service
    reserves must be what every consumer of the same message reads.

    Raises:
        MalformedEventError: not UTF-8 JSON, not the model's shape, or ambiguous; the message
            names the model by its title and lists the first few problems, in one line.
    """
    try:
        event = model.model_validate_json(body)
    except ValidationError as error:
        raise MalformedEventError(_describe(error)) from error
    ambiguity = find_ambiguity(body, model)
    if ambiguity is not None:
        title = model.model_config.get("title") or model.__name__
        msg = f"invalid {title}: {ambiguity}"
        raise MalformedEventError(msg)
    return event


def _describe(error: ValidationError, limit: int = 5) -> str:
    problems = [
        f"{'.'.join(str(part) for part in problem['loc']) or 'body'}: {problem['msg']}"
        for problem in error.errors(include_url=False, include_input=False)[:limit]
    ]
    more = error.error_count() - limit
    if more > 0:
        problems.append(f"and {more} more")
    return f"invalid {error.title}: " + "; ".join(problems)
