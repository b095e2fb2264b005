"""When ``fulfilment demo --reset`` may empty a database (``demo.reset.reset_refusal``)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from fulfilment.adapters.postgres.admin import DEMO_DATABASE_MARK, DemoDatabase
from fulfilment.demo.reset import reset_refusal
from fulfilment.entrypoints.cli import app


def database(comment: str | None = None, *holds: str) -> DemoDatabase:
    return DemoDatabase(name="shop", user="owner", comment=comment, holds=holds)


@pytest.mark.parametrize(
    "found",
    [
        database(f"{DEMO_DATABASE_MARK}: made or found empty by owner", "inbox_messages"),
        database(None),
        database("the shop's production database"),  # empty: nothing to lose
    ],
    ids=["marked as the demo's", "empty", "empty with another comment"],
)
def test_reset_may_empty_the_demo_s_database_or_an_empty_one(found: DemoDatabase) -> None:
    assert reset_refusal(found, confirmed=None) is None


def test_reset_refuses_a_database_with_rows_the_demo_did_not_write_and_names_the_option() -> None:
    found = database("the shop's production database", "inbox_messages", "dead_letter_audit")

    assert reset_refusal(found, confirmed=None) == (
        "--reset refused: database 'shop' is not the demo's (it did not create it or find it"
        " empty) and holds rows in inbox_messages, dead_letter_audit; to empty it anyway, name"
        " it: --reset --confirm-reset shop (make demo RESET=1 CONFIRM_RESET=shop)"
    )


def test_a_confirmation_must_name_the_database_of_the_url() -> None:
    found = database(None, "stock_levels")

    assert reset_refusal(found, confirmed="shop") is None
    assert reset_refusal(found, confirmed="fulfilment") == (
        "--confirm-reset 'fulfilment' does not name the database of FULFILMENT_DATABASE_URL,"
        " 'shop': nothing was emptied"
    )


def test_confirm_reset_without_reset_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["demo", "--confirm-reset", "shop"])

    assert result.exit_code == 2
    assert result.stderr == (
        "fulfilment: --confirm-reset names the database --reset may empty: add --reset\n"
    )


def test_reset_refuses_a_database_with_another_application_s_tables_even_if_marked() -> None:
    for comment in (None, f"{DEMO_DATABASE_MARK}: made or found empty by owner"):
        found = DemoDatabase(
            name="shop", user="owner", comment=comment, holds=(), foreign=("invoices",)
        )

        assert reset_refusal(found, confirmed=None) == (
            "--reset refused: database 'shop' is not the demo's (it did not create it or find"
            " it empty) and holds tables that are not the service's: invoices; to empty it"
            " anyway, name it: --reset --confirm-reset shop (make demo RESET=1 CONFIRM_RESET=shop)"
        )
