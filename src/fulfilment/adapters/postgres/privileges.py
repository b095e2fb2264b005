"""What the runtime role may do in the database: one decision per table, sequence and function.

Two roles use the database (docs/security.md, "Least privilege"). The **owner** runs ``fulfilment
migrate``: it owns every table and function the migrations create, and the operator commands
that empty, delete or load run as it. The **runtime** role runs ``fulfilment worker``,
``fulfilment relay``, ``fulfilment dispatcher`` and ``fulfilment webhooks`` (and the read-only,
dead-letter and warehouse tools): it owns nothing, and may do only what
:data:`RUNTIME_PRIVILEGES` lists, so that a leaked worker secret cannot drop a table, truncate
the inbox, or rewrite the dead-letter audit.

:data:`RUNTIME_PRIVILEGES` is the one list of those decisions, one entry per object of the
schema, each with the reason. ``fulfilment migrate`` applies it after upgrading, in the
migration's transaction and under its advisory lock (:func:`apply_runtime_grants`, called
from ``migrations/env.py``): for each object, ``REVOKE ALL`` from the runtime role, then
``GRANT`` what the entry lists, so that running it again changes nothing and a verb taken out
of the list is taken back. Functions are also revoked from ``PUBLIC`` (PostgreSQL lets every
role execute a new function). An object of the schema without an entry stops the migration
(:class:`UndecidedObjectsError`), and ``tests/integration/test_database_privileges.py``
fails on one, so that a new table or function of a revision gets a decision before it ships.

The functions run with their caller's rights (PL/pgSQL's default, ``SECURITY INVOKER``), so
the runtime role holds the table privileges the function bodies use
(``migrations/sql/*/v<N>.sql``), verb by verb. Each input event's function gets ``EXECUTE``
from its route (``fulfilment.routes.table.ROUTES``), so a new event needs no entry here
unless its function writes a table of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import text
from sqlalchemy.engine import Connection

from fulfilment.routes.table import ROUTES

ObjectKind = Literal["table", "sequence", "function"]

TABLE_PRIVILEGES = frozenset({"SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES"})
SEQUENCE_PRIVILEGES = frozenset({"USAGE", "SELECT", "UPDATE"})
FUNCTION_PRIVILEGES = frozenset({"EXECUTE"})
_ALLOWED: Mapping[ObjectKind, frozenset[str]] = {
    "table": TABLE_PRIVILEGES,
    "sequence": SEQUENCE_PRIVILEGES,
    "function": FUNCTION_PRIVILEGES,
}


@dataclass(frozen=True, slots=True)
class Grant:
    """What the runtime role may do with one object of the schema, and why.

    ``privileges`` empty means deliberately nothing.
    """

    kind: ObjectKind
    privileges: tuple[str, ...]
    why: str

    def __post_init__(self) -> None:
        unknown = set(self.privileges) - _ALLOWED[self.kind]
        if unknown:
            msg = f"{sorted(unknown)} are not privileges of a {self.kind}"
            raise ValueError(msg)


RUNTIME_PRIVILEGES: Mapping[str, Grant] = {
    # --- tables -----------------------------------------------------------------------------
    "inbox_messages": Grant(
        "table",
        ("SELECT", "INSERT", "UPDATE", "DELETE"),
        "place/cancel/ship_orders insert each event's row (ON CONFLICT ... RETURNING), set"
        " its outcome, and ship_orders deletes the row of a shipment it does not record",
    ),
    "reservations": Grant(
        "table",
        ("SELECT", "INSERT", "UPDATE"),
        "place/cancel_orders insert an order's row (cancel_orders' tombstone with ON CONFLICT"
        " DO UPDATE), the three lock it (FOR UPDATE) and change its status; never deleted",
    ),
    "reservation_lines": Grant(
        "table",
        ("SELECT", "INSERT", "UPDATE", "DELETE"),
        "place_orders inserts an order's lines; cancel_orders shrinks and deletes them;"
        " ship_orders and record_shipments raise their shipped units",
    ),
    "tombstone_lines": Grant(
        "table",
        ("SELECT", "INSERT", "UPDATE", "DELETE"),
        "cancel_orders adds to a tombstone's lines (ON CONFLICT DO UPDATE) and deletes them"
        " when the whole order is cancelled; place_orders reads them",
    ),
    "stock_levels": Grant(
        "table",
        ("SELECT", "INSERT", "UPDATE"),
        "the functions lock (FOR UPDATE) and change reserved/on_hand/shipped; record_adjustments"
        " creates a SKU a positive adjustment names (INSERT ... ON CONFLICT DO UPDATE); the"
        " invariant monitor reads. Not DELETE: the first load is the owner's"
        " (`fulfilment stock load`)",
    ),
    "delivery_attempts": Grant(
        "table",
        ("SELECT", "INSERT", "UPDATE"),
        "the worker counts redeliveries (INSERT ... ON CONFLICT DO UPDATE ... RETURNING)",
    ),
    "outbox": Grant(
        "table",
        ("SELECT", "INSERT", "UPDATE"),
        "the functions insert result events; the relay reads and marks them published."
        " Not DELETE: `fulfilment outbox prune` runs as the owner",
    ),
    "dead_letter_audit": Grant(
        "table",
        ("SELECT", "INSERT"),
        "`fulfilment dlq replay` and `purge` record each message before it leaves the DLQ,"
        " and replay counts an event's earlier replays there (FULFILMENT_REPLAY_LIMIT);"
        " append-only: nothing run with the runtime secret can change or delete the trail",
    ),
    "inbox_pruned": Grant(
        "table",
        ("SELECT",),
        "the invariant monitor and `report` add the inbox rows `fulfilment prune` deleted to"
        " the inbox's counts; written only by that prune, which runs as the owner",
    ),
    "warehouse_requests": Grant(
        "table",
        ("SELECT", "INSERT", "UPDATE"),
        "place/cancel_orders insert the requests to the warehouse system and cancel_orders"
        " locks (FOR UPDATE), shrinks or withdraws an unsent one; the dispatcher claims"
        " (FOR UPDATE SKIP LOCKED) and records answers; operators re-send. Never deleted",
    ),
    "warehouse_request_audit": Grant(
        "table",
        ("SELECT", "INSERT"),
        "re-sending a warehouse request records who did it in the same transaction;"
        " append-only, like dead_letter_audit",
    ),
    "webhook_inbox": Grant(
        "table",
        ("SELECT", "INSERT", "UPDATE"),
        "record_shipments/record_warehouse_cancellations, run by the intake (`fulfilment"
        " webhooks`), insert each webhook id (ON CONFLICT ... RETURNING) and set its outcome."
        " Not DELETE: pruning it is the owner's",
    ),
    "warehouse_shipments": Grant(
        "table",
        ("SELECT", "INSERT", "UPDATE"),
        "record_shipments, run by the intake and the dispatcher's poll, inserts each shipment"
        " once (ON CONFLICT DO NOTHING), then sets the outcome and order status it decided;"
        " operator commands read them. Not DELETE",
    ),
    "warehouse_shipment_lines": Grant(
        "table",
        ("SELECT", "INSERT"),
        "record_shipments inserts a shipment's lines with it; append-only",
    ),
    "warehouse_cancellations": Grant(
        "table",
        ("SELECT", "INSERT", "UPDATE"),
        "record_warehouse_cancellations, run by the intake and the dispatcher's poll, inserts"
        " each cancellation once (ON CONFLICT DO NOTHING), then sets the outcome it decided."
        " Not DELETE",
    ),
    "warehouse_cancellation_lines": Grant(
        "table",
        ("SELECT", "INSERT"),
        "record_warehouse_cancellations inserts a cancellation's lines with it; append-only",
    ),
    "warehouse_discrepancies": Grant(
        "table",
        ("SELECT", "INSERT"),
        "record_shipments, record_warehouse_cancellations and record_adjustments record what"
        " they could not apply; `fulfilment warehouse discrepancies` and `report` read them."
        " Append-only",
    ),
    "warehouse_adjustments": Grant(
        "table",
        ("SELECT", "INSERT", "UPDATE"),
        "record_adjustments, run by the intake and `fulfilment stock adjust`, inserts each"
        " adjustment once (ON CONFLICT DO NOTHING) and sets what it applied. Never deleted",
    ),
    "invalid_webhooks": Grant(
        "table",
        ("SELECT", "INSERT", "UPDATE"),
        "the intake keeps a signed but invalid webhook (ON CONFLICT DO NOTHING);"
        " `fulfilment warehouse replay-webhook` marks it replayed. Never deleted by the runtime",
    ),
    "invalid_webhook_audit": Grant(
        "table",
        ("SELECT", "INSERT"),
        "replaying a kept invalid webhook records who did it in the same transaction;"
        " append-only, like dead_letter_audit",
    ),
    "alembic_version": Grant(
        "table",
        ("SELECT",),
        "the worker and the relay refuse to start on a database behind their migrations",
    ),
    # --- sequences ----------------------------------------------------------------------------
    "outbox_id_seq": Grant(
        "sequence",
        (),
        "the identity of outbox.id: an INSERT draws from it without USAGE on it",
    ),
    "dead_letter_audit_id_seq": Grant(
        "sequence",
        (),
        "the identity of dead_letter_audit.id: an INSERT draws from it without USAGE on it",
    ),
    "warehouse_requests_id_seq": Grant(
        "sequence",
        (),
        "the identity of warehouse_requests.id: an INSERT draws from it without USAGE on it",
    ),
    "warehouse_request_audit_id_seq": Grant(
        "sequence",
        (),
        "the identity of warehouse_request_audit.id: an INSERT draws from it without USAGE",
    ),
    "warehouse_discrepancies_id_seq": Grant(
        "sequence",
        (),
        "the identity of warehouse_discrepancies.id: an INSERT draws from it without USAGE",
    ),
    "invalid_webhook_audit_id_seq": Grant(
        "sequence",
        (),
        "the identity of invalid_webhook_audit.id: an INSERT draws from it without USAGE",
    ),
    # --- functions ----------------------------------------------------------------------------
    "stock_shortage_event": Grant(
        "function",
        (),
        "the trigger of stock_levels (stock_levels_shortage): a trigger runs its function"
        " without EXECUTE on it, and nothing calls it directly",
    ),
    "shipped_order_lines": Grant(
        "function",
        (),
        "the trigger of reservations (reservations_shipped_lines): a trigger runs its function"
        " without EXECUTE on it, and nothing calls it directly",
    ),
    # Each input event's SQL function, from its route (fulfilment.routes.table.ROUTES).
    **{
        route.function.name: Grant(
            "function", ("EXECUTE",), f"the worker's {route.model.__name__} batches"
        )
        for route in ROUTES
    },
}
"""Every table, sequence and function of the schema, by name: what the runtime role may do
with it. Add an entry with each revision that creates an object (the migration refuses to
grant while one is missing); an entry whose object does not exist (yet, or any more) is
skipped."""


class RuntimeRoleError(RuntimeError):
    """The runtime role cannot be given its privileges as it is; the message says why."""


class UndecidedObjectsError(RuntimeError):
    """The schema holds objects that :data:`RUNTIME_PRIVILEGES` has no decision for."""

    def __init__(self, objects: list[tuple[ObjectKind, str]]) -> None:
        self.objects = objects
        listed = ", ".join(f"{kind} {name}" for kind, name in objects)
        super().__init__(
            f"no privilege decision for {listed}: add each to RUNTIME_PRIVILEGES in"
            " fulfilment/adapters/postgres/privileges.py (what the runtime role may do, and why)"
        )


@dataclass(frozen=True, slots=True)
class GrantSummary:
    """What :func:`apply_runtime_grants` did, for the migration's log line."""

    role: str
    granted: tuple[str, ...]
    """``table inbox_messages: SELECT, INSERT, ...`` for each object given something."""
    withheld: tuple[str, ...]
    """Objects the role may do nothing with."""
    warnings: tuple[str, ...]

    def describe(self) -> str:
        """One line: the role, how many objects it was granted, the rest withheld."""
        return (
            f"runtime role {self.role}: privileges on {len(self.granted)} objects,"
            f" none on {len(self.withheld)} ({', '.join(self.withheld) or 'none'})"
        )


