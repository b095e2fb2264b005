"""Least privilege: the owner migrates, the worker and the relay run as the runtime role.

Two roles of this module's own (unique names, dropped at the end) and a database owned by the
first: ``fulfilment migrate`` runs as the owner with ``FULFILMENT_DATABASE_RUNTIME_ROLE``
naming the second, then a real worker and a real relay run with the runtime role's URL and do
their whole job (reserve, reject, cancel, ship, publish the result events), and the runtime
role is refused what a leaked worker secret must not do: drop or empty a table, read back or
rewrite the dead-letter audit, load stock, prune the outbox (SQLSTATE 42501).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import aio_pika
import asyncpg
import pytest
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from fulfilment.adapters.postgres.privileges import RUNTIME_PRIVILEGES
from fulfilment.contracts.order_cancelled import order_cancelled_body
from fulfilment.contracts.order_shipped import order_shipped_body
from fulfilment.contracts.topology import ORDER_CANCELLED, ORDER_SHIPPED
from fulfilment.entrypoints.cli import app
from tests.e2e.harness import FAST_SETTINGS, WorkerProcess, order_event, publish, spawn, wait_for
from tests.e2e.relay_harness import RelayProcess, bind_events_queue, spawn_relay, take, unpublished
from tests.support.services import admin_execute, service_unavailable, throwaway_database

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.rabbitmq]

INSUFFICIENT_PRIVILEGE = "42501"


@dataclass(frozen=True)
class Roles:
    """The two roles, their URLs to the module's database, and what ``migrate`` printed."""

    owner: str
    runtime: str
    owner_url: str
    runtime_url: str
    migrations: tuple[str, ...]
    """Standard output of ``fulfilment migrate`` as the owner, run twice."""


def _as(url: str, user: str, driver: str = "postgresql") -> str:
    return (
        make_url(url)
        .set(drivername=driver, username=user, password=None)
        .render_as_string(hide_password=False)
    )


