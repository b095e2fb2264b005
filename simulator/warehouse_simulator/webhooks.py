"""The warehouse's webhooks: Standard Webhooks 1.0, signed with the ``standardwebhooks`` package.

Each change of the warehouse (a shipment, a cancellation of its own, an adjustment of its
stock) becomes one webhook, a
``POST`` of ``{"type", "timestamp", "data"}`` to ``webhook_url`` with the headers
``webhook-id`` (``msg_<hex>``, the same on every retry), ``webhook-timestamp`` (this attempt's
Unix seconds) and ``webhook-signature`` (one ``v1,<base64>`` per secret of
``webhook_secrets``, space-separated). The sender behaves as real ones do:

- a 2xx delivers it; a non-2xx, a timeout or a connection error is retried after the waits of
  ``webhook_retry_seconds`` (the last repeated), until ``webhook_give_up_seconds`` after the
  first attempt;
- a 410 Gone stops it, and disables the endpoint, as the specification asks: no later webhook
  is sent until ``webhook_url`` is set again;
- many are in flight at once (``concurrency``), so they may arrive out of order anyway.

The fault knobs (:class:`~.knobs.Faults`, ``webhook_*``) send one again under the same id
(duplicate) or a new one (resend), hold one back (reorder), delay them all, never send one,
sign an attempt with a wrong secret or give it a stale timestamp. :attr:`WebhookSender.webhooks`
records every webhook and each of its attempts with the answer, for the tests and the demo
(``GET /_simulator/webhooks``).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Coroutine
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import standardwebhooks

from warehouse_simulator.knobs import Faults
from warehouse_simulator.shipping import rfc3339

ATTEMPTS_CAP = 10_000
"""Attempts kept per webhook in the record (a receiver down for a day is retried that often)."""


@dataclass
class Attempt:
    """One POST of a webhook, and what came of it."""

    at: str
    """When it was sent (RFC 3339)."""
    timestamp: int
    """Its ``webhook-timestamp``."""
    wrong_secret: bool
    stale: bool
    status: int | None = None
    """The answer's status; None when there was none (``error``)."""
    error: str | None = None
    """``timeout``, or the transport error's name (e.g. ``ConnectError``)."""


@dataclass
class Webhook:
    """One webhook: a change sent under one ``webhook-id``.

    ``cause``: ``change`` (the change's first webhook), ``duplicate`` (a delivered one sent
    again, same id) or ``resend`` (the change once more, a new id). ``fate``: ``held``,
    ``waiting`` (delayed), ``sending``, ``delivered``, ``gave_up``, ``gone`` (a 410),
    ``endpoint_disabled`` (not sent: an earlier 410) or ``never_sent`` (the fault).
    """

    webhook_id: str
    type: str
    subject: str
    """The shipment's, cancellation's or adjustment's id."""
    reference: str | None
    """The order's reference (the service's order id); None for an adjustment."""
    cause: str
    fate: str
    attempts: list[Attempt] = field(default_factory=list)