_SCHEMA_OBJECTS = text(
    """
    SELECT CASE WHEN c.relkind = 'S' THEN 'sequence' ELSE 'table' END AS kind,
           c.relname AS name, NULL::text AS signature, c.relowner AS owner
      FROM pg_class AS c
     WHERE c.relnamespace = current_schema()::regnamespace
       AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
       AND NOT EXISTS (SELECT 1 FROM pg_depend AS d
                        WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                          AND d.deptype = 'e')
    UNION ALL
    SELECT 'function', p.proname, p.oid::regprocedure::text, p.proowner
      FROM pg_proc AS p
     WHERE p.pronamespace = current_schema()::regnamespace
       AND NOT EXISTS (SELECT 1 FROM pg_depend AS d
                        WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                          AND d.deptype = 'e')
     ORDER BY 1, 2, 3
    """
)
"""Tables, views, sequences and functions (every overload) of the schema the migrations use,
without those of extensions, each with its owner's oid."""


@dataclass(frozen=True, slots=True)
class SchemaObject:
    """One object of the schema as the catalogue has it."""

    kind: ObjectKind
    name: str
    signature: str | None
    """``place_orders(text,uuid[],...)`` for a function (``regprocedure``), else None."""
    owner: int


def schema_objects(connection: Connection) -> list[SchemaObject]:
    """The tables, sequences and functions of the current schema (extensions' left out)."""
    return [
        SchemaObject(row.kind, row.name, row.signature, row.owner)
        for row in connection.execute(_SCHEMA_OBJECTS)
    ]


