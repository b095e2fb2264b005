"""``fulfilment warehouse invalid-webhooks``, ``invalid-webhook``, ``replay-webhook`` and
``discrepancies``, and the report's counts of what the warehouse sent back, on PostgreSQL.

A kept webhook is a row of ``invalid_webhooks`` as the intake writes it (headers without the
signature, the raw body, the reason); a replay applies its command through ``PostgresStock``,
the store the intake applies through, to an order reserved as in production.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from pydantic import SecretStr
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine
from typer.testing import CliRunner

from fulfilment.adapters.postgres.engine import create_engine
from fulfilment.adapters.postgres.stock import PostgresStock
from fulfilment.adapters.postgres.tables.stock import reservations, stock_levels
from fulfilment.adapters.postgres.tables.warehouse import (
    invalid_webhook_audit,
    invalid_webhooks,
    warehouse_discrepancies,
)
from fulfilment.adapters.postgres.warehouse_requests import PostgresWarehouseRequests
from fulfilment.contracts.warehouse_events import ShipmentV1
from fulfilment.domain.handoff import Accepted
from fulfilment.domain.warehouse_events import RecordShipment, Source
from fulfilment.entrypoints.cli import app
from fulfilment.entrypoints.cli.options import tool_options
from fulfilment.exit_codes import ExitCode
from fulfilment.settings import DatabaseSettings, Settings
from fulfilment.tools.command import CommandError, ToolOptions
from fulfilment.tools.report import collect_report, render_report
from fulfilment.tools.warehouse_webhooks import (
    discrepancies_command,
    list_invalid_command,
    replay_command,
    show_invalid_command,
)
from tests.support.builders import order
from tests.support.services import admin_execute, throwaway_database

pytestmark = pytest.mark.postgres

HEADERS = {
    "content-type": "application/json",
    "webhook-id": "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W",
    "webhook-timestamp": "1796551200",
    "user-agent": "warehouse/1.0",
}
"""What the intake keeps of a request's headers: all but ``webhook-signature``."""


def shipment_body(order_id: uuid.UUID, *, shipment_id: str = "SHP-81723", **data: Any) -> bytes:
    """A ``shipment.shipped`` webhook's body of 4 units of 85123A of ``order_id``."""
    fields: dict[str, Any] = {
        "shipment_id": shipment_id,
        "fulfilment_order_id": "WH-7",
        "reference": str(order_id),
        "shipped_at": "2026-12-06T09:58:00Z",
        "carrier": "DHL",
        "tracking_numbers": ["JD014600003828392019"],
        "lines": [{"sku": "85123A", "quantity": 4}],
    }
    fields.update(data)
    return json.dumps(
        {"type": "shipment.shipped", "timestamp": "2026-12-06T10:00:00Z", "data": fields}
    ).encode()


def command_of(body: bytes, *, webhook_id: str | None, source: Source) -> RecordShipment:
    """The command of a shipment webhook's ``body``, as the intake or the poll makes it."""
    data = ShipmentV1.model_validate_json(json.dumps(json.loads(body)["data"]))
    return data.to_command(webhook_id=webhook_id, source=source)


@dataclass
class Warehouse:
    """The database of one test: a reserved order and what the intake kept."""

    engine: AsyncEngine
    stock: PostgresStock
    order_id: uuid.UUID

    async def keep(
        self, webhook_id: str, body: bytes, reason: str, *, type_: str | None = "shipment.shipped"
    ) -> None:
        async with self.engine.begin() as connection:
            await connection.execute(
                invalid_webhooks.insert().values(
                    webhook_id=webhook_id,
                    type=type_,
                    headers={**HEADERS, "webhook-id": webhook_id},
                    body=body,
                    reason=reason,
                )
            )

    async def kept(self, webhook_id: str) -> dict[str, Any]:
        async with self.engine.connect() as connection:
            row = await connection.execute(
                sa.select(invalid_webhooks).where(invalid_webhooks.c.webhook_id == webhook_id)
            )
            return dict(row.mappings().one())

    async def audit(self) -> list[dict[str, Any]]:
        async with self.engine.connect() as connection:
            rows = await connection.execute(
                sa.select(invalid_webhook_audit).order_by(invalid_webhook_audit.c.id)
            )
            return [dict(row) for row in rows.mappings()]

    async def levels(self, sku: str = "85123A") -> tuple[int, int]:
        async with self.engine.connect() as connection:
            row = await connection.execute(
                sa.select(stock_levels.c.on_hand, stock_levels.c.reserved).where(
                    stock_levels.c.sku == sku
                )
            )
            on_hand, reserved = row.one()
            return int(on_hand), int(reserved)

    async def status(self) -> str:
        async with self.engine.connect() as connection:
            row = await connection.execute(
                sa.select(reservations.c.status).where(reservations.c.order_id == self.order_id)
            )
            return str(row.scalar_one())


