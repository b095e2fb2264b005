"""The session advisory lock that makes one dispatcher active per database."""

from __future__ import annotations

import asyncpg

DISPATCHER_LOCK_KEY = 0x66756C66776D73
"""Key of the dispatcher's session advisory lock (``pg_try_advisory_lock``): ``b"fulfwms"`` read
as a number, distinct from the relay's (``outbox.RELAY_LOCK_KEY``) and the migrations' lock."""


async def try_dispatcher_lock(connection: asyncpg.Connection) -> bool:
    """Take the dispatcher's lock if free; True when this session holds it.

    Held until the session ends (closed, or dropped by the server or the network), so a
    dispatcher that dies frees it for a standby without a time-out of ours.
    """
    return bool(await connection.fetchval("SELECT pg_try_advisory_lock($1)", DISPATCHER_LOCK_KEY))
