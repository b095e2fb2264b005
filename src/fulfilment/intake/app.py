"""The intake's ASGI app: ``POST /webhooks/warehouse`` on FastAPI, and its OpenAPI document.

FastAPI (docs/design.md, "The webhook intake", says why) writes the OpenAPI document from the
route, while the handler takes the raw ``Request`` and reads its stream itself: the signature
is checked on the bytes as received, the body limit while they arrive, and nothing is parsed
before (``intake.receiver``). So FastAPI validates nothing of the request; the request body's
schema and the three Standard Webhooks headers are written into the document from the wire
models (``contracts.warehouse_webhooks``). The app serves no document, no docs page and no
other path: an Ingress exposes this port to the warehouse, and the probes are on another.

``make openapi`` (``python -m fulfilment.intake.app docs/openapi.json``) writes the document;
``tests/unit/test_openapi.py`` fails when the committed one is stale.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic.json_schema import models_json_schema
from starlette.requests import ClientDisconnect

from fulfilment.contracts.warehouse_webhooks import (
    AnyWebhook,
    FulfilmentOrderCancelledWebhook,
    InventoryAdjustedWebhook,
    ShipmentShippedWebhook,
)
from fulfilment.exit_codes import ExitCode
from fulfilment.intake.receiver import RETRY_AFTER_SECONDS, SenderGoneError, WebhookReceiver
from fulfilment.intake.signatures import MAX_TIMESTAMP_DIGITS, MAX_WEBHOOK_ID_LENGTH, Refusal

WEBHOOK_PATH: Final = "/webhooks/warehouse"
"""Where the warehouse sends its webhooks."""

CONTRACT_VERSION: Final = "1.0.0"
"""The document's ``info.version``: the version of the endpoint's contract, not the package's."""

_SCHEMAS = "#/components/schemas/{model}"

_ERROR_ANSWER = {
    "title": "ErrorAnswer",
    "type": "object",
    "properties": {
        "error": {"type": "string", "description": "What was refused, as a fixed label."},
        "reason": {"type": "string", "description": "Why the event is invalid (422 only)."},
    },
    "required": ["error"],
}

_HEADERS: Final[list[dict[str, Any]]] = [
    {
        "name": "webhook-id",
        "in": "header",
        "required": True,
        "description": "The sender's id of the event, the same on every retry of it.",
        "schema": {"type": "string", "minLength": 1, "maxLength": MAX_WEBHOOK_ID_LENGTH},
    },
    {
        "name": "webhook-timestamp",
        "in": "header",
        "required": True,
        "description": "Unix seconds of this attempt, an integer; refused outside the tolerance"
        " (FULFILMENT_WEBHOOKS_TOLERANCE_SECONDS) either way.",
        "schema": {"type": "string", "pattern": f"^[0-9]{{1,{MAX_TIMESTAMP_DIGITS}}}$"},
    },
    {
        "name": "webhook-signature",
        "in": "header",
        "required": True,
        "description": "Space-separated `v1,<base64 HMAC-SHA256 of"
        ' "{webhook-id}.{webhook-timestamp}.{raw body}">` entries (Standard Webhooks 1.0);'
        " one matching any secret passes, entries of other versions are ignored.",
        "schema": {"type": "string", "minLength": 1},
    },
]


def _response(description: str, headers: dict[str, object] | None = None) -> dict[str, object]:
    answer: dict[str, object] = {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": _SCHEMAS.format(model="ErrorAnswer")}}},
    }
    if headers:
        answer["headers"] = headers
    return answer


_RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    204: {
        "description": "Recorded (applied, or applied before: the same webhook id, or the same"
        " shipment or cancellation under another), committed before this answer; or a type the"
        " service does not take, counted and not kept."
    },
    401: _response(
        "A header missing, a malformed timestamp or one outside the tolerance, or no signature"
        " matching: nothing recorded, the body never parsed. `error` is one of "
        + ", ".join(
            f"`{reason}`"
            for reason in (
                Refusal.MISSING_HEADER,
                Refusal.MALFORMED_TIMESTAMP,
                Refusal.TIMESTAMP_OUTSIDE_TOLERANCE,
                Refusal.NO_MATCHING_SIGNATURE,
            )
        )
        + "."
    ),
    413: _response(
        "The body is over the limit (FULFILMENT_WEBHOOKS_MAX_BODY_BYTES): nothing recorded."
    ),
    422: _response(
        "Signed, but not a valid event of its type: `reason` says why; the webhook is kept once"
        " per webhook id for an operator to replay."
    ),
    503: _response(
        "The database did not answer in time: nothing recorded; send it again.",
        headers={
            "Retry-After": {
                "description": "Seconds to wait before sending it again.",
                "schema": {"type": "integer", "example": RETRY_AFTER_SECONDS},
            }
        },
    ),
}

router = APIRouter()


@router.post(
    WEBHOOK_PATH,
    status_code=204,
    response_class=Response,
    summary="Receive a signed webhook of the warehouse",
    description="A shipment (`shipment.shipped`), a cancellation by the warehouse"
    " (`fulfilment_order.cancelled`) or an adjustment of its stock (`inventory.adjusted`),"
    " signed as Standard Webhooks 1.0 specifies; any other"
    " `type` is answered 204 and not kept. The signature is checked on the raw body before it"
    " is parsed.",
    operation_id="receiveWarehouseWebhook",
    responses=_RESPONSES,
    openapi_extra={
        "parameters": _HEADERS,
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        "anyOf": [
                            {"$ref": _SCHEMAS.format(model="ShipmentShippedWebhook")},
                            {"$ref": _SCHEMAS.format(model="FulfilmentOrderCancelledWebhook")},
                            {"$ref": _SCHEMAS.format(model="InventoryAdjustedWebhook")},
                            {"$ref": _SCHEMAS.format(model="AnyWebhook")},
                        ]
                    }
                }
            },
        },
    },
)
async def receive_warehouse_webhook(request: Request) -> Response:
    """Answer one webhook (``intake.receiver``); the receiver is the app's ``state.receiver``."""
    receiver: WebhookReceiver = request.app.state.receiver
    answer = await receiver.receive(request.headers.raw, _chunks(request))
    if answer.body is None:
        return Response(status_code=answer.status, headers=answer.headers)
    return JSONResponse(answer.body, status_code=answer.status, headers=answer.headers)


async def _chunks(request: Request) -> AsyncIterator[bytes]:
    """The body's chunks as they arrive; a sender gone mid-body is ``SenderGoneError``."""
    try:
        async for chunk in request.stream():
            yield chunk
    except ClientDisconnect as gone:
        raise SenderGoneError from gone


def intake_app(receiver: WebhookReceiver | None) -> FastAPI:
    """The endpoint's app, answering with ``receiver`` (None: for its document alone)."""
    app = FastAPI(
        title="fulfilment webhook intake",
        version=CONTRACT_VERSION,
        description="The endpoint the warehouse sends its signed webhooks to"
        " (`fulfilment webhooks`, on FULFILMENT_WEBHOOKS_PORT).",
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.include_router(router)
    app.state.receiver = receiver
    return app


def openapi_document() -> str:
    """The endpoint's OpenAPI 3.1 document as committed: JSON, indented, a final newline."""
    document = intake_app(None).openapi()
    _, definitions = models_json_schema(
        [
            (ShipmentShippedWebhook, "validation"),
            (FulfilmentOrderCancelledWebhook, "validation"),
            (InventoryAdjustedWebhook, "validation"),
            (AnyWebhook, "validation"),
        ],
        ref_template=_SCHEMAS,
    )
    document.setdefault("components", {})["schemas"] = dict(sorted(definitions["$defs"].items()))
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> ExitCode:
    """``python -m fulfilment.intake.app FILE``: write :func:`openapi_document` to FILE.

    Returns the exit status: 0, or 2 with a one-line usage when FILE is not the one argument.
    """
    arguments = sys.argv[1:] if argv is None else argv
    if len(arguments) != 1:
        sys.stderr.write("usage: python -m fulfilment.intake.app FILE\n")
        return ExitCode.BAD_INPUT
    Path(arguments[0]).write_text(openapi_document(), encoding="utf-8")
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