@pytest.fixture
def options(clean_database: str) -> ToolOptions:
    return tool_options(Settings(database=DatabaseSettings(url=SecretStr(clean_database))))


@pytest.fixture
async def warehouse(options: ToolOptions) -> AsyncIterator[Warehouse]:
    engine = create_engine(options.database)
    try:
        stock = PostgresStock(engine, consumer=options.consumer, retry_budget_seconds=2.0)
        await stock.put_stock({"85123A": 20, "71053": 5})
        placed = order(("85123A", 10))
        await stock.apply(placed)
        yield Warehouse(engine, stock, placed.order_id)
    finally:
        await engine.dispose()


def echoed() -> tuple[list[str], Any]:
    lines: list[str] = []
    return lines, lines.append


# --- list and show ------------------------------------------------------------------------


async def test_list_shows_the_kept_webhooks_waiting_oldest_first_with_their_reason(
    options: ToolOptions, warehouse: Warehouse
) -> None:
    await warehouse.keep("msg_a", b"{not json", "invalid warehouse webhook: body: Invalid JSON")
    await warehouse.keep(
        "msg_b",
        shipment_body(warehouse.order_id, version=2),
        "invalid shipment.shipped webhook: data.version: Input should be 1",
    )
    lines, echo = echoed()

    await list_invalid_command(options, limit=50, replayed=False, as_json=False, echo=echo)

    assert lines[0].split() == ["WEBHOOK", "ID", "TYPE", "RECEIVED", "REPLAYED", "REASON"]
    assert [line.split()[0] for line in lines[1:-1]] == ["msg_a", "msg_b"]
    assert lines[1].split()[3] == "-"
    assert lines[1].endswith("invalid warehouse webhook: body: Invalid JSON")
    assert lines[-1] == "2 of 2 invalid webhook(s) waiting for a replay, oldest first"


async def test_list_as_json_with_a_limit_leaves_out_the_bodies(
    options: ToolOptions, warehouse: Warehouse
) -> None:
    await warehouse.keep("msg_a", b"{not json", "not JSON")
    await warehouse.keep("msg_b", b"[]", "not an object")
    lines, echo = echoed()

    await list_invalid_command(options, limit=1, replayed=False, as_json=True, echo=echo)

    [document] = json.loads(lines[0])
    assert document["webhook_id"] == "msg_a"
    assert document["reason"] == "not JSON"
    assert document["replayed_at"] is None
    assert "body" not in document
    assert "headers" not in document


@pytest.mark.usefixtures("warehouse")
async def test_list_says_so_when_nothing_waits(options: ToolOptions) -> None:
    lines, echo = echoed()

    await list_invalid_command(options, limit=50, replayed=False, as_json=False, echo=echo)

    assert lines == ["no invalid webhook is waiting for a replay"]


