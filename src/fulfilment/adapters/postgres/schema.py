"""Migrating the database: ``alembic upgrade head``, callable from code.

The migrations live in the repository's top-level ``migrations/`` folder (``alembic.ini`` points
there for the ``alembic`` command line). :func:`migrate` finds that folder from the source tree
or an editable install, from a ``fulfilment/_migrations`` folder packaged inside an installed
wheel, or from ``./migrations`` in the working directory (a container image that copies the
folder next to its working directory).

The bodies of the SQL functions live in ``migrations/sql/<function>/v<N>.sql``, one file per
version, which the revisions run with :func:`load_sql` (``migrations/sql/README.md`` says how to
change a function).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from alembic import command, op
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

import fulfilment
from fulfilment.adapters.postgres.privileges import GrantSummary


class MigrationsNotFoundError(RuntimeError):
    """No folder with the alembic migrations was found; ``searched`` lists where we looked."""

    def __init__(self, searched: tuple[Path, ...]) -> None:
        self.searched = searched
        places = ", ".join(str(path) for path in searched)
        super().__init__(
            f"cannot find the alembic migrations (looked in {places}); run from a directory "
            "holding migrations/ (a checkout, or the image's /app), or pass script_location="
        )


def migrations_location(explicit: Path | None = None) -> Path:
    """The folder holding ``env.py`` and ``versions/``.

    Args:
        explicit: use this folder, if given (it must hold an ``env.py``).

    Raises:
        MigrationsNotFoundError: none of the candidate folders holds an ``env.py``.
    """
    package = Path(fulfilment.__file__).resolve().parent
    candidates = (
        (explicit,)
        if explicit is not None
        else (
            # src/fulfilment -> src -> repository root
            package.parent.parent / "migrations",
            package / "_migrations",
            Path.cwd() / "migrations",
        )
    )
    for candidate in candidates:
        if (candidate / "env.py").is_file():
            return candidate
    raise MigrationsNotFoundError(candidates)


SQL_FOLDER = "sql"
"""The folder of versioned SQL files inside the migrations folder."""

_SQL_TOKEN = re.compile(
    r"""
      --[^\n]*                                       # line comment
    | /\*.*?\*/                                      # block comment
    | '(?:[^']|'')*'                                 # string
    | "(?:[^"]|"")*"                                 # quoted identifier
    | (?P<tag>\$(?:[A-Za-z_]\w*)?\$).*?(?P=tag)       # dollar-quoted string, e.g. a body
    | (?P<end>;)
    """,
    re.VERBOSE | re.DOTALL,
)
_SQL_COMMENT = re.compile(r"--[^\n]*|/\*.*?\*/", re.DOTALL)


def _blank(sql: str) -> bool:
    return not _SQL_COMMENT.sub("", sql).strip()


def sql_statements(script: str) -> list[str]:
    """The statements of ``script``, split at each ``;`` outside comments, quotes and dollar quotes.

    Each statement is returned without its ``;``, with the comments before it; statements of
    nothing but comments are left out. A function body is one dollar-quoted string, so the
    semicolons inside it do not split it.

    Raises:
        ValueError: ``script`` ends with a statement that has no ``;``.
    """
    statements = []
    start = 0
    for token in _SQL_TOKEN.finditer(script):
        if token.group("end") is not None:
            statement = script[start : token.start()].strip()
            if not _blank(statement):
                statements.append(statement)
            start = token.end()
    if not _blank(script[start:]):
        msg = f"the last statement has no closing ';': {script[start:].strip()[:80]!r}"
        raise ValueError(msg)
    return statements


def load_sql(name: str) -> None:
    """Run the statements of ``migrations/sql/<name>`` (e.g. ``reserve_orders/v1.sql``).

    For a revision's ``upgrade`` and ``downgrade``, which alembic runs from ``env.py``: each
    statement goes through ``op.execute``, so it runs in the migration's transaction (or is
    written to an offline ``--sql`` script). ``op.execute`` reads a colon before a word as a
    bind parameter, so a file casts with ``::type`` and writes no ``:word``.

    Raises:
        NameError: called outside a migration (alembic's ``op`` is not set up).
        RuntimeError: the migration context has no script directory to find the file in.
        OSError: the file cannot be read.
        ValueError: see :func:`sql_statements`.
    """
    script_directory = op.get_context().script
    if script_directory is None:
        msg = "load_sql() needs a migration run by alembic from env.py, with its script folder"
        raise RuntimeError(msg)
    path = Path(script_directory.dir) / SQL_FOLDER / name
    for statement in sql_statements(path.read_text(encoding="utf-8")):
        op.execute(statement)


def alembic_config(database_url: str, *, script_location: Path | None = None) -> Config:
    """An alembic configuration for ``database_url`` built in code (no ``alembic.ini`` read).

    Args:
        database_url: SQLAlchemy URL; ``postgresql://`` is run with the asyncpg driver.
        script_location: the migrations folder; found by :func:`migrations_location` if None.

    Raises:
        MigrationsNotFoundError: see :func:`migrations_location`.
    """
    config = Config()
    config.set_main_option("script_location", str(migrations_location(script_location)))
    config.set_main_option("path_separator", "os")
    # set_main_option applies ConfigParser interpolation: a URL-encoded password holds '%'.
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


RUNTIME_ROLE_ATTRIBUTE = "fulfilment.runtime_role"
"""Key of alembic's ``Config.attributes`` under which :func:`migrate` hands ``env.py`` the
runtime role to grant to after the upgrade."""
GRANT_SUMMARY_ATTRIBUTE = "fulfilment.grant_summary"
"""Key under which ``env.py`` hands back what it granted (a ``privileges.GrantSummary``)."""


def migrate(
    database_url: str,
    *,
    script_location: Path | None = None,
    runtime_role: str | None = None,
) -> GrantSummary | None:
    """Upgrade the database at ``database_url`` to the newest revision (``alembic upgrade head``).

    Blocking: it runs its own event loop (alembic's async environment calls ``asyncio.run``),
    so call it from synchronous code, or as ``await asyncio.to_thread(migrate, url)``. Replicas
    migrating at once take turns on an advisory lock, and the whole upgrade is one transaction.
    With ``runtime_role``, that transaction ends by giving the role what
    ``privileges.RUNTIME_PRIVILEGES`` says (``privileges.apply_runtime_grants``), so that a
    failed grant leaves the schema as it was; returns what was granted (None without a role).

    Args:
        database_url: SQLAlchemy URL of the database (``postgresql+asyncpg://`` or
            ``postgresql://``).
        script_location: the migrations folder; found by :func:`migrations_location` if None.
        runtime_role: the role the worker and the relay connect as, or None to grant nothing.

    Raises:
        MigrationsNotFoundError: the migrations folder cannot be found.
        RuntimeError: called from a thread that is running an event loop.
        sqlalchemy.exc.DBAPIError: the database refused the connection or a migration.
        OSError: the database cannot be reached.
        RuntimeRoleError, UndecidedObjectsError: see ``privileges.apply_runtime_grants``.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        msg = "migrate() blocks; from async code call it as asyncio.to_thread(migrate, url)"
        raise RuntimeError(msg)
    config = alembic_config(database_url, script_location=script_location)
    config.attributes[RUNTIME_ROLE_ATTRIBUTE] = runtime_role
    command.upgrade(config, "head")
    summary = config.attributes.get(GRANT_SUMMARY_ATTRIBUTE)
    return summary if isinstance(summary, GrantSummary) else None


class SchemaNotCurrentError(RuntimeError):
    """The database is not migrated to the revision this build of the service needs."""


async def check_schema_current(engine: AsyncEngine, *, script_location: Path | None = None) -> None:
    """Refuse to run against a database that is not at this build's alembic head.

    A worker that starts before its migration (a rolling deploy that outran the migration Job)
    would otherwise fail every reservation on a missing table or function.

    Raises:
        SchemaNotCurrentError: the database's ``alembic_version`` is another revision, or
            missing; the message says which and to run ``fulfilment migrate``.
        MigrationsNotFoundError: the migrations folder is not where this build looks.
    """
    folder = migrations_location(script_location)
    head = ScriptDirectory.from_config(
        alembic_config("postgresql://", script_location=folder)
    ).get_current_head()
    async with engine.connect() as connection:
        exists = await connection.scalar(text("SELECT to_regclass('alembic_version') IS NOT NULL"))
        current = (
            await connection.scalar(text("SELECT version_num FROM alembic_version"))
            if exists
            else None
        )
    if current != head:
        msg = (
            f"the database is at revision {current or 'none'}, this build needs {head}: "
            "run `fulfilment migrate` first"
        )
        raise SchemaNotCurrentError(msg)
