"""Keeping a signed but invalid webhook (table ``invalid_webhooks``), once per webhook id.

The intake answers such a webhook 422 and keeps its raw body, its headers without the
signature, and the reason, for an operator to read and replay (docs/runbook.md); the
sender's retries of it (the same ``webhook-id``) change nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncEngine

from fulfilment.adapters.postgres.retry import RetryHook, call_with_retry

_KEEP = sa.text(
    "INSERT INTO invalid_webhooks (webhook_id, type, headers, body, reason)"
    " VALUES (:webhook_id, :type, :headers, :body, :reason)"
    " ON CONFLICT (webhook_id) DO NOTHING"
).bindparams(
    sa.bindparam("headers", type_=postgresql.JSONB),
    sa.bindparam("body", type_=sa.LargeBinary),
)


@dataclass(frozen=True, slots=True)
class InvalidWebhook:
    """A webhook whose signature passed but whose body is not a valid event of its type.

    Attributes:
        webhook_id: its ``webhook-id``.
        type: its ``type`` when the body had one, else None.
        headers: the request's headers, names lower-case, ``webhook-signature`` left out.
        body: the raw body as received.
        reason: why it is invalid, one line.
    """

    webhook_id: str
    type: str | None
    headers: Mapping[str, str]
    body: bytes
    reason: str


class PostgresInvalidWebhooks:
    """Writes :class:`InvalidWebhook` rows.

    Args:
        engine: an asyncpg engine; not owned.
        retry_budget_seconds: total time one call may spend retrying transient errors.
        on_retry: called with the error before each retry.
    """

    def __init__(
        self, engine: AsyncEngine, *, retry_budget_seconds: float, on_retry: RetryHook | None = None
    ) -> None:
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._retry_budget_seconds = retry_budget_seconds
        self._on_retry = on_retry

    async def keep(self, webhook: InvalidWebhook) -> bool:
        """Insert ``webhook`` unless its webhook id is kept already; True when it was new.

        Raises:
            TransientError: a transient database error outlasted the retry budget.
        """
        parameters = {
            "webhook_id": webhook.webhook_id,
            "type": webhook.type,
            "headers": dict(webhook.headers),
            "body": webhook.body,
            "reason": webhook.reason,
        }

        async def attempt() -> bool:
            async with self._autocommit.connect() as connection:
                result = await connection.execute(_KEEP, parameters)
                return bool(result.rowcount)

        return await call_with_retry(
            attempt,
            operation="keep_invalid_webhook",
            budget_seconds=self._retry_budget_seconds,
            on_retry=self._on_retry,
        )
