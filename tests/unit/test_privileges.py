"""The runtime role's privilege list and what ``fulfilment migrate`` says about it."""

from __future__ import annotations

import pytest

from fulfilment.adapters.postgres.privileges import RUNTIME_PRIVILEGES, Grant, GrantSummary
from fulfilment.tools.migrate import GRANTS_SKIPPED, grants_line


def test_a_privilege_that_the_kind_of_object_does_not_have_is_refused() -> None:
    with pytest.raises(ValueError, match=r"\['EXECUTE'\] are not privileges of a table"):
        Grant("table", ("SELECT", "EXECUTE"), "a mistake")


def test_the_dead_letter_audit_is_append_only_and_nothing_may_be_truncated() -> None:
    assert RUNTIME_PRIVILEGES["dead_letter_audit"].privileges == ("SELECT", "INSERT")
    assert all(
        "TRUNCATE" not in decision.privileges and decision.why
        for decision in RUNTIME_PRIVILEGES.values()
    )


def test_migrate_says_in_one_line_that_it_granted_nothing_without_a_runtime_role() -> None:
    assert grants_line(None) == GRANTS_SKIPPED
    assert "FULFILMENT_DATABASE_RUNTIME_ROLE is not set" in GRANTS_SKIPPED


def test_migrate_says_what_it_granted_and_warns_on_its_own_lines() -> None:
    summary = GrantSummary(
        "runtime",
        granted=("table outbox: SELECT, INSERT, UPDATE",),
        withheld=("function reserve_orders",),
        warnings=("role runtime may create objects in schema public",),
    )

    assert grants_line(summary).splitlines() == [
        (
            "granted runtime role runtime: privileges on 1 objects, none on 1"
            " (function reserve_orders)"
        ),
        "warning: role runtime may create objects in schema public",
    ]
