-- ship_orders(), version 4: version 3, never taking on_hand below 0.
--
-- Created by migration 0016. To change it, add v5.sql beside this file (see ../README.md).
-- Read it as a diff:
--   git diff --no-index migrations/sql/ship_orders/v3.sql migrations/sql/ship_orders/v4.sql
--
-- Changed from version 3 (product contract, "Hearing back from the warehouse", the shortage
-- rule): a reported loss (record_adjustments(), migration 0016) may leave a SKU short,
-- reserved > on_hand, and the CHECK of stock_levels is now 0 <= reserved AND 0 <= on_hand.
-- Shipping what an order holds of a short SKU takes on_hand down by it but never below 0:
-- the warehouse shipped units it had reported lost, so the loss was that much smaller.
-- reserved goes down by all of it, so the shortfall shrinks, and the trigger of
-- stock_levels writes stock.shortage. A SKU that is not short ships exactly as in version 3.
-- The signature is version 3's, so a worker of the previous release calls this version too.
--
-- Version 3 (migration 0015): version 2, shipping only what the order still holds, its lines
-- less what the warehouse's shipments took of them.
--
-- Version 2 (migration 0009): many OrderShipped events in one transaction and one round trip,
-- counting the units that leave per SKU, and the result event of every order shipped written
-- to the outbox with it.
--
-- Changed from version 1: (d) raises stock_levels.shipped by the units it takes out of
-- on_hand (migration 0008), so that "on_hand went down by exactly the shipped lines" can be
-- checked (shipped = the lines of the shipped orders, per SKU). Step (f) writes one outbox
-- row 'stock.shipped' per order shipped, with the lines that left (sorted by code point), and
-- notifies the relay on the channel fulfilment_outbox when it wrote any (product contract,
-- "Result events"); an ignored, not_reserved or duplicate shipment writes none. The rows are
-- written by one INSERT for the batch, in arrival order. The new last parameter
-- p_traceparents gives each event's W3C trace context (NULL: none), copied to
-- outbox.traceparent; it defaults to NULL so that a worker of the previous release, which
-- passes four arguments, calls this version too (migration 0009).
--
-- What a shipment does is specified by fulfilment.domain.lifecycle.apply_shipped (the state
-- table of the product contract), which the in-memory warehouse of the tests runs. This
-- function implements it in PostgreSQL for a batch of shipments; the property tests in
-- tests/integration/test_postgres_lifecycle.py hold the two to the same answers.
--
-- The outcome of each shipment is the one apply_shipped gives it when the shipments are
-- applied one after the other in the order of the arrays (their arrival order):
--
-- (a) insert the inbox rows, in event_id order; the same event twice in one call is a
--     duplicate of the event the second time, unless the first was 'not_reserved' (it leaves
--     no inbox row, so the second is decided again, the same way);
-- (b) lock the reservation of every order of the new events that has one, in order_id order;
-- (c) the first new shipment of a reserved order ships it, a later one (and any of a shipped
--     order) is 'ignored'; any other order, or none, is 'not_reserved';
-- (d) lock the stock rows of every SKU the shipped orders hold, in COLLATE "C" order, and
--     take what they hold out: reserved goes down by it, and on_hand too but never below 0
--     (a short SKU), so the CHECK of stock_levels (0 <= reserved, 0 <= on_hand) keeps
--     holding;
-- (e) mark the orders shipped, keeping their lines as the units that left (shipped =
--     quantity), and withdraw their cancellation requests not sent yet; record each
--     outcome in its inbox row, and delete the inbox rows of 'not_reserved' shipments: such
--     an event is dead-lettered, and must ship the order when an operator replays it after
--     the order is placed, instead of being a duplicate;
-- (f) write the result event of every order shipped to the outbox.
--
-- Every writer (place_orders, cancel_orders, ship_orders, the stock load, and reserve_orders
-- v1 of the previous release) takes its locks table by table in this order (inbox,
-- reservations, stock, warehouse_requests) and within a table in key order, each table's locks in one statement,
-- so concurrent calls wait for each other instead of deadlocking. A shipment inserts no reservation, so it never waits for an order being
-- placed: (b) does not see a row that is not committed, and such a shipment is 'not_reserved'.

