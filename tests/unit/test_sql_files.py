"""The versioned SQL files of migrations/sql, and how the migrations split them."""

from __future__ import annotations

import re

import pytest

from fulfilment.adapters.postgres.schema import SQL_FOLDER, migrations_location, sql_statements

MIGRATIONS = migrations_location()
SQL_FILES = sorted((MIGRATIONS / SQL_FOLDER).glob("*/v*.sql"))
# What SQLAlchemy's text(), which op.execute wraps a string in, reads as a bind parameter.
BIND_PARAMETER = re.compile(r"(?<![:\w\\]):(\w+)(?![:\w])")


def test_a_statement_ends_at_a_semicolon_outside_comments_quotes_and_bodies():
    script = """
        -- a header; with a semicolon
        CREATE FUNCTION f() RETURNS text LANGUAGE plpgsql AS $body$
        BEGIN
            RETURN 'x;y';
        END;
        $body$;
        /* a block; comment */
        COMMENT ON FUNCTION "f;"() IS 'it''s; done';
        SELECT $$a;b$$;
        -- trailing; comment
    """

    statements = sql_statements(script)

    assert [statement.splitlines()[-1].strip() for statement in statements] == [
        "$body$",
        "COMMENT ON FUNCTION \"f;\"() IS 'it''s; done'",
        "SELECT $$a;b$$",
    ]
    assert statements[0].startswith("-- a header; with a semicolon")


def test_a_last_statement_without_its_semicolon_is_refused():
    with pytest.raises(ValueError, match="no closing ';'"):
        sql_statements("SELECT 1;\nSELECT 2\n-- the end")


def test_a_script_of_comments_only_has_no_statements():
    assert sql_statements("-- nothing;\n/* here; */\n;\n") == []


@pytest.mark.parametrize("path", SQL_FILES, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_each_function_version_is_its_create_and_its_comment(path):
    function = path.parent.name

    statements = sql_statements(path.read_text(encoding="utf-8"))

    assert len(statements) == 2
    assert statements[0].startswith("-- ")  # the header
    assert f"\nCREATE OR REPLACE FUNCTION {function}(" in statements[0]
    assert statements[1].startswith(f"COMMENT ON FUNCTION {function}(")
    assert BIND_PARAMETER.findall(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("path", SQL_FILES, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_each_function_version_is_loaded_by_a_revision(path):
    name = f'load_sql("{path.parent.name}/{path.name}")'
    revisions = (MIGRATIONS / "versions").glob("*.py")

    assert any(name in revision.read_text(encoding="utf-8") for revision in revisions)


def test_the_sql_files_are_found():
    assert {f"{path.parent.name}/{path.name}" for path in SQL_FILES} >= {"reserve_orders/v1.sql"}
