"""Every table, sequence and function the migrations create has a privilege decision.

``fulfilment migrate`` refuses to grant while an object of the schema has none
(``privileges.UndecidedObjectsError``); this test says so before a release does: a revision that
adds a table or a function without an entry in ``RUNTIME_PRIVILEGES`` fails here, naming it.
"""

from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from fulfilment.adapters.postgres.privileges import (
    RUNTIME_PRIVILEGES,
    SchemaObject,
    schema_objects,
    undecided_objects,
)

pytestmark = pytest.mark.postgres


@pytest.fixture
async def objects(database_url: str) -> list[SchemaObject]:
    """The objects of the session's database, migrated to head."""
    engine = create_async_engine(database_url)
    try:
        async with engine.connect() as connection:
            return await connection.run_sync(schema_objects)
    finally:
        await engine.dispose()


def test_every_table_sequence_and_function_of_the_schema_has_a_privilege_decision(
    objects: list[SchemaObject],
) -> None:
    assert undecided_objects(objects) == []


def test_every_privilege_decision_names_an_object_of_the_schema_at_head(
    objects: list[SchemaObject],
) -> None:
    present = {(item.kind, item.name) for item in objects}

    stale = {
        (decision.kind, name)
        for name, decision in RUNTIME_PRIVILEGES.items()
        if (decision.kind, name) not in present
    }

    assert stale == set()


def test_an_object_without_a_decision_is_named() -> None:
    objects = [
        SchemaObject("table", "inbox_messages", None, 10),
        SchemaObject("table", "pick_lists", None, 10),
        SchemaObject("function", "pick_orders", "pick_orders(uuid[])", 10),
        SchemaObject("function", "outbox", "outbox()", 10),  # a table's name, not a function's
    ]

    assert undecided_objects(objects) == [
        ("function", "outbox"),
        ("function", "pick_orders"),
        ("table", "pick_lists"),
    ]
