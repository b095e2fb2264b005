"""The webhook intake's OpenAPI document: committed as the code generates it, and complete.

``test_the_committed_document_is_the_one_the_code_generates`` is CI's check that
``docs/openapi.json`` was regenerated (``make openapi``) after a change of the endpoint or of a
wire model of the warehouse's webhooks.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from fulfilment.contracts.warehouse_webhooks import TAKEN
from fulfilment.intake import app

COMMITTED = Path(__file__).parents[2] / "docs" / "openapi.json"


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(app.openapi_document())
    return parsed


def test_the_committed_document_is_the_one_the_code_generates() -> None:
    generated = app.openapi_document()
    committed = COMMITTED.read_text(encoding="utf-8")

    difference = "".join(
        difflib.unified_diff(
            committed.splitlines(keepends=True),
            generated.splitlines(keepends=True),
            "docs/openapi.json (committed)",
            "generated",
            n=1,
        )
    )
    assert not difference, f"docs/openapi.json is stale: run `make openapi`\n{difference[:4000]}"


def test_the_make_target_writes_the_document(tmp_path: Path) -> None:
    out = tmp_path / "openapi.json"

    assert app.main([str(out)]) == 0
    assert out.read_text(encoding="utf-8") == app.openapi_document()
    assert app.main([]) == 2


def test_the_endpoint_documents_every_answer_and_the_three_headers(document) -> None:
    operation = document["paths"]["/webhooks/warehouse"]["post"]

    assert set(operation["responses"]) == {"204", "401", "413", "422", "503"}
    assert "Retry-After" in operation["responses"]["503"]["headers"]
    headers = {p["name"]: p["required"] for p in operation["parameters"] if p["in"] == "header"}
    assert headers == {"webhook-id": True, "webhook-timestamp": True, "webhook-signature": True}
    assert list(document["paths"]) == ["/webhooks/warehouse"]


def _resolved(document: dict[str, Any], name: str) -> dict[str, Any]:
    return {
        "$ref": f"#/components/schemas/{name}",
        "components": document["components"],
    }


@pytest.mark.parametrize("model", sorted(TAKEN.values(), key=lambda model: model.__name__))
def test_each_taken_type_has_a_schema_its_example_body_passes(document, model) -> None:
    schema = _resolved(document, model.__name__)
    webhook_type = model.model_fields["type"].annotation.__args__[0]
    data: dict[str, Any] = {
        "fulfilment_order_id": "FO-1",
        "reference": "0b6e3c9a-55d4-4f7e-8a59-0c1d2e3f4a5b",
        "lines": [{"sku": "85123A", "quantity": 4}],
    }
    if webhook_type == "shipment.shipped":
        data |= {"shipment_id": "SHP-1", "shipped_at": "2026-12-06T09:58:00Z"}
    elif webhook_type == "inventory.adjusted":
        data = {
            "adjustment_id": "ADJ-1",
            "sku": "85123A",
            "delta": -3,
            "reason": "damaged",
            "occurred_at": "2026-12-06T09:58:00Z",
        }
        broken = {**data, "reason": "stolen"}  # the lines' check's counterpart: a closed list
    else:
        data |= {"cancellation_id": "CXL-1", "cancelled_at": "2026-12-06T09:58:00Z", "reason": "x"}
    if webhook_type != "inventory.adjusted":
        broken = {**data, "lines": []}
    body = {"type": webhook_type, "timestamp": "2026-12-06T10:00:00Z", "data": data}

    jsonschema.validate(body, schema)
    model.model_validate_json(json.dumps(body))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**body, "data": broken}, schema)