def _migrate(url: str, runtime_role: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(
        app,
        ["migrate"],
        env={"FULFILMENT_DATABASE_URL": url, "FULFILMENT_DATABASE_RUNTIME_ROLE": runtime_role},
    )
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def roles() -> Iterator[Roles]:
    try:
        asyncio.run(admin_execute("SELECT 1"))
    except (OSError, asyncpg.PostgresError, TimeoutError) as error:
        service_unavailable("PostgreSQL", error)
    suffix = uuid.uuid4().hex[:10]
    owner, runtime = f"fulfilment_owner_{suffix}", f"fulfilment_runtime_{suffix}"
    asyncio.run(admin_execute(f"CREATE ROLE {owner} LOGIN"))
    try:
        asyncio.run(admin_execute(f"CREATE ROLE {runtime} LOGIN"))
        with throwaway_database("fulfilment_roles", f"OWNER {owner}") as url:
            owner_url = _as(url, owner)
            outputs = []
            for _ in range(2):
                code, stdout, stderr = _migrate(owner_url, runtime)
                assert code == 0, stderr
                outputs.append(stdout)
            yield Roles(owner, runtime, owner_url, _as(url, runtime), tuple(outputs))
    finally:
        # The database went first (WITH FORCE), and the roles' privileges with it.
        asyncio.run(admin_execute(f"DROP ROLE IF EXISTS {runtime}"))
        asyncio.run(admin_execute(f"DROP ROLE IF EXISTS {owner}"))


def test_migrate_as_the_owner_grants_the_runtime_role_its_list_and_says_so(roles: Roles) -> None:
    first, second = roles.migrations

    assert first == second  # idempotent: the second run grants the same, and no more
    assert first.splitlines() == [
        "database migrated to head",
        (
            f"granted runtime role {roles.runtime}: privileges on 27 objects, none on 8"
            " (function shipped_order_lines, function stock_shortage_event,"
            " sequence dead_letter_audit_id_seq, sequence invalid_webhook_audit_id_seq,"
            " sequence outbox_id_seq, sequence warehouse_discrepancies_id_seq,"
            " sequence warehouse_request_audit_id_seq, sequence warehouse_requests_id_seq)"
        ),
    ]


async def test_the_runtime_role_holds_exactly_the_listed_privileges_and_owns_nothing(
    roles: Roles,
) -> None:
    connection = await asyncpg.connect(roles.owner_url)
    try:
        rows = await connection.fetch(
            "SELECT c.relname, c.relkind, pg_get_userbyid(c.relowner) AS owner,"
            " array(SELECT p FROM unnest(ARRAY['SELECT','INSERT','UPDATE','DELETE','TRUNCATE',"
            "'REFERENCES','TRIGGER']) AS p WHERE has_table_privilege($1, c.oid, p)) AS granted"
            " FROM pg_class AS c WHERE c.relnamespace = 'public'::regnamespace"
            " AND c.relkind IN ('r', 'p', 'v')",
            roles.runtime,
        )
        functions = await connection.fetch(
            "SELECT proname, has_function_privilege($1, oid, 'EXECUTE') AS granted,"
            " pg_get_userbyid(proowner) AS owner"
            " FROM pg_proc WHERE pronamespace = 'public'::regnamespace",
            roles.runtime,
        )
    finally:
        await connection.close()

    assert {row["owner"] for row in [*rows, *functions]} == {roles.owner}
    assert {row["relname"]: sorted(row["granted"]) for row in rows} == {
        name: sorted(decision.privileges)
        for name, decision in RUNTIME_PRIVILEGES.items()
        if decision.kind == "table"
    }
    # An entry whose function is gone (reserve_orders, dropped by 0013) is skipped.
    assert {row["proname"]: row["granted"] for row in functions} == {
        name: bool(decision.privileges)
        for name, decision in RUNTIME_PRIVILEGES.items()
        if decision.kind == "function" and name != "reserve_orders"
    }


@pytest.mark.parametrize(
    ("role", "reason"),
    [
        ("owner", "is the role running the migration, which owns the tables"),
        ("nobody", "does not exist in the database server"),
    ],
)
def test_migrate_refuses_a_runtime_role_that_is_the_owner_or_missing(
    roles: Roles, role: str, reason: str
) -> None:
    name = roles.owner if role == "owner" else f"fulfilment_nobody_{uuid.uuid4().hex[:8]}"

    code, _, stderr = _migrate(roles.owner_url, name)

    assert code == 2
    assert stderr.startswith(f"fulfilment: FULFILMENT_DATABASE_RUNTIME_ROLE: role {name} {reason}")
    assert stderr.rstrip().endswith("nothing was migrated")


async def test_the_worker_and_the_relay_do_their_whole_job_as_the_runtime_role(
    roles: Roles,
    workers: list[WorkerProcess],
    broker: aio_pika.abc.AbstractRobustConnection,
    amqp_url: str,
    tmp_path: Path,
) -> None:
    owner = await asyncpg.connect(roles.owner_url)
    relays: list[RelayProcess] = []
    try:
        await owner.executemany(
            "INSERT INTO stock_levels (sku, on_hand) VALUES ($1, $2)", [("A1", 10), ("B2", 3)]
        )
        env = {
            **FAST_SETTINGS,
            "FULFILMENT_DATABASE_URL": _as(roles.runtime_url, roles.runtime),
            "FULFILMENT_AMQP_URL": amqp_url,
            "FULFILMENT_RELAY_POLL_SECONDS": "0.2",
        }
        events = await bind_events_queue(broker)
        spawn(workers, env, tmp_path)
        spawn_relay(relays, env, tmp_path)
        bodies = [
            order_event([("A1", 4), ("B2", 1)]),  # reserved, then partly cancelled
            order_event([("A1", 2)]),  # reserved, then shipped
            order_event([("B2", 5)]),  # rejected: insufficient stock
        ]
        for body, _ in bodies:
            await publish(broker, body)

        async def inbox(count: int) -> bool:
            return int(await owner.fetchval("SELECT count(*) FROM inbox_messages")) >= count

        await wait_for(lambda: inbox(3), what="three orders in the inbox")
        # order_event's order id: uuid5 of the event id.
        placed, shipped = (
            uuid.uuid5(uuid.NAMESPACE_URL, f"order:{event_id}") for _, event_id in bodies[:2]
        )
        now = datetime.now(UTC)
        cancel = order_cancelled_body(
            event_id=uuid.uuid4(), order_id=placed, cancelled_at=now, lines=[("A1", 1)]
        )
        await publish(broker, cancel, routing_key=ORDER_CANCELLED.routing_key)
        ship = order_shipped_body(event_id=uuid.uuid4(), order_id=shipped, shipped_at=now)
        await publish(broker, ship, routing_key=ORDER_SHIPPED.routing_key)
        await wait_for(lambda: inbox(5), what="the cancel and the shipment in the inbox")

        statuses = dict(await owner.fetch("SELECT order_id, status FROM reservations"))
        assert sorted(statuses.values()) == ["rejected", "reserved", "shipped"]
        stock = dict(await owner.fetch("SELECT sku, on_hand - reserved FROM stock_levels"))
        assert stock == {"A1": 10 - 3 - 2, "B2": 3 - 1}
        # reserved x2, rejected, released (the partial cancel), shipped: all published.
        received = await take(events, 5)
        assert sorted(message.routing_key or "" for message in received) == [
            "stock.rejected",
            "stock.released",
            "stock.reserved",
            "stock.reserved",
            "stock.shipped",
        ]
        await wait_for(lambda: _none_unpublished(owner), what="the outbox marked published")
    finally:
        for relay in relays:
            relay.stop_quietly()
        await owner.close()


async def test_a_worker_whose_role_was_granted_nothing_refuses_to_start_in_one_line(
    roles: Roles, workers: list[WorkerProcess], amqp_url: str, tmp_path: Path
) -> None:
    stranger = f"fulfilment_stranger_{uuid.uuid4().hex[:10]}"
    await admin_execute(f"CREATE ROLE {stranger} LOGIN")
    try:
        env = {
            **FAST_SETTINGS,
            "FULFILMENT_DATABASE_URL": _as(roles.runtime_url, stranger),
            "FULFILMENT_AMQP_URL": amqp_url,
        }
        worker = WorkerProcess(env, tmp_path / "stranger.log")
        workers.append(worker)
        worker.start(wait_ready=False)
        assert worker.process is not None
        code = worker.process.wait(timeout=60)
    finally:
        await admin_execute(f"DROP ROLE IF EXISTS {stranger}")

    assert code == 4  # refused, as for a wrong password: retrying will not help
    refused = [line for line in worker.log_lines() if line.get("level") == "error"]
    assert [line["event"] for line in refused] == ["worker.privileges_missing"]
    assert refused[0]["reason"].startswith(
        f"the database user '{stranger}' may not do what the worker does (function"
        " cancel_orders: EXECUTE; function place_orders: EXECUTE; function record_adjustments:"
        " EXECUTE; function record_shipments: EXECUTE; function record_warehouse_cancellations:"
        " EXECUTE; function ship_orders:"
        " EXECUTE; table alembic_version: SELECT; table dead_letter_audit: INSERT;"
        " table dead_letter_audit: SELECT; "
    )
    assert refused[0]["reason"].endswith(
        ": run `fulfilment migrate` with FULFILMENT_DATABASE_RUNTIME_ROLE naming it"
        " (docs/security.md, 'Least privilege')"
    )


async def _none_unpublished(connection: asyncpg.Connection) -> bool:
    return await unpublished(connection) == 0


REFUSED = [
    ("DROP TABLE reservations", "must be owner of table reservations"),
    ("TRUNCATE inbox_messages", "permission denied for table inbox_messages"),
    ("TRUNCATE stock_levels, reservations", "permission denied for table stock_levels"),
    (
        "UPDATE dead_letter_audit SET reason = 'nothing happened'",
        "permission denied for table dead_letter_audit",
    ),
    ("DELETE FROM dead_letter_audit", "permission denied for table dead_letter_audit"),
    ("DELETE FROM inbox_pruned", "permission denied for table inbox_pruned"),
    ("DELETE FROM stock_levels", "permission denied for table stock_levels"),
    ("DELETE FROM outbox", "permission denied for table outbox"),
    ("DELETE FROM reservations", "permission denied for table reservations"),
    (
        "ALTER TABLE stock_levels DROP CONSTRAINT stock_levels_reserved_within_on_hand",
        "must be owner of table stock_levels",
    ),
    ("CREATE TABLE sneaky (id int)", "permission denied for schema public"),
]


async def test_the_runtime_role_may_append_to_the_audit_but_not_drop_truncate_or_rewrite(
    roles: Roles,
) -> None:
    connection = await asyncpg.connect(roles.runtime_url)
    try:
        # What `fulfilment dlq replay` and `purge` do: insert (no RETURNING), and replay
        # counts earlier replays; neither changes nor deletes a row.
        await connection.execute(
            "INSERT INTO dead_letter_audit (run_id, action, failure_class, exception_type,"
            " reason, headers, body, operator) VALUES ($1, 'purged', 'permanent', 'E', 'r',"
            " '{}', '\\x00', 'test')",
            uuid.uuid4(),
        )
        refused = {}
        for statement, _ in REFUSED:
            with pytest.raises(asyncpg.InsufficientPrivilegeError) as caught:
                await connection.execute(statement)
            refused[statement] = (caught.value.sqlstate, str(caught.value))
    finally:
        await connection.close()

    assert refused == {
        statement: (INSUFFICIENT_PRIVILEGE, message) for statement, message in REFUSED
    }
    owner = await asyncpg.connect(roles.owner_url)
    try:
        assert await owner.fetchval("SELECT count(*) FROM dead_letter_audit") == 1
        assert await owner.fetchval("SELECT to_regclass('reservations') IS NOT NULL")
    finally:
        await owner.close()


@pytest.mark.parametrize(
    ("command", "refused"),
    [
        (["outbox", "prune"], "permission denied for table outbox"),
    ],
)
def test_an_owner_command_run_as_the_runtime_role_says_which_role_it_needs(
    roles: Roles, amqp_url: str, command: list[str], refused: str
) -> None:
    result = CliRunner().invoke(
        app,
        command,
        env={"FULFILMENT_DATABASE_URL": roles.runtime_url, "FULFILMENT_AMQP_URL": amqp_url},
    )

    assert result.exit_code == 4
    assert result.stderr == (
        "fulfilment: PostgreSQL refused this command to the user of FULFILMENT_DATABASE_URL:"
        f" InsufficientPrivilegeError: {refused}; run it with the owner role's URL"
        " (docs/security.md, 'Least privilege')\n"
    )


def test_an_operators_adjustment_runs_as_the_runtime_role_with_its_shortage_event(
    roles: Roles, amqp_url: str
) -> None:
    env = {
        "FULFILMENT_DATABASE_URL": _as(roles.runtime_url, roles.runtime, "postgresql+asyncpg"),
        "FULFILMENT_AMQP_URL": amqp_url,
    }

    async def reserve_some() -> None:
        runtime = await asyncpg.connect(roles.runtime_url)
        try:
            await runtime.execute(
                "SELECT * FROM place_orders('fulfilment', $1, $2, ARRAY[now()],"
                " ARRAY[1], ARRAY['ROLE-A'], ARRAY[4])",
                [uuid.uuid4()],
                [uuid.uuid4()],
            )
        finally:
            await runtime.close()

    async def events() -> list[tuple[str, str]]:
        owner = await asyncpg.connect(roles.owner_url)
        try:
            rows = await owner.fetch(
                "SELECT routing_key, sku FROM outbox WHERE sku = 'ROLE-A' ORDER BY id"
            )
            return [(row["routing_key"], row["sku"]) for row in rows]
        finally:
            await owner.close()

    # A SKU the service never stocked, created by a receipt; then a loss below what is held.
    received = CliRunner().invoke(
        app, ["stock", "adjust", "ROLE-A", "5", "--reason", "received", "--yes"], env=env
    )
    asyncio.run(reserve_some())
    lost = CliRunner().invoke(
        app, ["stock", "adjust", "ROLE-A", "-3", "--reason", "damaged", "--yes"], env=env
    )

    assert (received.exit_code, lost.exit_code) == (0, 0), received.output + lost.output
    assert lost.stdout.splitlines()[-1].endswith("on_hand 2, reserved 4, short 2")
    assert asyncio.run(events()) == [
        ("stock.adjusted", "ROLE-A"),
        ("stock.shortage", "ROLE-A"),
        ("stock.adjusted", "ROLE-A"),
    ]
