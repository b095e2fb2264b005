"""The dead-letter header contract: what a DLQ message is said to be, from its headers."""

from __future__ import annotations

from datetime import UTC, datetime

from fulfilment.contracts import dead_letter as h
from fulfilment.contracts.dead_letter import FailureClass, describe_dead_letter

BODY = b'{"event_id": "6f1c0d2e-8f0b-4b7e-9a57-2f1f0c6b9e11"}'
DIED_AT = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def death(reason: str) -> dict[str, object]:
    return {
        "x-death": [
            {"count": 1, "reason": reason, "queue": "fulfilment.order-placed", "time": DIED_AT}
        ]
    }


def test_a_dead_letter_the_service_wrote_is_described_by_its_headers() -> None:
    described = describe_dead_letter(
        {h.FAILURE_CLASS: "permanent", h.REASON: "invalid", h.DELIVERY_COUNT: 0}, BODY
    )

    assert described.failure_class is FailureClass.PERMANENT
    assert described.reason == "invalid"
    assert described.event_id == "6f1c0d2e-8f0b-4b7e-9a57-2f1f0c6b9e11"


def test_service_headers_on_a_message_the_broker_dead_lettered_are_the_senders_and_ignored() -> (
    None
):
    forged = {
        h.FAILURE_CLASS: "permanent",
        h.REASON: "nothing to see",
        h.DELIVERY_COUNT: 0,
        **death("rejected"),
    }

    described = describe_dead_letter(forged, BODY)

    assert described.failure_class is FailureClass.BROKER_REJECTED
    assert described.reason.startswith("dead-lettered by the broker: rejected")
    assert described.dead_lettered_at == DIED_AT


def test_an_expired_message_says_whose_expiration_it_was_and_what_to_do() -> None:
    described = describe_dead_letter(death("expired"), BODY)

    assert described.failure_class is FailureClass.BROKER_OTHER
    assert "expiration" in described.reason
    assert "replay" in described.reason