def undecided_objects(objects: list[SchemaObject]) -> list[tuple[ObjectKind, str]]:
    """The objects :data:`RUNTIME_PRIVILEGES` has no entry of their kind for, sorted."""
    return sorted(
        {
            (item.kind, item.name)
            for item in objects
            if (decision := RUNTIME_PRIVILEGES.get(item.name)) is None or decision.kind != item.kind
        }
    )


def quote_identifier(name: str) -> str:
    """``name`` as a quoted SQL identifier (``"a""b"`` for ``a"b``)."""
    return '"' + name.replace('"', '""') + '"'


def apply_runtime_grants(connection: Connection, role: str) -> GrantSummary:
    """Give ``role`` exactly what :data:`RUNTIME_PRIVILEGES` says, on every object of the schema.

    Runs in the caller's transaction (the migration's), as the role that owns the objects (or
    a superuser). Idempotent: each object is first revoked from ``role``, then granted.

    Raises:
        RuntimeRoleError: ``role`` does not exist, is the role migrating, a superuser, owns an
            object of the schema, or is a member of a role that owns one (it would inherit
            every right of the owner).
        UndecidedObjectsError: an object of the schema has no decision.
    """
    found = connection.execute(
        text(
            "SELECT oid, rolsuper, rolname = current_user AS is_current FROM pg_roles"
            " WHERE rolname = :role"
        ),
        {"role": role},
    ).one_or_none()
    if found is None:
        msg = (
            f"role {role} does not exist in the database server: create it first"
            " (docs/security.md, 'Least privilege')"
        )
        raise RuntimeRoleError(msg)
    if found.is_current:
        msg = (
            f"role {role} is the role running the migration, which owns the tables: the"
            " runtime role must be another role"
        )
        raise RuntimeRoleError(msg)
    if found.rolsuper:
        msg = f"role {role} is a superuser: no privilege could be withheld from it"
        raise RuntimeRoleError(msg)
    objects = schema_objects(connection)
    _refuse_owning(connection, role, found.oid, objects)
    undecided = undecided_objects(objects)
    if undecided:
        raise UndecidedObjectsError(undecided)

    quoted = quote_identifier(role)
    granted, withheld = [], []
    for item in objects:
        decision = RUNTIME_PRIVILEGES[item.name]
        if item.kind == "function":
            target = f"FUNCTION {item.signature}"
            # New functions are executable by PUBLIC; only the decided roles may run them.
            connection.execute(text(f"REVOKE ALL ON {target} FROM PUBLIC, {quoted}"))
        else:
            target = f"{item.kind.upper()} {quote_identifier(item.name)}"
            connection.execute(text(f"REVOKE ALL ON {target} FROM {quoted}"))
        label = f"{item.kind} {item.signature or item.name}"
        if decision.privileges:
            connection.execute(
                text(f"GRANT {', '.join(decision.privileges)} ON {target} TO {quoted}")
            )
            granted.append(f"{label}: {', '.join(decision.privileges)}")
        else:
            withheld.append(f"{item.kind} {item.name}")
    warnings = []
    schema = connection.scalar(text("SELECT current_schema()"))
    if connection.scalar(
        text("SELECT has_schema_privilege(:role, current_schema(), 'CREATE')"), {"role": role}
    ):
        # PostgreSQL before 15 lets PUBLIC create in schema public; its owner can take it back.
        warnings.append(
            f"role {role} may create objects in schema {schema}: revoke CREATE on it from"
            " PUBLIC (docs/security.md, 'Least privilege')"
        )
    return GrantSummary(role, tuple(granted), tuple(withheld), tuple(warnings))


