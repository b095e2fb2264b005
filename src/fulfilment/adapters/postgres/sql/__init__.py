"""The adapters' SQL statements, one file each: ``sql/<store>/<name>.sql``.

Each module that runs them loads its statements once, at import, with :func:`statement`
(``importlib.resources``: read from the installed package, wheel or checkout alike). The
lifecycle's SQL functions are schema, versioned under ``migrations/sql``; these are the
statements an adapter sends as they stand, changed with the adapter that runs them.
"""

from __future__ import annotations

from importlib.resources import files

import sqlalchemy as sa


def statement(store: str, name: str) -> sa.TextClause:
    """The statement of ``sql/<store>/<name>.sql``, its comment lines (``--``) left out.

    The comments say why the statement is written so; they are not sent to the server. Its
    ``:name`` bind parameters are SQLAlchemy's (``sa.text``); their types, where asyncpg needs
    them, are the caller's (``.bindparams``).

    Raises:
        FileNotFoundError: the package holds no such file.
    """
    text = files(__name__).joinpath(store, f"{name}.sql").read_text(encoding="utf-8")
    return sa.text(
        "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))
    )
