"""``fulfilment warehouse list``, ``show`` and ``resend``, and the report's counts, on PostgreSQL.

The requests are made as in production: the stock store with the hand-off on records a
fulfilment order per reservation, the requests' store claims it and records the warehouse's
answer (a 422 fails one, an acceptance accepts one, and one first attempted before the key's
retention expires).
"""

from __future__ import annotations

import asyncio
import getpass
import json
import socket
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import sqlalchemy as sa
from pydantic import SecretStr
from typer.testing import CliRunner

from builders import cancellation, order
from fulfilment.adapters.postgres.engine import create_engine
from fulfilment.adapters.postgres.warehouse import PostgresWarehouse
from fulfilment.adapters.postgres.warehouse_requests import PostgresWarehouseRequests
from fulfilment.domain.handoff import (
    Accepted,
    Failed,
    RequestKind,
    RequestStatus,
    WarehouseRequest,
)
from fulfilment.entrypoints.cli import app
from fulfilment.entrypoints.cli.options import tool_options
from fulfilment.exit_codes import ExitCode
from fulfilment.settings import Settings
from fulfilment.tools.command import CommandError, ToolOptions
from fulfilment.tools.report import collect_report, render_report
from fulfilment.tools.warehouse_requests import list_command, resend_command, show_command
from fulfilment.worker.topology import Topology, declare_topology

pytestmark = pytest.mark.postgres

LEASE = 30.0
FAILED_ANSWER = '{"error": "unknown_sku", "sku": "A"}'


@dataclass
class Requests:
    """One request of each status the commands treat differently, as the dispatcher left them."""

    failed: WarehouseRequest
    expired: WarehouseRequest
    accepted: WarehouseRequest
    store: PostgresWarehouseRequests
    engine: sa.ext.asyncio.AsyncEngine

    async def status_of(self, request: WarehouseRequest) -> RequestStatus:
        record = await self.store.get(request.idempotency_key)
        assert record is not None
        return record.status

    async def audit(self) -> list[tuple[uuid.UUID, str, str, str]]:
        async with self.engine.connect() as connection:
            rows = await connection.execute(
                sa.text(
                    "SELECT idempotency_key, action, status_before, operator"
                    " FROM warehouse_request_audit ORDER BY id"
                )
            )
            return [tuple(row) for row in rows]


@pytest.fixture
def options(clean_database: str) -> ToolOptions:
    return tool_options(Settings(database_url=SecretStr(clean_database)))


@pytest.fixture
async def requests(options: ToolOptions) -> AsyncIterator[Requests]:
    engine = create_engine(options.database)
    try:
        stock = PostgresWarehouse(
            engine, consumer=options.consumer, retry_budget_seconds=2.0, handoff=True
        )
        store = PostgresWarehouseRequests(engine, retry_budget_seconds=2.0)
        await stock.put_stock({"A": 10, "B": 10, "C": 10})

        async def sent(sku: str, *, lease_seconds: float = LEASE) -> WarehouseRequest:
            await stock.apply(order((sku, 1)))
            [request] = await store.claim(10, lease_seconds=lease_seconds)
            return request

        failed = await sent("A")
        await store.record(failed, Failed("unknown_sku", FAILED_ANSWER, 422))
        accepted = await sent("B")
        await store.record(accepted, Accepted(201, '{"status": "received"}', "WH-7"))
        expired = await sent("C", lease_seconds=0.1)
        await asyncio.sleep(0.3)
        assert await store.expire(0.2) == 1
        yield Requests(failed, expired, accepted, store, engine)
    finally:
        await engine.dispose()


def echoed() -> tuple[list[str], object]:
    lines: list[str] = []
    return lines, lines.append


def seat() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}"


# --- list ---------------------------------------------------------------------------------


