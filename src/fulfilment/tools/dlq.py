"""``fulfilment dlq``: look into the dead-letter queues, replay or purge their messages.

Every operation works on the DLQs it is given (``queues``), all of them by default
(``contracts.topology.DEAD_LETTER_QUEUES``), one after the other, and walks each in bounded
pages (``adapters.rabbitmq.walk.QueueWalk``): at most ``page_size`` messages are held at once,
unacknowledged in the broker and in this process, so memory stays flat however deep a DLQ is
(docs/runbook.md, "Dead letters and replay": figures for 100,000). A message the command does
not take out is put back at the tail of its DLQ (a confirmed copy, then the original's ack),
so after a whole walk the DLQ holds what it held, in the same order, with any dead letters
that workers added meanwhile behind. The copy expires when the original would have: it carries
what ``ttl_seconds`` (the DLQs' ``message-ttl``, ``FULFILMENT_DEAD_LETTER_TTL_SECONDS``) leaves of
the time since the message was dead-lettered, so looking at a DLQ never extends its retention.

- :func:`list_groups` and :func:`find` read the DLQs without removing anything.
- :func:`replay` publishes selected dead letters back to the exchange and routing key they
  were first published with (:meth:`DeadLetter.replay_target`: ``orders`` with
  ``order.placed``, ``order.cancelled`` or ``order.shipped``): body, ``message_id`` and the
  other properties unchanged (so the inbox answers an event already applied as a counted
  duplicate) but the priority and reply address, dropped, the broker's and the service's
  ``x-*`` headers stripped, ``x-fulfilment-replay-id`` and ``x-fulfilment-replayed-at`` added,
  and ``x-fulfilment-replay-count`` set to the replays before it plus one. It refuses (and
  leaves in the DLQ) a dead letter replayed ``replay_limit`` times already, counted by that
  header and by the audit table, unless ``force``; and, even with ``force``, one dead-lettered
  longer ago than the processed-id retention, whose inbox row may be gone, so a replay could
  apply it twice.
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
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import aio_pika
import aiormq.exceptions
from aiolimiter import AsyncLimiter

from fulfilment.adapters.postgres.dead_letter_audit import (
    AuditEntry,
    Operator,
    record,
    replay_counts,
)
from fulfilment.adapters.rabbitmq.publishing import UnroutableError, publish_confirmed, resent
from fulfilment.adapters.rabbitmq.walk import WALK_PAGE_SIZE, QueueWalk, walk_queue
from fulfilment.contracts.dead_letter import (
    DEAD_LETTER_TTL_SECONDS,
    replay_count,
    replay_headers,
)
from fulfilment.routes.table import DEAD_LETTER_QUEUES
from fulfilment.tools.dead_letters import (
    DeadLetter,
    Group,
    Refusal,
    ReplayRules,
    ReplayStoppedError,
    RunResult,
    Selection,
    age,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from aio_pika.abc import AbstractConnection, AbstractIncomingMessage
    from sqlalchemy.ext.asyncio import AsyncEngine

CONFIRM_SECONDS = 10.0
"""How long a replay waits for the broker's confirm of one message before it stops."""


async def list_groups(
    connection: AbstractConnection,
    queues: Sequence[str] = DEAD_LETTER_QUEUES,
    *,
    page_size: int = WALK_PAGE_SIZE,
    ttl_seconds: float | None = DEAD_LETTER_TTL_SECONDS,
) -> list[Group]:
    """The messages of ``queues`` grouped per DLQ by ``<failure class>/<exception type>``.

    Largest groups first, then by group and DLQ. Every message is walked (and put back), a
    page at a time; only the groups stay in memory.
    """
    groups: dict[tuple[str, str], Group] = {}
    for queue in queues:
        async with walk_queue(
            connection, queue, page_size=page_size, ttl_seconds=ttl_seconds
        ) as walk:
            async for page in walk.pages():
                for message in page:
                    letter = DeadLetter.of(message, queue)
                    described = letter.description
                    group = groups.get((queue, described.group))
                    if group is None:
                        group = groups[queue, described.group] = Group(
                            described.group,
                            str(described.failure_class),
                            described.exception_type,
                            queue,
                        )
                    group.add(letter)
                await walk.settle(page, keep=page)
    return sorted(groups.values(), key=lambda group: (-group.count, group.key, group.queue))


