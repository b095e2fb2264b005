"""The session advisory locks that make one relay and one dispatcher active per database."""

from __future__ import annotations

import asyncpg

RELAY_LOCK_KEY = 0x66756C66696C6D
"""Key of the relay's lock: ``b"fulfilm"`` read as a number, so that it does not collide with
the migrations' lock."""

DISPATCHER_LOCK_KEY = 0x66756C66776D73
"""Key of the dispatcher's lock: ``b"fulfwms"`` read as a number, distinct from the relay's
and the migrations' lock."""


async def try_advisory_lock(connection: asyncpg.Connection, key: int) -> bool:
    """Take the session advisory lock ``key`` if free (``pg_try_advisory_lock``); True when held.

    Held until the session ends (closed, or dropped by the server or the network), so a
    process that dies frees it for a standby without a time-out of ours.
    """
    return bool(await connection.fetchval("SELECT pg_try_advisory_lock($1)", key))
