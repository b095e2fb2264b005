"""Standard Webhooks 1.0 verification of the warehouse's webhooks, on the raw bytes.

A webhook carries ``webhook-id``, ``webhook-timestamp`` (integer Unix seconds of this attempt)
and ``webhook-signature`` (space-separated ``<version>,<base64>`` entries); a ``v1`` signature
is the HMAC-SHA256, with a secret's bytes, of ``{webhook-id}.{webhook-timestamp}.{raw body}``
(product.md, "Hearing back from the warehouse").

The expected signature is the ``standardwebhooks`` package's own (``Webhook.sign``), one per
secret; the checks around it are written here because the package's ``verify`` does not fit
(docs/design.md, "The webhook intake"): its tolerance is fixed at 5 minutes, it floors a
fractional timestamp and signs the floor, and it tries only one secret. So:

- every secret of ``FULFILMENT_WAREHOUSE_WEBHOOK_SECRETS`` is tried (rotation), against every
  ``v1`` entry of the header, each comparison in constant time (``hmac.compare_digest``) and
  all of them made, whatever matched first; an entry of another version (``v1a``, ed25519) or
  a malformed one is skipped, never an error, so one bad entry beside a valid one passes;
- the timestamp is ASCII digits only, and within the tolerance either way of now;
- the headers are checked before the body is read (:meth:`WebhookVerifier.signed_headers`),
  the signature once it is (:meth:`WebhookVerifier.verify`): a refused request's body is
  never parsed.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Final

from standardwebhooks import Webhook

MAX_WEBHOOK_ID_LENGTH: Final = 255
"""Characters of a ``webhook-id``, at most: the warehouse's ids of the contract are as long."""

MAX_TIMESTAMP_DIGITS: Final = 12
"""Digits of a ``webhook-timestamp``, at most (Unix seconds until the year 33658)."""


class Refusal(StrEnum):
    """Why a request was refused before its body was applied: ``fulfilment_webhook_refusals_total``.

    The four signature reasons answer 401, ``body_too_large`` 413, ``database_unavailable`` 503.
    """

    MISSING_HEADER = "missing_header"
    """A ``webhook-id``, ``webhook-timestamp`` or ``webhook-signature`` header is absent or
    empty; or the id is not UTF-8 or longer than :data:`MAX_WEBHOOK_ID_LENGTH` (no sender's
    id is, so it counts as none)."""
    MALFORMED_TIMESTAMP = "malformed_timestamp"
    """``webhook-timestamp`` is not an integer of ASCII digits."""
    TIMESTAMP_OUTSIDE_TOLERANCE = "timestamp_outside_tolerance"
    """``webhook-timestamp`` is further from now than the tolerance, either way."""
    NO_MATCHING_SIGNATURE = "no_matching_signature"
    """No ``v1`` entry of ``webhook-signature`` matches any secret."""
    BODY_TOO_LARGE = "body_too_large"
    """The body is larger than ``FULFILMENT_WEBHOOKS_MAX_BODY_BYTES``."""
    DATABASE_UNAVAILABLE = "database_unavailable"
    """The database did not answer in time; the sender retries."""


class RefusedError(Exception):
    """The request is refused for ``reason`` (:class:`Refusal`); its body is not applied."""

    def __init__(self, reason: Refusal) -> None:
        super().__init__(str(reason))
        self.reason = reason


@dataclass(frozen=True, slots=True)
class SignedHeaders:
    """The three Standard Webhooks headers of a request, checked but not yet its signature.

    Attributes:
        webhook_id: the sender's id of the event, the same on every retry of it.
        timestamp: ``webhook-timestamp``, Unix seconds of this attempt.
        signatures: ``webhook-signature`` as received (bytes; never logged).
    """

    webhook_id: str
    timestamp: int
    signatures: bytes = field(repr=False)


class WebhookVerifier:
    """Checks a webhook's headers, then its signature, against every secret.

    Args:
        secrets: the ``whsec_<base64>`` secrets (at least one), in any order.
        tolerance_seconds: how far the timestamp may be from now, either way
            (``FULFILMENT_WEBHOOKS_TOLERANCE_SECONDS``); a timestamp exactly that far passes.
        clock: the current Unix time in seconds (``time.time``; tests pass a fixed one).

    Raises:
        ValueError: no secret, or a secret the package cannot read (the settings check them).
    """

    def __init__(
        self,
        secrets: Sequence[str],
        *,
        tolerance_seconds: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not secrets:
            msg = "at least one webhook secret is needed"
            raise ValueError(msg)
        try:
            self._webhooks = tuple(Webhook(secret) for secret in secrets)
        except Exception as error:
            # Its message could quote the secret: say only which one.
            msg = "a webhook secret is not whsec_<base64>"
            raise ValueError(msg) from error
        self._tolerance_seconds = tolerance_seconds
        self._clock = clock

    def signed_headers(self, headers: Mapping[bytes, bytes]) -> SignedHeaders:
        """The checked headers of a request, from its raw ASGI headers (names lower-case).

        Raises:
            RefusedError: ``missing_header``, ``malformed_timestamp`` or
                ``timestamp_outside_tolerance``.
        """
        raw_id = headers.get(b"webhook-id", b"").strip()
        raw_timestamp = headers.get(b"webhook-timestamp", b"").strip()
        signatures = headers.get(b"webhook-signature", b"").strip()
        if not (raw_id and raw_timestamp and signatures):
            raise RefusedError(Refusal.MISSING_HEADER)
        try:
            webhook_id = raw_id.decode()
        except UnicodeDecodeError:
            raise RefusedError(Refusal.MISSING_HEADER) from None
        if len(webhook_id) > MAX_WEBHOOK_ID_LENGTH:
            raise RefusedError(Refusal.MISSING_HEADER)
        if not (raw_timestamp.isdigit() and len(raw_timestamp) <= MAX_TIMESTAMP_DIGITS):
            # isdigit() of bytes: ASCII digits only, so no sign, point, exponent or space.
            raise RefusedError(Refusal.MALFORMED_TIMESTAMP)
        timestamp = int(raw_timestamp)
        if abs(self._clock() - timestamp) > self._tolerance_seconds:
            raise RefusedError(Refusal.TIMESTAMP_OUTSIDE_TOLERANCE)
        return SignedHeaders(webhook_id, timestamp, signatures)

    def verify(self, signed: SignedHeaders, body: bytes) -> None:
        """Return when a ``v1`` entry of ``signed.signatures`` signs ``body`` with a secret.

        Every entry is compared with every secret's expected ``v1,<base64>`` in constant time,
        all of them, so the time taken says nothing of which matched.

        Raises:
            RefusedError: ``no_matching_signature``.
        """
        sent_at = datetime.fromtimestamp(signed.timestamp, tz=UTC)
        expected = [
            webhook.sign(signed.webhook_id, sent_at, body).encode() for webhook in self._webhooks
        ]
        entries = [entry for entry in signed.signatures.split() if entry.startswith(b"v1,")]
        matched = False
        for entry in entries:
            for signature in expected:
                matched |= hmac.compare_digest(entry, signature)
        if not matched:
            raise RefusedError(Refusal.NO_MATCHING_SIGNATURE)
