"""``fulfilment dlq``: the sub-commands list, show, replay and purge (see ``tools.dlq``).

Each connects to the services it needs, runs one operation of ``tools.dlq`` on the chosen
dead-letter queues (``queues``: every one by default) and echoes its result, rendered here
(:func:`render_groups`, :func:`render_letter`); replay and purge echo each dead letter as they
go, and a summary.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal, TypeAlias

from fulfilment.adapters.postgres.admin import warehouse_session
from fulfilment.adapters.postgres.dead_letter_audit import Operator
from fulfilment.adapters.rabbitmq.connection import connect
from fulfilment.contracts.dead_letter import DEAD_LETTER_TTL_SECONDS
from fulfilment.routes.table import DEAD_LETTER_QUEUES
from fulfilment.tools.command import CommandError, Echo, ToolOptions
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
from fulfilment.tools.dlq import find, list_groups, purge, replay
from fulfilment.tools.virtual_host import missing_queues, missing_queues_note

if TYPE_CHECKING:
    from aio_pika.abc import AbstractConnection
    from sqlalchemy.ext.asyncio import AsyncEngine


OnEach = Callable[[DeadLetter], object]
"""Called with each dead letter a replay or purge has done (or, dry, chosen)."""

RunOnDeadLetters: TypeAlias = (
    "Callable[[AbstractConnection, AsyncEngine | None, OnEach], Awaitable[RunResult]]"
)
"""A replay or purge, given the broker connection, the audit engine (None for a dry run) and
``on_each``."""


REASON_WIDTH = 70
"""Characters of a reason shown in the ``list`` table."""

QUEUE_WIDTH = max(len(name) for name in DEAD_LETTER_QUEUES)
"""Characters of the ``list`` table's DLQ column: the longest DLQ name."""


async def list_command(
    amqp_url: str,
    *,
    as_json: bool,
    echo: Echo,
    queues: Sequence[str] = DEAD_LETTER_QUEUES,
    ttl_seconds: float | None = DEAD_LETTER_TTL_SECONDS,
) -> None:
    """``fulfilment dlq list``: echo the groups of :func:`list_groups`, as a table or JSON.

    Raises:
        BrokerUnavailableError: RabbitMQ does not answer.
    """
    async with connect(amqp_url) as connection:
        groups = await list_groups(connection, queues, ttl_seconds=ttl_seconds)
        missing = await missing_queues(connection, queues)
    if not as_json:
        echo(render_groups(groups))
        note = missing_queues_note(missing)
        if note is not None:
            echo(note)
        return
    document = [
        {
            "queue": group.queue,
            "group": group.key,
            "failure_class": group.failure_class,
            "exception_type": group.exception_type,
            "count": group.count,
            "oldest_dead_lettered_at": group.oldest.isoformat() if group.oldest else None,
            "example_reason": group.example_reason,
            "event_ids_sample": group.event_ids,
        }
        for group in groups
    ]
    echo(json.dumps(document, indent=2))


async def show_command(  # noqa: PLR0913 - each option of the command, by name
    amqp_url: str,
    selection: Selection,
    *,
    limit: int,
    as_json: bool,
    echo: Echo,
    queues: Sequence[str] = DEAD_LETTER_QUEUES,
    ttl_seconds: float | None = DEAD_LETTER_TTL_SECONDS,
) -> None:
    """``fulfilment dlq show``: echo at most ``limit`` chosen dead letters, as text or JSON.

    Raises:
        CommandError: ``--id`` or ``--group`` matches no dead letter (exit 1).
        BrokerUnavailableError: RabbitMQ does not answer.
    """
    async with connect(amqp_url) as connection:
        letters = await find(connection, selection, queues, limit=limit, ttl_seconds=ttl_seconds)
    _require_match(selection, len(letters), queues)
    if as_json:
        echo(json.dumps([letter.to_document() for letter in letters], indent=2))
    elif not letters:
        echo("no dead letter matches")
    else:
        echo("\n\n".join(render_letter(letter) for letter in letters))


