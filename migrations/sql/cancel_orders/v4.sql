-- cancel_orders(), version 4: version 3, releasing only what the order still holds, its lines
-- less what the warehouse's shipments took of them.
--
-- Created by migration 0015. To change it, add v5.sql beside this file (see ../README.md).
-- Read it as a diff:
--   git diff --no-index migrations/sql/cancel_orders/v3.sql migrations/sql/cancel_orders/v4.sql
--
-- Changed from version 3 (product contract, "Hearing back from the warehouse"): the
-- warehouse's shipments (record_shipments(), migration 0015) may have taken some of an
-- order's units, counted in reservation_lines.shipped (migration 0014), and it holds per SKU
-- quantity - shipped. Step (d) gives back per SKU at most that (a line with nothing held is
-- not cancelled), shrinks quantity by it (a line goes only when nothing of it is held or
-- shipped), and an order then holding nothing is 'released' (outcome 'released') when none of
-- it shipped, 'shipped' when some did (at its last shipment's time, shipped_at). A pending
-- fulfilment-order request shrinks to what the order holds. The result event gains
-- reason 'cancelled' and warehouse_reason NULL (a release by the warehouse's own
-- cancellation says 'warehouse_cancelled'), and its order_status may be 'shipped'. An order
-- none of whose units a warehouse's shipment took is cancelled exactly as in version 3. The
-- signature is version 3's, so a worker of the previous release calls this version too.
--
-- Version 3 (migration 0011): version 2, and with p_handoff a cancel of an order the
-- warehouse system may hold recorded as a cancellation request instead of released at once.
--
-- Changed from version 2 (product contract, "The warehouse system"): a new last parameter
-- p_handoff boolean DEFAULT false. When true, step (d) locks a reserved order's
-- fulfilment-order request (warehouse_requests, after the stock rows: the lock order of every
-- writer, and the dispatcher's claim skips locked rows instead of waiting) and by its status
-- (fulfilment.domain.handoff.cancel_with_handoff):
--   - 'sending', 'accepted' or 'expired' (the warehouse may hold the order): nothing is
--     released; a cancellation request is inserted (pending, lines the units asked and held,
--     NULL for a whole cancel, causation_id the cancel's event_id, a new idempotency key) and
--     the outcome is 'cancel_requested' (inbox too), the order still 'reserved';
--   - 'pending' (never sent): the cancel releases as in version 2, and the request's lines
--     become what the order still holds, or the request is 'withdrawn' when it holds nothing;
--   - 'failed', or no request (reserved before the hand-off): as in version 2.
-- A cancel that would release nothing ('ignored') records nothing either. When false, this is
-- version 2 exactly; a worker of the previous release, which passes nine arguments, calls it
-- so (migration 0011).
--
-- Version 2 (migration 0009): many OrderCancelled events in one transaction and one round
-- trip, and the result event of every cancel that released stock written to the outbox with
-- it.
--
-- Changed from version 1 (product contract, "Result events"): step (f) writes one outbox row
-- 'stock.released' per cancel that gave stock back ('released' or 'partially_released'),
-- with the lines released (sorted by code point) and the order's status after it
-- ('released' or 'reserved'), and notifies the relay on the channel fulfilment_outbox when it
-- wrote any. A tombstone, a cancel that changes nothing and a duplicate write none. The rows
-- are written by one INSERT for the batch, in arrival order, so that two cancels of one order
-- in a call are published in the order they were applied. The new last parameter
-- p_traceparents gives each event's W3C trace context (NULL: none), copied to
-- outbox.traceparent.
--
-- What a cancel does is specified by fulfilment.domain.lifecycle.apply_cancelled (the state
-- table of the product contract), which the in-memory warehouse of the tests runs. This
-- function implements it in PostgreSQL for a batch of cancels; the property tests in
-- tests/integration/test_postgres_lifecycle.py hold the two to the same answers (outcomes,
-- stock levels, inbox, reservations, their lines and tombstones).
--
-- The outcome of each cancel is the one apply_cancelled gives it when the cancels are applied
-- one after the other in the order of the arrays (their arrival order):
--
-- (a) insert the inbox rows, in event_id order; the same event twice in one call is a
--     duplicate of the event the second time;
-- (b) lock the reservation of every order of the new events, in order_id order, in one
--     statement that also inserts the tombstone of an order without a row: its first cancel
--     of the call is 'tombstoned' (tombstone 'order' for a whole cancel, else 'lines' summed
--     into tombstone_lines);
-- (c) lock the stock rows of every SKU the reserved ones among them hold, in COLLATE "C" order;
-- (d) apply every other new cancel in turn, in arrival order: a tombstone of lines remembers
--     more ('tombstoned'; a whole cancel makes it of the order), one of the order changes
--     nothing ('ignored'); a reserved order gives back, per cancelled SKU, the units it holds
--     up to those cancelled (reserved goes down, its lines shrink or go), and is 'released'
--     when it holds nothing more, else 'partially_released' ('ignored' when it holds none of
--     the SKUs), or with p_handoff 'cancel_requested' as above; a shipped order is
--     'cancel_after_ship'; a rejected or released one 'ignored';
-- (e) record each new event's outcome in its inbox row;
-- (f) write the result event of every cancel that released stock to the outbox.
--
-- Every writer (place_orders, cancel_orders, ship_orders, the stock load, and reserve_orders
-- v1 of the previous release) takes its locks table by table in this order (inbox,
-- reservations, stock) and within a table in key order, each table's locks in one statement,
-- so concurrent calls wait for each other instead of deadlocking. The lines of an order (reservation_lines, tombstone_lines) are written only by
-- the holder of its reservations row. Stock only goes back here, so the CHECK of stock_levels
-- (0 <= reserved <= on_hand) holds as long as every reserved unit has its line.

CREATE OR REPLACE FUNCTION cancel_orders(
    p_consumer text,
    p_event_ids uuid[],
    p_order_ids uuid[],
    p_cancelled_at timestamptz[],
    p_whole boolean[],
    p_line_orders integer[],
    p_line_skus text[],
    p_line_quantities integer[],
    p_traceparents text[] DEFAULT NULL,
    p_handoff boolean DEFAULT false
) RETURNS TABLE (ordinal integer, outcome text, status text, skus text[], quantities integer[])
LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
    v_orders integer := coalesce(cardinality(p_event_ids), 0);
    v_lines integer;
    -- Per cancel (index = ordinal): its outcome and the order's status after it. Every cancel
    -- starts as a duplicate event and is overwritten once its inbox row turns out to be new.
    v_outcome text[];
    v_status text[];
    v_fresh integer[];    -- ordinals whose event is new, ascending
    v_created integer[];  -- ordinals that inserted their order's tombstone, ascending
    v_order_ids uuid[];   -- the orders of the new events
    -- The units released, one row per cancel and SKU.
    r_order integer[] := '{}';
    r_sku text[] := '{}';
    r_quantity integer[] := '{}';
    c_sku text[];
    c_quantity integer[];
    v_o integer;
    v_order uuid;
    v_row_status text;
    v_tombstone text;
    v_locked integer;
    v_written integer;
    v_request bigint;        -- the order's fulfilment-order request, with p_handoff
    v_request_status text;
BEGIN
    IF p_consumer IS NULL OR v_orders = 0
        OR cardinality(p_order_ids) IS DISTINCT FROM v_orders
        OR cardinality(p_cancelled_at) IS DISTINCT FROM v_orders
        OR cardinality(p_whole) IS DISTINCT FROM v_orders
        OR array_position(p_event_ids, NULL) IS NOT NULL
        OR array_position(p_order_ids, NULL) IS NOT NULL
        OR array_position(p_cancelled_at, NULL) IS NOT NULL
        OR array_position(p_whole, NULL) IS NOT NULL
    THEN
        RAISE EXCEPTION 'cancel_orders: consumer, and per cancel event id, order id, cancelled_at, whole'
            USING DETAIL = 'A consumer and equally long, NULL-free cancel arrays are required.',
                  ERRCODE = 'null_value_not_allowed';
    END IF;
    v_lines := coalesce(cardinality(p_line_orders), 0);
    IF cardinality(p_line_skus) IS DISTINCT FROM v_lines
        OR cardinality(p_line_quantities) IS DISTINCT FROM v_lines
        OR EXISTS (
            SELECT 1
              FROM unnest(p_line_orders, p_line_skus, p_line_quantities) AS l(o, sku, quantity)
             WHERE l.o IS NULL OR l.o NOT BETWEEN 1 AND v_orders OR p_whole[l.o]
                OR l.sku IS NULL OR l.quantity IS NULL OR l.quantity <= 0
        )
        OR (SELECT count(DISTINCT l.o) FROM unnest(p_line_orders) AS l(o))
           <> (SELECT count(*) FROM unnest(p_whole) AS w(whole) WHERE NOT w.whole)
    THEN
        RAISE EXCEPTION 'cancel_orders: malformed lines'
            USING DETAIL = 'A cancel of lines needs a line, a whole cancel none; each line an ordinal, a SKU, a quantity > 0.',
                  ERRCODE = 'invalid_parameter_value';
    END IF;

    v_outcome := array_fill('duplicate'::text, ARRAY[v_orders]);
    v_status := array_fill(NULL::text, ARRAY[v_orders]);

    -- (a) The inbox first: a concurrent duplicate of an event blocks on the primary key until
    -- the first commits, then sees the conflict and changes nothing. 'tombstoned' is a
    -- placeholder that (e) overwrites.
    WITH src AS (
        SELECT DISTINCT ON (e.event_id) e.event_id, e.order_id, e.o::integer AS o
          FROM unnest(p_event_ids, p_order_ids) WITH ORDINALITY AS e(event_id, order_id, o)
         ORDER BY e.event_id, e.o
    ), inserted AS (
        INSERT INTO inbox_messages (consumer, event_id, order_id, outcome)
        SELECT p_consumer, src.event_id, src.order_id, 'tombstoned'
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

    -- (b) Every order's row, locked in order_id order by one statement: ON CONFLICT DO UPDATE
    -- locks the existing rows even though its WHERE updates none, and an order without a row
    -- gets its tombstone from its first cancel here.
    WITH src AS (
        SELECT DISTINCT ON (p_order_ids[f.o]) f.o, p_order_ids[f.o] AS order_id
          FROM unnest(v_fresh) AS f(o)
         ORDER BY p_order_ids[f.o], f.o
    ), inserted AS (
        INSERT INTO reservations AS r (order_id, status, tombstone, cancelled_at)
        SELECT src.order_id, 'cancelled',
               CASE WHEN p_whole[src.o] THEN 'order' ELSE 'lines' END, p_cancelled_at[src.o]
          FROM src
         ORDER BY src.order_id
        ON CONFLICT (order_id) DO UPDATE SET status = r.status WHERE false
        RETURNING r.order_id
    )
    SELECT coalesce(array_agg(src.o ORDER BY src.o), '{}'),
           (SELECT array_agg(s.order_id) FROM src AS s)
      INTO v_created, v_order_ids
      FROM src JOIN inserted ON inserted.order_id = src.order_id;
    INSERT INTO tombstone_lines (order_id, sku, quantity)
    SELECT p_order_ids[l.o], l.sku, sum(l.quantity)
      FROM unnest(p_line_orders, p_line_skus, p_line_quantities) AS l(o, sku, quantity)
     WHERE l.o = ANY (v_created)
     GROUP BY 1, 2;

    -- (c) The stock rows a release may change, locked in the one order every writer uses.
    SELECT count(*)
      INTO v_locked
      FROM (
            SELECT t.sku
              FROM stock_levels AS t
             WHERE t.sku IN (
                    SELECT rl.sku
                      FROM reservation_lines AS rl
                      JOIN reservations AS r ON r.order_id = rl.order_id
                     WHERE r.order_id = ANY (v_order_ids) AND r.status = 'reserved'
                       AND rl.quantity > rl.shipped
                   )
             ORDER BY t.sku COLLATE "C"
               FOR UPDATE
           ) AS s;

    -- (d) Each new cancel in turn, like fulfilment.domain.lifecycle.apply_cancelled.
    FOREACH v_o IN ARRAY v_fresh LOOP
        v_order := p_order_ids[v_o];
        IF v_o = ANY (v_created) THEN
            v_outcome[v_o] := 'tombstoned';
            v_status[v_o] := 'cancelled';
            CONTINUE;
        END IF;
        SELECT r.status, r.tombstone INTO v_row_status, v_tombstone
          FROM reservations AS r
         WHERE r.order_id = v_order;
        v_status[v_o] := v_row_status;
        IF v_row_status = 'cancelled' THEN
            IF v_tombstone = 'order' THEN
                v_outcome[v_o] := 'ignored';
            ELSIF p_whole[v_o] THEN
                UPDATE reservations AS r
                   SET tombstone = 'order', cancelled_at = p_cancelled_at[v_o]
                 WHERE r.order_id = v_order;
                DELETE FROM tombstone_lines AS t WHERE t.order_id = v_order;
                v_outcome[v_o] := 'tombstoned';
            ELSE
                INSERT INTO tombstone_lines AS t (order_id, sku, quantity)
                SELECT v_order, l.sku, sum(l.quantity)
                  FROM unnest(p_line_orders, p_line_skus, p_line_quantities)
                       AS l(o, sku, quantity)
                 WHERE l.o = v_o
                 GROUP BY l.sku
                ON CONFLICT (order_id, sku) DO UPDATE SET quantity = t.quantity + excluded.quantity;
                UPDATE reservations AS r
                   SET cancelled_at = p_cancelled_at[v_o]
                 WHERE r.order_id = v_order;
                v_outcome[v_o] := 'tombstoned';
            END IF;
        ELSIF v_row_status = 'reserved' THEN
            -- Per SKU the order holds and the cancel names (every one, for a whole cancel):
            -- what it holds (its line less what shipped), at most what is cancelled.
            SELECT array_agg(x.sku ORDER BY x.sku COLLATE "C"),
                   array_agg(x.quantity ORDER BY x.sku COLLATE "C")
              INTO c_sku, c_quantity
              FROM (
                    SELECT rl.sku,
                           least(rl.quantity - rl.shipped, c.quantity)::integer AS quantity
                      FROM reservation_lines AS rl
                      LEFT JOIN (
                            SELECT l.sku, sum(l.quantity) AS quantity
                              FROM unnest(p_line_orders, p_line_skus, p_line_quantities)
                                   AS l(o, sku, quantity)
                             WHERE l.o = v_o
                             GROUP BY l.sku
                           ) AS c ON c.sku = rl.sku
                     WHERE rl.order_id = v_order AND rl.quantity > rl.shipped
                       AND (p_whole[v_o] OR c.sku IS NOT NULL)
                   ) AS x;
            v_request := NULL;
            v_request_status := NULL;
            IF p_handoff AND c_sku IS NOT NULL THEN
                SELECT w.id, w.status INTO v_request, v_request_status
                  FROM warehouse_requests AS w
                 WHERE w.order_id = v_order AND w.kind = 'fulfilment_order'
                   FOR UPDATE;
            END IF;
            IF c_sku IS NULL THEN
                v_outcome[v_o] := 'ignored';
            ELSIF v_request_status IN ('sending', 'accepted', 'expired') THEN
                -- The warehouse may hold the order: ask it, release when it accepts.
                INSERT INTO warehouse_requests
                       (idempotency_key, kind, order_id, causation_id, lines, traceparent)
                SELECT gen_random_uuid(), 'cancellation', v_order, p_event_ids[v_o],
                       CASE WHEN NOT p_whole[v_o] THEN
                            jsonb_agg(jsonb_build_object('sku', c.sku, 'quantity', c.quantity)
                                      ORDER BY c.sku COLLATE "C")
                       END,
                       p_traceparents[v_o]
                  FROM unnest(c_sku, c_quantity) AS c(sku, quantity);
                v_outcome[v_o] := 'cancel_requested';
            ELSE
                UPDATE stock_levels AS t
                   SET reserved = t.reserved - c.quantity, updated_at = now()
                  FROM unnest(c_sku, c_quantity) AS c(sku, quantity)
                 WHERE t.sku = c.sku;
                -- A line given back whole (nothing of it shipped) goes; the others shrink
                -- (the DELETE's rows are gone for the UPDATE that follows it).
                DELETE FROM reservation_lines AS rl
                 USING unnest(c_sku, c_quantity) AS c(sku, quantity)
                 WHERE rl.order_id = v_order AND rl.sku = c.sku AND rl.quantity = c.quantity;
                UPDATE reservation_lines AS rl
                   SET quantity = rl.quantity - c.quantity
                  FROM unnest(c_sku, c_quantity) AS c(sku, quantity)
                 WHERE rl.order_id = v_order AND rl.sku = c.sku;
                IF EXISTS (SELECT 1 FROM reservation_lines AS rl
                            WHERE rl.order_id = v_order AND rl.quantity > rl.shipped)
                THEN
                    v_outcome[v_o] := 'partially_released';
                    UPDATE reservations AS r
                       SET cancelled_at = p_cancelled_at[v_o]
                     WHERE r.order_id = v_order;
                ELSIF EXISTS (SELECT 1 FROM reservation_lines AS rl WHERE rl.order_id = v_order)
                THEN
                    -- Nothing held, some shipped: what is left of the order left.
                    v_outcome[v_o] := 'released';
                    v_status[v_o] := 'shipped';
                    UPDATE reservations AS r
                       SET status = 'shipped', cancelled_at = p_cancelled_at[v_o],
                           shipped_at = coalesce(
                               (SELECT max(s.shipped_at) FROM warehouse_shipments AS s
                                 WHERE s.order_id = v_order AND s.outcome = 'shipped'),
                               p_cancelled_at[v_o])
                     WHERE r.order_id = v_order;
                ELSE
                    v_outcome[v_o] := 'released';
                    v_status[v_o] := 'released';
                    UPDATE reservations AS r
                       SET status = 'released', cancelled_at = p_cancelled_at[v_o]
                     WHERE r.order_id = v_order;
                END IF;
                -- A request never sent shrinks to what the order still holds, or is
                -- withdrawn with its last lines when the order holds nothing.
                IF v_request_status = 'pending' THEN
                    UPDATE warehouse_requests AS w
                       SET status = CASE WHEN x.lines IS NULL THEN 'withdrawn' ELSE 'pending' END,
                           lines = coalesce(x.lines, w.lines)
                      FROM (
                            SELECT jsonb_agg(jsonb_build_object('sku', rl.sku,
                                                                'quantity',
                                                                rl.quantity - rl.shipped)
                                             ORDER BY rl.sku COLLATE "C") AS lines
                              FROM reservation_lines AS rl
                             WHERE rl.order_id = v_order AND rl.quantity > rl.shipped
                           ) AS x
                     WHERE w.id = v_request;
                END IF;
                r_order := r_order || array_fill(v_o, ARRAY[cardinality(c_sku)]);
                r_sku := r_sku || c_sku;
                r_quantity := r_quantity || c_quantity;
            END IF;
        ELSIF v_row_status = 'shipped' THEN
            v_outcome[v_o] := 'cancel_after_ship';
        ELSE
            v_outcome[v_o] := 'ignored';
        END IF;
    END LOOP;

    -- (e) The inbox says what each new cancel did (an ignored cancel as 'cancel_ignored').
    UPDATE inbox_messages AS i
       SET outcome = CASE v_outcome[f.o] WHEN 'ignored' THEN 'cancel_ignored'
                                         ELSE v_outcome[f.o] END
      FROM unnest(v_fresh) AS f(o)
     WHERE i.consumer = p_consumer AND i.event_id = p_event_ids[f.o]
       AND v_outcome[f.o] <> 'tombstoned';

    -- (f) The result events, in arrival order (outbox.id is the relay's publishing order).
    -- Each row's event_id is minted once in the inner SELECT, whose volatile
    -- gen_random_uuid() keeps it from being merged into the outer one, and is written both as
    -- the column and in the body. occurred_at is the transaction's time.
    IF cardinality(r_order) > 0 THEN
        INSERT INTO outbox (event_id, order_id, routing_key, body, traceparent)
        SELECT e.event_id, e.order_id, 'stock.released',
               jsonb_build_object('version', 1, 'event_id', e.event_id,
                                  'causation_id', e.causation_id, 'order_id', e.order_id,
                                  'occurred_at', now(), 'lines', e.lines,
                                  'order_status', v_status[e.o], 'reason', 'cancelled',
                                  'warehouse_reason', NULL),
               p_traceparents[e.o]
          FROM (
                SELECT r.o, gen_random_uuid() AS event_id, p_order_ids[r.o] AS order_id,
                       p_event_ids[r.o] AS causation_id,
                       jsonb_agg(jsonb_build_object('sku', r.sku, 'quantity', r.quantity)
                                 ORDER BY r.sku COLLATE "C") AS lines
                  FROM unnest(r_order, r_sku, r_quantity) AS r(o, sku, quantity)
                 GROUP BY r.o
               ) AS e
         ORDER BY e.o;
        GET DIAGNOSTICS v_written = ROW_COUNT;
        IF v_written > 0 THEN
            PERFORM pg_notify('fulfilment_outbox', '');
        END IF;
    END IF;

    RETURN QUERY
        SELECT g.o, v_outcome[g.o], v_status[g.o], coalesce(x.skus, '{}'),
               coalesce(x.quantities, '{}')
          FROM generate_series(1, v_orders) AS g(o)
          LEFT JOIN (
                SELECT r.o, array_agg(r.sku ORDER BY r.sku COLLATE "C") AS skus,
                       array_agg(r.quantity ORDER BY r.sku COLLATE "C") AS quantities
                  FROM unnest(r_order, r_sku, r_quantity) AS r(o, sku, quantity)
                 GROUP BY r.o
               ) AS x ON x.o = g.o
         ORDER BY g.o;
END;
$function$;

COMMENT ON FUNCTION cancel_orders(text, uuid[], uuid[], timestamptz[], boolean[], integer[], text[], integer[], text[], boolean) IS
'Applies many OrderCancelled events in one transaction, once per (consumer, event_id), as if
they came one after the other in array order (fulfilment.domain.lifecycle.apply_cancelled),
releasing only what the order holds (its lines less what the warehouse''s shipments took); an
order then holding nothing is released, or shipped when some of it shipped.
Cancels are given by position in p_event_ids, p_order_ids, p_cancelled_at and p_whole (true:
the whole order, with no lines); line i belongs to the cancel at position p_line_orders[i]
(1-based). Returns one row per cancel, by ordinal: (outcome, the order status after it, the
SKUs released sorted by code point, their units), where outcome is released,
partially_released, tombstoned, ignored, cancel_after_ship, cancel_requested, or duplicate
(status NULL).
Every cancel that released stock writes its result event (stock.released, reason
cancelled) to the outbox in
the same transaction, with the trace context p_traceparents gives its event (NULL: none), and
the relay is notified on fulfilment_outbox. With p_handoff, a cancel of a reserved order whose
fulfilment-order request was sent (sending, accepted, expired) releases nothing and records a
cancellation request (cancel_requested); one whose request was never sent shrinks it, or
withdraws it when nothing remains. Run it as a single autocommit statement.';