async def find(  # noqa: PLR0913 - the selection, where, how many, and the walk's bounds
    connection: AbstractConnection,
    selection: Selection,
    queues: Sequence[str] = DEAD_LETTER_QUEUES,
    *,
    limit: int | None = None,
    page_size: int = WALK_PAGE_SIZE,
    ttl_seconds: float | None = DEAD_LETTER_TTL_SECONDS,
) -> list[DeadLetter]:
    """The first ``limit`` (all, when None) messages of ``queues`` chosen by ``selection``.

    In queue order, left in the DLQ. The walk stops at the page where ``limit`` is reached:
    the pages walked go to the tail of their DLQ, ahead of nothing, so only their place
    changes, not what the DLQ holds.
    """
    found: list[DeadLetter] = []
    for queue in queues:
        async with walk_queue(
            connection, queue, page_size=page_size, ttl_seconds=ttl_seconds
        ) as walk:
            async for page in walk.pages():
                found += [
                    letter
                    for letter in (DeadLetter.of(message, queue) for message in page)
                    if selection.matches(letter)
                ]
                await walk.settle(page, keep=page)
                if limit is not None and len(found) >= limit:
                    return found[:limit]
    return found


def _refusal(letter: DeadLetter, rules: ReplayRules, replays: int, now: datetime) -> str | None:
    """Why ``letter`` must not be replayed now, in one line naming it; None when it may."""
    name = letter.description.event_id or letter.message.message_id or "(no id)"
    moment = letter.description.dead_lettered_at
    if moment is not None and (now - moment).total_seconds() > rules.max_age_seconds:
        return (
            f"{name} in {letter.queue} was dead-lettered {age(moment, now)} ago, longer than "
            f"the processed-id retention (FULFILMENT_PROCESSED_ID_RETENTION_SECONDS="
            f"{rules.max_age_seconds:.0f} s): its inbox row may be pruned, so a replay could "
            "apply it twice; refused, left in the dead-letter queue (--force does not apply)"
        )
    if replays >= rules.replay_limit and not rules.force:
        return (
            f"{name} in {letter.queue} was replayed {replays} time(s), the limit is "
            f"{rules.replay_limit} (FULFILMENT_REPLAY_LIMIT): refused, left in the dead-letter "
            "queue; add --force to replay it again"
        )
    return None


async def replay(  # noqa: PLR0913 - each option of the command, by name
    connection: AbstractConnection,
    selection: Selection,
    *,
    audit: AsyncEngine | None,
    execute: bool,
    rate_per_second: float,
    operator: Operator,
    comment: str | None,
    rules: ReplayRules | None = None,
    queues: Sequence[str] = DEAD_LETTER_QUEUES,
    page_size: int = WALK_PAGE_SIZE,
    ttl_seconds: float | None = DEAD_LETTER_TTL_SECONDS,
    on_each: Callable[[DeadLetter], object] = lambda _: None,
    on_refused: Callable[[Refusal], object] = lambda _: None,
) -> RunResult:
    """Replay the chosen dead letters to where they came from (see the module's text).

    Args:
        connection: to the broker.
        selection: which dead letters.
        queues: the DLQs to take them from, one after the other.
        audit: engine of the database holding ``dead_letter_audit``; required to execute.
            A dry run without it counts replays by the header alone.
        execute: False for a dry run that only lists what would be replayed.
        rate_per_second: most messages published per second.
        operator: who runs the replay, for the audit table.
        comment: why, for the audit table.
        rules: the replay limit, ``--force`` and the age limit (:class:`ReplayRules`).
        page_size: most dead letters held at once.
        ttl_seconds: the DLQs' ``message-ttl``; the copies put back keep what it leaves of
            each dead letter's time (None: the broker's count starts again).
        on_each: called with each dead letter after it was replayed (or, dry, chosen).
        on_refused: called with each chosen dead letter a rule refused (left in the DLQ).

    Raises:
        ReplayStoppedError: a publish was returned (no queue bound), refused or not
            confirmed; that message and the rest stay in the DLQ.
        sqlalchemy.exc.DBAPIError, OSError: the audit row could not be written; that message
            was published but stays in the DLQ too (a second replay is a duplicate).
    """
    rules = rules or ReplayRules()
    result = RunResult(uuid.uuid4(), "replayed", executed=execute)
    if execute and audit is None:
        msg = "replaying needs the audit database"
        raise ValueError(msg)
    limiter = AsyncLimiter(rate_per_second, 1.0)
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    try:
        for queue in queues:
            async with walk_queue(
                connection, queue, page_size=page_size, ttl_seconds=ttl_seconds
            ) as walk:
                async for page in walk.pages():
                    await _replay_page(
                        walk,
                        page,
                        queue,
                        selection,
                        result,
                        replay_page=_ReplayPage(
                            channel,
                            audit,
                            limiter,
                            rules,
                            operator,
                            comment,
                            on_each,
                            on_refused,
                        ),
                    )
                result.most_held = max(result.most_held, walk.stats.most_held)
    finally:
        if not channel.is_closed:
            await channel.close()
    return result


@dataclass(frozen=True, slots=True)
class _ReplayPage:
    channel: aio_pika.abc.AbstractChannel
    audit: AsyncEngine | None
    limiter: AsyncLimiter
    rules: ReplayRules
    operator: Operator
    comment: str | None
    on_each: Callable[[DeadLetter], object]
    on_refused: Callable[[Refusal], object]


