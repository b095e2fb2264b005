"""The demo's line that tells a first run from a second, or from one in between, read from the
inbox of a real database (``demo.player.played_before``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from fulfilment.dataset.files import match_read_cancellations, read_order_files
from fulfilment.demo.player import played_before

pytestmark = pytest.mark.postgres

SAMPLE = Path(__file__).parents[2] / "data" / "sample" / "online-retail"


async def test_a_database_that_never_saw_the_sample_is_a_first_run(stock):
    read = read_order_files([SAMPLE])

    line = await played_before(stock, "fulfilment", read.orders, match_read_cancellations(read))

    assert line == (
        "none of these events is in this database's inbox yet (170 orders, 1 cancellation,"
        " their shipments): a first run"
    )


async def test_orders_published_before_without_their_shipments_are_not_called_a_whole_replay(
    stock,
):
    # What `fulfilment publish` of the sample with a worker leaves: the orders in the inbox,
    # none shipped. The demo then ships the reserved ones (with the shop's OrderShipped: the
    # warehouse never received them), so the line must not say that nothing will change.
    read = read_order_files([SAMPLE])
    async with stock.engine.begin() as connection:
        await connection.execute(
            sa.text(
                "INSERT INTO inbox_messages (consumer, event_id, order_id, outcome)"
                " VALUES ('fulfilment', :event_id, :order_id, 'rejected')"
            ),
            [{"event_id": o.event_id, "order_id": o.order_id} for o in read.orders],
        )

    line = await played_before(stock, "fulfilment", read.orders, match_read_cancellations(read))

    assert line.startswith(
        "played before: this database's inbox already holds 170 of these 170 orders, 0 of the 1"
        " cancellation, and 0 of the orders shipped; those are answered as duplicates and"
        " change nothing, any other is applied"
    )
