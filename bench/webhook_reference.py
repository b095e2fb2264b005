"""The hand-written reference receiver of shipment webhooks: bare ASGI + asyncpg under uvicorn.

What a careful engineer writes by hand for ``shipment.shipped``, compared with ``fulfilment
webhooks`` by ``bench/webhooks.py``: the signature checked with ``standardwebhooks``
(``Webhook.verify``, which also parses the body), then one transaction per request through a
pool of asyncpg connections, one statement per round trip, answered 204 after the commit::

    BEGIN
    INSERT INTO webhook_inbox ... ON CONFLICT DO NOTHING      -- a duplicate webhook stops here
    INSERT INTO warehouse_shipments ... ON CONFLICT DO NOTHING -- a shipment seen before, here
    SELECT status FROM reservations ... FOR UPDATE             -- the order, then
    SELECT ... FROM reservation_lines ... FOR UPDATE           -- its lines (code-point order)
    UPDATE reservation_lines SET shipped = shipped + $n ...    -- executemany, code-point order
    UPDATE stock_levels SET on_hand = on_hand - $n, ...        -- executemany, code-point order
    INSERT INTO warehouse_shipment_lines ...                   -- executemany
    UPDATE reservations SET status = 'shipped' ...             -- when the order holds nothing
    UPDATE warehouse_requests SET news_at = now() ...          -- its fulfilment order had news
    WITH e AS (INSERT INTO outbox ...) SELECT pg_notify(...)   -- stock.shipped, for the relay
    COMMIT

The same rows as ``record_shipments()`` writes for a shipment of a reserved order (the
product's checks of the other cases, discrepancies and statuses, are left out: the benchmark
sends none). Locks are taken as the product takes them (the reservation, then the stock rows
in ``COLLATE "C"`` order), so concurrent requests wait instead of deadlocking. The pool has one
connection per sender and sends no reset on release (asyncpg's default ``RESET ALL`` would be
one more round trip; no statement changes the session). A bad signature is answered 401, a
body that is not a shipment 422; a database error 500 (the sender retries).

Run: ``python bench/webhook_reference.py --port N --database-url URL --secret whsec_...
--connections N``; it prints ``ready`` once serving, and stops on SIGTERM or SIGINT after the
requests in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import asyncpg
import uvicorn
from standardwebhooks import Webhook, WebhookVerificationError

CONSUMER = "bench-reference"
"""``webhook_inbox.consumer`` of the reference receiver."""

PATH = "/webhooks/warehouse"

INSERT_INBOX = """
INSERT INTO webhook_inbox (consumer, webhook_id, type, outcome)
VALUES ($1, $2, 'shipment.shipped', 'shipped')
ON CONFLICT DO NOTHING
RETURNING 1
"""
INSERT_SHIPMENT = """
INSERT INTO warehouse_shipments (shipment_id, order_id, fulfilment_order_id, webhook_id, source,
                                 shipped_at, carrier, tracking_numbers, tracking_url, outcome)
VALUES ($1, $2, $3, $4, 'webhook', $5, $6, $7, $8, 'shipped')
ON CONFLICT DO NOTHING
RETURNING 1
"""
LOCK_ORDER = "SELECT status FROM reservations WHERE order_id = $1 FOR UPDATE"
LOCK_LINES = """
SELECT sku, quantity - shipped AS held
  FROM reservation_lines
 WHERE order_id = $1
 ORDER BY sku COLLATE "C"
   FOR UPDATE
"""
SHIP_LINE = "UPDATE reservation_lines SET shipped = shipped + $3 WHERE order_id = $1 AND sku = $2"
SHIP_STOCK = """
UPDATE stock_levels
   SET on_hand = on_hand - $2, reserved = reserved - $2, shipped = shipped + $2,
       updated_at = now()
 WHERE sku = $1
"""
INSERT_SHIPMENT_LINE = """
INSERT INTO warehouse_shipment_lines (shipment_id, sku, quantity, taken) VALUES ($1, $2, $3, $4)
"""
ORDER_SHIPPED = "UPDATE reservations SET status = 'shipped', shipped_at = $2 WHERE order_id = $1"
SET_ORDER_STATUS = "UPDATE warehouse_shipments SET order_status = $2 WHERE shipment_id = $1"
NEWS = """
UPDATE warehouse_requests SET news_at = now()
 WHERE order_id = $1 AND kind = 'fulfilment_order'
