"""What the intake answers a webhook, row by row of product.md's answer table.

| the request | answer |
|---|---|
| a header missing, no signature matching, a timestamp malformed or outside the tolerance | 401 |
| a body over the limit (its ``Content-Length``, or the bytes read so far) | 413 |
| signed; a ``type`` the service does not take | 204, counted |
| signed; not a valid event of its type | 422 with the reason, kept once per webhook id |
| signed; applied, a duplicate, a discrepancy or ``already_shipped`` | 204 after the commit |
| the database does not answer within :data:`DATABASE_WAIT_SECONDS` | 503 with Retry-After |

In that order: the headers are checked before the body is read, the signature on the raw
bytes before anything parses them, and only a signed body is parsed. Nothing is recorded for a
401, 413 or 503. Each answer is one log line (``webhooks.answered``: type, webhook id,
outcome, status, milliseconds) and counted (``observability.intake_metrics``); no secret or
signature is ever logged.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import structlog

from fulfilment.adapters.postgres.invalid_webhooks import InvalidWebhook
from fulfilment.application.ports import Stock, TransientError
from fulfilment.contracts.warehouse_webhooks import (
    OTHER_TYPE,
    TAKEN,
    AnyWebhook,
    TakenWebhook,
    type_label,
)
from fulfilment.domain.warehouse_events import (
    RecordAdjustment,
    RecordShipment,
    RecordWarehouseCancellation,
    Source,
)
from fulfilment.intake.signatures import Refusal, RefusedError, WebhookVerifier
from fulfilment.observability.intake_metrics import INVALID, TYPE_NOT_TAKEN, IntakeMetrics
from fulfilment.routes.handling import MalformedEventError, parse_event

DATABASE_WAIT_SECONDS: Final = 2.0
"""Longest wait for the database per webhook (the group commit's queue, the transaction and
its retries), after which it is answered 503: senders give up after 5 s (Shopify; ShipBob
15 s), and an answer they never read would be retried as a failure all the same."""

RETRY_AFTER_SECONDS: Final = 5
"""``Retry-After`` of a 503: a few seconds, about a failover's length."""

UNKEPT_HEADERS: Final = frozenset({"webhook-signature", "authorization", "cookie"})
"""Headers never kept with an invalid webhook (nor logged): the signature, and credentials a
proxy in front may have added."""

MAX_REASON_LENGTH: Final = 2000
"""Characters of a 422's reason, at most (the first problems are what an operator reads)."""

KeepInvalid = Callable[[InvalidWebhook], Awaitable[bool]]
"""Keeps a signed but invalid webhook once per webhook id (``PostgresInvalidWebhooks.keep``);
raises ``TransientError`` when the database failed."""

logger = structlog.get_logger("fulfilment.webhooks")

T = TypeVar("T")


class SenderGoneError(Exception):
    """The sender closed the connection before its body was whole: nothing was recorded."""


@dataclass(frozen=True, slots=True)
class Answer:
    """The HTTP answer to one webhook.

    Attributes:
        status: the status code.
        body: the JSON body, None for a 204.
        headers: more headers (``Retry-After``, ``Connection``).
    """

    status: int
    body: dict[str, str] | None = None
    headers: dict[str, str] = field(default_factory=dict)


