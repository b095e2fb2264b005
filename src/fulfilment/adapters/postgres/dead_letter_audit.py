"""The audit trail of ``fulfilment dlq replay`` and ``purge`` (table ``dead_letter_audit``).

The tools only ever INSERT rows (:func:`record`) and count past replays (:func:`replay_counts`);
nothing here updates or deletes one, so the table can be granted append-only.
"""

from __future__ import annotations

import base64
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Literal
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from fulfilment.adapters.postgres.tables.stock import dead_letter_audit

AuditAction = Literal["replayed", "purged"]


@dataclass(frozen=True, slots=True)
class Operator:
    """Who ran a replay or purge, from the environment rather than only from a flag.

    Attributes:
        os_user: the operating-system user running the command (``getpass.getuser()``: the
            ``LOGNAME``/``USER`` variables, else the password database; ``uid:<n>`` when
            neither names it, as in a container without a user entry).
        host: the machine's (or pod's) host name.
        stated: the name given with ``--operator``, if any: a claim, recorded beside the two.
    """

    os_user: str
    host: str
    stated: str | None = None

    @property
    def name(self) -> str:
        """The ``operator`` column: the stated name, else the OS user."""
        return self.stated or self.os_user


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One dead letter an operator replayed or purged.

    Attributes:
        run_id: one per command run; a replay also sends it as ``x-fulfilment-replay-id``.
        action: ``replayed`` or ``purged``.
        event_id: the body's ``event_id``, if it has one.
        message_id: the AMQP ``message_id``, if any.
        failure_class, exception_type, reason: why it was dead-lettered.
        dead_lettered_at: when it entered the DLQ, if known.
        headers: the dead letter's headers as they were in the DLQ.
        body: the body, unchanged.
        operator: who ran the command (:class:`Operator`). The database adds the session's
            role itself (``database_user``, migration 0010), which no caller can set.
        comment: why, in the operator's words (``--comment``), if given.
    """

    run_id: UUID
    action: AuditAction
    event_id: str | None
    message_id: str | None
    failure_class: str
    exception_type: str
    reason: str
    dead_lettered_at: datetime | None
    headers: Mapping[str, object]
    body: bytes
    operator: Operator
    comment: str | None


async def record(engine: AsyncEngine, entry: AuditEntry) -> None:
    """Insert ``entry`` and commit; the caller removes the message from the DLQ only after.

    Raises:
        sqlalchemy.exc.DBAPIError: the database refused or failed the insert.
        OSError: the database cannot be reached.
    """
    async with engine.begin() as connection:
        await connection.execute(
            dead_letter_audit.insert().values(
                run_id=entry.run_id,
                action=entry.action,
                event_id=entry.event_id,
                message_id=entry.message_id,
                failure_class=entry.failure_class,
                exception_type=entry.exception_type,
                reason=entry.reason,
                dead_lettered_at=entry.dead_lettered_at,
                headers=json_safe(entry.headers),
                body=entry.body,
                operator=entry.operator.name,
                os_user=entry.operator.os_user,
                host=entry.operator.host,
                comment=entry.comment,
            )
        )


async def replay_counts(engine: AsyncEngine, event_ids: Collection[str]) -> dict[str, int]:
    """How often each of ``event_ids`` was replayed, by the audit table (one query).

    Ids never replayed are absent. Read beside the message's own ``x-fulfilment-replay-count``,
    so a dead letter whose header was lost or rewritten is still counted.

    Raises:
        sqlalchemy.exc.DBAPIError: the database refused or failed the query.
        OSError: the database cannot be reached.
    """
    if not event_ids:
        return {}
    query = (
        sa.select(dead_letter_audit.c.event_id, sa.func.count())
        .where(
            dead_letter_audit.c.action == "replayed",
            dead_letter_audit.c.event_id.in_(sorted(event_ids)),
        )
        .group_by(dead_letter_audit.c.event_id)
    )
    async with engine.connect() as connection:
        rows = await connection.execute(query)
        return {str(event_id): int(count) for event_id, count in rows}


def json_safe(value: object) -> object:  # noqa: PLR0911 - one return per kind of AMQP value
    """AMQP header values as JSON: times as ISO 8601, bytes as UTF-8 (base64 if not text).

    Tables (``x-death``) and arrays are converted recursively; anything else becomes text.
    """
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, Decimal):
        return str(value)
    return str(value)