async def _replay_page(  # noqa: PLR0913 - the page, where it is from, and the run's state
    walk: QueueWalk,
    page: list[AbstractIncomingMessage],
    queue: str,
    selection: Selection,
    result: RunResult,
    *,
    replay_page: _ReplayPage,
) -> None:
    """Replay the chosen letters of ``page``, then put the rest back at the DLQ's tail.

    The page is settled at its end (one acknowledgement). If a replay stops it half-way, the
    letters replayed so far are acknowledged one by one and the rest of the page goes back to
    the head of the DLQ.
    """
    run = replay_page
    letters = [DeadLetter.of(message, queue) for message in page]
    chosen = [selection.matches(letter) for letter in letters]
    audited: dict[str, int] = {}
    if run.audit is not None:
        ids = {letter.description.event_id for letter, c in zip(letters, chosen, strict=True) if c}
        audited = await replay_counts(run.audit, {i for i in ids if i is not None})
    now = datetime.now(UTC)
    kept: list[AbstractIncomingMessage] = []
    done: list[AbstractIncomingMessage] = []
    try:
        for letter, is_chosen in zip(letters, chosen, strict=True):
            if not is_chosen:
                kept.append(letter.message)
                continue
            result.chose(letter)
            replays = max(
                replay_count(letter.message.headers),
                audited.get(letter.description.event_id or "", 0),
            )
            refusal = _refusal(letter, run.rules, replays, now)
            if refusal is not None:
                result.refused += 1
                run.on_refused(Refusal(letter, refusal))
                kept.append(letter.message)
                continue
            if not result.executed:
                run.on_each(letter)
                kept.append(letter.message)
                continue
            async with run.limiter:
                await _republish(run.channel, letter, result, replays_before=replays)
            assert run.audit is not None  # noqa: S101 - replay() checked it
            await record(run.audit, _entry(letter, result, run.operator, run.comment))
            done.append(letter.message)
            result.done += 1
            run.on_each(letter)
    except BaseException:
        await walk.remove_now(done)
        raise
    await walk.settle(page, keep=kept)


async def purge(  # noqa: PLR0913 - each option of the command, by name
    connection: AbstractConnection,
    selection: Selection,
    *,
    audit: AsyncEngine | None,
    execute: bool,
    operator: Operator,
    comment: str | None,
    queues: Sequence[str] = DEAD_LETTER_QUEUES,
    page_size: int = WALK_PAGE_SIZE,
    ttl_seconds: float | None = DEAD_LETTER_TTL_SECONDS,
    on_each: Callable[[DeadLetter], object] = lambda _: None,
) -> RunResult:
    """Remove the chosen dead letters of ``queues`` for good, each after its audit row.

    The audit row keeps the body and headers, so a purged message can still be read. The
    others are put back at the tail of their DLQ, a page at a time.

    Raises:
        sqlalchemy.exc.DBAPIError, OSError: the audit row could not be written; that message
            and the rest stay in the DLQ.
    """
    result = RunResult(uuid.uuid4(), "purged", executed=execute)
    if execute and audit is None:
        msg = "purging needs the audit database"
        raise ValueError(msg)
    for queue in queues:
        async with walk_queue(
            connection, queue, page_size=page_size, ttl_seconds=ttl_seconds
        ) as walk:
            async for page in walk.pages():
                kept: list[AbstractIncomingMessage] = []
                done: list[AbstractIncomingMessage] = []
                try:
                    for message in page:
                        letter = DeadLetter.of(message, queue)
                        if not selection.matches(letter):
                            kept.append(message)
                            continue
                        result.chose(letter)
                        if execute:
                            assert audit is not None  # noqa: S101 - checked above
                            await record(audit, _entry(letter, result, operator, comment))
                            done.append(message)
                            result.done += 1
                        else:
                            kept.append(message)
                        on_each(letter)
                except BaseException:
                    await walk.remove_now(done)  # audited: out; the rest back at the head
                    raise
                await walk.settle(page, keep=kept)
            result.most_held = max(result.most_held, walk.stats.most_held)
    return result


async def _republish(
    channel: aio_pika.abc.AbstractChannel,
    letter: DeadLetter,
    result: RunResult,
    *,
    replays_before: int,
) -> None:
    original = letter.message
    # Without the first sender's priority, reply address or expiration (``resent``).
    message = resent(
        original,
        replay_headers(
            original.headers,
            replay_id=str(result.run_id),
            replayed_at=datetime.now(UTC),
            replays_before=replays_before,
        ),
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


def _entry(
    letter: DeadLetter, result: RunResult, operator: Operator, comment: str | None
) -> AuditEntry:
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