CREATE OR REPLACE FUNCTION ship_orders(
    p_consumer text,
    p_event_ids uuid[],
    p_order_ids uuid[],
    p_shipped_at timestamptz[],
    p_traceparents text[] DEFAULT NULL
) RETURNS TABLE (ordinal integer, outcome text, status text, skus text[], quantities integer[])
LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
    v_orders integer := coalesce(cardinality(p_event_ids), 0);
    -- Per shipment (index = ordinal): its outcome and the order's status after it. Every
    -- shipment starts as a duplicate event and is overwritten once its inbox row is new.
    v_outcome text[];
    v_status text[];
    v_fresh integer[];            -- ordinals whose event is new, ascending
    v_shipping integer[] := '{}'; -- ordinals that ship their order, ascending
    -- The locked reservations, by order_id: their ids and their status as the loop goes.
    k_order uuid[];
    k_status text[];
    v_o integer;
    v_k integer;
    v_first integer;
    v_locked integer;
    -- The units each shipping order holds (and ships), one row per order and SKU.
    t_order integer[];
    t_sku text[];
    t_quantity integer[];
    v_written integer;
BEGIN
    IF p_consumer IS NULL OR v_orders = 0
        OR cardinality(p_order_ids) IS DISTINCT FROM v_orders
        OR cardinality(p_shipped_at) IS DISTINCT FROM v_orders
        OR array_position(p_event_ids, NULL) IS NOT NULL
        OR array_position(p_order_ids, NULL) IS NOT NULL
        OR array_position(p_shipped_at, NULL) IS NOT NULL
    THEN
        RAISE EXCEPTION 'ship_orders: consumer, and per shipment event id, order id, shipped_at'
            USING DETAIL = 'A consumer and equally long, NULL-free shipment arrays are required.',
                  ERRCODE = 'null_value_not_allowed';
    END IF;

    v_outcome := array_fill('duplicate'::text, ARRAY[v_orders]);
    v_status := array_fill(NULL::text, ARRAY[v_orders]);

    -- (a) The inbox first, as in place_orders(); 'shipped' is a placeholder for (e).
    WITH src AS (
        SELECT DISTINCT ON (e.event_id) e.event_id, e.order_id, e.o::integer AS o
          FROM unnest(p_event_ids, p_order_ids) WITH ORDINALITY AS e(event_id, order_id, o)
         ORDER BY e.event_id, e.o
    ), inserted AS (
        INSERT INTO inbox_messages (consumer, event_id, order_id, outcome)
        SELECT p_consumer, src.event_id, src.order_id, 'shipped'
          FROM src
         ORDER BY src.event_id
        ON CONFLICT DO NOTHING
        RETURNING inbox_messages.event_id
    )
    SELECT coalesce(array_agg(src.o ORDER BY src.o), '{}')
      INTO v_fresh
      FROM src JOIN inserted ON inserted.event_id = src.event_id;
    IF cardinality(v_fresh) = 0 THEN
        RETURN QUERY
            SELECT g.o, v_outcome[g.o], v_status[g.o], '{}'::text[], '{}'::integer[]
              FROM generate_series(1, v_orders) AS g(o);
        RETURN;
    END IF;

    -- (b) The existing rows of the orders, locked in order_id order.
    SELECT coalesce(array_agg(r.order_id ORDER BY r.order_id), '{}'),
           coalesce(array_agg(r.status ORDER BY r.order_id), '{}')
      INTO k_order, k_status
      FROM (
            SELECT r.order_id, r.status
              FROM reservations AS r
             WHERE r.order_id IN (SELECT p_order_ids[f.o] FROM unnest(v_fresh) AS f(o))
             ORDER BY r.order_id
               FOR UPDATE
           ) AS r;

    -- (c) Each new shipment in turn, like fulfilment.domain.lifecycle.apply_shipped.
    FOREACH v_o IN ARRAY v_fresh LOOP
        v_k := array_position(k_order, p_order_ids[v_o]);
        IF v_k IS NULL THEN
            v_outcome[v_o] := 'not_reserved';
        ELSIF k_status[v_k] = 'reserved' THEN
            v_outcome[v_o] := 'shipped';
            k_status[v_k] := 'shipped';
            v_shipping := v_shipping || v_o;
        ELSIF k_status[v_k] = 'shipped' THEN
            v_outcome[v_o] := 'ignored';
        ELSE
            v_outcome[v_o] := 'not_reserved';
        END IF;
        v_status[v_o] := k_status[v_k];
    END LOOP;
    -- A repeat in this call of a 'not_reserved' event meets the order as its first delivery
    -- left it (a shipment changes no order that is not reserved), and its first delivery
    -- leaves no inbox row: it is 'not_reserved' too, not a duplicate.
    IF cardinality(v_fresh) < v_orders THEN
        FOR v_o IN 1 .. v_orders LOOP
            v_first := array_position(p_event_ids, p_event_ids[v_o]);
            IF v_first < v_o AND v_outcome[v_first] = 'not_reserved' THEN
                v_outcome[v_o] := 'not_reserved';
                v_status[v_o] := v_status[v_first];
            END IF;
        END LOOP;
    END IF;

    -- (d) What the shipping orders hold, then its stock rows in the one order every writer
    -- uses, then out.
    IF cardinality(v_shipping) > 0 THEN
        SELECT coalesce(array_agg(s.o ORDER BY s.o, rl.sku COLLATE "C"), '{}'),
               coalesce(array_agg(rl.sku ORDER BY s.o, rl.sku COLLATE "C"), '{}'),
               coalesce(array_agg(rl.quantity - rl.shipped ORDER BY s.o, rl.sku COLLATE "C"),
                        '{}')
          INTO t_order, t_sku, t_quantity
          FROM unnest(v_shipping) AS s(o)
          JOIN reservation_lines AS rl ON rl.order_id = p_order_ids[s.o]
         WHERE rl.quantity > rl.shipped;
        SELECT count(*)
          INTO v_locked
          FROM (
                SELECT t.sku
                  FROM stock_levels AS t
                 WHERE t.sku IN (SELECT u.sku FROM unnest(t_sku) AS u(sku))
                 ORDER BY t.sku COLLATE "C"
                   FOR UPDATE
               ) AS s;
        UPDATE stock_levels AS t
           SET on_hand = greatest(0, t.on_hand - d.units), reserved = t.reserved - d.units,
               shipped = t.shipped + d.units, updated_at = now()
          FROM (
                SELECT u.sku, sum(u.quantity)::integer AS units
                  FROM unnest(t_sku, t_quantity) AS u(sku, quantity)
                 GROUP BY u.sku
               ) AS d
         WHERE t.sku = d.sku;
        UPDATE reservation_lines AS rl
           SET shipped = rl.quantity
          FROM unnest(v_shipping) AS s(o)
         WHERE rl.order_id = p_order_ids[s.o] AND rl.shipped < rl.quantity;
        -- (e) Shipped at the time its event gives; the lines stay, as what left.
        UPDATE reservations AS r
           SET status = 'shipped', shipped_at = p_shipped_at[s.o]
          FROM unnest(v_shipping) AS s(o)
         WHERE r.order_id = p_order_ids[s.o];
        -- Nothing is left to cancel: a cancellation never sent is not sent (the dispatcher's
        -- claim skips locked rows instead of waiting).
        UPDATE warehouse_requests AS w
           SET status = 'withdrawn', answered_at = now()
          FROM unnest(v_shipping) AS s(o)
         WHERE w.order_id = p_order_ids[s.o] AND w.kind = 'cancellation'
           AND w.status = 'pending';

        -- (f) The result events, in arrival order (outbox.id is the relay's publishing
        -- order). Each row's event_id is minted once in the inner SELECT, whose volatile
        -- gen_random_uuid() keeps it from being merged into the outer one, and is written
        -- both as the column and in the body. occurred_at is the transaction's time.
        INSERT INTO outbox (event_id, order_id, routing_key, body, traceparent)
        SELECT e.event_id, e.order_id, 'stock.shipped',
               jsonb_build_object('version', 1, 'event_id', e.event_id,
                                  'causation_id', e.causation_id, 'order_id', e.order_id,
                                  'occurred_at', now(), 'lines', e.lines,
                                  'shipment_id', NULL, 'carrier', NULL,
                                  'tracking_numbers', '[]'::jsonb, 'tracking_url', NULL,
                                  'order_status', 'shipped'),
               p_traceparents[e.o]
          FROM (
                SELECT u.o, gen_random_uuid() AS event_id, p_order_ids[u.o] AS order_id,
                       p_event_ids[u.o] AS causation_id,
                       jsonb_agg(jsonb_build_object('sku', u.sku, 'quantity', u.quantity)
                                 ORDER BY u.sku COLLATE "C") AS lines
                  FROM unnest(t_order, t_sku, t_quantity) AS u(o, sku, quantity)
                 GROUP BY u.o
               ) AS e
         ORDER BY e.o;
        GET DIAGNOSTICS v_written = ROW_COUNT;
        IF v_written > 0 THEN
            PERFORM pg_notify('fulfilment_outbox', '');
        END IF;
    END IF;

    -- (e) The inbox: an ignored shipment says 'ship_ignored'; one of an order that is not
    -- reserved leaves no row (the transaction inserted it, so no one else has seen it).
    UPDATE inbox_messages AS i
       SET outcome = 'ship_ignored'
      FROM unnest(v_fresh) AS f(o)
     WHERE i.consumer = p_consumer AND i.event_id = p_event_ids[f.o]
       AND v_outcome[f.o] = 'ignored';
    DELETE FROM inbox_messages AS i
     USING unnest(v_fresh) AS f(o)
     WHERE i.consumer = p_consumer AND i.event_id = p_event_ids[f.o]
       AND v_outcome[f.o] = 'not_reserved';

    RETURN QUERY
        SELECT g.o, v_outcome[g.o], v_status[g.o], coalesce(x.skus, '{}'),
               coalesce(x.quantities, '{}')
          FROM generate_series(1, v_orders) AS g(o)
          LEFT JOIN (
                SELECT u.o, array_agg(u.sku ORDER BY u.sku COLLATE "C") AS skus,
                       array_agg(u.quantity ORDER BY u.sku COLLATE "C") AS quantities
                  FROM unnest(t_order, t_sku, t_quantity) AS u(o, sku, quantity)
                 GROUP BY u.o
               ) AS x ON x.o = g.o
         ORDER BY g.o;
END;
$function$;

COMMENT ON FUNCTION ship_orders(text, uuid[], uuid[], timestamptz[], text[]) IS
'Applies many OrderShipped events in one transaction, once per (consumer, event_id), as if
they came one after the other in array order (fulfilment.domain.lifecycle.apply_shipped): a
reserved order is shipped (on_hand and reserved go down by what it holds, its lines less
what the warehouse''s shipments took, shipped goes up by it) and writes its result event (stock.shipped) to the outbox in the same transaction, with
the trace context p_traceparents gives its event (NULL: none), notifying the relay on
fulfilment_outbox; its cancellation requests not sent yet are withdrawn. Returns one row per
shipment, by ordinal: (outcome, the order status after it, the SKUs shipped sorted by code
point, their units taken), where outcome is shipped, ignored (already shipped), not_reserved (no
reserved order; the event is not recorded, so that it can be replayed), or duplicate (status
NULL). Run it as a single autocommit statement.';