async def test_show_prints_the_reason_the_headers_and_the_body_as_received(
    options: ToolOptions, warehouse: Warehouse
) -> None:
    body = shipment_body(warehouse.order_id, version=2)
    await warehouse.keep(
        "msg_b", body, "invalid shipment.shipped webhook: data.version: Input should be 1"
    )
    lines, echo = echoed()

    await show_invalid_command(options, "msg_b", as_json=False, echo=echo)

    text = lines[0].splitlines()
    assert "webhook_id:     msg_b" in text
    assert "type:           shipment.shipped" in text
    assert (
        "reason:         invalid shipment.shipped webhook: data.version: Input should be 1" in text
    )
    assert "replayed_at:    -" in text
    assert "  webhook-id: msg_b" in text
    assert "  user-agent: warehouse/1.0" in text
    assert not any("signature" in line for line in text)
    assert text[-1] == f"body:           {body.decode()}"


async def test_show_as_json_gives_a_body_that_is_not_utf8_in_base64(
    options: ToolOptions, warehouse: Warehouse
) -> None:
    await warehouse.keep(
        "msg_c",
        b"\xff\xfe{}",
        "invalid warehouse webhook: body: Invalid JSON: invalid unicode code point",
    )
    lines, echo = echoed()

    await show_invalid_command(options, "msg_c", as_json=True, echo=echo)

    document = json.loads(lines[0])
    assert document["body_base64"] == "//57fQ=="
    assert "body" not in document
    assert document["headers"]["webhook-id"] == "msg_c"


@pytest.mark.usefixtures("warehouse")
async def test_show_of_an_id_not_kept_exits_1_in_one_line(options: ToolOptions) -> None:
    with pytest.raises(CommandError) as raised:
        await show_invalid_command(options, "msg_nope", as_json=False, echo=print)

    assert raised.value.exit_code == ExitCode.FAILED
    assert str(raised.value) == "no invalid webhook is kept with the id 'msg_nope'"


# --- replay -------------------------------------------------------------------------------


async def test_a_dry_run_says_what_it_would_apply_and_changes_nothing(
    options: ToolOptions, warehouse: Warehouse
) -> None:
    # Kept by an older release that did not read tracking_url; this one does.
    body = shipment_body(warehouse.order_id, tracking_url="https://track.example/JD0146")
    await warehouse.keep(
        "msg_b",
        body,
        "invalid shipment.shipped webhook: data.tracking_url: Extra inputs are not permitted",
    )
    lines, echo = echoed()

    result = await replay_command(
        options, "msg_b", execute=False, operator=None, comment=None, echo=echo
    )

    assert lines == [
        f"replay (dry run): msg_b  shipment SHP-81723 of order {warehouse.order_id} (85123A x4)",
        "dry run: nothing changed (add --yes to do it)",
    ]
    assert result.outcome is None
    assert result.command == command_of(body, webhook_id="msg_b", source=Source.WEBHOOK)
    assert (await warehouse.kept("msg_b"))["replayed_at"] is None
    assert await warehouse.audit() == []
    assert await warehouse.levels() == (20, 10)


async def test_replay_with_yes_applies_the_shipment_marks_the_row_and_audits_it(
    options: ToolOptions, warehouse: Warehouse
) -> None:
    await warehouse.keep("msg_b", shipment_body(warehouse.order_id), "an older release's reason")
    lines, echo = echoed()

    result = await replay_command(
        options,
        "msg_b",
        execute=True,
        operator="alice",
        comment="0.3.0 reads it",
        echo=echo,
    )

    assert lines == [
        f"replayed: msg_b  shipment SHP-81723 of order {warehouse.order_id} (85123A x4): shipped"
    ]
    assert result.outcome == "shipped"
    # 4 of the 10 units held left the building: the order still holds 6, so stays reserved.
    assert await warehouse.levels() == (16, 6)
    assert await warehouse.status() == "reserved"
    kept = await warehouse.kept("msg_b")
    assert kept["replayed_at"] == result.replayed_at
    assert kept["replay_outcome"] == "shipped"
    [audit] = await warehouse.audit()
    assert {key: audit[key] for key in ("webhook_id", "action", "outcome", "operator")} == {
        "webhook_id": "msg_b",
        "action": "replayed",
        "outcome": "shipped",
        "operator": "alice",
    }
    assert audit["comment"] == "0.3.0 reads it"
    assert audit["os_user"] == getpass.getuser()
    assert audit["host"] == socket.gethostname()
    assert audit["database_user"] == "postgres"


