"""The database schema as SQLAlchemy Core tables, mirroring the alembic migrations.

The migrations under ``migrations/versions`` are the source of truth; this package repeats
them so that queries can be written against typed columns. ``tests/integration`` checks that
a migrated database and :data:`metadata` do not differ (alembic's ``compare_metadata``).

Table and column names are part of the product's external contract ("Database" in the
product description); constraint names are spelled out so that they are the same on every
database and can be named in error handling and in later migrations.

Modules, by what the tables hold: ``stock`` (the stock levels, the orders and their lines,
the inbox and the outbox, the worker's and the operators' records), ``handoff`` (the
requests to the warehouse system), ``warehouse`` (what the warehouse system sent: its
webhooks, shipments, cancellations, adjustments and discrepancies); ``base`` holds
:data:`metadata` and what they share.
"""

from __future__ import annotations

# Each module adds its tables to the one MetaData as it is imported; importing them here makes
# metadata whole whichever table a caller imports first (migrations, the schema check and the
# reset guard read every table of it).
from fulfilment.adapters.postgres.tables import handoff, stock, warehouse
from fulfilment.adapters.postgres.tables.base import metadata

__all__ = ["handoff", "metadata", "stock", "warehouse"]