async def test_list_shows_the_requests_the_warehouse_has_not_settled_oldest_first(
    options: ToolOptions, requests: Requests
) -> None:
    lines, echo = echoed()

    await list_command(options, (), limit=50, as_json=False, echo=echo)

    assert lines[0].split() == ["KEY", "KIND", "STATUS", "ATTEMPTS", "CODE", "CREATED", "ORDER"]
    rows = [line.split() for line in lines[1:-1]]
    assert [(row[0], row[1], row[2], row[3], row[4]) for row in rows] == [
        (str(requests.failed.idempotency_key), "fulfilment_order", "failed", "1", "422"),
        (str(requests.expired.idempotency_key), "fulfilment_order", "expired", "1", "-"),
    ]
    assert [row[-1] for row in rows] == [
        str(requests.failed.order_id),
        str(requests.expired.order_id),
    ]
    assert lines[-1] == "2 of 2 request(s) pending, sending, failed, expired, oldest first"


async def test_list_by_status_with_a_limit_and_as_json(
    options: ToolOptions, requests: Requests
) -> None:
    lines, echo = echoed()

    await list_command(
        options,
        (RequestStatus.EXPIRED, RequestStatus.ACCEPTED),
        limit=1,
        as_json=False,
        echo=echo,
    )
    await list_command(options, (RequestStatus.ACCEPTED,), limit=5, as_json=True, echo=echo)
    await list_command(options, (RequestStatus.REFUSED,), limit=5, as_json=False, echo=echo)

    assert lines[1].split()[:3] == [
        str(requests.accepted.idempotency_key),
        "fulfilment_order",
        "accepted",
    ]
    assert lines[2] == "1 of 2 request(s) expired, accepted, oldest first"
    [document] = json.loads(lines[3])
    assert document["idempotency_key"] == str(requests.accepted.idempotency_key)
    assert (document["status"], document["warehouse_id"]) == ("accepted", "WH-7")
    assert "body" not in document
    assert lines[4] == "no warehouse request is refused"


# --- show ---------------------------------------------------------------------------------


async def test_show_gives_an_operator_every_column_and_the_body_sent(
    options: ToolOptions, requests: Requests
) -> None:
    lines, echo = echoed()

    await show_command(options, [requests.failed.idempotency_key], as_json=False, echo=echo)
    await show_command(
        options,
        [requests.accepted.idempotency_key, requests.failed.idempotency_key],
        as_json=True,
        echo=echo,
    )

    fields = dict(line.split(maxsplit=1) for line in lines[0].splitlines())
    assert fields["idempotency_key:"] == str(requests.failed.idempotency_key)
    assert fields["kind:"] == "fulfilment_order"
    assert fields["order_id:"] == str(requests.failed.order_id)
    assert fields["status:"] == "failed"
    assert fields["attempts:"] == "1"
    assert fields["last_status_code:"] == "422"
    assert fields["last_answer:"] == FAILED_ANSWER
    assert fields["lines:"] == "A x1"
    assert fields["body:"] == requests.failed.body.decode()
    assert fields["first_attempt_at:"] != "-"
    assert fields["answered_at:"] != "-"
    accepted, failed = json.loads(lines[1])
    assert (accepted["warehouse_id"], accepted["last_status_code"]) == ("WH-7", 201)
    assert accepted["body"].encode() == requests.accepted.body
    assert failed["lines"] == [{"sku": "A", "quantity": 1}]
    assert failed["kind"] == RequestKind.FULFILMENT_ORDER


async def test_show_of_a_key_no_request_has_fails_naming_it(
    options: ToolOptions, requests: Requests
) -> None:
    lines, echo = echoed()
    unknown = uuid.uuid4()

    with pytest.raises(CommandError) as raised:
        await show_command(
            options, [requests.failed.idempotency_key, unknown], as_json=False, echo=echo
        )

    assert raised.value.exit_code == ExitCode.FAILED
    assert str(raised.value) == f"no warehouse request has the key {unknown}"
    assert lines == []


# --- resend -------------------------------------------------------------------------------