async def test_a_replay_without_operator_records_the_os_user(
    options: ToolOptions, warehouse: Warehouse
) -> None:
    await warehouse.keep("msg_b", shipment_body(warehouse.order_id), "reason")

    await replay_command(options, "msg_b", execute=True, operator=None, comment=None, echo=print)

    [audit] = await warehouse.audit()
    assert audit["operator"] == getpass.getuser()
    assert audit["comment"] is None


@pytest.mark.parametrize("execute", [False, True], ids=["dry run", "--yes"])
async def test_a_body_still_invalid_stays_kept_and_the_replay_says_why(
    options: ToolOptions, warehouse: Warehouse, *, execute: bool
) -> None:
    body = shipment_body(warehouse.order_id, lines=[{"sku": "85123A", "quantity": 0}])
    await warehouse.keep(
        "msg_q",
        body,
        "invalid shipment.shipped webhook: data.lines.0.quantity: Input should be greater than"
        " or equal to 1",
    )
    lines, echo = echoed()

    with pytest.raises(CommandError) as raised:
        await replay_command(
            options, "msg_q", execute=execute, operator="alice", comment=None, echo=echo
        )

    assert str(raised.value) == (
        "webhook msg_q is still invalid, left as it was: invalid shipment.shipped webhook:"
        " data.lines.0.quantity: Input should be greater than or equal to 1"
    )
    assert raised.value.exit_code == ExitCode.FAILED
    assert lines == []
    assert (await warehouse.kept("msg_q"))["replayed_at"] is None
    assert await warehouse.audit() == []
    assert await warehouse.levels() == (20, 10)


async def test_a_body_that_is_no_json_stays_invalid(
    options: ToolOptions, warehouse: Warehouse
) -> None:
    await warehouse.keep("msg_a", b'{"type": "shipment.shipped",', "not JSON", type_=None)

    with pytest.raises(
        CommandError,
        match="still invalid, left as it was: invalid warehouse webhook: body: Invalid JSON",
    ):
        await replay_command(
            options, "msg_a", execute=True, operator=None, comment=None, echo=print
        )

    assert await warehouse.audit() == []


async def test_a_type_the_service_does_not_apply_is_refused(
    options: ToolOptions, warehouse: Warehouse
) -> None:
    body = json.dumps(
        {"type": "inventory.counted", "timestamp": "2026-12-06T10:00:00Z", "data": {}}
    ).encode()
    await warehouse.keep("msg_i", body, "kept by hand", type_="inventory.counted")

    with pytest.raises(CommandError, match=r"'inventory\.counted' is not one the service applies"):
        await replay_command(
            options, "msg_i", execute=True, operator=None, comment=None, echo=print
        )

    assert (await warehouse.kept("msg_i"))["replayed_at"] is None


async def test_a_second_replay_is_refused_and_the_shipment_is_applied_once(
    options: ToolOptions, warehouse: Warehouse
) -> None:
    await warehouse.keep("msg_b", shipment_body(warehouse.order_id), "reason")
    await replay_command(options, "msg_b", execute=True, operator=None, comment=None, echo=print)

    with pytest.raises(CommandError, match=r"msg_b was replayed already, at .* \(shipped\)"):
        await replay_command(
            options, "msg_b", execute=True, operator=None, comment=None, echo=print
        )

    assert await warehouse.levels() == (16, 6)
    assert len(await warehouse.audit()) == 1


