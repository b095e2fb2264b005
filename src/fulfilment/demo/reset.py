"""``fulfilment demo --reset``: the guard that empties only the demo's own database, and the reset.

``--reset`` empties only a database the demo recognises as its own: one it created, or found
empty, and marked so in the database's comment (``admin.DEMO_DATABASE_MARK``), or one that
holds no row at all. Any other database is refused, unless the operator names it again with
``--confirm-reset NAME`` (as ``heroku pg:reset --confirm`` asks for the app's name): a wrong
``FULFILMENT_DATABASE_URL`` must not cost a shop its inbox. A reset is recorded: one line of
output (the database, the user, the rows and messages removed), each dead letter it purges in
``dead_letter_audit`` (as ``fulfilment dlq purge`` does), and the database's comment.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from fulfilment.adapters.postgres.admin import (
    DEMO_DATABASE_MARK,
    DemoDatabase,
    demo_database,
    mark_demo_database,
    reset_tables,
)
from fulfilment.adapters.rabbitmq.connection import connect
from fulfilment.demo.result_events import RESULT_EVENTS_QUEUE
from fulfilment.exit_codes import ExitCode
from fulfilment.routes.table import DEAD_LETTER_QUEUES, SUBSCRIBED_QUEUES
from fulfilment.tools.command import CommandError, Echo, ToolOptions
from fulfilment.tools.dead_letters import Selection
from fulfilment.tools.dlq import purge
from fulfilment.tools.dlq_commands import operator_identity

if TYPE_CHECKING:
    from fulfilment.adapters.postgres.warehouse import PostgresWarehouse

CONFIRM_RESET_OPTION = "--confirm-reset"
"""The option that names the database ``--reset`` may empty although it is not the demo's."""


class ResetRefusedError(CommandError):
    """``--reset`` would empty a database that is not the demo's (exit 2, nothing changed)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, ExitCode.BAD_INPUT)


def reset_refusal(database: DemoDatabase, confirmed: str | None) -> str | None:
    """Why ``--reset`` may not empty ``database``, or None when it may.

    It may when the database is marked as the demo's, holds no row of the service, or
    ``confirmed`` (``--confirm-reset``) is its name.
    """
    if confirmed is not None:
        if confirmed == database.name:
            return None
        return (
            f"{CONFIRM_RESET_OPTION} {confirmed!r} does not name the database of"
            f" FULFILMENT_DATABASE_URL, {database.name!r}: nothing was emptied"
        )
    if (database.marked and not database.foreign) or database.empty:
        return None
    held = [f"rows in {', '.join(database.holds)}"] if database.holds else []
    if database.foreign:
        held.append(f"tables that are not the service's: {', '.join(database.foreign)}")
    return (
        f"--reset refused: database {database.name!r} is not the demo's (it did not create it"
        f" or find it empty) and holds {' and '.join(held)}; to empty it anyway,"
        f" name it: --reset {CONFIRM_RESET_OPTION} {database.name}"
        f" (make demo RESET=1 CONFIRM_RESET={database.name})"
    )


@dataclass(frozen=True, slots=True)
class Reset:
    """``--reset``, with the database name of ``--confirm-reset`` if given."""

    confirmed: str | None

    def check(self, database: DemoDatabase) -> None:
        """Raise :class:`ResetRefusedError` when :func:`reset_refusal` refuses ``database``."""
        refusal = reset_refusal(database, self.confirmed)
        if refusal is not None:
            raise ResetRefusedError(refusal)

    async def run(
        self,
        options: ToolOptions,
        warehouse: PostgresWarehouse,
        database: DemoDatabase,
        echo: Echo,
    ) -> None:
        """Empty the tables and the queues, if :func:`reset_refusal` allows, and record it.

        Raises:
            ResetRefusedError: the database is not the demo's, and was not named.
        """
        self.check(database)
        rows = await reset_tables(warehouse)
        # Dead letters as `fulfilment dlq purge --all --yes` removes them: each recorded in
        # dead_letter_audit (which the reset keeps) before it leaves its queue.
        async with connect(options.amqp_url) as connection:
            dead = await purge(
                connection,
                Selection(everything=True),
                audit=warehouse.engine,
                execute=True,
                operator=operator_identity(f"{database.user} (fulfilment demo --reset)"),
                comment="fulfilment demo --reset",
                queues=DEAD_LETTER_QUEUES,
            )
        pending = await _purge_queues(options.amqp_url)
        how = f" ({CONFIRM_RESET_OPTION} {self.confirmed})" if self.confirmed else ""
        echo(
            f"reset{how}: database {database.name} as {database.user}: emptied"
            f" {sum(rows.values())} rows ({', '.join(f'{t} {n}' for t, n in rows.items())});"
            f" purged {sum(pending.values())} queued messages"
            f" ({', '.join(f'{q} {n}' for q, n in pending.items() if n) or 'none'}) and"
            f" {dead.done} dead letters, each recorded in dead_letter_audit (run {dead.run_id})"
        )
        stamp = datetime.now(UTC).isoformat(timespec="seconds")
        await mark(
            warehouse,
            f"{DEMO_DATABASE_MARK}: last emptied by `fulfilment demo --reset`{how} at {stamp} as",
            echo,
        )


async def mark(warehouse: PostgresWarehouse, comment: str, echo: Echo) -> None:
    """Mark the database as the demo's, ``comment`` followed by the user; say so if it cannot."""
    database = await demo_database(warehouse)
    if not await mark_demo_database(warehouse, f"{comment} {database.user}"):
        echo(
            f"could not mark database {database.name} as the demo's (only its owner may comment"
            f" on it): a later --reset of it will ask for {CONFIRM_RESET_OPTION} {database.name}"
        )


async def _purge_queues(amqp_url: str) -> dict[str, int]:
    """Purge the consumed queues and the demo's own; the messages each held (0 if missing)."""
    names = (*(queue.name for queue in SUBSCRIBED_QUEUES), RESULT_EVENTS_QUEUE)
    purged = dict.fromkeys(names, 0)
    async with connect(amqp_url) as connection:
        for name in names:
            # A channel per queue: a missing queue closes the channel it was asked on.
            channel = await connection.channel()
            with contextlib.suppress(Exception):
                queue = await channel.get_queue(name, ensure=True)
                result = await queue.purge()
                purged[name] = int(getattr(result, "message_count", 0) or 0)
            if not channel.is_closed:
                await channel.close()
    return purged
