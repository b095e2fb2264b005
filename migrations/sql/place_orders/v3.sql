-- place_orders(), version 3: version 2, and with p_handoff the fulfilment-order request of
-- every order it reserves recorded for the warehouse system in the same transaction.
--
-- Created by migration 0011. To change it, add v4.sql beside this file (see ../README.md).
-- Read it as a diff:
--   git diff --no-index migrations/sql/place_orders/v2.sql migrations/sql/place_orders/v3.sql
--
-- Changed from version 2 (product contract, "The warehouse system"): a new last parameter
-- p_handoff boolean DEFAULT false. When true, step (h) inserts one warehouse_requests row per
-- order this call reserved: kind 'fulfilment_order', status 'pending', lines the reserved
-- lines (merged per SKU, sorted by code point, as stock.reserved has them), causation_id the
-- OrderPlaced's event_id, the event's trace context, and an idempotency key minted here
-- (gen_random_uuid()) that never changes. A rejection, a duplicate and a tombstone record
-- none. The rows are written by one INSERT for the batch, in arrival order (their id is the
-- per-order sending order). When false, this is version 2 exactly; a worker of the
-- previous release, which passes eight arguments, calls it so (migration 0011).
--
-- Version 2 (migration 0009): version 1, and the result event of every order it places
-- written to the outbox in the same transaction.
--
-- Changed from version 1 (product contract, "Result events"): step (g) writes one outbox row
-- per order this call placed, 'stock.reserved' with the lines reserved (merged per SKU,
-- sorted by code point) or 'stock.rejected' with the reason and the SKUs (the short or
-- unknown ones; for 'cancelled', every SKU the order asked for), and notifies the relay on
-- the channel fulfilment_outbox when it wrote any. A duplicate (of the event or of the
-- order) writes none. The rows are written set-based, one INSERT per kind for the batch,
-- in arrival order, so that the call stays one round trip whose cost grows with its lines.
-- The parameter p_traceparents gives each event's W3C trace context (NULL: none), copied to
-- outbox.traceparent.
--
-- Version 1 (migration 0007): many OrderPlaced events in one transaction and one round trip;
-- an order cancelled before it came reserves what its cancels left. It is reserve_orders() v1
-- (../reserve_orders/v1.sql, migration 0005) with the lifecycle, under
-- a new name so that workers of the previous release keep calling v1, unchanged, during a
-- rolling update (migration 0007 says what they do; a revision of a later release drops v1, as
-- 0006 dropped reserve_order()). Read it as a diff:
--   git diff --no-index migrations/sql/reserve_orders/v1.sql migrations/sql/place_orders/v1.sql
--
-- Changed from reserve_orders() v1: an order whose cancels came first has a tombstone, a
-- 'cancelled' row (cancel_orders()); the OrderPlaced places it instead of being a duplicate of
-- the order, and decides on what the tombstone left (a tombstone of the 'order' leaves nothing;
-- one of 'lines' takes tombstone_lines off the demand). When nothing is left the order is
-- rejected with reason 'cancelled' and holds no lines. Step (b) locks every existing
-- reservation it meets, placed or not (ON CONFLICT DO UPDATE locks even the rows its WHERE
-- leaves alone), in order_id order with the rows it inserts. The work on tombstones is done
-- only in a call that meets one: a call without costs one more column in (b)'s RETURNING.
--
-- The reservation rule is specified by fulfilment.domain.model.decide, and the lifecycle by
-- fulfilment.domain.lifecycle.apply_placed, which the in-memory warehouse of the tests runs.
-- This function implements both in PostgreSQL so that a batch of orders costs the worker one
-- round trip. The property test
-- test_one_transaction_gives_every_order_the_outcome_it_gets_one_after_the_other, in
-- tests/integration/test_postgres_batches.py, holds the two to the same answers (outcomes,
-- stock levels, inbox, reservations and their lines) on random batches, and those of
-- tests/integration/test_postgres_lifecycle.py do so with cancels and shipments between them.
--
-- The outcome of each order is the one decide gives it when the orders are sent one after the
-- other in the order of the arrays (their arrival order). Rows are written and locked in key
-- order, which is what keeps concurrent calls from deadlocking; the decisions follow arrival
-- order:
--
-- (a) insert the inbox rows, in event_id order; the same event twice in one call is a
--     duplicate of the event the second time;
-- (b) insert one reservation per order, or place its tombstone, in order_id order; later
--     events of a placed order are duplicates of the order, and their inbox rows say
--     duplicate_order;
-- (c) aggregate the demand of each placed order per SKU, less what its tombstone cancelled;
-- (d) lock the stock rows of every SKU of the call in COLLATE "C" order;
-- (e) decide each order in turn, in arrival order, against what the orders before it left;
-- (f) apply every decision, record the demand lines and the outcomes;
-- (g) write the result event of every order placed to the outbox;
-- (h) with p_handoff, record the fulfilment-order request of every order reserved.
--
-- Every writer (place_orders, cancel_orders, ship_orders, the stock load, and reserve_orders
-- v1 of the previous release) takes its locks table by table in this order (inbox,
-- reservations, stock) and within a table in key order, each table's locks in one statement,
-- so concurrent calls wait for each other instead of deadlocking. The lines of an order (reservation_lines, tombstone_lines) are written only by
-- the holder of its reservations row.