async def test_a_webhook_the_sender_delivered_again_meanwhile_is_a_duplicate_of_it(
    options: ToolOptions, warehouse: Warehouse
) -> None:
    # The sender retried the same webhook id and a fixed intake applied it: the replay of the
    # kept copy applies nothing more, and says so.
    body = shipment_body(warehouse.order_id)
    await warehouse.keep("msg_b", body, "reason")
    await warehouse.stock.apply(command_of(body, webhook_id="msg_b", source=Source.WEBHOOK))
    lines, echo = echoed()

    result = await replay_command(
        options, "msg_b", execute=True, operator=None, comment=None, echo=echo
    )

    assert result.outcome == "duplicate:webhook"
    assert lines[0].endswith(": duplicate:webhook")
    assert await warehouse.levels() == (16, 6)
    assert (await warehouse.kept("msg_b"))["replay_outcome"] == "duplicate:webhook"


async def test_the_same_shipment_under_another_webhook_id_is_applied_once(
    options: ToolOptions, warehouse: Warehouse
) -> None:
    # The poll (or a re-send under a new webhook id) found the shipment first.
    body = shipment_body(warehouse.order_id)
    await warehouse.keep("msg_b", body, "reason")
    await warehouse.stock.apply(command_of(body, webhook_id=None, source=Source.POLL))

    result = await replay_command(
        options, "msg_b", execute=True, operator=None, comment=None, echo=print
    )

    assert result.outcome == "duplicate:change"
    assert await warehouse.levels() == (16, 6)


async def test_two_operators_replaying_at_once_apply_it_once_and_audit_it_once(
    options: ToolOptions, warehouse: Warehouse
) -> None:
    await warehouse.keep("msg_b", shipment_body(warehouse.order_id), "reason")

    results = await asyncio.gather(
        *(
            replay_command(options, "msg_b", execute=True, operator=name, comment=None, echo=print)
            for name in ("alice", "bob")
        ),
        return_exceptions=True,
    )

    refused = [result for result in results if isinstance(result, CommandError)]
    assert len(refused) == 1, results
    assert "replayed" in str(refused[0])
    assert await warehouse.levels() == (16, 6)
    assert len(await warehouse.audit()) == 1


@pytest.mark.usefixtures("warehouse")
async def test_replay_of_an_id_not_kept_exits_1(options: ToolOptions) -> None:
    with pytest.raises(CommandError, match="no invalid webhook is kept with the id 'msg_nope'"):
        await replay_command(
            options, "msg_nope", execute=True, operator=None, comment=None, echo=print
        )


# --- discrepancies ------------------------------------------------------------------------


async def _discrepancy(engine: AsyncEngine, **values: Any) -> None:
    async with engine.begin() as connection:
        await connection.execute(warehouse_discrepancies.insert().values(**values))


async def test_discrepancies_newest_first_by_kind_and_as_json(
    options: ToolOptions, warehouse: Warehouse
) -> None:
    unknown = uuid.uuid4()
    await _discrepancy(
        warehouse.engine,
        kind="unknown_order",
        source="shipment",
        source_id="SHP-1",
        order_id=unknown,
    )
    await _discrepancy(
        warehouse.engine,
        kind="more_than_held",
        source="shipment",
        source_id="SHP-2",
        order_id=warehouse.order_id,
        sku="85123A",
        quantity=3,
        order_status="reserved",
    )
    lines, echo = echoed()

    await discrepancies_command(options, kinds=(), limit=50, as_json=False, echo=echo)

    assert lines[0].split()[:4] == ["ID", "KIND", "SOURCE", "SOURCE"]
    rows = [line.split() for line in lines[1:-1]]
    assert [row[1:4] for row in rows] == [
        ["more_than_held", "shipment", "SHP-2"],
        ["unknown_order", "shipment", "SHP-1"],
    ]
    assert rows[0][4:8] == [str(warehouse.order_id), "85123A", "3", "reserved"]
    assert rows[1][4:8] == [str(unknown), "-", "-", "-"]
    assert lines[-1] == "2 of 2 discrepancies, newest first"

    lines, echo = echoed()
    await discrepancies_command(
        options, kinds=("unknown_order",), limit=50, as_json=True, echo=echo
    )
    [document] = json.loads(lines[0])
    assert document["kind"] == "unknown_order"
    assert document["order_id"] == str(unknown)
    assert document["sku"] is None


