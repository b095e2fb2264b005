"""``fulfilment stock adjust``: an operator's adjustment of a SKU's ``on_hand``, audited.

The same rule and result event as the warehouse's ``inventory.adjusted`` webhooks
(``fulfilment.domain.adjustments``): ``on_hand`` changes by the delta, never below 0, once;
the adjustment is kept in ``warehouse_adjustments`` with who recorded it (the stated name,
the OS user and host, the database's session role) and why, as ``fulfilment dlq replay``
records a replay. ``fulfilment stock load`` stays the first load of absolute levels
(docs/design.md, "Stock that follows the warehouse", says when to use which).
"""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import uuid4

from fulfilment.adapters.postgres.admin import stock_session
from fulfilment.contracts.order_placed import MAX_QUANTITY, shown_sku, sku_problem
from fulfilment.domain.adjustments import apply_adjustment
from fulfilment.domain.model import StockLevel
from fulfilment.domain.warehouse_events import (
    AdjustmentReason,
    OperatorIdentity,
    RecordAdjustment,
    Source,
    warehouse_event_id,
)
from fulfilment.exit_codes import ExitCode
from fulfilment.tools.command import CommandError, Echo, ToolOptions
from fulfilment.tools.dlq_commands import operator_identity

OPERATOR_ADJUSTMENT_PREFIX = "op-"
"""How the ``adjustment_id`` of an operator's adjustment begins (then a new UUID): never one
the warehouse sends, whose ids are its own."""


def _level(level: StockLevel | None) -> str:
    if level is None:
        return "unknown (no stock row)"
    short = f", short {level.short}" if level.short else ""
    return f"on_hand {level.on_hand}, reserved {level.reserved}{short}"


def _refusal(sku: str, delta: int) -> str | None:
    problem = sku_problem(sku)
    if problem is not None:
        return f"sku {shown_sku(sku)} {problem}"
    if delta == 0 or not -MAX_QUANTITY <= delta <= MAX_QUANTITY:
        return f"DELTA must be a non-zero number of units within ±{MAX_QUANTITY}, not {delta}"
    return None


async def adjust_command(  # noqa: PLR0913 - the command's arguments, by name
    options: ToolOptions,
    sku: str,
    delta: int,
    *,
    reason: AdjustmentReason,
    comment: str | None,
    operator: str | None,
    execute: bool,
    echo: Echo,
) -> None:
    """Change ``on_hand`` of ``sku`` by ``delta`` for ``reason``; a dry run unless ``execute``.

    The dry run reads the SKU's level and says what the adjustment would make of it, by the
    rule (``apply_adjustment``); executed, ``record_adjustments()`` applies it in one
    transaction with its ``stock.adjusted`` event (and ``stock.shortage`` when the shortfall
    changes) and its audit columns: ``operator`` (``--operator``, else the OS user), the OS user
    and host, ``comment``, and the database's session role. One line each: the level before,
    and what was (or would be) done.

    Raises:
        CommandError: the SKU or the delta is refused (exit 2, nothing done).
        DatabaseUnavailableError: PostgreSQL does not answer.
    """
    refusal = _refusal(sku, delta)
    if refusal is not None:
        raise CommandError(refusal, ExitCode.BAD_INPUT)
    who = operator_identity(operator)
    async with stock_session(options.database, consumer=options.consumer) as stock:
        before = (await stock.levels_of([sku])).get(sku)
        echo(f"{shown_sku(sku)}: {_level(before)}")
        if not execute:
            would = apply_adjustment(before, delta)
            lost = f"; {would.discrepancy} unit(s) beyond on hand kept as a discrepancy"
            echo(
                f"adjust (dry run): {delta:+d} ({reason}) would leave {_level(would.level)}"
                f"{lost if would.discrepancy else ''}; nothing changed (add --yes to do it)"
            )
            return
        adjustment_id = f"{OPERATOR_ADJUSTMENT_PREFIX}{uuid4()}"
        outcome = await stock.apply(
            RecordAdjustment(
                event_id=warehouse_event_id("adjustment", adjustment_id),
                adjustment_id=adjustment_id,
                webhook_id=None,
                sku=sku,
                delta=delta,
                reason=reason,
                occurred_at=datetime.now(UTC),
                source=Source.OPERATOR,
                operator=OperatorIdentity(
                    operator=who.stated or who.os_user,
                    comment=comment or None,
                    os_user=who.os_user,
                    host=who.host,
                ),
            )
        )
    after = StockLevel(outcome.on_hand, outcome.reserved)
    lost = f"; {outcome.discrepancy} unit(s) beyond on hand kept as a discrepancy"
    echo(
        f"adjusted {adjustment_id}: {delta:+d} ({reason}), applied {outcome.applied:+d}:"
        f" {_level(after)}{lost if outcome.discrepancy else ''}"
    )
