"""The audit trail of ``fulfilment dlq replay`` and ``purge`` (table ``dead_letter_audit``)."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Literal
from uuid import UUID

from sqlalchemy.ext.asyncio import AsyncEngine

from fulfilment.adapters.postgres.tables import dead_letter_audit

AuditAction = Literal["replayed", "purged"]


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
        operator: who ran the command.
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
    operator: str
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
                operator=entry.operator,
                comment=entry.comment,
            )
        )


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