class WebhookSender:
    """Sends the warehouse's webhooks in tasks of the running loop.

    Args:
        faults: the knobs, read at each webhook and attempt.
        rng: the simulator's seeded random choices.
        concurrency: most attempts in flight at once.
    """

    def __init__(self, faults: Faults, rng: random.Random, *, concurrency: int = 8) -> None:
        self.faults = faults
        self.webhooks: list[Webhook] = []
        """Every webhook, in the order made (a duplicate is one more, with the same id)."""
        self._random = rng
        self._concurrency = concurrency
        self._http: httpx.AsyncClient | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._signers: dict[str, standardwebhooks.Webhook] = {}
        self._gone: str | None = None
        """The URL that answered 410: nothing more is sent to it."""

    def emit(self, kind: str, data: dict[str, Any]) -> None:
        """Send a change's webhook (or not: no ``webhook_url``, or the never-sent fault)."""
        faults = self.faults
        if faults.webhook_url is None:
            return
        body = json.dumps(
            {"type": kind, "timestamp": rfc3339(time.time()), "data": data},
            separators=(",", ":"),
        ).encode()
        subject = str(
            data.get("shipment_id") or data.get("cancellation_id") or data.get("adjustment_id")
        )
        webhook = Webhook(_webhook_id(), kind, subject, data.get("reference"), "change", "waiting")
        self.webhooks.append(webhook)
        if self._random.random() < faults.webhook_never_rate:
            webhook.fate = "never_sent"
            return
        self._spawn(self._deliver(webhook, body))

    @property
    def in_flight(self) -> int:
        """Webhooks waiting, held or being sent."""
        return len(self._tasks)

    async def drained(self) -> None:
        """Wait until no webhook is waiting, held or being sent (those they cause too)."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def close(self) -> None:
        """Stop sending: cancel every webhook in flight, close the connections."""
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks))
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    def counts(self) -> dict[str, int]:
        """Webhooks by fate, and attempts made."""
        counts = Counter(webhook.fate for webhook in self.webhooks)
        counts["attempts"] = sum(len(webhook.attempts) for webhook in self.webhooks)
        return dict(sorted(counts.items()))

    def document(self) -> list[dict[str, Any]]:
        """The record as JSON: every webhook and its attempts."""
        return [asdict(webhook) for webhook in self.webhooks]

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _deliver(self, webhook: Webhook, body: bytes) -> None:
        """Wait (delay, hold), then attempt until delivered, gone, or given up."""
        faults = self.faults
        delay = 0.0 if webhook.cause == "duplicate" else faults.webhook_delay_seconds
        if webhook.cause == "change" and self._random.random() < faults.webhook_reorder_rate:
            webhook.fate = "held"
            delay += faults.webhook_hold_seconds
        if delay > 0:
            await asyncio.sleep(delay)
        webhook.fate = "sending"
        first = time.monotonic()
        for attempt in itertools.count():
            url = faults.webhook_url
            if url is None or url == self._gone:
                webhook.fate = "endpoint_disabled"
                break
            status = await self._attempt(webhook, body, url)
            if status is not None and 200 <= status < 300:  # noqa: PLR2004 - any 2xx delivers
                webhook.fate = "delivered"
                break
            if status == 410:  # noqa: PLR2004 - Gone: the receiver asks the sender to stop
                webhook.fate = "gone"
                self._gone = url
                return
            waits = faults.webhook_retry_seconds
            wait = waits[min(attempt, len(waits) - 1)]
            if time.monotonic() + wait - first > faults.webhook_give_up_seconds:
                webhook.fate = "gave_up"
                break
            await asyncio.sleep(wait)
        self._after(webhook, body)

    def _after(self, webhook: Webhook, body: bytes) -> None:
        """The faults that follow a delivery: a duplicate, a resend under a new id."""
        faults = self.faults
        if (
            webhook.fate == "delivered"
            and webhook.cause != "duplicate"
            and self._random.random() < faults.webhook_duplicate_rate
        ):
            again = Webhook(
                webhook.webhook_id,
                webhook.type,
                webhook.subject,
                webhook.reference,
                "duplicate",
                "sending",
            )
            self.webhooks.append(again)
            self._spawn(self._deliver(again, body))
        if webhook.cause == "change" and self._random.random() < faults.webhook_resend_rate:
            resent = Webhook(
                _webhook_id(), webhook.type, webhook.subject, webhook.reference, "resend", "sending"
            )
            self.webhooks.append(resent)
            self._spawn(self._deliver(resent, body))

    async def _attempt(self, webhook: Webhook, body: bytes, url: str) -> int | None:
        """One signed POST; its status, or None (timeout, transport error)."""
        faults = self.faults
        now = time.time()
        stale = self._random.random() < faults.webhook_stale_rate
        wrong = self._random.random() < faults.webhook_wrong_secret_rate
        timestamp = int(now - (faults.webhook_stale_seconds if stale else 0))
        secrets = [_a_wrong_secret()] if wrong else list(faults.webhook_secrets)
        signed_at = datetime.fromtimestamp(timestamp, UTC)
        signature = " ".join(
            self._signer(secret).sign(webhook.webhook_id, signed_at, body.decode())
            for secret in secrets
        )
        record = Attempt(rfc3339(now), timestamp, wrong_secret=wrong, stale=stale)
        if len(webhook.attempts) < ATTEMPTS_CAP:
            webhook.attempts.append(record)
        headers = {
            "webhook-id": webhook.webhook_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": signature,
            "content-type": "application/json",
        }
        try:
            answer = await self._client().post(
                url,
                content=body,
                headers=headers,
                timeout=httpx.Timeout(faults.webhook_timeout_seconds, pool=None),
            )
        except httpx.TimeoutException:
            record.error = "timeout"
            return None
        except httpx.HTTPError as error:
            record.error = type(error).__name__
            return None
        record.status = answer.status_code
        return answer.status_code

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(
                limits=httpx.Limits(max_connections=self._concurrency),
                headers={"user-agent": "warehouse-simulator"},
            )
        return self._http

    def _signer(self, secret: str) -> standardwebhooks.Webhook:
        signer = self._signers.get(secret)
        if signer is None:
            signer = self._signers[secret] = standardwebhooks.Webhook(secret)
        return signer

    def reenable(self) -> None:
        """Send to the endpoint again after a 410 (``webhook_url`` set again)."""
        self._gone = None


def _webhook_id() -> str:
    """A new ``webhook-id``, ``msg_`` and 32 hex digits: unique across runs of the simulator."""
    return f"msg_{uuid.uuid4().hex}"


def _a_wrong_secret() -> str:
    """A secret no receiver knows: 24 random bytes."""
    return "whsec_" + base64.b64encode(os.urandom(24)).decode()
