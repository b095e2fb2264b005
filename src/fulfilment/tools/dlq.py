"""``fulfilment dlq``: look into the dead-letter queues, replay or purge their messages.

Every operation works on the DLQs it is given (``queues``), all of them by default
(``contracts.topology.DEAD_LETTER_QUEUES``), one after the other.

- :func:`list_groups` and :func:`find` read the DLQs without removing anything.
- :func:`replay` publishes selected dead letters back to the exchange and routing key they
  were first published with (:meth:`DeadLetter.replay_target`: ``orders`` with
  ``order.placed``, ``order.cancelled`` or ``order.shipped``): body, ``message_id`` and the
  other properties unchanged (so the inbox answers an event already applied as a counted
  duplicate) but the priority and reply address, dropped, the broker's and the service's
  ``x-*`` headers stripped, ``x-fulfilment-replay-id`` and ``x-fulfilment-replayed-at`` added.
  Each message is published with publisher confirms and ``mandatory``, written to
  ``dead_letter_audit``, and only then acknowledged, i.e. removed from the DLQ. A crash in
  between leaves it in the DLQ as well (replaying it again is a counted duplicate), never in
  neither.
- :func:`purge` writes the audit row (body and headers included) and then removes the
  message.

Both are dry runs unless ``execute`` is true, and both touch only the messages present when
they start, so a replayed message that fails again and comes back is not taken twice.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import aio_pika
import aiormq.exceptions
from aiolimiter import AsyncLimiter

from fulfilment.adapters.postgres.dead_letter_audit import (
    AuditAction,
    AuditEntry,
    json_safe,
    record,
)
from fulfilment.adapters.rabbitmq import (
    UnroutableError,
    claim_messages,
    peek_messages,
    publish_confirmed,
)
from fulfilment.contracts.dead_letter import (
    DeadLetterDescription,
    describe_dead_letter,
    replay_headers,
)
from fulfilment.contracts.topology import (
    DEAD_LETTER_QUEUES,
    ORDERS_EXCHANGE,
    SUBSCRIBED_QUEUES,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from aio_pika.abc import AbstractConnection, AbstractIncomingMessage
    from sqlalchemy.ext.asyncio import AsyncEngine

CONFIRM_SECONDS = 10.0
"""How long a replay waits for the broker's confirm of one message before it stops."""


REASON_WIDTH = 70
"""Characters of a reason shown in the ``list`` table."""

QUEUE_WIDTH = max(len(name) for name in DEAD_LETTER_QUEUES)
"""Characters of the ``list`` table's DLQ column: the longest DLQ name."""


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
            "headers": json_safe(dict(self.message.headers or {})),
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
    """What a replay or purge did: ``matched`` chosen, ``done`` replayed or purged."""

    run_id: uuid.UUID
    action: AuditAction
    executed: bool
    matched: int = 0
    done: int = 0
    letters: list[DeadLetter] = field(default_factory=list)


async def list_groups(
    connection: AbstractConnection, queues: Sequence[str] = DEAD_LETTER_QUEUES
) -> list[Group]:
    """The messages of ``queues`` grouped per DLQ by ``<failure class>/<exception type>``.

    Largest groups first, then by group and DLQ.
    """
    groups: dict[tuple[str, str], Group] = {}
    for queue in queues:
        for message in await peek_messages(connection, queue):
            letter = DeadLetter.of(message, queue)
            described = letter.description
            group = groups.get((queue, described.group))
            if group is None:
                group = groups[queue, described.group] = Group(
                    described.group, str(described.failure_class), described.exception_type, queue
                )
            group.add(letter)
    return sorted(groups.values(), key=lambda group: (-group.count, group.key, group.queue))


async def find(
    connection: AbstractConnection,
    selection: Selection,
    queues: Sequence[str] = DEAD_LETTER_QUEUES,
) -> list[DeadLetter]:
    """The messages of ``queues`` chosen by ``selection``, in queue order, left in place."""
    letters = [
        DeadLetter.of(message, queue)
        for queue in queues
        for message in await peek_messages(connection, queue)
    ]
    return [letter for letter in letters if selection.matches(letter)]


async def replay(  # noqa: PLR0913 - each option of the command, by name
    connection: AbstractConnection,
    selection: Selection,
    *,
    audit: AsyncEngine | None,
    execute: bool,
    rate_per_second: float,
    operator: str,
    comment: str | None,
    queues: Sequence[str] = DEAD_LETTER_QUEUES,
    on_each: Callable[[DeadLetter], object] = lambda _: None,
) -> RunResult:
    """Replay the chosen dead letters to where they came from (see the module's text).

    Args:
        connection: to the broker.
        selection: which dead letters.
        queues: the DLQs to take them from, one after the other.
        audit: engine of the database holding ``dead_letter_audit``; required to execute.
        execute: False for a dry run that only lists what would be replayed.
        rate_per_second: most messages published per second.
        operator: who runs the replay, for the audit table.
        comment: why, for the audit table.
        on_each: called with each dead letter after it was replayed (or, dry, chosen).

    Raises:
        ReplayStoppedError: a publish was returned (no queue bound), refused or not
            confirmed; that message and the rest stay in the DLQ.
        sqlalchemy.exc.DBAPIError, OSError: the audit row could not be written; that message
            was published but stays in the DLQ too (a second replay is a duplicate).
    """
    result = RunResult(uuid.uuid4(), "replayed", executed=execute)
    if execute and audit is None:
        msg = "replaying needs the audit database"
        raise ValueError(msg)
    limiter = AsyncLimiter(rate_per_second, 1.0)
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    try:
        for queue in queues:
            async with claim_messages(connection, queue) as claim:
                while (message := await claim.next()) is not None:
                    letter = DeadLetter.of(message, queue)
                    if not selection.matches(letter):
                        continue  # held until the claim ends, then back in its place
                    result.matched += 1
                    result.letters.append(letter)
                    if not execute:
                        on_each(letter)
                        continue
                    async with limiter:
                        await _republish(channel, letter, result)
                    assert audit is not None  # noqa: S101 - checked above
                    await record(audit, _entry(letter, result, operator, comment))
                    await claim.remove(message)
                    result.done += 1
                    on_each(letter)
    finally:
        if not channel.is_closed:
            await channel.close()
    return result


