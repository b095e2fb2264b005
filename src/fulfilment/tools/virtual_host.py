"""Whether the virtual host of ``FULFILMENT_AMQP_URL`` holds the service's queues.

A command that reads queues from another virtual host (a wrong URL) finds them missing and
would print zeros that look like a healthy, empty service; ``dlq list`` and ``report`` add
:func:`missing_queues_note` to their output instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from fulfilment.adapters.rabbitmq.inspection import queue_state

if TYPE_CHECKING:
    from aio_pika.abc import AbstractConnection


async def missing_queues(connection: AbstractConnection, names: Sequence[str]) -> list[str]:
    """The queues of ``names`` that do not exist on ``connection``'s virtual host, in order.

    Raises:
        aiormq.exceptions.AMQPError: the broker failed otherwise than by a missing queue.
    """
    return [name for name in names if await queue_state(connection, name) is None]


def missing_queues_note(missing: Sequence[str]) -> str | None:
    """``note: no queue <names> in this virtual host: ...``, or None when none is missing."""
    if not missing:
        return None
    return (
        f"note: no queue {', '.join(missing)} in this virtual host: is"
        " FULFILMENT_AMQP_URL the service's? (the worker declares them at start)"
    )
