"""What the ``fulfilment dlq`` operations work on: a dead letter, a selection, a run's result.

A :class:`DeadLetter` is one message of a DLQ with what its headers say
(``contracts.dead_letter``); a :class:`Selection` chooses the ones an operation acts on, and
:func:`dead_letter_queues` the DLQs it walks; :class:`Group` counts a ``dlq list`` group;
:class:`RunResult`, :class:`ReplayRules` and :class:`Refusal` are what a replay or purge did,
obeys and refused. The operations are ``tools.dlq``'s, their rendering ``tools.dlq_commands``'.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from fulfilment.adapters.postgres.dead_letter_audit import AuditAction, json_safe
from fulfilment.adapters.rabbitmq.walk import WALK_HEADER
from fulfilment.contracts.dead_letter import DeadLetterDescription, describe_dead_letter
from fulfilment.contracts.topology import ORDERS_EXCHANGE
from fulfilment.routes.table import DEAD_LETTER_QUEUES, SUBSCRIBED_QUEUES

if TYPE_CHECKING:
    from aio_pika.abc import AbstractIncomingMessage

LETTERS_KEPT = 1000
"""Dead letters a :class:`RunResult` keeps as a sample (``letters``): a bound, not all of them."""


class ReplayStoppedError(Exception):
    """The broker refused, returned or did not confirm a replayed message; the run stopped.

    The message is still in the DLQ; ``done`` messages before it were replayed.
    """

    def __init__(self, reason: str, done: int) -> None:
        super().__init__(f"replay stopped after {done} message(s): {reason}")
        self.done = done


def dead_letter_queues(names: Collection[str]) -> tuple[str, ...]:
    """The DLQs that ``names`` choose, in the topology's order; all of them when none is given.

    A name is a dead-letter queue (``fulfilment.order-shipped.dlq``) or the queue whose DLQ
    it is (``fulfilment.order-shipped``).

    Raises:
        ValueError: a name is neither; the message lists the dead-letter queues.
    """
    if not names:
        return DEAD_LETTER_QUEUES
    by_name = {queue.name: queue.dead_letter_queue for queue in SUBSCRIBED_QUEUES}
    by_name |= {name: name for name in DEAD_LETTER_QUEUES}
    unknown = sorted(set(names) - set(by_name))
    if unknown:
        msg = (
            f"no dead-letter queue {', '.join(unknown)}; "
            f"the dead-letter queues are {', '.join(DEAD_LETTER_QUEUES)}"
        )
        raise ValueError(msg)
    chosen = {by_name[name] for name in names}
    return tuple(name for name in DEAD_LETTER_QUEUES if name in chosen)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One message of a DLQ (``queue``) and what its headers say."""

    message: AbstractIncomingMessage
    description: DeadLetterDescription
    queue: str

    @classmethod
    def of(cls, message: AbstractIncomingMessage, queue: str) -> DeadLetter:
        """Describe ``message``, read from the DLQ ``queue`` (``contracts.dead_letter``)."""
        return cls(message, describe_dead_letter(message.headers, message.body), queue)

    def replay_target(self) -> tuple[str, str]:
        """``(exchange, routing key)`` to replay it to: where it was first published.

        Read from its ``x-fulfilment-original-exchange`` and ``-routing-key`` (or, for a
        message the broker dead-lettered, from ``x-death``); without them (a dead letter
        written by hand, or by an older release), ``orders`` and the routing key of the queue
        whose DLQ holds it.
        """
        described = self.description
        if described.original_exchange is not None and described.original_routing_key:
            return described.original_exchange, described.original_routing_key
        for subscribed in SUBSCRIBED_QUEUES:
            if subscribed.dead_letter_queue == self.queue:
                return ORDERS_EXCHANGE, subscribed.routing_key
        msg = f"{self.queue} is not a dead-letter queue of the topology"
        raise ValueError(msg)

    def to_document(self, *, body_limit: int = 4_000) -> dict[str, Any]:
        """A JSON-ready view: the DLQ, the description, all headers, and the body (clipped)."""
        described = self.description
        body = self.message.body.decode("utf-8", "replace")
        return {
            "queue": self.queue,
            "group": described.group,
            "failure_class": str(described.failure_class),
            "exception_type": described.exception_type,
            "reason": described.reason,
            "dead_lettered_at": _iso(described.dead_lettered_at),
            "event_id": described.event_id,
            "message_id": self.message.message_id,
            "delivery_count": described.delivery_count,
            "original_queue": described.original_queue,
            # The walk's own mark says nothing about the dead letter.
            "headers": json_safe(
                {k: v for k, v in (self.message.headers or {}).items() if k != WALK_HEADER}
            ),
            "body": body if len(body) <= body_limit else body[:body_limit] + "…",
        }