async def test_a_dry_run_says_what_it_would_resend_and_changes_nothing(
    options: ToolOptions, requests: Requests
) -> None:
    lines, echo = echoed()
    keys = [r.idempotency_key for r in (requests.failed, requests.accepted, requests.expired)]

    await resend_command(options, keys, execute=False, operator="ops", echo=echo)

    assert lines[0].startswith(f"resend (dry run): {requests.failed.idempotency_key}  ")
    assert lines[1] == (
        f"refused: {requests.accepted.idempotency_key}  fulfilment_order  order"
        f" {requests.accepted.order_id}  accepted, 1 attempt(s): only failed or expired"
        " requests are re-sent"
    )
    assert lines[2].startswith(f"resend (dry run): {requests.expired.idempotency_key}  ")
    assert lines[3] == (
        "dry run: 2 request(s) would be re-sent, 1 refused (unchanged); nothing changed"
        " (add --yes to do it)"
    )
    assert len(lines) == 4
    assert await requests.status_of(requests.failed) is RequestStatus.FAILED
    assert await requests.status_of(requests.expired) is RequestStatus.EXPIRED
    assert await requests.audit() == []
    assert await requests.store.claim(10, lease_seconds=LEASE) == []


async def test_resend_puts_failed_and_expired_back_to_sending_same_key_and_body_audited(
    options: ToolOptions, requests: Requests
) -> None:
    lines, echo = echoed()
    keys = [r.idempotency_key for r in (requests.failed, requests.expired, requests.accepted)]

    with pytest.raises(CommandError) as raised:
        await resend_command(options, keys, execute=True, operator="alice", echo=echo)

    assert raised.value.exit_code == ExitCode.FAILED
    assert str(raised.value) == (
        "1 request(s) refused (the lines above say why), left as they were"
    )
    assert [line.split(":")[0] for line in lines[:3]] == ["resent", "resent", "refused"]
    assert lines[3] == "resent 2 of 3 request(s), 1 refused (unchanged)"
    assert await requests.status_of(requests.failed) is RequestStatus.SENDING
    assert await requests.status_of(requests.expired) is RequestStatus.SENDING
    assert await requests.status_of(requests.accepted) is RequestStatus.ACCEPTED
    assert await requests.audit() == [
        (requests.failed.idempotency_key, "resent", "failed", f"alice ({seat()})"),
        (requests.expired.idempotency_key, "resent", "expired", f"alice ({seat()})"),
    ]
    # Due now: the dispatcher's next claim sends both again, the same bytes under the same key.
    again = await requests.store.claim(10, lease_seconds=LEASE)
    assert {(r.idempotency_key, r.body, r.attempts) for r in again} == {
        (requests.failed.idempotency_key, requests.failed.body, 2),
        (requests.expired.idempotency_key, requests.expired.body, 2),
    }


async def test_resend_without_a_stated_operator_audits_the_os_user_and_host(
    options: ToolOptions, requests: Requests
) -> None:
    lines, echo = echoed()

    await resend_command(
        options, [requests.failed.idempotency_key], execute=True, operator=None, echo=echo
    )

    assert lines[-1] == "resent 1 of 1 request(s)"
    assert await requests.audit() == [(requests.failed.idempotency_key, "resent", "failed", seat())]


async def test_resend_refuses_a_failed_fulfilment_order_whose_order_was_cancelled_since(
    options: ToolOptions, requests: Requests
) -> None:
    stock = PostgresWarehouse(
        requests.engine, consumer=options.consumer, retry_budget_seconds=2.0, handoff=True
    )
    # The warehouse holds nothing of a failed order: its cancel releases it at once.
    await stock.apply(cancellation(requests.failed.order_id, ("A", 1)))
    lines, echo = echoed()

    with pytest.raises(CommandError):
        await resend_command(
            options, [requests.failed.idempotency_key], execute=True, operator="ops", echo=echo
        )

    assert lines[0].startswith(f"refused: {requests.failed.idempotency_key}  ")
    assert lines[0].endswith(
        ": its order is no longer reserved as the body says, or the status"
        " changed meanwhile (fulfilment warehouse show)"
    )
    assert lines[1] == "resent 0 of 1 request(s), 1 refused (unchanged)"
    assert await requests.status_of(requests.failed) is RequestStatus.FAILED
    assert await requests.audit() == []