@pytest.mark.usefixtures("warehouse")
async def test_no_discrepancy_is_said_in_one_line(options: ToolOptions) -> None:
    lines, echo = echoed()

    await discrepancies_command(options, kinds=("sku_not_held",), limit=5, as_json=False, echo=echo)

    assert lines == ["no discrepancy is recorded of kind sku_not_held"]


# --- the command line ---------------------------------------------------------------------


def _invoke(clean_database: str, *args: str) -> Any:
    return CliRunner().invoke(
        app, args, env={"FULFILMENT_DATABASE_URL": clean_database}, catch_exceptions=False
    )


async def test_the_commands_exit_as_the_others_do(
    clean_database: str, warehouse: Warehouse
) -> None:
    await warehouse.keep("msg_b", shipment_body(warehouse.order_id), "reason")
    loop = asyncio.get_running_loop()

    def invoke(*args: str) -> Any:
        return _invoke(clean_database, *args)

    listed = await loop.run_in_executor(None, invoke, "warehouse", "invalid-webhooks", "--json")
    missing = await loop.run_in_executor(None, invoke, "warehouse", "invalid-webhook", "msg_x")
    dry = await loop.run_in_executor(None, invoke, "warehouse", "replay-webhook", "msg_b")
    bad_kind = await loop.run_in_executor(
        None, invoke, "warehouse", "discrepancies", "--kind", "lost"
    )

    assert listed.exit_code == 0
    assert [item["webhook_id"] for item in json.loads(listed.stdout)] == ["msg_b"]
    assert missing.exit_code == ExitCode.FAILED
    assert missing.stderr == "fulfilment: no invalid webhook is kept with the id 'msg_x'\n"
    assert dry.exit_code == 0
    assert dry.stdout.splitlines()[-1] == "dry run: nothing changed (add --yes to do it)"
    assert bad_kind.exit_code == ExitCode.BAD_INPUT


# --- the report ---------------------------------------------------------------------------


async def test_the_report_counts_what_the_warehouse_sent_back(
    options: ToolOptions, warehouse: Warehouse
) -> None:
    await warehouse.keep("msg_b", shipment_body(warehouse.order_id), "reason")
    await warehouse.keep("msg_c", b"{", "not JSON", type_=None)
    await replay_command(options, "msg_b", execute=True, operator=None, comment=None, echo=print)
    whole = order(("71053", 2))
    await warehouse.stock.apply(whole)
    polled = shipment_body(
        whole.order_id, shipment_id="SHP-2", lines=[{"sku": "71053", "quantity": 2}]
    )
    await warehouse.stock.apply(command_of(polled, webhook_id=None, source=Source.POLL))
    await _discrepancy(
        warehouse.engine,
        kind="unknown_order",
        source="cancellation",
        source_id="CXL-1",
        order_id=uuid.uuid4(),
    )

    document = await collect_report(options, reconcile_after_seconds=3600)

    assert document["warehouse"] == {
        "shipments": {
            "by_source": {"poll": 1, "webhook": 1},
            "by_outcome": {"shipped": 2},
        },
        "orders_shipped": {"in_part": 1, "in_whole": 1},
        "cancellations": {"by_source": {}, "by_outcome": {}},
        "discrepancies": {"unknown_order": 1},
        "invalid_webhooks": {"kept": 1, "replayed": 1},
        "orders_without_news": 0,
    }
    text = render_report(document)
    assert "  orders shipped              in part 1, in whole 1" in text
    assert "  invalid webhooks            kept 1, replayed 1" in text


@pytest.mark.usefixtures("warehouse")
async def test_the_report_leaves_the_warehouse_out_when_nothing_came_back(
    options: ToolOptions,
) -> None:
    document = await collect_report(options, reconcile_after_seconds=3600)

    assert "warehouse" not in document


