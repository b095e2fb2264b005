"""What a route is made of: :class:`Route`, its transport and its SQL function.

The list of routes is ``fulfilment.routes.table.ROUTES``; ``docs/development.md``, "Adding an
input event", says what a new one needs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from pydantic import BaseModel

from fulfilment.contracts.topology import SubscribedQueue
from fulfilment.domain.model import Command

if TYPE_CHECKING:
    from fulfilment.application.ports import Warehouse
    from fulfilment.routes.handling import Handled

EventT = TypeVar("EventT", bound=BaseModel)
CommandT = TypeVar("CommandT", bound=Command[Any])
OutcomeT = TypeVar("OutcomeT")

Transport = SubscribedQueue
"""How a route's events arrive: today a queue bound to ``orders`` with its DLQ. The
warehouse's webhooks (``POST /webhooks/warehouse``, one event ``type`` per route, such as
``shipment.shipped``) make a second kind, a member of this union beside the queue carrying the
same ``event`` name; what serves only queues (``SUBSCRIBED_QUEUES``, the broker's definitions,
the KEDA triggers) takes the routes whose transport is a queue."""


class RouteHandler(Protocol):
    """A route's handler: the raw body and the stock store in, what it made of the event out.

    It raises ``MalformedEventError`` for a body that can never be its event,
    ``EventRefusedError`` for an event it refuses as things stand, and ``TransientError``
    when the store failed past its retry budget (``fulfilment.routes.handling``).
    """

    def __call__(self, body: bytes, *, warehouse: Warehouse) -> Awaitable[Handled]:
        """Handle one event's ``body``."""
        ...


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
            column's check lists every route's: ``adapters.postgres.tables``).
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


@dataclass(frozen=True, slots=True)
class Route(Generic[EventT, CommandT, OutcomeT]):
    """One input event: how it arrives, what it is, who handles it, what it may end as.

    Attributes:
        transport: how its events arrive (:data:`Transport`).
        model: its wire model, whose ``to_command()`` gives :attr:`command`; the AsyncAPI
            document describes it.
        summary: one sentence on what the event does, the ``summary`` of its message in the
            AsyncAPI document.
        command: the domain command its handler applies.
        handler: its handler (:class:`RouteHandler`).
        outcomes: the ``(outcome, reason)`` labels of ``fulfilment_events_total`` its handler
            can return, refusals included; bound at 0 from the start.
        function: the SQL function that applies :attr:`command` in PostgreSQL.
    """

    transport: Transport
    model: type[EventT]
    summary: str
    command: type[CommandT]
    handler: RouteHandler
    outcomes: tuple[tuple[str, str], ...]
    function: BatchFunction[CommandT, OutcomeT]

    @property
    def event(self) -> str:
        """Its name in snake case (``order_placed``): the ``event`` label, the log prefix."""
        return self.transport.event