_MISSING = text(
    """
    SELECT w.kind, w.name, w.privilege
      FROM unnest(CAST(:kinds AS text[]), CAST(:names AS text[]), CAST(:privileges AS text[]))
           AS w(kind, name, privilege)
     WHERE NOT CASE w.kind
               WHEN 'function' THEN (
                   SELECT bool_and(has_function_privilege(p.oid, 'EXECUTE'))
                     FROM pg_proc AS p
                    WHERE p.proname = w.name
                      AND p.pronamespace = current_schema()::regnamespace)
               WHEN 'sequence' THEN to_regclass(w.name) IS NULL
                                 OR has_sequence_privilege(to_regclass(w.name), w.privilege)
               ELSE to_regclass(w.name) IS NULL
                 OR has_table_privilege(to_regclass(w.name), w.privilege)
           END
     ORDER BY w.kind, w.name, w.privilege
    """
)


def missing_runtime_privileges(connection: Connection) -> list[str]:
    """What :data:`RUNTIME_PRIVILEGES` grants that the connected user may not do.

    Empty for the runtime role after ``fulfilment migrate`` granted it, and for the owner (who
    may do everything); ``table outbox: UPDATE`` ... otherwise. The worker and the relay ask
    at start, so that a migration that granted nothing (or to another role) stops them with
    one line instead of dead-lettering every order on ``insufficient_privilege``. An object
    that does not exist is not asked about.
    """
    wanted = [
        (decision.kind, name, privilege)
        for name, decision in RUNTIME_PRIVILEGES.items()
        for privilege in decision.privileges
    ]
    rows = connection.execute(
        _MISSING,
        {
            "kinds": [kind for kind, _, _ in wanted],
            "names": [name for _, name, _ in wanted],
            "privileges": [privilege for _, _, privilege in wanted],
        },
    )
    return [f"{row.kind} {row.name}: {row.privilege}" for row in rows]


def _refuse_owning(
    connection: Connection, role: str, role_oid: int, objects: list[SchemaObject]
) -> None:
    owned = sorted({item.name for item in objects if item.owner == role_oid})
    if owned:
        msg = f"role {role} owns {', '.join(owned)}: the runtime role must own nothing"
        raise RuntimeRoleError(msg)
    for owner in sorted({item.owner for item in objects}):
        inherits = connection.scalar(
            text("SELECT pg_has_role(:role, CAST(:owner AS oid), 'USAGE')"),
            {"role": role, "owner": owner},
        )
        if inherits:
            name = connection.scalar(
                text("SELECT rolname FROM pg_roles WHERE oid = CAST(:owner AS oid)"),
                {"owner": owner},
            )
            msg = (
                f"role {role} is a member of {name}, which owns the schema's tables, and"
                " inherits its rights: the runtime role must not be"
            )
            raise RuntimeRoleError(msg)
