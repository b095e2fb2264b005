"""What the tables share.

The one :data:`metadata`, the bound of an ``integer`` column, and how a check lists a column's
values.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()
"""Every table of the service (``adapters.postgres.tables`` imports every module of them)."""

INTEGER_MAX = 2_147_483_647
"""Largest value of an ``integer`` column (``on_hand``, ``reserved``, ``quantity``)."""


def one_of(column: str, values: tuple[str, ...]) -> str:
    """The SQL of a check that ``column`` is one of ``values`` (``outcome IN ('a', 'b')``)."""
    return f"{column} IN ({', '.join(repr(value) for value in values)})"