async def test_the_report_counts_the_accepted_orders_without_news_past_the_interval(
    options: ToolOptions, warehouse: Warehouse
) -> None:
    handoff = PostgresStock(
        warehouse.engine, consumer=options.consumer, retry_budget_seconds=2.0, handoff=True
    )
    requests = PostgresWarehouseRequests(warehouse.engine, retry_budget_seconds=2.0)
    for sku in ("85123A", "71053"):
        await handoff.apply(order((sku, 1)))
    for request in await requests.claim(10, lease_seconds=30.0):
        await requests.record(request, Accepted(201, '{"status": "received"}', "WH-9"))

    async def count(after: float) -> int:
        document = await collect_report(options, handoff=True, reconcile_after_seconds=after)
        return int(document["warehouse"]["orders_without_news"])

    async def execute(sql: str) -> None:
        async with warehouse.engine.begin() as connection:
            await connection.execute(sa.text(sql))

    assert await count(3600) == 0
    await execute("UPDATE warehouse_requests SET answered_at = now() - interval '2 hours'")
    assert await count(3600) == 2
    assert await count(3 * 3600) == 0
    # News of one of them (a shipment, a cancellation) restarts its interval.
    await execute(
        "UPDATE warehouse_requests SET news_at = now() WHERE id = (SELECT min(id) FROM"
        " warehouse_requests)"
    )
    assert await count(3600) == 1


# --- as the runtime role ------------------------------------------------------------------


def _options(url: str) -> ToolOptions:
    return tool_options(Settings(database=DatabaseSettings(url=SecretStr(url))))


def _as(url: str, user: str) -> str:
    return make_url(url).set(username=user, password=None).render_as_string(hide_password=False)


@pytest.fixture
def runtime_options(database_url: str) -> Iterator[tuple[ToolOptions, ToolOptions]]:
    """A database of its own, migrated by a new owner role granting a second one the runtime
    privileges: the tools' options as ``(owner, runtime)``."""
    del database_url  # only ensures PostgreSQL answers
    suffix = uuid.uuid4().hex[:10]
    owner, runtime = f"fulfilment_owner_{suffix}", f"fulfilment_runtime_{suffix}"
    asyncio.run(admin_execute(f"CREATE ROLE {owner} LOGIN"))
    try:
        asyncio.run(admin_execute(f"CREATE ROLE {runtime} LOGIN"))
        with throwaway_database("fulfilment_ops_roles", f"OWNER {owner}") as url:
            migrated = CliRunner().invoke(
                app,
                ["migrate"],
                env={
                    "FULFILMENT_DATABASE_URL": _as(url, owner),
                    "FULFILMENT_DATABASE_RUNTIME_ROLE": runtime,
                },
            )
            assert migrated.exit_code == 0, migrated.stderr
            yield _options(_as(url, owner)), _options(_as(url, runtime))
    finally:
        asyncio.run(admin_execute(f"DROP ROLE IF EXISTS {runtime}"))
        asyncio.run(admin_execute(f"DROP ROLE IF EXISTS {owner}"))


async def test_the_commands_need_only_the_runtime_role(
    runtime_options: tuple[ToolOptions, ToolOptions],
) -> None:
    owner, runtime = runtime_options
    engine = create_engine(owner.database)
    try:
        stock = PostgresStock(engine, consumer=owner.consumer, retry_budget_seconds=2.0)
        await stock.put_stock({"85123A": 20})
        placed = order(("85123A", 10))
        await stock.apply(placed)
        await Warehouse(engine, stock, placed.order_id).keep(
            "msg_b", shipment_body(placed.order_id), "reason"
        )
    finally:
        await engine.dispose()
    _, echo = echoed()

    await list_invalid_command(runtime, limit=5, replayed=True, as_json=True, echo=echo)
    await show_invalid_command(runtime, "msg_b", as_json=True, echo=echo)
    replayed = await replay_command(
        runtime, "msg_b", execute=True, operator="alice", comment=None, echo=echo
    )
    await discrepancies_command(runtime, kinds=(), limit=5, as_json=True, echo=echo)
    document = await collect_report(runtime, reconcile_after_seconds=3600)

    assert replayed.outcome == "shipped"
    assert document["warehouse"]["invalid_webhooks"] == {"kept": 0, "replayed": 1}