"""
INSERT_EVENT = """
WITH written AS (
    INSERT INTO outbox (event_id, order_id, routing_key, body)
    VALUES ($1, $2, 'stock.shipped', $3::jsonb)
    RETURNING 1
)
SELECT pg_notify('fulfilment_outbox', '') FROM written
"""


class NotReservedError(Exception):
    """The order is unknown or not reserved: the benchmark sends no such shipment."""


async def record(connection: asyncpg.Connection, webhook_id: str, data: dict[str, Any]) -> str:
    """Apply one shipment in one transaction; return ``shipped`` or ``duplicate``.

    Raises:
        KeyError, ValueError, TypeError: ``data`` is not a shipment.
        NotReservedError: the order is unknown or not reserved (rolled back).
        asyncpg.PostgresError: the database failed.
    """
    order_id = uuid.UUID(data["reference"])
    shipment_id = str(data["shipment_id"])
    shipped_at = datetime.fromisoformat(data["shipped_at"])
    sent: dict[str, int] = {}
    for line in data["lines"]:
        sent[line["sku"]] = sent.get(line["sku"], 0) + int(line["quantity"])
    async with connection.transaction():
        if not await connection.fetchval(INSERT_INBOX, CONSUMER, webhook_id):
            return "duplicate"
        if not await connection.fetchval(
            INSERT_SHIPMENT,
            shipment_id,
            order_id,
            data["fulfilment_order_id"],
            webhook_id,
            shipped_at,
            data.get("carrier"),
            list(data.get("tracking_numbers", [])),
            data.get("tracking_url"),
        ):
            return "duplicate"
        if await connection.fetchval(LOCK_ORDER, order_id) != "reserved":
            raise NotReservedError(order_id)
        held = {row["sku"]: row["held"] for row in await connection.fetch(LOCK_LINES, order_id)}
        taken = {sku: min(quantity, held.get(sku, 0)) for sku, quantity in sent.items()}
        shipped = sorted((sku, units) for sku, units in taken.items() if units > 0)
        await connection.executemany(SHIP_LINE, [(order_id, sku, n) for sku, n in shipped])
        await connection.executemany(SHIP_STOCK, shipped)
        await connection.executemany(
            INSERT_SHIPMENT_LINE,
            [(shipment_id, sku, quantity, taken[sku]) for sku, quantity in sent.items()],
        )
        status = "reserved"
        if all(held[sku] == taken.get(sku, 0) for sku in held):
            status = "shipped"
            await connection.execute(ORDER_SHIPPED, order_id, shipped_at)
        await connection.execute(SET_ORDER_STATUS, shipment_id, status)
        await connection.execute(NEWS, order_id)
        event_id = uuid.uuid4()
        event = {
            "version": 1,
            "event_id": str(event_id),
            "order_id": str(order_id),
            "occurred_at": datetime.now().astimezone().isoformat(),
            "lines": [{"sku": sku, "quantity": n} for sku, n in shipped],
            "shipment_id": shipment_id,
            "carrier": data.get("carrier"),
            "tracking_numbers": list(data.get("tracking_numbers", [])),
            "tracking_url": data.get("tracking_url"),
            "order_status": status,
        }
        await connection.fetchval(INSERT_EVENT, event_id, order_id, json.dumps(event))
    return "shipped"


async def keep_session(_connection: asyncpg.Connection) -> None:
    """Pool ``reset`` hook that sends nothing: no statement changes the session."""


Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def answer_webhook(
    webhook: Webhook, pool: asyncpg.Pool, headers: dict[str, str], body: bytes
) -> tuple[int, bytes]:
    """The status and JSON body (empty for none) of one webhook, as the module says."""
    try:
        payload = webhook.verify(body, headers)
    except WebhookVerificationError:
        return 401, b""
    except ValueError:
        return 422, b'{"error":"not JSON"}'
    if payload.get("type") != "shipment.shipped":
        return 204, b""
    try:
        async with pool.acquire() as connection:
            await record(connection, headers["webhook-id"], payload["data"])
    except (KeyError, TypeError, ValueError, NotReservedError) as error:
        return 422, json.dumps({"error": repr(error)}).encode()
    except asyncpg.PostgresError as error:
        print(f"failed {headers['webhook-id']}: {error!r}", file=sys.stderr)
        return 500, b""
    return 204, b""


def make_app(secret: str, pool: asyncpg.Pool) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """The receiver, a bare ASGI app: ``POST`` :data:`PATH`, answered by :func:`answer_webhook`."""
    webhook = Webhook(secret)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        status, answer = 404, b""
        if scope["method"] == "POST" and scope["path"] == PATH:
            body = b""
            more = True
            while more:
                message = await receive()
                body += message.get("body", b"")
                more = message.get("more_body", False)
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            status, answer = await answer_webhook(webhook, pool, headers, body)
        kind = [(b"content-type", b"application/json")] if answer else []
        await send({"type": "http.response.start", "status": status, "headers": kind})
        await send({"type": "http.response.body", "body": answer})

    return app


async def serve(port: int, database_url: str, secret: str, connections: int) -> None:
    """Open the pool, serve on ``port`` until SIGTERM or SIGINT, close the pool."""
    pool = await asyncpg.create_pool(
        database_url, min_size=connections, max_size=connections, reset=keep_session
    )
    try:
        server = uvicorn.Server(
            uvicorn.Config(
                make_app(secret, pool),
                host="127.0.0.1",
                port=port,
                http="httptools",  # as the intake's
                lifespan="off",
                access_log=False,
                log_level="warning",
            )
        )
        # uvicorn's serve() stops on SIGTERM and SIGINT after the requests in flight.
        serving = asyncio.create_task(server.serve())
        while not server.started and not serving.done():  # noqa: ASYNC110 - uvicorn has a flag
            await asyncio.sleep(0.05)
        if server.started:
            print("ready", flush=True)
        await serving
    finally:
        await pool.close()


def main() -> None:
    """Parse the command line and serve until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--database-url", required=True, help="postgresql://...")
    parser.add_argument("--secret", required=True, help="whsec_...")
    parser.add_argument("--connections", type=int, required=True, help="the pool's size")
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.database_url, args.secret, args.connections))


if __name__ == "__main__":
    main()