class WebhookReceiver:
    """Answers webhooks: verifies, reads, parses and applies them (module text).

    Args:
        verifier: checks the headers and the signature.
        stock: where the commands are applied (``PostgresStock``: concurrent webhooks share
            one transaction).
        keep_invalid: keeps a signed but invalid webhook.
        metrics: where each answer is counted.
        max_body_bytes: the largest body taken (``FULFILMENT_WEBHOOKS_MAX_BODY_BYTES``).
        database_wait_seconds: the wait for the database before a 503.
    """

    def __init__(  # noqa: PLR0913 - the root passes each collaborator by name
        self,
        *,
        verifier: WebhookVerifier,
        stock: Stock,
        keep_invalid: KeepInvalid,
        metrics: IntakeMetrics,
        max_body_bytes: int,
        database_wait_seconds: float = DATABASE_WAIT_SECONDS,
    ) -> None:
        self._verifier = verifier
        self._stock = stock
        self._keep_invalid = keep_invalid
        self._metrics = metrics
        self._max_body_bytes = max_body_bytes
        self._database_wait_seconds = database_wait_seconds

    async def receive(
        self, headers: Iterable[tuple[bytes, bytes]], body: AsyncIterator[bytes]
    ) -> Answer:
        """Answer one request from its raw ASGI headers and its body's chunks as they come.

        Never raises: a sender gone mid-body (``SenderGoneError`` from ``body``) is answered
        400 for no one to read; an error of the service itself (a bug) is logged with its
        trace (``webhooks.failed``) and answered 500, and the sender retries.
        """
        started = time.perf_counter()
        fields: dict[str, Any] = {}
        try:
            answer = await self._answer(dict(headers), body, fields)
        except RefusedError as refused:
            self._metrics.refusals.labels(reason=refused.reason).inc()
            fields["refused"] = str(refused.reason)
            answer = _refusal(refused.reason)
        except SenderGoneError:
            fields["refused"] = "sender_gone"
            answer = Answer(400, {"error": "sender_gone"})
        except Exception as error:  # noqa: BLE001 - a bug: answered 500, its trace logged
            # The trace as text, never a renderer's with the frames' locals: they hold the
            # signature header.
            logger.error(  # noqa: TRY400
                "webhooks.failed",
                error=f"{type(error).__name__}: {error}",
                trace=traceback.format_exc(),
                **fields,
            )
            answer = Answer(500, {"error": "internal_error"})
        seconds = time.perf_counter() - started
        self._metrics.answer_seconds.labels(status=str(answer.status)).observe(seconds)
        # A refusal (401, 413, 422, 503) is a warning: a wrong secret refuses every webhook,
        # and the log is where an operator looks first.
        log = logger.info if answer.status < 400 else logger.warning  # noqa: PLR2004 - HTTP
        log("webhooks.answered", status=answer.status, ms=round(seconds * 1000, 1), **fields)
        return answer

    async def _answer(
        self, headers: dict[bytes, bytes], chunks: AsyncIterator[bytes], fields: dict[str, Any]
    ) -> Answer:
        signed = self._verifier.signed_headers(headers)
        fields["webhook_id"] = signed.webhook_id
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self._max_body_bytes:
            raise RefusedError(Refusal.BODY_TOO_LARGE)
        body = await read_body(chunks, self._max_body_bytes)
        self._verifier.verify(signed, body)
        try:
            webhook_type = parse_event(AnyWebhook, body).type
        except MalformedEventError as error:
            fields["type"] = OTHER_TYPE
            return await self._invalid(
                webhook_id=signed.webhook_id,
                webhook_type=None,
                headers=headers,
                body=body,
                error=error,
                fields=fields,
            )
        label = fields["type"] = type_label(webhook_type)
        model = TAKEN.get(webhook_type)
        if model is None:
            fields["outcome"] = TYPE_NOT_TAKEN
            self._metrics.received.labels(type=label, outcome=TYPE_NOT_TAKEN).inc()
            return Answer(204)
        try:
            command = _command(model, body, signed.webhook_id)
            outcome = await self._bounded(self._stock.apply(command))
        except (MalformedEventError, ValueError) as error:
            # ValueError: the stock store refuses the command as it is (BatchFunction.check).
            return await self._invalid(
                webhook_id=signed.webhook_id,
                webhook_type=webhook_type,
                headers=headers,
                body=body,
                error=error,
                fields=fields,
            )
        fields["outcome"] = outcome.label
        self._metrics.count_applied(label, outcome)
        return Answer(204)

    async def _invalid(  # noqa: PLR0913 - the request's parts, by name
        self,
        *,
        webhook_id: str,
        webhook_type: str | None,
        headers: dict[bytes, bytes],
        body: bytes,
        error: Exception,
        fields: dict[str, Any],
    ) -> Answer:
        """Keep the invalid webhook (once per webhook id), count it, and answer 422."""
        # PostgreSQL's text cannot hold a NUL, which a JSON string (a type, a quoted key) can.
        reason = str(error).replace("\x00", "\\x00")[:MAX_REASON_LENGTH]
        invalid = InvalidWebhook(
            webhook_id=webhook_id,
            type=webhook_type if webhook_type and "\x00" not in webhook_type else None,
            headers=kept_headers(headers),
            body=body,
            reason=reason,
        )
        await self._bounded(self._keep_invalid(invalid))
        fields["outcome"] = INVALID
        self._metrics.received.labels(type=fields["type"], outcome=INVALID).inc()
        return Answer(422, {"error": "invalid_event", "reason": reason})

    async def _bounded(self, call: Awaitable[T]) -> T:
        """``call``'s result, awaited at most the database wait.

        Raises:
            RefusedError: ``database_unavailable``: the wait passed, or the store's retry
                budget was spent (``TransientError``).
        """
        try:
            async with asyncio.timeout(self._database_wait_seconds):
                return await call
        except (TimeoutError, TransientError) as error:
            raise RefusedError(Refusal.DATABASE_UNAVAILABLE) from error


def _command(
    model: type[TakenWebhook], body: bytes, webhook_id: str
) -> RecordShipment | RecordWarehouseCancellation | RecordAdjustment:
    """The command of a signed ``body`` of a taken type, whose model is ``model``.

    Raises:
        MalformedEventError: the body is no valid event of its type.
    """
    event = parse_event(model, body)
    return event.data.to_command(webhook_id=webhook_id, source=Source.WEBHOOK)


async def read_body(chunks: AsyncIterator[bytes], limit: int) -> bytes:
    """The body from its ``chunks``, refused as soon as more than ``limit`` bytes came.

    Raises:
        RefusedError: ``body_too_large``; the rest of the body is not read.
    """
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise RefusedError(Refusal.BODY_TOO_LARGE)
        parts.append(chunk)
    return b"".join(parts)


def kept_headers(headers: dict[bytes, bytes]) -> dict[str, str]:
    """The headers kept with an invalid webhook: all but :data:`UNKEPT_HEADERS`, as text."""
    kept = {name.decode("latin-1"): value.decode("latin-1") for name, value in headers.items()}
    return {name: value for name, value in kept.items() if name not in UNKEPT_HEADERS}


def _refusal(reason: Refusal) -> Answer:
    if reason is Refusal.BODY_TOO_LARGE:
        # The rest of the body stays unread: the connection cannot carry another request.
        return Answer(413, {"error": str(reason)}, {"connection": "close"})
    if reason is Refusal.DATABASE_UNAVAILABLE:
        return Answer(503, {"error": str(reason)}, {"retry-after": str(RETRY_AFTER_SECONDS)})
    return Answer(401, {"error": str(reason)})