CREATE OR REPLACE FUNCTION place_orders(
    p_consumer text,
    p_event_ids uuid[],
    p_order_ids uuid[],
    p_placed_at timestamptz[],
    p_line_orders integer[],
    p_line_skus text[],
    p_line_quantities integer[],
    p_traceparents text[] DEFAULT NULL,
    p_handoff boolean DEFAULT false
) RETURNS TABLE (ordinal integer, outcome text, reason text, skus text[])
LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
    v_orders integer := coalesce(cardinality(p_event_ids), 0);
    -- Per order (index = ordinal): the answer. Every order starts as a duplicate event and
    -- is overwritten once its inbox row turns out to be new.
    v_outcome text[];
    v_reason text[];
    v_fresh integer[];   -- ordinals whose event is new, ascending
    v_placed integer[];  -- ordinals that placed their order, ascending
    v_whole integer[];   -- ... of which placed a tombstone of the whole order
    v_partial integer[]; -- ... of which placed a tombstone of lines
    v_emptied integer[] := '{}'; -- ... of which were left nothing by their tombstone
    -- Per demand line of the placed orders, sorted by (ordinal, SKU by code point).
    l_order integer[];
    l_sku text[];
    l_quantity integer[];
    l_stock integer[];   -- index into s_sku, NULL for an unknown SKU
    l_offending boolean[];
    -- Per locked stock row, sorted by code point.
    s_sku text[];
    s_available integer[];
    s_delta integer[];
    v_lines integer;
    v_first integer;
    v_last integer;
    v_order integer;
    v_unknown boolean;
    v_short boolean;
    v_rejected boolean := false;
    v_stock integer;
    v_line integer;
    v_fresh_ordinal integer;
    v_events integer;
    v_written integer := 0;