async def replay_command(  # noqa: PLR0913 - each option of the command, by name
    options: ToolOptions,
    selection: Selection,
    *,
    execute: bool,
    rate_per_second: float,
    operator: str | None,
    comment: str | None,
    echo: Echo,
    rules: ReplayRules | None = None,
    queues: Sequence[str] = DEAD_LETTER_QUEUES,
    ttl_seconds: float | None = DEAD_LETTER_TTL_SECONDS,
) -> None:
    """``fulfilment dlq replay``: :func:`replay`, echoing each dead letter and a summary.

    ``operator`` is the stated name (``--operator``), recorded beside the OS user and host
    (:func:`operator_identity`). Each refused dead letter is echoed as ``refused: <why>``.

    Raises:
        CommandError: ``--id`` or ``--group`` matches no dead letter (exit 1, nothing done),
            the replay stopped (exit 1; the rest stay in the DLQ), or, executed, it refused
            some (exit 1, after the summary; those stay in the DLQ).
        BrokerUnavailableError, DatabaseUnavailableError: a service does not answer (the
            database is only needed to execute).
    """
    try:
        result = await _on_dead_letters(
            options,
            lambda connection, audit, on_each: replay(
                connection,
                selection,
                audit=audit,
                execute=execute,
                rate_per_second=rate_per_second,
                operator=operator_identity(operator),
                comment=comment,
                rules=rules,
                queues=queues,
                ttl_seconds=ttl_seconds,
                on_each=on_each,
                on_refused=lambda refusal: _echo_refusal(refusal, echo),
            ),
            execute=execute,
            verb="replay",
            echo=echo,
        )
    except ReplayStoppedError as error:
        msg = f"{error}; the rest are still in the dead-letter queue"
        raise CommandError(msg) from error
    _require_match(selection, result.matched, queues)
    echo(_summary(result, verb="replayed"))
    if result.executed and result.refused:
        # Not everything asked for was done: a script running the replay must see it.
        msg = f"{result.refused} dead letter(s) refused (the lines above say why), left in the DLQ"
        raise CommandError(msg)


async def purge_command(  # noqa: PLR0913 - each option of the command, by name
    options: ToolOptions,
    selection: Selection,
    *,
    execute: bool,
    operator: str | None,
    comment: str | None,
    echo: Echo,
    queues: Sequence[str] = DEAD_LETTER_QUEUES,
    ttl_seconds: float | None = DEAD_LETTER_TTL_SECONDS,
) -> None:
    """``fulfilment dlq purge``: :func:`purge`, echoing each dead letter and a summary.

    ``operator`` is the stated name, recorded beside the OS user and host.

    Raises:
        CommandError: ``--id`` or ``--group`` matches no dead letter (exit 1, nothing done).
        BrokerUnavailableError, DatabaseUnavailableError: a service does not answer (the
            database is only needed to execute).
    """
    result = await _on_dead_letters(
        options,
        lambda connection, audit, on_each: purge(
            connection,
            selection,
            audit=audit,
            execute=execute,
            operator=operator_identity(operator),
            comment=comment,
            queues=queues,
            ttl_seconds=ttl_seconds,
            on_each=on_each,
        ),
        execute=execute,
        verb="purge",
        echo=echo,
    )
    _require_match(selection, result.matched, queues)
    echo(_summary(result, verb="purged"))


async def _on_dead_letters(
    options: ToolOptions,
    action: RunOnDeadLetters,
    *,
    execute: bool,
    verb: Literal["replay", "purge"],
    echo: Echo,
) -> RunResult:
    """Run a replay or purge with a broker connection and, to execute, the audit database."""

    def each(letter: DeadLetter) -> None:
        described = letter.description
        done = {"replay": "replayed", "purge": "purged"}[verb] if execute else f"{verb} (dry run)"
        name = described.event_id or letter.message.message_id
        echo(f"{done}: {name}  {described.group}  ({letter.queue})")

    async with connect(options.amqp_url) as connection:
        if not execute:
            return await action(connection, None, each)
        async with warehouse_session(options.database, consumer=options.consumer) as warehouse:
            return await action(connection, warehouse.engine, each)


def operator_identity(stated: str | None) -> Operator:
    """Who runs the command: the OS user and host from the environment, and ``stated``.

    The OS user is ``getpass.getuser()`` (``LOGNAME``, ``USER``, ``LNAME``, ``USERNAME``, then
    the password database), else ``uid:<n>``: a container's user often has no entry.
    """
    try:
        os_user = getpass.getuser()
    except (KeyError, OSError):  # no user name in the environment or the password database
        os_user = f"uid:{os.getuid()}"
    return Operator(os_user=os_user, host=socket.gethostname(), stated=stated or None)


def _require_match(selection: Selection, matched: int, queues: Sequence[str]) -> None:
    """Refuse a selection by ``--id`` or ``--group`` that ``matched`` no dead letter.

    A mistyped id or group is no success; ``--all`` on empty queues is one: it asked for
    whatever is there.

    Raises:
        CommandError: ``no dead letter matches --id x in <queues>`` (exit 1).
    """
    if not matched and not selection.everything:
        msg = f"no dead letter matches {selection.describe()} in {', '.join(queues)}"
        raise CommandError(msg)


def _echo_refusal(refusal: Refusal, echo: Echo) -> None:
    echo(f"refused: {refusal.reason}")


def _summary(result: RunResult, *, verb: str) -> str:
    refused = f", {result.refused} refused (left in the DLQ)" if result.refused else ""
    if not result.executed:
        return (
            f"dry run: {result.matched - result.refused} dead letter(s) would be {verb}"
            f"{refused}; nothing changed (add --yes to do it)"
        )
    return f"{verb} {result.done} of {result.matched} dead letter(s){refused}, run {result.run_id}"


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