@dataclass(frozen=True, slots=True)
class Selection:
    """Which dead letters a command acts on: by id, by group, or all of them.

    ``ids`` match a message's ``event_id`` (from its body) or its AMQP ``message_id``;
    ``group`` is ``<failure class>/<exception type>`` as ``dlq list`` shows it.
    """

    ids: frozenset[str] = frozenset()
    group: str | None = None
    everything: bool = False

    @classmethod
    def build(cls, ids: Collection[str], group: str | None, *, everything: bool) -> Selection:
        """Validate that exactly one way of choosing was given.

        Raises:
            ValueError: none, or more than one, of ids, group and everything.
        """
        given = sum((bool(ids), group is not None, everything))
        if given != 1:
            msg = "choose the dead letters with exactly one of --id, --group or --all"
            raise ValueError(msg)
        return cls(frozenset(ids), group, everything)

    def describe(self) -> str:
        """The selection as its options: ``--id a --id b``, ``--group poison/-`` or ``--all``."""
        if self.everything:
            return "--all"
        if self.group is not None:
            return f"--group {self.group}"
        return " ".join(f"--id {event_id}" for event_id in sorted(self.ids))

    def matches(self, letter: DeadLetter) -> bool:
        """Whether ``letter`` is chosen."""
        if self.everything:
            return True
        if self.group is not None:
            return letter.description.group == self.group
        return letter.description.event_id in self.ids or letter.message.message_id in self.ids


@dataclass(slots=True)
class Group:
    """Dead letters of one DLQ (``queue``) sharing a failure class and exception type."""

    key: str
    failure_class: str
    exception_type: str
    queue: str
    count: int = 0
    oldest: datetime | None = None
    example_reason: str = ""
    event_ids: list[str] = field(default_factory=list)

    def add(self, letter: DeadLetter) -> None:
        """Count ``letter`` in, keeping the oldest time and the first reason seen."""
        described = letter.description
        self.count += 1
        moment = described.dead_lettered_at
        if moment is not None and (self.oldest is None or moment < self.oldest):
            self.oldest = moment
        self.example_reason = self.example_reason or described.reason
        if described.event_id is not None and len(self.event_ids) < 5:  # noqa: PLR2004 - a sample
            self.event_ids.append(described.event_id)


@dataclass(slots=True)
class RunResult:
    """What a replay or purge did.

    ``matched`` chosen, ``done`` replayed or purged, ``refused``
    left in the DLQ by a rule (:class:`Refusal`); ``letters``, the first :data:`LETTERS_KEPT`
    matched; ``most_held``, the most messages held unacknowledged at once.
    """

    run_id: uuid.UUID
    action: AuditAction
    executed: bool
    matched: int = 0
    done: int = 0
    refused: int = 0
    most_held: int = 0
    letters: list[DeadLetter] = field(default_factory=list)

    def chose(self, letter: DeadLetter) -> None:
        """Count ``letter`` as matched, keeping it while the sample has room."""
        self.matched += 1
        if len(self.letters) < LETTERS_KEPT:
            self.letters.append(letter)


@dataclass(frozen=True, slots=True)
class ReplayRules:
    """When a replay refuses a dead letter (it stays in the DLQ; see :func:`replay`).

    Attributes:
        replay_limit: replays after which a dead letter is refused without ``force``
            (``FULFILMENT_REPLAY_LIMIT``).
        force: replay past the limit (``--force``).
        max_age_seconds: dead letters dead-lettered longer ago are refused, whatever
            ``force`` says (``FULFILMENT_PROCESSED_ID_RETENTION_SECONDS``).
    """

    replay_limit: int = 3
    force: bool = False
    max_age_seconds: float = 30 * 86_400.0


@dataclass(frozen=True, slots=True)
class Refusal:
    """A dead letter a replay would not take, and why (one line naming it)."""

    letter: DeadLetter
    reason: str


def age(moment: datetime | None, now: datetime) -> str:
    """``moment``'s age in the largest two units (``3d 4h``, ``12m 5s``), or ``-``."""
    if moment is None:
        return "-"
    seconds = max(0, int((now - moment).total_seconds()))
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, seconds = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (seconds, "s")]
    shown = [f"{value}{unit}" for value, unit in parts if value][:2]
    return " ".join(shown) or "0s"


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None