async def purge(  # noqa: PLR0913 - each option of the command, by name
    connection: AbstractConnection,
    selection: Selection,
    *,
    audit: AsyncEngine | None,
    execute: bool,
    operator: str,
    comment: str | None,
    queues: Sequence[str] = DEAD_LETTER_QUEUES,
    on_each: Callable[[DeadLetter], object] = lambda _: None,
) -> RunResult:
    """Remove the chosen dead letters of ``queues`` for good, each after its audit row.

    The audit row keeps the body and headers, so a purged message can still be read.

    Raises:
        sqlalchemy.exc.DBAPIError, OSError: the audit row could not be written; that message
            and the rest stay in the DLQ.
    """
    result = RunResult(uuid.uuid4(), "purged", executed=execute)
    if execute and audit is None:
        msg = "purging needs the audit database"
        raise ValueError(msg)
    for queue in queues:
        async with claim_messages(connection, queue) as claim:
            while (message := await claim.next()) is not None:
                letter = DeadLetter.of(message, queue)
                if not selection.matches(letter):
                    continue
                result.matched += 1
                result.letters.append(letter)
                if execute:
                    assert audit is not None  # noqa: S101 - checked above
                    await record(audit, _entry(letter, result, operator, comment))
                    await claim.remove(message)
                    result.done += 1
                on_each(letter)
    return result


async def _republish(
    channel: aio_pika.abc.AbstractChannel, letter: DeadLetter, result: RunResult
) -> None:
    original = letter.message
    message = aio_pika.Message(
        original.body,
        headers=replay_headers(  # type: ignore[arg-type] # aio-pika's header type is invariant
            original.headers, replay_id=str(result.run_id), replayed_at=datetime.now(UTC)
        ),
        content_type=original.content_type,
        content_encoding=original.content_encoding,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        # No priority, reply address or expiration: a replay is the operator's decision and
        # must not be reordered, answered or expired by what the first sender asked for.
        correlation_id=original.correlation_id,
        message_id=original.message_id,
        timestamp=original.timestamp,
        type=original.type,
        app_id=original.app_id,
    )
    exchange, routing_key = letter.replay_target()
    try:
        await publish_confirmed(
            channel,
            message,
            exchange=exchange,
            routing_key=routing_key,
            timeout_seconds=CONFIRM_SECONDS,
        )
    except UnroutableError as error:
        msg = f"{error}: start the worker first"
        raise ReplayStoppedError(msg, result.done) from error
    except aiormq.exceptions.DeliveryError as error:
        msg = f"the broker refused the message: {error}"
        raise ReplayStoppedError(msg, result.done) from error
    except TimeoutError as error:
        msg = f"no confirm from the broker within {CONFIRM_SECONDS:g} s"
        raise ReplayStoppedError(msg, result.done) from error


def _entry(letter: DeadLetter, result: RunResult, operator: str, comment: str | None) -> AuditEntry:
    described = letter.description
    return AuditEntry(
        run_id=result.run_id,
        action=result.action,
        event_id=described.event_id,
        message_id=letter.message.message_id,
        failure_class=str(described.failure_class),
        exception_type=described.exception_type,
        reason=described.reason,
        dead_lettered_at=described.dead_lettered_at,
        headers=dict(letter.message.headers or {}),
        body=letter.message.body,
        operator=operator,
        comment=comment,
    )


def render_groups(groups: list[Group], *, now: datetime | None = None) -> str:
    """The ``dlq list`` table: a line per group of a DLQ (count, oldest age, a reason)."""
    if not groups:
        return "the dead-letter queues are empty"
    moment = now or datetime.now(UTC)
    total = sum(group.count for group in groups)
    oldest = min((group.oldest for group in groups if group.oldest), default=None)
    lines = [
        f"{total} dead letter(s), oldest {age(oldest, moment)}",
        f"{'QUEUE':<{QUEUE_WIDTH}} {'GROUP':<44} {'COUNT':>5}  {'OLDEST':>8}  REASON",
    ]
    for group in groups:
        reason = " ".join(group.example_reason.split())
        if len(reason) > REASON_WIDTH:
            reason = reason[: REASON_WIDTH - 1] + "…"
        lines.append(
            f"{group.queue:<{QUEUE_WIDTH}} {group.key:<44} {group.count:>5}  "
            f"{age(group.oldest, moment):>8}  {reason}"
        )
    return "\n".join(lines)


def render_letter(letter: DeadLetter) -> str:
    """The ``dlq show`` view of one dead letter: its description, headers and body."""
    document = letter.to_document()
    lines = [
        f"{key}: {document[key]}"
        for key in (
            "queue",
            "group",
            "reason",
            "event_id",
            "message_id",
            "dead_lettered_at",
            "delivery_count",
            "original_queue",
        )
    ]
    lines.append("headers:")
    lines += [f"  {key}: {value}" for key, value in sorted(document["headers"].items())]
    lines.append("body:")
    lines.append(f"  {document['body']}")
    return "\n".join(lines)


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