BEGIN
    IF p_consumer IS NULL OR v_orders = 0
        OR cardinality(p_order_ids) IS DISTINCT FROM v_orders
        OR cardinality(p_placed_at) IS DISTINCT FROM v_orders
        OR array_position(p_event_ids, NULL) IS NOT NULL
        OR array_position(p_order_ids, NULL) IS NOT NULL
        OR array_position(p_placed_at, NULL) IS NOT NULL
    THEN
        RAISE EXCEPTION 'place_orders: consumer, and per order event id, order id, placed_at'
            USING DETAIL = 'A consumer and equally long, NULL-free order arrays are required.',
                  ERRCODE = 'null_value_not_allowed';
    END IF;
    v_lines := coalesce(cardinality(p_line_orders), 0);
    IF cardinality(p_line_skus) IS DISTINCT FROM v_lines
        OR cardinality(p_line_quantities) IS DISTINCT FROM v_lines
        OR EXISTS (
            SELECT 1
              FROM unnest(p_line_orders, p_line_skus, p_line_quantities) AS l(o, sku, quantity)
             WHERE l.o IS NULL OR l.o NOT BETWEEN 1 AND v_orders
                OR l.sku IS NULL OR l.quantity IS NULL OR l.quantity <= 0
        )
        OR (SELECT count(DISTINCT l.o) FROM unnest(p_line_orders) AS l(o)) <> v_orders
    THEN
        RAISE EXCEPTION 'place_orders: malformed lines'
            USING DETAIL = 'Each order needs a line; each line an ordinal, a SKU, a quantity > 0.',
                  ERRCODE = 'invalid_parameter_value';
    END IF;

    v_outcome := array_fill('duplicate'::text, ARRAY[v_orders]);
    v_reason := array_fill('event'::text, ARRAY[v_orders]);

    -- (a) The inbox first: a concurrent duplicate of an event blocks on the primary key until
    -- the first commits, then sees the conflict and changes nothing.
    WITH src AS (
        SELECT DISTINCT ON (e.event_id) e.event_id, e.order_id, e.o::integer AS o
          FROM unnest(p_event_ids, p_order_ids) WITH ORDINALITY AS e(event_id, order_id, o)
         ORDER BY e.event_id, e.o
    ), inserted AS (
        INSERT INTO inbox_messages (consumer, event_id, order_id, outcome)
        SELECT p_consumer, src.event_id, src.order_id, 'reserved'
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
            SELECT g.o, v_outcome[g.o], v_reason[g.o], '{}'::text[]
              FROM generate_series(1, v_orders) AS g(o);
        RETURN;
    END IF;

    -- (b) One reservation per order, whichever event placed it first; 'reserved' is a
    -- placeholder that (f) overwrites for a rejection. A tombstone is placed the same way,
    -- and RETURNING says what it cancelled (NULL for a new row). The DO UPDATE locks every
    -- existing row it meets, in the statement's order_id order.
    WITH src AS (
        SELECT DISTINCT ON (p_order_ids[f.o]) f.o, p_order_ids[f.o] AS order_id
          FROM unnest(v_fresh) AS f(o)
         ORDER BY p_order_ids[f.o], f.o
    ), inserted AS (
        INSERT INTO reservations AS r (order_id, event_id, status, placed_at)
        SELECT src.order_id, p_event_ids[src.o], 'reserved', p_placed_at[src.o]
          FROM src
         ORDER BY src.order_id
        ON CONFLICT (order_id) DO UPDATE
           SET event_id = excluded.event_id, placed_at = excluded.placed_at, status = 'reserved'
         WHERE r.status = 'cancelled'
        RETURNING r.order_id, r.tombstone
    )
    SELECT coalesce(array_agg(src.o ORDER BY src.o), '{}'),
           coalesce(array_agg(src.o ORDER BY src.o) FILTER (WHERE inserted.tombstone = 'order'),
                    '{}'),
           coalesce(array_agg(src.o ORDER BY src.o) FILTER (WHERE inserted.tombstone = 'lines'),
                    '{}')
      INTO v_placed, v_whole, v_partial
      FROM src JOIN inserted ON inserted.order_id = src.order_id;
    IF cardinality(v_placed) < cardinality(v_fresh) THEN
        UPDATE inbox_messages AS i
           SET outcome = 'duplicate_order'
         WHERE i.consumer = p_consumer
           AND i.event_id IN (
                SELECT p_event_ids[f.o] FROM unnest(v_fresh) AS f(o) WHERE f.o <> ALL (v_placed)
           );
        FOREACH v_fresh_ordinal IN ARRAY v_fresh LOOP
            IF v_fresh_ordinal <> ALL (v_placed) THEN
                v_reason[v_fresh_ordinal] := 'order';
            END IF;
        END LOOP;
    END IF;

    IF cardinality(v_placed) > 0 THEN
        -- (c) One demand per order and SKU. COLLATE "C" compares bytes, so SKUs that differ
        -- only in case stay apart, and the order is the domain's code-point order.
        IF cardinality(v_whole) + cardinality(v_partial) = 0 THEN
            SELECT array_agg(d.o ORDER BY d.o, d.sku), array_agg(d.sku ORDER BY d.o, d.sku),
                   array_agg(d.quantity ORDER BY d.o, d.sku)
              INTO l_order, l_sku, l_quantity
              FROM (
                    SELECT l.o, l.sku COLLATE "C" AS sku, sum(l.quantity)::integer AS quantity
                      FROM unnest(p_line_orders, p_line_skus, p_line_quantities)
                           AS l(o, sku, quantity)
                     WHERE l.o = ANY (v_placed)
                     GROUP BY 1, 2
                   ) AS d;
        ELSE
            -- What the tombstones left (fulfilment.domain.lifecycle.Tombstone.remaining):
            -- nothing of a whole order; of lines, each SKU less its cancelled units, and
            -- dropped at 0. The tombstone rows are this transaction's, locked in (b), and
            -- their lines are written only under that lock, so this read stays true.
            SELECT coalesce(array_agg(d.o ORDER BY d.o, d.sku), '{}'),
                   coalesce(array_agg(d.sku ORDER BY d.o, d.sku), '{}'),
                   coalesce(array_agg(d.quantity::integer ORDER BY d.o, d.sku), '{}')
              INTO l_order, l_sku, l_quantity
              FROM (
                    SELECT a.o, a.sku, a.quantity - coalesce(t.quantity, 0) AS quantity
                      FROM (
                            SELECT l.o, l.sku COLLATE "C" AS sku,
                                   sum(l.quantity)::integer AS quantity
                              FROM unnest(p_line_orders, p_line_skus, p_line_quantities)
                                   AS l(o, sku, quantity)
                             WHERE l.o = ANY (v_placed) AND l.o <> ALL (v_whole)
                             GROUP BY 1, 2
                           ) AS a
                      LEFT JOIN tombstone_lines AS t
                        ON a.o = ANY (v_partial)
                       AND t.order_id = p_order_ids[a.o]
                       AND t.sku = a.sku
                   ) AS d
             WHERE d.quantity > 0;
            SELECT coalesce(array_agg(f.o ORDER BY f.o), '{}')
              INTO v_emptied
              FROM unnest(v_whole || v_partial) AS f(o)
             WHERE f.o <> ALL (l_order);
            FOREACH v_fresh_ordinal IN ARRAY v_emptied LOOP
                v_outcome[v_fresh_ordinal] := 'rejected';
                v_reason[v_fresh_ordinal] := 'cancelled';
                v_rejected := true;
            END LOOP;
        END IF;
        v_lines := cardinality(l_order);

        -- (d) Every writer locks stock rows in this one order. The rows stay locked until
        -- commit, so what is read here stays true.
        SELECT coalesce(array_agg(s.sku ORDER BY s.sku), '{}'),
               coalesce(array_agg(s.on_hand - s.reserved ORDER BY s.sku), '{}')
          INTO s_sku, s_available
          FROM (
                SELECT t.sku COLLATE "C" AS sku, t.on_hand, t.reserved
                  FROM stock_levels AS t
                 WHERE t.sku = ANY (l_sku)
                 ORDER BY t.sku COLLATE "C"
                   FOR UPDATE
               ) AS s;
        s_delta := array_fill(0, ARRAY[cardinality(s_sku)]);
        l_offending := array_fill(false, ARRAY[v_lines]);
        -- Each line's stock row, found once with a hash join: looked up line by line in the
        -- loop below, the lookup made a batch cost lines x SKUs.
        SELECT array_agg(s.i::integer ORDER BY l.j)
          INTO l_stock
          FROM unnest(l_sku) WITH ORDINALITY AS l(sku, j)
          LEFT JOIN unnest(s_sku) WITH ORDINALITY AS s(sku, i) ON s.sku = l.sku;

        -- (e) Each order in turn, like fulfilment.domain.model.decide: unknown SKUs win over
        -- insufficient stock; an accepted order takes its units from what the next one sees.
        v_first := 1;
        WHILE v_first <= v_lines LOOP
            v_order := l_order[v_first];
            v_last := v_first;
            WHILE v_last < v_lines AND l_order[v_last + 1] = v_order LOOP
                v_last := v_last + 1;
            END LOOP;
            v_unknown := false;
            v_short := false;
            FOR v_line IN v_first .. v_last LOOP
                v_stock := l_stock[v_line];
                IF v_stock IS NULL THEN
                    v_unknown := true;
                ELSIF s_available[v_stock] < l_quantity[v_line] THEN
                    v_short := true;
                END IF;
            END LOOP;
            IF v_unknown THEN
                v_outcome[v_order] := 'rejected';
                v_reason[v_order] := 'unknown_sku';
                FOR v_line IN v_first .. v_last LOOP
                    l_offending[v_line] := l_stock[v_line] IS NULL;
                END LOOP;
            ELSIF v_short THEN
                v_outcome[v_order] := 'rejected';
                v_reason[v_order] := 'insufficient_stock';
                FOR v_line IN v_first .. v_last LOOP
                    l_offending[v_line] := s_available[l_stock[v_line]] < l_quantity[v_line];
                END LOOP;
            ELSE
                v_outcome[v_order] := 'reserved';
                v_reason[v_order] := NULL;
                FOR v_line IN v_first .. v_last LOOP
                    v_stock := l_stock[v_line];
                    s_available[v_stock] := s_available[v_stock] - l_quantity[v_line];
                    s_delta[v_stock] := s_delta[v_stock] + l_quantity[v_line];
                END LOOP;
            END IF;
            v_rejected := v_rejected OR v_unknown OR v_short;
            v_first := v_last + 1;
        END LOOP;

        -- (f) Apply: every line of an accepted order, none of a rejected one.
        UPDATE stock_levels AS t
           SET reserved = t.reserved + d.delta,
               updated_at = now()
          FROM unnest(s_sku, s_delta) AS d(sku, delta)
         WHERE t.sku = d.sku AND d.delta > 0;
        IF v_rejected THEN
            IF cardinality(v_emptied) > 0 THEN
                UPDATE reservations AS r
                   SET status = 'rejected', reason = 'cancelled', skus = '{}'
                 WHERE r.order_id IN (SELECT p_order_ids[f.o] FROM unnest(v_emptied) AS f(o));
            END IF;
            UPDATE reservations AS r
               SET status = 'rejected', reason = x.reason, skus = x.skus
              FROM (
                    SELECT p_order_ids[l.o] AS order_id, v_reason[l.o] AS reason,
                           array_agg(l.sku ORDER BY l.sku COLLATE "C")
                               FILTER (WHERE l.offending) AS skus
                      FROM unnest(l_order, l_sku, l_offending) AS l(o, sku, offending)
                     WHERE v_outcome[l.o] = 'rejected'
                     GROUP BY l.o
                   ) AS x
             WHERE r.order_id = x.order_id;
            UPDATE inbox_messages AS i
               SET outcome = 'rejected'
             WHERE i.consumer = p_consumer
               AND i.event_id IN (
                    SELECT p_event_ids[f.o] FROM unnest(v_placed) AS f(o)
                     WHERE v_outcome[f.o] = 'rejected'
               );
        END IF;
        INSERT INTO reservation_lines (order_id, sku, quantity)
        SELECT p_order_ids[l.o], l.sku, l.quantity
          FROM unnest(l_order, l_sku, l_quantity) AS l(o, sku, quantity);

        -- (g) The result events, in arrival order (outbox.id is the relay's publishing
        -- order). Each row's event_id is minted once in the inner SELECT, whose volatile
        -- gen_random_uuid() keeps it from being merged into the outer one, and is written
        -- both as the column and in the body. occurred_at is the transaction's time.
        IF cardinality(l_order) > 0 THEN
            INSERT INTO outbox (event_id, order_id, routing_key, body, traceparent)
            SELECT e.event_id, e.order_id, 'stock.reserved',
                   jsonb_build_object('version', 1, 'event_id', e.event_id,
                                      'causation_id', e.causation_id, 'order_id', e.order_id,
                                      'occurred_at', now(), 'lines', e.lines),
                   p_traceparents[e.o]
              FROM (
                    SELECT l.o, gen_random_uuid() AS event_id, p_order_ids[l.o] AS order_id,
                           p_event_ids[l.o] AS causation_id,
                           jsonb_agg(jsonb_build_object('sku', l.sku, 'quantity', l.quantity)
                                     ORDER BY l.sku COLLATE "C") AS lines
                      FROM unnest(l_order, l_sku, l_quantity) AS l(o, sku, quantity)
                     WHERE v_outcome[l.o] = 'reserved'
                     GROUP BY l.o
                   ) AS e
             ORDER BY e.o;
            GET DIAGNOSTICS v_events = ROW_COUNT;
            v_written := v_written + v_events;
        END IF;
        IF v_rejected THEN
            -- The SKUs of a rejection: the offending ones; for 'cancelled', every SKU the
            -- order asked for (its tombstone took them all).
            INSERT INTO outbox (event_id, order_id, routing_key, body, traceparent)
            SELECT e.event_id, e.order_id, 'stock.rejected',
                   jsonb_build_object('version', 1, 'event_id', e.event_id,
                                      'causation_id', e.causation_id, 'order_id', e.order_id,
                                      'occurred_at', now(), 'reason', v_reason[e.o],
                                      'skus', e.skus),
                   p_traceparents[e.o]
              FROM (
                    SELECT r.o, gen_random_uuid() AS event_id, p_order_ids[r.o] AS order_id,
                           p_event_ids[r.o] AS causation_id,
                           coalesce(jsonb_agg(DISTINCT r.sku ORDER BY r.sku)
                                        FILTER (WHERE r.named), '[]')
                               AS skus
                      FROM (
                            SELECT l.o, l.sku COLLATE "C" AS sku, l.offending AS named
                              FROM unnest(l_order, l_sku, l_offending) AS l(o, sku, offending)
                             WHERE v_outcome[l.o] = 'rejected'
                            UNION ALL
                            SELECT l.o, l.sku COLLATE "C", true
                              FROM unnest(p_line_orders, p_line_skus) AS l(o, sku)
                             WHERE l.o = ANY (v_emptied)
                           ) AS r
                     GROUP BY r.o
                   ) AS e
             ORDER BY e.o;
            GET DIAGNOSTICS v_events = ROW_COUNT;
            v_written := v_written + v_events;
        END IF;
        IF v_written > 0 THEN
            PERFORM pg_notify('fulfilment_outbox', '');
        END IF;

        -- (h) The requests to the warehouse system, in arrival order, each with its own key.
        -- The reservations rows are this transaction's, so no other call records a request
        -- of these orders meanwhile (and warehouse_requests_one_fulfilment_order_idx would
        -- refuse a second one).
        IF p_handoff AND cardinality(l_order) > 0 THEN
            INSERT INTO warehouse_requests
                   (idempotency_key, kind, order_id, causation_id, lines, traceparent)
            SELECT gen_random_uuid(), 'fulfilment_order', e.order_id, e.causation_id, e.lines,
                   p_traceparents[e.o]
              FROM (
                    SELECT l.o, p_order_ids[l.o] AS order_id, p_event_ids[l.o] AS causation_id,
                           jsonb_agg(jsonb_build_object('sku', l.sku, 'quantity', l.quantity)
                                     ORDER BY l.sku COLLATE "C") AS lines
                      FROM unnest(l_order, l_sku, l_quantity) AS l(o, sku, quantity)
                     WHERE v_outcome[l.o] = 'reserved'
                     GROUP BY l.o
                   ) AS e
             ORDER BY e.o;
        END IF;
    END IF;

    RETURN QUERY
        SELECT g.o, v_outcome[g.o], v_reason[g.o], coalesce(x.skus, '{}')
          FROM generate_series(1, v_orders) AS g(o)
          LEFT JOIN (
                SELECT l.o, array_agg(l.sku ORDER BY l.sku COLLATE "C") AS skus
                  FROM unnest(l_order, l_sku, l_offending) AS l(o, sku, offending)
                 WHERE l.offending
                 GROUP BY l.o
               ) AS x ON x.o = g.o
         ORDER BY g.o;
END;
$function$;

COMMENT ON FUNCTION place_orders(text, uuid[], uuid[], timestamptz[], integer[], text[], integer[], text[], boolean) IS
'Reserves stock for many OrderPlaced events in one transaction, each all lines or none, once
per (consumer, event_id), as if they came one after the other in array order. Orders are
given by position in p_event_ids, p_order_ids and p_placed_at; line i belongs to the order at
position p_line_orders[i] (1-based). Returns one row per order, by ordinal: (reserved, NULL,
{}), (rejected, unknown_sku|insufficient_stock, offending SKUs sorted by code point;
cancelled, {}) or
(duplicate, event|order, {}). An order cancelled before it came (a tombstone) reserves what its
cancels left, or is rejected with reason cancelled when nothing is left. Every order placed
writes its result event (stock.reserved or stock.rejected) to the outbox in the same
transaction, with the trace context p_traceparents gives its event (NULL: none), and the
relay is notified on fulfilment_outbox. With p_handoff, every order reserved also records its
fulfilment-order request to the warehouse system (warehouse_requests, pending, with a new
idempotency key). Run it as a single autocommit statement.';
