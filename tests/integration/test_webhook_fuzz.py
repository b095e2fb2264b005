"""A fuzz of ``POST /webhooks/warehouse`` from its committed OpenAPI document (schemathesis).

Requests made from the document's schemas, valid and not (schemathesis' positive and negative
modes), go to a real intake process on the real PostgreSQL: none may be answered with a 5xx
but the 503 of a database that does not answer, and nothing unsigned may be recorded. The
signed fuzz signs each generated body as the warehouse would, so that the parser, the
invalid webhooks' keeping and the apply run on what the generator makes. About 30 s.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given
from hypothesis import strategies as st
from schemathesis.core import NotSet
from sqlalchemy.engine import make_url

from tests.support.webhooks import IntakeProcess, running_intake, signed_headers

pytestmark = pytest.mark.postgres

SCHEMA = schemathesis.openapi.from_path(Path(__file__).parents[2] / "docs" / "openapi.json")
OPERATION = SCHEMA["/webhooks/warehouse"]["POST"]
CASES = st.one_of(
    OPERATION.as_strategy(schemathesis.GenerationMode.POSITIVE),
    OPERATION.as_strategy(schemathesis.GenerationMode.NEGATIVE),
)
FUZZ = hypothesis.settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
RECORDING_TABLES = (
    "webhook_inbox",
    "warehouse_shipments",
    "warehouse_cancellations",
    "warehouse_discrepancies",
    "invalid_webhooks",
    "inbox_messages",
    "outbox",
)


@pytest.fixture(scope="module")
def intake(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[IntakeProcess]:
    with running_intake(database_url, tmp_path_factory.mktemp("fuzz")) as process:
        yield process


@pytest.fixture(scope="module")
def http() -> Iterator[requests.Session]:
    with requests.Session() as session:
        yield session


def rows(database_url: str) -> dict[str, int]:
    async def count() -> dict[str, int]:
        url = make_url(database_url).set(drivername="postgresql")
        connection = await asyncpg.connect(url.render_as_string(hide_password=False))
        try:
            return {
                table: await connection.fetchval(f"SELECT count(*) FROM {table}")  # noqa: S608
                for table in RECORDING_TABLES
            }
        finally:
            await connection.close()

    return asyncio.run(count())


def base_url(intake: IntakeProcess) -> str:
    return f"http://127.0.0.1:{intake.port}"


def raw_body(case: schemathesis.Case) -> bytes:
    """The generated body as bytes: JSON, or as generated when the negative mode made bytes."""
    if isinstance(case.body, bytes):
        return case.body
    if isinstance(case.body, NotSet):
        return b""
    return json.dumps(case.body).encode()


def no_server_error(status: int) -> bool:
    return status < 500 or status == 503


@pytest.mark.usefixtures("clean_database")
def test_unsigned_requests_get_no_5xx_and_nothing_is_recorded(intake, http, database_url) -> None:
    statuses: set[int] = set()

    @FUZZ
    @given(case=CASES)
    def fuzz(case: schemathesis.Case) -> None:
        try:
            answer = case.call(base_url=base_url(intake), session=http)
        except (requests.exceptions.InvalidHeader, ValueError):
            return  # a header no HTTP client can send
        statuses.add(answer.status_code)
        assert no_server_error(answer.status_code), (answer.status_code, answer.text)
        assert answer.status_code != 204, case

    fuzz()

    assert statuses <= {400, 401, 413, 503}
    assert rows(database_url) == dict.fromkeys(RECORDING_TABLES, 0)


@pytest.mark.usefixtures("clean_database")
def test_signed_requests_get_no_5xx(intake, http) -> None:
    statuses: set[int] = set()

    @FUZZ
    @given(case=CASES)
    def fuzz(case: schemathesis.Case) -> None:
        body = raw_body(case)
        answer = http.post(
            base_url(intake) + "/webhooks/warehouse",
            data=body,
            headers=signed_headers(body),
            timeout=10,
        )
        statuses.add(answer.status_code)
        assert no_server_error(answer.status_code), (answer.status_code, answer.text, body)

    fuzz()

    assert 422 in statuses
