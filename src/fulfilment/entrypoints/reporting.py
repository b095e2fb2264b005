"""``fulfilment report``: what happened to the orders, and whether the stock adds up."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fulfilment.adapters.database import warehouse_session
from fulfilment.adapters.postgres.reporting import outcome_report
from fulfilment.adapters.rabbitmq import browse_dead_letters, connect, queue_state
from fulfilment.entrypoints.topology import DEAD_LETTER_QUEUE, MAIN_QUEUE
from fulfilment.settings import Settings


async def collect_report(settings: Settings) -> dict[str, Any]:
    """The report as a JSON-ready document.

    Shape: ``{"outcomes": {...}, "dead_lettered": {"total", "by_reason": [{"class",
    "reason", "count"}]}, "pending": {"ready", "consumers"}, "invariants": {..., "ok"}}``.

    Raises:
        DatabaseUnavailableError, BrokerUnavailableError: a service does not answer.
    """
    async with warehouse_session(settings) as warehouse:
        outcomes = await outcome_report(warehouse.engine)
    async with connect(settings.amqp_url.get_secret_value()) as connection:
        main = await queue_state(connection, MAIN_QUEUE)
        dead = await browse_dead_letters(connection, DEAD_LETTER_QUEUE)
        dead_state = await queue_state(connection, DEAD_LETTER_QUEUE)
    details = asdict(outcomes)
    invariants = details.pop("invariants", {})
    return {
        "outcomes": details,
        "dead_lettered": {
            "total": dead_state.ready if dead_state else 0,
            "by_reason": [
                {"class": failure_class, "reason": reason, "count": count}
                for (failure_class, reason), count in sorted(dead.by_reason.items())
            ],
        },
        "pending": {
            "ready": main.ready if main else 0,
            "consumers": main.consumers if main else 0,
        },
        "invariants": {**invariants, "ok": outcomes.ok},
    }


def render_report(document: dict[str, Any]) -> str:
    """The report for people: one fact per line, counts right-aligned."""
    lines = ["outcomes"]
    lines += [f"  {key:<28}{_value(value)}" for key, value in document["outcomes"].items()]
    dead = document["dead_lettered"]
    lines.append(f"dead-lettered{dead['total']:>25}")
    lines += [
        f"  {row['class']}: {row['reason'] or '-'}  {row['count']}" for row in dead["by_reason"]
    ]
    pending = document["pending"]
    lines.append(f"pending (ready in queue){pending['ready']:>14}")
    lines.append(f"consumers attached{pending['consumers']:>20}")
    invariants = document["invariants"]
    lines.append("stock invariants               " + ("hold" if invariants["ok"] else "BROKEN"))
    lines += [f"  {key:<28}{_value(value)}" for key, value in invariants.items() if key != "ok"]
    return "\n".join(lines)


def _value(value: object) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items()) or "-"
    if isinstance(value, list | tuple):
        return ", ".join(map(str, value)) or "-"
    return str(value)