async def test_resend_of_keys_no_request_has_fails_in_one_line_and_does_nothing(
    options: ToolOptions, requests: Requests
) -> None:
    lines, echo = echoed()
    unknown = uuid.uuid4()

    with pytest.raises(CommandError) as raised:
        await resend_command(options, [unknown], execute=True, operator="ops", echo=echo)

    assert str(raised.value) == f"no warehouse request has the key {unknown}"
    assert raised.value.exit_code == ExitCode.FAILED
    assert lines == []
    assert await requests.audit() == []


def test_the_command_line_exits_1_for_an_unknown_key_and_2_for_one_that_is_no_uuid(
    database_url: str,
) -> None:
    env = {"FULFILMENT_DATABASE_URL": database_url}
    unknown = uuid.uuid4()

    missing = CliRunner().invoke(app, ["warehouse", "resend", str(unknown), "--yes"], env=env)
    malformed = CliRunner().invoke(app, ["warehouse", "show", "KEY"], env=env)

    assert missing.exit_code == ExitCode.FAILED
    assert missing.stderr == f"fulfilment: no warehouse request has the key {unknown}\n"
    assert missing.stdout == ""
    assert malformed.exit_code == ExitCode.BAD_INPUT
    assert malformed.stderr == "fulfilment: not an idempotency key (a UUID): 'KEY'\n"


# --- report -------------------------------------------------------------------------------


@pytest.fixture
async def report_options(clean_database: str, amqp_url: str) -> ToolOptions:
    await declare_topology(amqp_url, Topology(5))
    return tool_options(
        Settings(database_url=SecretStr(clean_database), amqp_url=SecretStr(amqp_url))
    )


@pytest.mark.rabbitmq
async def test_the_report_counts_the_requests_by_kind_and_status(
    report_options: ToolOptions, requests: Requests
) -> None:
    engine = requests.engine
    stock = PostgresWarehouse(
        engine, consumer=report_options.consumer, retry_budget_seconds=2.0, handoff=True
    )
    await stock.apply(order(("A", 1)))  # pending: recorded, never sent
    await asyncio.sleep(0.1)

    document = await collect_report(report_options)

    requests_report = document["warehouse_requests"]
    assert requests_report["by_kind"] == {
        "fulfilment_order": {"accepted": 1, "expired": 1, "failed": 1, "pending": 1}
    }
    assert (requests_report["open"], requests_report["failed"], requests_report["expired"]) == (
        1,
        1,
        1,
    )
    assert 0.1 <= requests_report["oldest_open_age_seconds"] < 30
    rendered = render_report(document).splitlines()
    at = rendered.index("warehouse requests")
    assert rendered[at + 1].split()[:2] == ["open", "1,"]
    assert rendered[at + 2].split() == ["failed", "1"]
    assert rendered[at + 3].split() == ["expired", "1"]
    assert rendered[at + 4].split() == [
        "fulfilment_order",
        "accepted",
        "1,",
        "expired",
        "1,",
        "failed",
        "1,",
        "pending",
        "1",
    ]


@pytest.mark.rabbitmq
async def test_without_the_hand_off_the_report_is_as_before_and_with_it_counts_zero(
    report_options: ToolOptions,
) -> None:
    without = await collect_report(report_options)
    configured = await collect_report(report_options, handoff=True)

    assert "warehouse_requests" not in without
    assert "warehouse requests" not in render_report(without)
    assert configured["warehouse_requests"] == {
        "open": 0,
        "oldest_open_age_seconds": None,
        "failed": 0,
        "expired": 0,
        "by_kind": {},
    }
    assert "  open                        0" in render_report(configured).splitlines()
