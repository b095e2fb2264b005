"""What a route is made of: :class:`Route`, its transport and its SQL function.

The list of routes is ``fulfilment.routes.table.ROUTES``; ``docs/development.md``, "Adding an
input event", says what a new one needs. :func:`line_arrays` and :func:`row_lines` are how the
routes' SQL functions take and give back lines.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from pydantic import BaseModel

from fulfilment.contracts.topology import SubscribedQueue
from fulfilment.domain.model import Command, OrderLine

if TYPE_CHECKING:
    from fulfilment.application.ports import Stock
    from fulfilment.domain.warehouse_events import Source
    from fulfilment.routes.handling import Handled

EventT = TypeVar("EventT", bound=BaseModel)
CommandT = TypeVar("CommandT", bound=Command[Any])
OutcomeT = TypeVar("OutcomeT")


@dataclass(frozen=True, slots=True)
class WebhookType:
    """The warehouse's webhooks of one ``type``, posted to ``POST /webhooks/warehouse``.

    The intake (``fulfilment webhooks``) verifies a webhook's signature, reads its envelope
    (``contracts.warehouse_events.WebhookEnvelope``) and hands the ``data`` of a type it
    takes to the route of that type (``routes.warehouse.WEBHOOK_ROUTES``); the dispatcher's poll
    hands the same objects, found by ``GET /fulfilment-orders/{id}``, to the same routes.

    Attributes:
        event: the event in snake case (``shipment_shipped``): the ``event`` label of its
            metrics and the prefix of its log lines, as a queue's.
        type: the webhook's ``type`` (``shipment.shipped``), recorded in ``webhook_inbox``.
    """

    event: str
    type: str


Transport = SubscribedQueue | WebhookType
"""How a route's events arrive: a queue bound to ``orders`` with its DLQ, which the worker
consumes, or the warehouse's webhooks of one type, which the intake receives (and the
dispatcher's poll finds). What serves only queues (``SUBSCRIBED_QUEUES``, the worker's
subscriptions and metrics, the broker's definitions, the KEDA triggers, the AsyncAPI
channels) takes the routes whose transport is a :class:`SubscribedQueue`."""


class RouteHandler(Protocol):
    """A route's handler: the raw body and the stock store in, what it made of the event out.

    It raises ``MalformedEventError`` for a body that can never be its event,
    ``EventRefusedError`` for an event it refuses as things stand, and ``TransientError``
    when the store failed past its retry budget (``fulfilment.routes.handling``).
    """

    def __call__(self, body: bytes, *, stock: Stock) -> Awaitable[Handled]:
        """Handle one event's ``body``."""
        ...


class WebhookHandler(Protocol):
    """A webhook route's handler: the JSON of a webhook's ``data`` object and how it came in.

    ``webhook_id`` is the ``webhook-id`` that brought it, None when the dispatcher's poll found
    it (``source`` says which). It raises ``MalformedEventError`` for ``data`` that is not a
    valid event of its type (the intake answers 422 and keeps the webhook), and
    ``TransientError`` when the store failed past its retry budget (the intake answers 503).
    """

    def __call__(
        self, data: bytes, *, stock: Stock, webhook_id: str | None, source: Source
    ) -> Awaitable[Handled]:
        """Handle one webhook's ``data``."""
        ...


HandlerT = TypeVar("HandlerT", bound="RouteHandler | WebhookHandler")


def _accept(_command: object) -> None:
    return None


@dataclass(frozen=True, slots=True)
class BatchFunction(Generic[CommandT, OutcomeT]):
    """The PL/pgSQL function that applies a batch of one kind of command in one transaction.

    Called as ``name(consumer, <arguments>, traceparents[, handoff])``: the inbox's namespace
    first, then one array per argument of :attr:`arguments` (one element per command, or
    per line with an ordinal array naming its command), then the trace context of each command
    and, when :attr:`handoff`, whether the hand-off to the warehouse system is on. It returns
    one row per command, ``ordinal`` (1, 2, ...) first, in the commands' order.

    Attributes:
        name: the function (``migrations/sql/<name>/v<N>.sql``); the runtime role may
            execute it (``adapters.postgres.privileges``).
        arguments: the arrays of a batch, by parameter name (without ``p_``), in the
            function's order.
        outcome: a command's outcome from its row (the columns after ``ordinal``); raises
            ``ValueError`` on a value the code does not know.
        inbox_outcomes: the values the function writes to ``inbox_messages.outcome`` (the
            column's check lists every route's: ``adapters.postgres.tables.stock``).
        handoff: the function takes ``p_handoff`` last.
        check: raises ``ValueError`` for a command the function cannot take, before it is
            sent.
    """

    name: str
    arguments: Callable[[Sequence[CommandT]], dict[str, list[Any]]]
    outcome: Callable[[CommandT, Sequence[Any]], OutcomeT]
    inbox_outcomes: tuple[str, ...]
    handoff: bool = False
    check: Callable[[CommandT], None] = _accept


def line_arrays(lines_per_command: Iterable[Mapping[str, int]]) -> dict[str, list[Any]]:
    """``line_orders``, ``line_skus``, ``line_quantities``: each command's lines, flattened.

    ``line_orders`` holds the 1-based ordinal of the command a line belongs to, as the batch
    functions join lines to their command by it.
    """
    line_orders: list[int] = []
    line_skus: list[str] = []
    line_quantities: list[int] = []
    for ordinal, lines in enumerate(lines_per_command, start=1):
        line_orders.extend([ordinal] * len(lines))
        line_skus.extend(lines)
        line_quantities.extend(lines.values())
    return {"line_orders": line_orders, "line_skus": line_skus, "line_quantities": line_quantities}


def row_lines(skus: Sequence[str], quantities: Sequence[int]) -> tuple[OrderLine, ...]:
    """The lines a function's row returned as two parallel arrays, in their order.

    Raises:
        ValueError: the arrays differ in length.
    """
    return tuple(OrderLine(sku, quantity) for sku, quantity in zip(skus, quantities, strict=True))


@dataclass(frozen=True, slots=True)
class Route(Generic[EventT, CommandT, OutcomeT, HandlerT]):
    """One input event: how it arrives, what it is, who handles it, what it may end as.

    Attributes:
        transport: how its events arrive (:data:`Transport`): a queue's route has a
            :class:`RouteHandler`, a webhook type's a :class:`WebhookHandler`.
        model: its wire model, whose ``to_command()`` gives :attr:`command`; the AsyncAPI
            document describes it.
        summary: one sentence on what the event does, the ``summary`` of its message in the
            AsyncAPI document.
        command: the domain command its handler applies.
        handler: its handler.
        outcomes: the ``(outcome, reason)`` labels its handler can return, refusals
            included: of ``fulfilment_events_total`` for a queue's route, bound at 0 from the
            start; of the warehouse events' metrics for a webhook type's.
        function: the SQL function that applies :attr:`command` in PostgreSQL.
    """

    transport: Transport
    model: type[EventT]
    summary: str
    command: type[CommandT]
    handler: HandlerT
    outcomes: tuple[tuple[str, str], ...]
    function: BatchFunction[CommandT, OutcomeT]

    @property
    def event(self) -> str:
        """Its name in snake case (``order_placed``): the ``event`` label, the log prefix."""
        return self.transport.event
