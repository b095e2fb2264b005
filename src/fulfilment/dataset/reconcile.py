"""``fulfilment reconcile``: where each event published from Online Retail files ended.

The events are those the commands of the data set publish from the files: one
``OrderPlaced`` per order (``fulfilment publish``); with ``cancellations``, one
``OrderCancelled`` per mapped cancellation (``publish --cancellations`` and the demo); with
``shipments``, one ``OrderShipped`` per order the demo ships at the end of its day, which is
every order the service holds ``reserved`` or ``shipped`` (``retail_lifecycle.SHIPPABLE``:
an order whose shipment was dead-lettered is still reserved, one whose shipment was applied is
shipped) but those a shipment of the warehouse shipped (recorded in ``warehouse_shipments``):
the demo takes their shipments from the warehouse. Each kind is checked against the inbox and
every DLQ by
:func:`fulfilment.tools.report.reconcile`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from uuid import UUID

from fulfilment.adapters.postgres.admin import order_statuses, stock_session
from fulfilment.adapters.postgres.warehouse_news import recorded_shipments
from fulfilment.dataset.files import match_read_cancellations, read_order_files
from fulfilment.dataset.retail_lifecycle import plan_days
from fulfilment.tools.command import CommandError, Echo, ToolOptions
from fulfilment.tools.report import reconcile


async def reconcile_command(
    options: ToolOptions,
    files: Sequence[Path],
    *,
    cancellations: bool = False,
    shipments: bool = False,
    echo: Echo,
) -> None:
    """Echo where each event published from ``files`` ended: one line, or one per kind.

    Without ``cancellations`` or ``shipments`` only the ``OrderPlaced`` events are checked,
    and the line is :meth:`Reconciliation.describe`; with either, each kind checked has its
    own line, ``<kind>: <describe>``, as the demo prints them.

    Raises:
        CommandError: a file cannot be read (exit 2); an event is missing or a stock invariant
            does not hold (exit 1), after the lines that say so.
        DatabaseUnavailableError, BrokerUnavailableError: a service does not answer.
    """
    read = read_order_files(files)
    kinds: list[tuple[str, list[UUID]]] = [
        ("OrderPlaced", [order.event_id for order in read.orders])
    ]
    if cancellations:
        match = match_read_cancellations(read)
        kinds.append(("OrderCancelled", [event.event_id for event in match.cancellations]))
    if shipments:
        order_ids = [order.order_id for order in read.orders]
        async with stock_session(options.database, consumer=options.consumer) as stock:
            statuses = await order_statuses(stock, order_ids)
            by_warehouse = {s.order_id for s in await recorded_shipments(stock, order_ids)}
        statuses = {k: status for k, status in statuses.items() if k not in by_warehouse}
        days = plan_days(read.days, read.orders, ())
        shipped = [event.event_id for day in days for event in day.shipments(statuses)]
        kinds.append(("OrderShipped", shipped))
    if len(kinds) == 1:
        result = await reconcile(options, kinds[0][1])
        echo(result.describe())
        missing = len(result.missing)
        ok = result.ok
    else:
        ok, missing = await reconcile_kinds(options, kinds, echo=echo)
    if not ok:
        msg = f"{missing} events missing or stock invariants broken"
        raise CommandError(msg)


async def reconcile_kinds(
    options: ToolOptions, kinds: Sequence[tuple[str, Sequence[UUID]]], *, echo: Echo
) -> tuple[bool, int]:
    """Reconcile the event ids of each ``(kind, ids)``; echo ``<kind>: <describe>`` for each.

    Returns:
        Whether every kind reconciled (nothing missing, the invariants hold), and how many
        events are missing over all kinds.

    Raises:
        DatabaseUnavailableError, BrokerUnavailableError: a service does not answer.
    """
    ok, missing = True, 0
    for kind, event_ids in kinds:
        result = await reconcile(options, event_ids)
        echo(f"{kind}: {result.describe()}")
        ok = ok and result.ok
        missing += len(result.missing)
    return ok, missing
