"""``fulfilment stock adjust``: an operator's adjustment, a dry run unless --yes, audited."""

from __future__ import annotations

import getpass
import socket

import asyncpg
import pytest
from pydantic import SecretStr
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from fulfilment.domain.warehouse_events import AdjustmentReason
from fulfilment.entrypoints.cli import app
from fulfilment.entrypoints.startup import database_options
from fulfilment.exit_codes import ExitCode
from fulfilment.settings import DatabaseSettings, DeadlineSettings
from fulfilment.tools.command import CommandError, ToolOptions
from fulfilment.tools.stock_adjust import adjust_command

pytestmark = pytest.mark.postgres


@pytest.fixture
def options(clean_database: str) -> ToolOptions:
    return ToolOptions(
        amqp_url="amqp://unused/",
        database=database_options(
            DatabaseSettings(url=SecretStr(clean_database)), DeadlineSettings()
        ),
        consumer="fulfilment",
    )


async def _fetch(url: str, query: str) -> list[asyncpg.Record]:
    connection = await asyncpg.connect(
        make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    )
    try:
        return list(await connection.fetch(query))
    finally:
        await connection.close()


async def _stock_of(url: str, on_hand: int, reserved: int) -> None:
    connection = await asyncpg.connect(
        make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    )
    try:
        await connection.execute(
            "INSERT INTO stock_levels (sku, on_hand, reserved) VALUES ('A', $1, $2)",
            on_hand,
            reserved,
        )
    finally:
        await connection.close()


async def test_a_dry_run_says_what_it_would_do_and_changes_nothing(options, clean_database):
    await _stock_of(clean_database, 5, 4)
    lines: list[str] = []

    await adjust_command(
        options,
        "A",
        -7,
        reason=AdjustmentReason.DAMAGED,
        comment=None,
        operator=None,
        execute=False,
        echo=lines.append,
    )

    assert lines == [
        "'A': on_hand 5, reserved 4",
        (
            "adjust (dry run): -7 (damaged) would leave on_hand 0, reserved 4, short 4; 2 unit(s)"
            " beyond on hand kept as a discrepancy; nothing changed (add --yes to do it)"
        ),
    ]
    assert await _fetch(clean_database, "SELECT * FROM warehouse_adjustments") == []
    assert await _fetch(clean_database, "SELECT * FROM outbox") == []


async def test_an_executed_adjustment_applies_once_and_records_who_and_why(options, clean_database):
    await _stock_of(clean_database, 5, 4)
    lines: list[str] = []

    await adjust_command(
        options,
        "A",
        -2,
        reason=AdjustmentReason.COUNTED,
        comment="cycle count, aisle 4",
        operator="jane",
        execute=True,
        echo=lines.append,
    )

    [row] = await _fetch(
        clean_database,
        "SELECT adjustment_id, sku, delta, applied, reason, source, webhook_id, operator,"
        " comment, os_user, host, database_user, on_hand_after, reserved_after"
        " FROM warehouse_adjustments",
    )
    assert row["adjustment_id"].startswith("op-")
    assert dict(row) | {"adjustment_id": "op-"} == {
        "adjustment_id": "op-",
        "sku": "A",
        "delta": -2,
        "applied": -2,
        "reason": "counted",
        "source": "operator",
        "webhook_id": None,
        "operator": "jane",
        "comment": "cycle count, aisle 4",
        "os_user": getpass.getuser(),
        "host": socket.gethostname(),
        "database_user": make_url(clean_database).username,
        "on_hand_after": 3,
        "reserved_after": 4,
    }
    assert lines == [
        "'A': on_hand 5, reserved 4",
        (
            f"adjusted {row['adjustment_id']}: -2 (counted), applied -2: on_hand 3, reserved 4,"
            " short 1"
        ),
    ]
    events = await _fetch(clean_database, "SELECT routing_key, sku, body FROM outbox ORDER BY id")
    assert [(event["routing_key"], event["sku"]) for event in events] == [
        ("stock.shortage", "A"),
        ("stock.adjusted", "A"),
    ]


@pytest.mark.parametrize(
    ("sku", "delta", "reason"),
    [
        ("A", 0, "DELTA must be a non-zero number of units within ±1000000, not 0"),
        ("A", 1_000_001, "DELTA must be a non-zero number of units within ±1000000, not 1000001"),
        (" A", 1, "sku ' A' must not start or end with white space, nor contain a line feed"),
    ],
)
async def test_a_bad_sku_or_delta_is_refused_before_anything_is_read(options, sku, delta, reason):
    with pytest.raises(CommandError) as raised:
        await adjust_command(
            options,
            sku,
            delta,
            reason=AdjustmentReason.FOUND,
            comment=None,
            operator=None,
            execute=True,
            echo=print,
        )

    assert (str(raised.value), raised.value.exit_code) == (reason, ExitCode.BAD_INPUT)


def test_the_command_line_takes_a_negative_delta_and_a_reason(clean_database: str) -> None:
    env = {"FULFILMENT_DATABASE_URL": clean_database, "FULFILMENT_AMQP_URL": "amqp://unused/"}

    dry = CliRunner().invoke(app, ["stock", "adjust", "NEW", "-3", "--reason", "lost"], env=env)
    done = CliRunner().invoke(
        app, ["stock", "adjust", "NEW", "4", "--reason", "received", "--yes"], env=env
    )
    bad = CliRunner().invoke(app, ["stock", "adjust", "NEW", "4", "--reason", "stolen"], env=env)
    mistyped = CliRunner().invoke(
        app, ["stock", "adjust", "NEW", "4", "--reason", "lost", "--yess"], env=env
    )

    assert dry.exit_code == ExitCode.OK, dry.output
    assert dry.stdout.splitlines() == [
        "'NEW': unknown (no stock row)",
        (
            "adjust (dry run): -3 (lost) would leave unknown (no stock row); 3 unit(s) beyond"
            " on hand kept as a discrepancy; nothing changed (add --yes to do it)"
        ),
    ]
    assert done.exit_code == ExitCode.OK, done.output
    assert done.stdout.splitlines()[-1].endswith(
        ": +4 (received), applied +4: on_hand 4, reserved 0"
    )
    assert bad.exit_code == ExitCode.BAD_INPUT
    assert mistyped.exit_code == ExitCode.BAD_INPUT
    assert "--yess" in mistyped.stderr
