"""Standard Webhooks verification (``intake.signatures``) against the package's own signatures.

The clock is fixed, so the tolerance's edges are exact; the intake's tests over a socket
(tests/integration/test_webhook_intake.py) run the same checks end to end.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import UTC, datetime

import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from fulfilment.intake.signatures import Refusal, RefusedError, WebhookVerifier
from tests.support.webhooks import SECOND_SECRET, SECRET, UNKNOWN_SECRET, signed_headers

NOW = 1_765_000_000
BODY = b'{"type": "shipment.shipped", "timestamp": "2026-12-06T10:00:00Z", "data": {}}'


def verifier(*secrets: str, tolerance: int = 300) -> WebhookVerifier:
    return WebhookVerifier(secrets or (SECRET,), tolerance_seconds=tolerance, clock=lambda: NOW)


def raw(headers: dict[str, str]) -> dict[bytes, bytes]:
    return {name.encode(): value.encode() for name, value in headers.items()}


def check(verifier: WebhookVerifier, headers: dict[str, str], body: bytes = BODY) -> None:
    verifier.verify(verifier.signed_headers(raw(headers)), body)


def refusal(verifier: WebhookVerifier, headers: dict[str, str], body: bytes = BODY) -> Refusal:
    with pytest.raises(RefusedError) as refused:
        check(verifier, headers, body)
    return refused.value.reason


def test_a_signature_made_by_the_package_passes() -> None:
    headers = signed_headers(BODY, webhook_id="msg_1", timestamp=NOW)

    check(verifier(), headers)


def test_the_package_and_the_intake_agree_on_a_good_and_a_forged_signature() -> None:
    now = int(datetime.now(UTC).timestamp())
    good = signed_headers(BODY, webhook_id="msg_1", timestamp=now)
    forged = {**good, "webhook-signature": good["webhook-signature"][:-5] + "AAAA="}
    ours = WebhookVerifier([SECRET], tolerance_seconds=300)

    Webhook(SECRET).verify(BODY, good)
    check(ours, good)
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(BODY, forged)
    assert refusal(ours, forged) is Refusal.NO_MATCHING_SIGNATURE


def test_the_signature_is_the_hmac_of_id_timestamp_and_raw_body() -> None:
    key = base64.b64decode(SECRET.removeprefix("whsec_"))
    digest = hmac.new(key, b"msg_1.%d." % NOW + BODY, hashlib.sha256).digest()
    headers = {
        "webhook-id": "msg_1",
        "webhook-timestamp": str(NOW),
        "webhook-signature": "v1," + base64.b64encode(digest).decode(),
    }

    check(verifier(), headers)


def test_a_body_changed_by_one_byte_is_refused() -> None:
    headers = signed_headers(BODY, timestamp=NOW)

    assert refusal(verifier(), headers, BODY.replace(b"shipped", b"shippeD")) is (
        Refusal.NO_MATCHING_SIGNATURE
    )


def test_a_body_that_is_not_utf8_is_verified_as_bytes() -> None:
    body = b"\xff\xfe not text"
    headers = signed_headers(body, timestamp=NOW)

    check(verifier(), headers, body)


@pytest.mark.parametrize("signed_with", [SECRET, SECOND_SECRET])
def test_either_of_two_secrets_passes(signed_with: str) -> None:
    headers = signed_headers(BODY, timestamp=NOW, secrets=(signed_with,))

    check(verifier(SECRET, SECOND_SECRET), headers)


def test_two_signatures_of_which_one_matches_pass() -> None:
    headers = signed_headers(BODY, timestamp=NOW, secrets=(UNKNOWN_SECRET, SECOND_SECRET))

    check(verifier(SECRET, SECOND_SECRET), headers)


def test_a_signature_of_an_unknown_secret_is_refused() -> None:
    headers = signed_headers(BODY, timestamp=NOW, secrets=(UNKNOWN_SECRET,))

    assert refusal(verifier(SECRET, SECOND_SECRET), headers) is Refusal.NO_MATCHING_SIGNATURE


def test_a_v1a_entry_is_ignored_even_with_a_matching_value() -> None:
    headers = signed_headers(BODY, timestamp=NOW)
    _, value = headers["webhook-signature"].split(",", 1)

    only_v1a = {**headers, "webhook-signature": f"v1a,{value}"}
    beside = {**headers, "webhook-signature": f"v1a,{value} {headers['webhook-signature']}"}

    assert refusal(verifier(), only_v1a) is Refusal.NO_MATCHING_SIGNATURE
    check(verifier(), beside)


@pytest.mark.parametrize(
    "malformed", ["v1,not base64!!", "v1", "nocomma", "v1,", ",", "v2,AAAA", "v1,\u00e9"]
)
def test_a_malformed_entry_beside_a_valid_one_does_not_fail_the_request(malformed: str) -> None:
    headers = signed_headers(BODY, timestamp=NOW)
    header = f"{malformed} {headers['webhook-signature']}"

    check(verifier(), {**headers, "webhook-signature": header})
    assert refusal(verifier(), {**headers, "webhook-signature": malformed}) is (
        Refusal.NO_MATCHING_SIGNATURE
    )


@pytest.mark.parametrize("offset", [-300, 300, 0])
def test_a_timestamp_at_the_tolerance_either_way_passes(offset: int) -> None:
    headers = signed_headers(BODY, timestamp=NOW + offset)

    check(verifier(tolerance=300), headers)


@pytest.mark.parametrize("offset", [-301, 301, -86400])
def test_a_timestamp_past_the_tolerance_either_way_is_refused(offset: int) -> None:
    headers = signed_headers(BODY, timestamp=NOW + offset)

    assert refusal(verifier(tolerance=300), headers) is Refusal.TIMESTAMP_OUTSIDE_TOLERANCE


def test_the_tolerance_is_the_setting_not_the_package_five_minutes() -> None:
    headers = signed_headers(BODY, timestamp=NOW - 500)

    check(verifier(tolerance=600), headers)
    assert refusal(verifier(tolerance=60), signed_headers(BODY, timestamp=NOW - 61)) is (
        Refusal.TIMESTAMP_OUTSIDE_TOLERANCE
    )


@pytest.mark.parametrize(
    "timestamp", [f"{NOW}.9", f"{NOW}.0", "-1", f"+{NOW}", "1.7e9", f"{NOW}x", "0x10", "٣"]
)
def test_a_timestamp_that_is_not_an_integer_is_refused(timestamp: str) -> None:
    # The package floors "1765000000.9" and would verify a signature over 1765000000.
    headers = signed_headers(BODY, timestamp=NOW)

    assert refusal(verifier(), {**headers, "webhook-timestamp": timestamp}) is (
        Refusal.MALFORMED_TIMESTAMP
    )


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_each_header_missing_or_empty_is_refused(missing: str) -> None:
    headers = signed_headers(BODY, timestamp=NOW)
    without = {name: value for name, value in headers.items() if name != missing}

    assert refusal(verifier(), without) is Refusal.MISSING_HEADER
    assert refusal(verifier(), {**headers, missing: ""}) is Refusal.MISSING_HEADER


def test_a_webhook_id_longer_than_any_sender_mints_is_refused() -> None:
    headers = signed_headers(BODY, webhook_id="m" * 256, timestamp=NOW)

    assert refusal(verifier(), headers) is Refusal.MISSING_HEADER


def test_the_headers_are_checked_before_the_body_is_read() -> None:
    headers = signed_headers(BODY, timestamp=NOW - 301)

    with pytest.raises(RefusedError):
        verifier().signed_headers(raw(headers))


def test_no_secret_or_an_unreadable_one_is_refused_without_quoting_it() -> None:
    with pytest.raises(ValueError, match="at least one"):
        WebhookVerifier([], tolerance_seconds=300)
    with pytest.raises(ValueError, match="not whsec_") as refused:
        WebhookVerifier(["whsec_"], tolerance_seconds=300)
    assert "whsec_" not in str(refused.value).replace("whsec_<base64>", "")
