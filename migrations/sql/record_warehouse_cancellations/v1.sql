-- record_warehouse_cancellations(), version 1: many cancellations by the warehouse in one
-- transaction and one round trip, each applied once by its webhook id and once by its
-- cancellation_id, its rows kept, and the result event of every cancellation that released
-- units written to the outbox with it.
--
-- Created by migration 0015. To change it, add v2.sql beside this file (see ../README.md).
--
-- What a cancellation by the warehouse does is specified by
-- fulfilment.domain.warehouse_lifecycle.apply_warehouse_cancellation (the state table of
-- docs/design.md, "The reservation lifecycle"; product contract, "Hearing back from the
-- warehouse"), which the in-memory stock store of the tests runs. This function implements it
-- in PostgreSQL for a batch; the property tests hold the two to the same answers. An order
-- holds, per SKU, reservation_lines.quantity - shipped.
--
-- The outcome of each cancellation is the one it gets when they are applied one after the
-- other in the order of the arrays (their arrival order):
--
-- (a) insert the webhook_inbox rows of those that came with a webhook id (a poll's has none),
--     in webhook_id order; one whose id was there, or came earlier in this call, is a
--     duplicate by its webhook ('webhook') and changes nothing else;
-- (b) insert the warehouse_cancellations rows of the others, in cancellation_id order; one
--     whose id was there, or came earlier in this call, is a duplicate by its change
--     ('change'): its new webhook id stays recorded (outcome 'duplicate'), nothing else;
-- (c) lock the reservation of every order of the new cancellations that has one, in
--     order_id order, then the stock rows of every SKU the reserved ones among them hold, in
--     COLLATE "C" order;
-- (d) apply every new cancellation in turn: without a row it is a 'discrepancy'
--     (unknown_order), on a rejected order or a tombstone, which never held stock, a
--     'discrepancy' (order_not_reserved): one row per line, or one without SKU for a
--     cancellation of the whole order. A shipped or released order is 'ignored'. A reserved
--     order gives back, per SKU cancelled (every one it holds, without lines), what it holds
--     of it, never what shipped: reserved goes down, its line's quantity shrinks by it (a line
--     with nothing held or shipped left goes). It is 'released' when it gave back a unit
--     ('ignored' when it holds none of the lines), and the order stays 'reserved' while it
--     holds units, else is 'shipped' when some of it shipped (at its last shipment's time),
--     else 'released'. An order left holding nothing has nothing left to cancel: a
--     cancellation request of the shop's for it not sent yet ('pending') is 'withdrawn'. The
--     cancellation's lines are kept with the units released (for a whole cancellation, the
--     units released);
-- (e) record each new cancellation's outcome and the order's status after it on its row, and
--     in its webhook_inbox row; set news_at on the fulfilment-order request of every order
--     named by a new cancellation;
-- (f) write the result event (stock.released, reason 'warehouse_cancelled' and the
--     warehouse's reason) of every cancellation that released units to the outbox, and
--     notify the relay on the channel fulfilment_outbox.
--
-- Locks: as record_shipments() (webhook_inbox, warehouse_cancellations, reservations, stock
-- in COLLATE "C" order, warehouse_requests), so concurrent calls of any writer wait for each
-- other instead of deadlocking, and two calls with the same webhook id or cancellation_id
-- meet on the primary key. Stock only goes back here, so the CHECK of stock_levels holds.

CREATE OR REPLACE FUNCTION record_warehouse_cancellations(
    p_consumer text,
    p_event_ids uuid[],
    p_cancellation_ids text[],
    p_webhook_ids text[],
    p_sources text[],
    p_fulfilment_order_ids text[],
    p_order_ids uuid[],
    p_cancelled_at timestamptz[],
    p_reasons text[],
    p_whole boolean[],
    p_line_orders integer[],
    p_line_skus text[],
    p_line_quantities integer[],
    p_traceparents text[] DEFAULT NULL
) RETURNS TABLE (ordinal integer, outcome text, duplicate_by text, status text, skus text[],
                 quantities integer[], discrepancy_kinds text[], discrepancy_skus text[],
                 discrepancy_quantities integer[], discrepancy_statuses text[])
LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
    v_count integer := coalesce(cardinality(p_event_ids), 0);
    v_lines integer;
    v_outcome text[];
    v_by text[];
    v_status text[];
    v_hooked integer[];   -- ordinals whose webhook id is new (or that have none), ascending
    v_fresh integer[];    -- ordinals whose cancellation is new, ascending
    k_order uuid[];
    k_status text[];
    -- Per SKU the cancellation in the loop releases: the SKU and the units.
    c_sku text[];
    c_quantity integer[];
    -- The units released, one row per cancellation and SKU.
    r_order integer[] := '{}';
    r_sku text[] := '{}';
    r_quantity integer[] := '{}';
    v_o integer;
    v_k integer;
    v_order uuid;
    v_locked integer;
    v_written integer;
BEGIN
    IF p_consumer IS NULL OR v_count = 0
        OR cardinality(p_cancellation_ids) IS DISTINCT FROM v_count
        OR cardinality(p_webhook_ids) IS DISTINCT FROM v_count
        OR cardinality(p_sources) IS DISTINCT FROM v_count
        OR cardinality(p_fulfilment_order_ids) IS DISTINCT FROM v_count
        OR cardinality(p_order_ids) IS DISTINCT FROM v_count
        OR cardinality(p_cancelled_at) IS DISTINCT FROM v_count
        OR cardinality(p_reasons) IS DISTINCT FROM v_count
        OR cardinality(p_whole) IS DISTINCT FROM v_count
        OR array_position(p_event_ids, NULL) IS NOT NULL
        OR array_position(p_cancellation_ids, NULL) IS NOT NULL
        OR array_position(p_sources, NULL) IS NOT NULL
        OR array_position(p_fulfilment_order_ids, NULL) IS NOT NULL
        OR array_position(p_order_ids, NULL) IS NOT NULL
        OR array_position(p_cancelled_at, NULL) IS NOT NULL
        OR array_position(p_reasons, NULL) IS NOT NULL
        OR array_position(p_whole, NULL) IS NOT NULL
    THEN
        RAISE EXCEPTION 'record_warehouse_cancellations: consumer, and per cancellation every array'
            USING DETAIL = 'A consumer and equally long cancellation arrays are required; only webhook ids may be NULL.',
                  ERRCODE = 'null_value_not_allowed';
    END IF;
    v_lines := coalesce(cardinality(p_line_orders), 0);
    IF cardinality(p_line_skus) IS DISTINCT FROM v_lines
        OR cardinality(p_line_quantities) IS DISTINCT FROM v_lines
        OR EXISTS (
            SELECT 1
              FROM unnest(p_line_orders, p_line_skus, p_line_quantities) AS l(o, sku, quantity)
             WHERE l.o IS NULL OR l.o NOT BETWEEN 1 AND v_count OR p_whole[l.o]
                OR l.sku IS NULL OR l.quantity IS NULL OR l.quantity <= 0
        )
        OR (SELECT count(DISTINCT l.o) FROM unnest(p_line_orders) AS l(o))
           <> (SELECT count(*) FROM unnest(p_whole) AS w(whole) WHERE NOT w.whole)
    THEN
        RAISE EXCEPTION 'record_warehouse_cancellations: malformed lines'
            USING DETAIL = 'A cancellation of lines needs a line, a whole one none; each line an ordinal, a SKU, a quantity > 0.',
                  ERRCODE = 'invalid_parameter_value';
    END IF;

    v_outcome := array_fill('duplicate'::text, ARRAY[v_count]);
    v_by := array_fill(NULL::text, ARRAY[v_count]);
    v_status := array_fill(NULL::text, ARRAY[v_count]);

    -- (a) The webhook ids first, as in record_shipments().
    WITH src AS (
        SELECT DISTINCT ON (e.webhook_id) e.webhook_id, e.o::integer AS o
          FROM unnest(p_webhook_ids) WITH ORDINALITY AS e(webhook_id, o)
         WHERE e.webhook_id IS NOT NULL
         ORDER BY e.webhook_id, e.o
    ), inserted AS (
        INSERT INTO webhook_inbox (consumer, webhook_id, type, outcome)
        SELECT p_consumer, src.webhook_id, 'fulfilment_order.cancelled', 'duplicate'
          FROM src
         ORDER BY src.webhook_id
        ON CONFLICT DO NOTHING
        RETURNING webhook_inbox.webhook_id
    )
    SELECT coalesce(array_agg(g.o ORDER BY g.o), '{}')
      INTO v_hooked
      FROM generate_series(1, v_count) AS g(o)
     WHERE p_webhook_ids[g.o] IS NULL
        OR g.o IN (SELECT src.o FROM src JOIN inserted USING (webhook_id));
    FOR v_o IN 1 .. v_count LOOP
        IF NOT v_o = ANY (v_hooked) THEN
            v_by[v_o] := 'webhook';
        END IF;
    END LOOP;

    -- (b) The cancellations, by their own id; 'discrepancy' is a placeholder that (e)
    -- overwrites.
    WITH src AS (
        SELECT DISTINCT ON (p_cancellation_ids[h.o]) h.o, p_cancellation_ids[h.o] AS cancellation_id
          FROM unnest(v_hooked) AS h(o)
         ORDER BY p_cancellation_ids[h.o], h.o
    ), inserted AS (
        INSERT INTO warehouse_cancellations
               (cancellation_id, order_id, fulfilment_order_id, webhook_id, source,
                cancelled_at, reason, whole, outcome)
        SELECT src.cancellation_id, p_order_ids[src.o], p_fulfilment_order_ids[src.o],
               p_webhook_ids[src.o], p_sources[src.o], p_cancelled_at[src.o],
               p_reasons[src.o], p_whole[src.o], 'discrepancy'
          FROM src
         ORDER BY src.cancellation_id
        ON CONFLICT DO NOTHING
        RETURNING warehouse_cancellations.cancellation_id
    )
    SELECT coalesce(array_agg(src.o ORDER BY src.o), '{}')
      INTO v_fresh
      FROM src JOIN inserted USING (cancellation_id);
    FOREACH v_o IN ARRAY v_hooked LOOP
        IF NOT v_o = ANY (v_fresh) THEN
            v_by[v_o] := 'change';
        END IF;
    END LOOP;

    IF cardinality(v_fresh) > 0 THEN
        -- (c) The orders' rows in order_id order, then the stock rows a release may change.
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
        SELECT count(*)
          INTO v_locked
          FROM (
                SELECT t.sku
                  FROM stock_levels AS t
                 WHERE t.sku IN (
                        SELECT rl.sku
                          FROM reservation_lines AS rl
                          JOIN reservations AS r ON r.order_id = rl.order_id
                         WHERE r.order_id = ANY (k_order) AND r.status = 'reserved'
                           AND rl.quantity > rl.shipped
                       )
                 ORDER BY t.sku COLLATE "C"
                   FOR UPDATE
               ) AS s;

        -- (d) Each new cancellation in turn, like apply_warehouse_cancellation.
        FOREACH v_o IN ARRAY v_fresh LOOP
            v_order := p_order_ids[v_o];
            v_k := array_position(k_order, v_order);
            v_status[v_o] := k_status[v_k];
            c_sku := NULL;
            c_quantity := NULL;
            IF v_k IS NULL OR k_status[v_k] IN ('rejected', 'cancelled') THEN
                v_outcome[v_o] := 'discrepancy';
                INSERT INTO warehouse_discrepancies (kind, source, source_id, order_id, sku,
                                                     quantity, order_status)
                SELECT CASE WHEN v_k IS NULL THEN 'unknown_order' ELSE 'order_not_reserved' END,
                       'cancellation', p_cancellation_ids[v_o], v_order, x.sku, x.quantity,
                       k_status[v_k]
                  FROM (
                        SELECT NULL::text AS sku, NULL::integer AS quantity
                         WHERE p_whole[v_o]
                        UNION ALL
                        SELECT l.sku, sum(l.quantity)::integer
                          FROM unnest(p_line_orders, p_line_skus, p_line_quantities)
                               AS l(o, sku, quantity)
                         WHERE l.o = v_o
                         GROUP BY l.sku
                       ) AS x
                 ORDER BY x.sku COLLATE "C";
            ELSIF k_status[v_k] = 'reserved' THEN
                -- Per SKU the order holds and the cancellation names (every one, for a whole
                -- cancellation): what it holds, at most what is cancelled.
                SELECT array_agg(x.sku ORDER BY x.sku COLLATE "C"),
                       array_agg(x.quantity ORDER BY x.sku COLLATE "C")
                  INTO c_sku, c_quantity
                  FROM (
                        SELECT rl.sku,
                               least(rl.quantity - rl.shipped,
                                     coalesce(c.quantity, rl.quantity))::integer AS quantity
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
                IF c_sku IS NULL THEN
                    v_outcome[v_o] := 'ignored';
                ELSE
                    v_outcome[v_o] := 'released';
                    UPDATE stock_levels AS t
                       SET reserved = t.reserved - c.quantity, updated_at = now()
                      FROM unnest(c_sku, c_quantity) AS c(sku, quantity)
                     WHERE t.sku = c.sku;
                    -- A line given back whole (nothing of it shipped) goes; the others shrink
                    -- (the DELETE's rows are gone for the UPDATE that follows it).
                    DELETE FROM reservation_lines AS rl
                     USING unnest(c_sku, c_quantity) AS c(sku, quantity)
                     WHERE rl.order_id = v_order AND rl.sku = c.sku
                       AND rl.quantity = c.quantity;
                    UPDATE reservation_lines AS rl
                       SET quantity = rl.quantity - c.quantity
                      FROM unnest(c_sku, c_quantity) AS c(sku, quantity)
                     WHERE rl.order_id = v_order AND rl.sku = c.sku;
                    IF NOT EXISTS (SELECT 1 FROM reservation_lines AS rl
                                    WHERE rl.order_id = v_order AND rl.quantity > rl.shipped)
                    THEN
                        IF EXISTS (SELECT 1 FROM reservation_lines AS rl
                                    WHERE rl.order_id = v_order)
                        THEN
                            k_status[v_k] := 'shipped';
                            UPDATE reservations AS r
                               SET status = 'shipped', cancelled_at = p_cancelled_at[v_o],
                                   shipped_at = coalesce(
                                       (SELECT max(s.shipped_at) FROM warehouse_shipments AS s
                                         WHERE s.order_id = v_order AND s.outcome = 'shipped'),
                                       p_cancelled_at[v_o])
                             WHERE r.order_id = v_order;
                        ELSE
                            k_status[v_k] := 'released';
                            UPDATE reservations AS r
                               SET status = 'released', cancelled_at = p_cancelled_at[v_o]
                             WHERE r.order_id = v_order;
                        END IF;
                        v_status[v_o] := k_status[v_k];
                        -- Nothing is left to cancel: a cancellation never sent is not sent.
                        UPDATE warehouse_requests AS w
                           SET status = 'withdrawn', answered_at = now()
                         WHERE w.order_id = v_order AND w.kind = 'cancellation'
                           AND w.status = 'pending';
                    ELSE
                        UPDATE reservations AS r
                           SET cancelled_at = p_cancelled_at[v_o]
                         WHERE r.order_id = v_order;
                    END IF;
                    r_order := r_order || array_fill(v_o, ARRAY[cardinality(c_sku)]);
                    r_sku := r_sku || c_sku;
                    r_quantity := r_quantity || c_quantity;
                END IF;
            ELSE
                v_outcome[v_o] := 'ignored';
            END IF;
            -- Its lines: as sent with what each released, or (whole) what it released.
            INSERT INTO warehouse_cancellation_lines (cancellation_id, sku, quantity, released)
            SELECT p_cancellation_ids[v_o], c.sku, c.quantity, c.quantity
              FROM unnest(c_sku, c_quantity) AS c(sku, quantity)
             WHERE p_whole[v_o];
            INSERT INTO warehouse_cancellation_lines (cancellation_id, sku, quantity, released)
            SELECT p_cancellation_ids[v_o], l.sku, sum(l.quantity)::integer,
                   coalesce(max(c.quantity), 0)
              FROM unnest(p_line_orders, p_line_skus, p_line_quantities) AS l(o, sku, quantity)
              LEFT JOIN unnest(c_sku, c_quantity) AS c(sku, quantity) ON c.sku = l.sku
             WHERE l.o = v_o
             GROUP BY l.sku;
        END LOOP;

        -- (e) Each new cancellation's row says how it ended; its order's fulfilment order had
        -- news (its rows locked in id order, as its reservation is held: no writer waits).
        UPDATE warehouse_cancellations AS c
           SET outcome = v_outcome[f.o], order_status = v_status[f.o]
          FROM unnest(v_fresh) AS f(o)
         WHERE c.cancellation_id = p_cancellation_ids[f.o];
        UPDATE warehouse_requests AS w
           SET news_at = now()
          FROM (
                SELECT q.id
                  FROM warehouse_requests AS q
                 WHERE q.order_id IN (SELECT p_order_ids[f.o] FROM unnest(v_fresh) AS f(o))
                   AND q.kind = 'fulfilment_order'
                 ORDER BY q.id
                   FOR UPDATE
               ) AS q
         WHERE w.id = q.id;

        -- (f) The result events, in arrival order, as in cancel_orders().
        IF cardinality(r_order) > 0 THEN
            INSERT INTO outbox (event_id, order_id, routing_key, body, traceparent)
            SELECT e.event_id, e.order_id, 'stock.released',
                   jsonb_build_object('version', 1, 'event_id', e.event_id,
                                      'causation_id', e.causation_id, 'order_id', e.order_id,
                                      'occurred_at', now(), 'lines', e.lines,
                                      'order_status', v_status[e.o],
                                      'reason', 'warehouse_cancelled',
                                      'warehouse_reason', p_reasons[e.o]),
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
    END IF;

    -- (e) The webhook inbox says how each new webhook's cancellation ended.
    UPDATE webhook_inbox AS i
       SET outcome = v_outcome[f.o]
      FROM unnest(v_fresh) AS f(o)
     WHERE i.consumer = p_consumer AND i.webhook_id = p_webhook_ids[f.o];

    -- The discrepancies each new cancellation kept are read back as written, so that whoever
    -- counts them counts the rows.
    RETURN QUERY
        SELECT g.o, v_outcome[g.o], v_by[g.o], v_status[g.o], coalesce(x.skus, '{}'),
               coalesce(x.quantities, '{}'), coalesce(y.kinds, '{}'), coalesce(y.skus, '{}'),
               coalesce(y.quantities, '{}'), coalesce(y.statuses, '{}')
          FROM generate_series(1, v_count) AS g(o)
          LEFT JOIN (
                SELECT r.o, array_agg(r.sku ORDER BY r.sku COLLATE "C") AS skus,
                       array_agg(r.quantity ORDER BY r.sku COLLATE "C") AS quantities
                  FROM unnest(r_order, r_sku, r_quantity) AS r(o, sku, quantity)
                 GROUP BY r.o
               ) AS x ON x.o = g.o
          LEFT JOIN LATERAL (
                SELECT array_agg(d.kind ORDER BY d.sku COLLATE "C") AS kinds,
                       array_agg(d.sku ORDER BY d.sku COLLATE "C") AS skus,
                       array_agg(d.quantity ORDER BY d.sku COLLATE "C") AS quantities,
                       array_agg(d.order_status ORDER BY d.sku COLLATE "C") AS statuses
                  FROM warehouse_discrepancies AS d
                 WHERE g.o = ANY (v_fresh) AND d.source = 'cancellation'
                   AND d.source_id = p_cancellation_ids[g.o]
               ) AS y ON true
         ORDER BY g.o;
END;
$function$;

COMMENT ON FUNCTION record_warehouse_cancellations(text, uuid[], text[], text[], text[], text[], uuid[], timestamptz[], text[], boolean[], integer[], text[], integer[], text[]) IS
'Applies many cancellations by the warehouse in one transaction, as if they came one after the
other in array order (fulfilment.domain.warehouse_lifecycle.apply_warehouse_cancellation):
once per webhook id (webhook_inbox, per consumer; NULL for one found by the poll) and once per
cancellation_id (warehouse_cancellations). p_whole true: everything the order holds, with no
lines; line i belongs to the cancellation at position p_line_orders[i] (1-based). A reserved
order gives back per SKU what it holds of the lines, never what shipped (reserved goes down),
and holding nothing is then shipped when some of it shipped, else released; an unknown order,
a rejected one or a tombstone is kept in warehouse_discrepancies. Every cancellation that
released units writes its result event (stock.released, reason warehouse_cancelled) to the
outbox in the same transaction, with the trace context p_traceparents gives it, and the relay
is notified on fulfilment_outbox. Returns one row per cancellation, by ordinal: (outcome,
duplicate_by, the order status after it, the SKUs released sorted by code point, their
units, and of the warehouse_discrepancies rows it kept, by SKU, the kinds, SKUs, units and
order statuses; a whole cancellation''s one row has a NULL SKU and units), where outcome is
released, ignored, discrepancy or duplicate (duplicate_by webhook or change; status NULL).
Run it as a single autocommit statement.';
