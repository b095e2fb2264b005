"""A service that answers but refuses is told apart from one that does not answer.

A wrong user or password, a missing virtual host or database, and a user that may not create
the database each get one line naming the URL without its password, and exit 4; an
unreachable server keeps exit 3 (``tests/unit/test_cli.py``).
"""

from __future__ import annotations

import asyncio
import urllib.parse
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from fulfilment.entrypoints.cli import app
from tests.support.services import admin_execute

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

SAMPLE_STOCK = "data/sample/stock.csv"


@pytest.fixture(autouse=True)
def no_environment(monkeypatch):
    for name in ("FULFILMENT_DATABASE_URL", "FULFILMENT_AMQP_URL"):
        monkeypatch.delenv(name, raising=False)


def fulfilment(*args: str, **env: str):
    return CliRunner().invoke(app, list(args), env=env)


def with_credentials(amqp_url: str, user: str, password: str, vhost: str | None = None) -> str:
    parts = urllib.parse.urlsplit(amqp_url)
    netloc = f"{user}:{password}@{parts.hostname}:{parts.port}"
    path = parts.path if vhost is None else "/" + urllib.parse.quote(vhost, safe="")
    return urllib.parse.urlunsplit((parts.scheme, netloc, path, "", ""))


def hidden(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    netloc = f"{parts.username}:***@{parts.hostname}:{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def test_a_wrong_broker_password_is_a_refused_login_not_an_unreachable_broker(amqp_url):
    url = with_credentials(amqp_url, "guest", "wrong-password")

    result = fulfilment("dlq", "list", FULFILMENT_AMQP_URL=url)

    assert result.exit_code == 4
    assert result.stderr.startswith(
        f"fulfilment: RabbitMQ at {hidden(url)} refused the login of user 'guest': "
        "ProbableAuthenticationError: ACCESS_REFUSED"
    )
    assert result.stderr.count("\n") == 1
    assert "wrong-password" not in result.stderr


def test_a_missing_virtual_host_is_named_and_told_apart_from_an_unreachable_broker(amqp_url):
    user = urllib.parse.urlsplit(amqp_url).username or "guest"
    password = urllib.parse.urlsplit(amqp_url).password or "guest"
    vhost = f"fulfilment-missing-{uuid.uuid4().hex[:8]}"
    url = with_credentials(amqp_url, user, password, vhost)

    result = fulfilment("dlq", "list", FULFILMENT_AMQP_URL=url)

    assert result.exit_code == 4
    assert result.stderr == (
        f"fulfilment: RabbitMQ at {hidden(url)} refused virtual host '{vhost}':"
        f" it does not exist, or user '{user}' may not use it\n"
    )


@pytest.fixture
def role_without_createdb() -> Iterator[str]:
    """A login role of its own, without CREATEDB, dropped at the end."""
    name = f"fulfilment_test_{uuid.uuid4().hex[:8]}"
    asyncio.run(admin_execute(f'CREATE ROLE "{name}" LOGIN NOCREATEDB'))
    try:
        yield name
    finally:
        asyncio.run(admin_execute(f'DROP ROLE IF EXISTS "{name}"'))


def test_an_unknown_database_user_is_a_refused_login_not_an_unreachable_server(database_url):
    url = make_url(database_url).set(username="nobody_of_fulfilment")

    result = fulfilment(
        "stock",
        "load",
        SAMPLE_STOCK,
        FULFILMENT_DATABASE_URL=url.render_as_string(hide_password=False),
    )

    assert result.exit_code == 4
    assert result.stderr == (
        f"fulfilment: PostgreSQL at {url.render_as_string(hide_password=True)} refused user"
        " 'nobody_of_fulfilment': InvalidAuthorizationSpecificationError:"
        ' role "nobody_of_fulfilment" does not exist\n'
    )


def test_a_missing_database_is_named_with_the_command_that_creates_it(database_url):
    url = make_url(database_url).set(database="fulfilment_missing_database")

    result = fulfilment("report", FULFILMENT_DATABASE_URL=url.render_as_string(hide_password=False))

    assert result.exit_code == 4
    assert result.stderr == (
        f"fulfilment: PostgreSQL at {url.render_as_string(hide_password=True)} has no such"
        " database (fulfilment migrate creates it): InvalidCatalogNameError:"
        ' database "fulfilment_missing_database" does not exist\n'
    )


def test_migrate_by_a_user_that_may_not_create_the_missing_database_says_so(
    database_url, role_without_createdb
):
    url = make_url(database_url).set(
        username=role_without_createdb, password=None, database=f"{role_without_createdb}_db"
    )

    result = fulfilment("migrate", FULFILMENT_DATABASE_URL=url.render_as_string())

    assert result.exit_code == 4
    assert result.stderr == (
        f"fulfilment: PostgreSQL at {url.render_as_string()} has no database"
        f" '{role_without_createdb}_db' and refused user '{role_without_createdb}' to create"
        " it: InsufficientPrivilegeError: permission denied to create database\n"
    )


def test_migrate_creates_a_missing_database_and_names_it(database_url):
    name = f"fulfilment_created_{uuid.uuid4().hex[:8]}"
    url = make_url(database_url).set(database=name).render_as_string(hide_password=False)
    try:
        first = fulfilment("migrate", FULFILMENT_DATABASE_URL=url)
        second = fulfilment("migrate", FULFILMENT_DATABASE_URL=url)
    finally:
        asyncio.run(admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    assert first.exit_code == 0, first.stderr
    assert first.stdout.splitlines()[:2] == [
        f"created the database {name}",
        "database migrated to head",
    ]
    assert second.exit_code == 0, second.stderr
    assert second.stdout.splitlines()[0] == "database migrated to head"


@pytest.mark.parametrize(
    ("command", "missing"),
    [
        (("report",), 'relation "reservations" does not exist'),
        (("stock", "load", SAMPLE_STOCK), 'relation "stock_levels" does not exist'),
        (("warehouse", "list"), 'relation "warehouse_requests" does not exist'),
        (("prune",), 'relation "'),
    ],
)
def test_a_database_never_migrated_gets_one_line_that_says_to_migrate(
    database_url, command, missing
):
    name = f"fulfilment_unmigrated_{uuid.uuid4().hex[:8]}"
    url = make_url(database_url).set(database=name).render_as_string(hide_password=False)
    asyncio.run(admin_execute(f'CREATE DATABASE "{name}"'))
    try:
        result = fulfilment(*command, FULFILMENT_DATABASE_URL=url)
    finally:
        asyncio.run(admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    assert result.exit_code == 1, result.stderr
    assert result.stderr.startswith(
        "fulfilment: the database of FULFILMENT_DATABASE_URL is not migrated to this build"
    ), result.stderr
    assert missing in result.stderr
    assert result.stderr.endswith("): run `fulfilment migrate` first\n")
    assert result.stderr.count("\n") == 1
