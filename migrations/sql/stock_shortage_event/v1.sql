-- stock_shortage_event(), version 1: the trigger function that writes stock.shortage when a
-- change of stock_levels changed the SKU's shortfall.
--
-- Created by migration 0016, which attaches it to stock_levels (trigger
-- stock_levels_shortage, AFTER UPDATE OF on_hand, reserved, FOR EACH ROW, with a WHEN clause
-- that calls it only when greatest(0, reserved - on_hand) differs between OLD and NEW). To
-- change it, add v2.sql beside this file (see ../README.md).
--
-- The shortage rule (product contract, "Hearing back from the warehouse";
-- fulfilment.domain.adjustments): the service never reserves beyond on_hand, but a reported
-- loss may leave reserved > on_hand; the SKU is then short by reserved - on_hand, and
-- stock.shortage (sku, on_hand, reserved, short) says so once per change of the shortfall,
-- short 0 when it settled. Every writer of stock_levels can change it (record_adjustments()
-- by a loss or a receipt; cancel_orders(), record_warehouse_cancellations() and the
-- dispatcher's release of an accepted cancellation by releasing; ship_orders() and
-- record_shipments() when a shipment takes more than a short SKU's on_hand; the stock load by
-- raising on_hand): a row trigger writes the event in the writer's transaction whichever it
-- is, a worker of the previous release included, with no change to their signatures.
--
-- The row is keyed by its SKU (outbox.sku, order_id NULL): the relay publishes the events of
-- one SKU in the order they were written. It carries no trace context (a trigger does not know
-- the event that caused it) and no causation_id. The relay is notified on fulfilment_outbox
-- (notifications of one transaction are delivered once, at its commit).

CREATE OR REPLACE FUNCTION stock_shortage_event() RETURNS trigger
LANGUAGE plpgsql
AS $function$
DECLARE
    v_event_id uuid := gen_random_uuid();
BEGIN
    INSERT INTO outbox (event_id, order_id, sku, routing_key, body)
    VALUES (v_event_id, NULL, NEW.sku, 'stock.shortage',
            jsonb_build_object('version', 1, 'event_id', v_event_id, 'occurred_at', now(),
                               'sku', NEW.sku, 'on_hand', NEW.on_hand,
                               'reserved', NEW.reserved,
                               'short', greatest(0, NEW.reserved - NEW.on_hand)));
    PERFORM pg_notify('fulfilment_outbox', '');
    RETURN NULL;
END;
$function$;

COMMENT ON FUNCTION stock_shortage_event() IS
'Trigger of stock_levels (stock_levels_shortage, migration 0016): writes stock.shortage (sku,
on_hand, reserved, short = greatest(0, reserved - on_hand)) to the outbox, keyed by the SKU,
when an update changed the SKU''s shortfall, and notifies fulfilment_outbox.';
