-- record_shipments(), version 2: version 1, never taking on_hand below 0.
--
-- Created by migration 0016. To change it, add v3.sql beside this file (see ../README.md).
-- Read it as a diff:
--   git diff --no-index migrations/sql/record_shipments/v1.sql migrations/sql/record_shipments/v2.sql
--
-- Changed from version 1 (the shortage rule, migration 0016): a shipment that takes from a
-- short SKU (reserved > on_hand, after a reported loss) more than its on_hand takes on_hand
-- to 0, not below: the warehouse shipped units it had reported lost. reserved goes down by
-- all it took, so the shortfall shrinks and the trigger of stock_levels writes
-- stock.shortage. The signature is version 1's.
--
-- Version 1: many shipments of the warehouse in one transaction and one
-- round trip, each applied once by its webhook id and once by its shipment_id, its rows kept,
-- and the result event of every shipment that took units written to the outbox with it.
--
--
-- What a shipment does is specified by fulfilment.domain.warehouse_lifecycle.apply_shipment
-- (the state table of docs/design.md, "The reservation lifecycle"; product contract, "Hearing
-- back from the warehouse"), which the in-memory stock store of the tests runs. This function
-- implements it in PostgreSQL for a batch of shipments; the property tests hold the two to
-- the same answers. An order holds, per SKU, reservation_lines.quantity - shipped.
--
-- The outcome of each shipment is the one it gets when the shipments are applied one after
-- the other in the order of the arrays (their arrival order):
--
-- (a) insert the webhook_inbox rows of the shipments that came with a webhook id (a poll's
--     has none), in webhook_id order; one whose id was there, or came earlier in this call,
--     is a duplicate by its webhook ('webhook') and changes nothing else;
-- (b) insert the warehouse_shipments rows of the others, in shipment_id order; one whose
--     shipment_id was there, or came earlier in this call, is a duplicate by its change
--     ('change'): its new webhook id stays recorded (outcome 'duplicate'), nothing else;
-- (c) lock the reservation of every order of the new shipments that has one, in order_id
--     order, then the stock rows of every SKU those shipments name, in COLLATE "C" order;
-- (d) apply every new shipment in turn: without a row it is a 'discrepancy' (unknown_order,
--     per SKU); on a shipped order 'already_shipped'; on any other order that is not reserved
--     a 'discrepancy' (order_not_reserved, per SKU). A reserved order gives per SKU what it
--     holds, never more: reservation_lines.shipped goes up by it, and on_hand and reserved
--     go down by it (stock_levels.shipped up), so the CHECK of stock_levels keeps holding;
--     the rest is a discrepancy (more_than_held when the order has a line of the SKU,
--     sku_not_held when not). It is 'shipped' when it took a unit ('discrepancy' when it
--     took none), and the order 'shipped' (at the shipment's shipped_at) when it then holds
--     nothing, else still 'reserved'. An order left holding nothing has nothing left to
--     cancel: a cancellation request of the shop's for it not sent yet ('pending') is
--     'withdrawn'. The shipment's lines are kept as sent (merged per SKU) with the units
--     taken, and its discrepancies in warehouse_discrepancies;
-- (e) record each new shipment's outcome and the order's status after it on its row, and in
--     its webhook_inbox row; set news_at on the fulfilment-order request of every order
--     named by a new shipment;
-- (f) write the result event (stock.shipped) of every shipment that took units to the
--     outbox, with its shipment_id, carrier, tracking numbers and URL and the order's status
--     after it, and notify the relay on the channel fulfilment_outbox.
--
-- Every writer takes its locks table by table in the order inbox (here webhook_inbox, then
-- warehouse_shipments, each a primary key), reservations, stock (COLLATE "C"),
-- warehouse_requests, and within a table in key order, so concurrent calls wait for each
-- other instead of deadlocking. Two calls with the same webhook id or the same shipment_id
-- (two replicas of the intake, or the intake and the poll) meet on the primary key in (a) or
-- (b): the second waits for the first to commit, then finds its row and is a duplicate.

CREATE OR REPLACE FUNCTION record_shipments(
    p_consumer text,
    p_event_ids uuid[],
    p_shipment_ids text[],
    p_webhook_ids text[],
    p_sources text[],
    p_fulfilment_order_ids text[],
    p_order_ids uuid[],
    p_shipped_at timestamptz[],
    p_carriers text[],
    p_tracking_urls text[],
    p_tracking_orders integer[],
    p_tracking_numbers text[],
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
    -- Per shipment (index = ordinal): its outcome, what a duplicate repeated, and the order's
    -- status after it.
    v_outcome text[];
    v_by text[];
    v_status text[];
    v_hooked integer[];   -- ordinals whose webhook id is new (or that have none), ascending
    v_fresh integer[];    -- ordinals whose shipment is new, ascending
    -- The locked reservations, by order_id: their ids and their status as the loop goes.
    k_order uuid[];
    k_status text[];
    -- Per SKU of the shipment in the loop: sent, taken, and whether the order has its line.
    c_sku text[];
    c_sent integer[];
    c_taken integer[];
    c_has_line boolean[];
    -- The units taken, one row per shipment and SKU.
    t_order integer[] := '{}';
    t_sku text[] := '{}';
    t_quantity integer[] := '{}';
    v_o integer;
    v_k integer;
    v_order uuid;
    v_locked integer;
    v_written integer;
BEGIN
    IF p_consumer IS NULL OR v_count = 0
        OR cardinality(p_shipment_ids) IS DISTINCT FROM v_count
        OR cardinality(p_webhook_ids) IS DISTINCT FROM v_count
        OR cardinality(p_sources) IS DISTINCT FROM v_count
        OR cardinality(p_fulfilment_order_ids) IS DISTINCT FROM v_count
        OR cardinality(p_order_ids) IS DISTINCT FROM v_count
        OR cardinality(p_shipped_at) IS DISTINCT FROM v_count
        OR cardinality(p_carriers) IS DISTINCT FROM v_count
        OR cardinality(p_tracking_urls) IS DISTINCT FROM v_count
        OR array_position(p_event_ids, NULL) IS NOT NULL
        OR array_position(p_shipment_ids, NULL) IS NOT NULL
        OR array_position(p_sources, NULL) IS NOT NULL
        OR array_position(p_fulfilment_order_ids, NULL) IS NOT NULL
        OR array_position(p_order_ids, NULL) IS NOT NULL
        OR array_position(p_shipped_at, NULL) IS NOT NULL
    THEN
        RAISE EXCEPTION 'record_shipments: consumer, and per shipment every array'
            USING DETAIL = 'A consumer and equally long shipment arrays are required; only webhook ids, carriers and tracking URLs may be NULL.',
                  ERRCODE = 'null_value_not_allowed';
    END IF;
    v_lines := coalesce(cardinality(p_line_orders), 0);
    IF cardinality(p_line_skus) IS DISTINCT FROM v_lines
        OR cardinality(p_line_quantities) IS DISTINCT FROM v_lines
        OR EXISTS (
            SELECT 1
              FROM unnest(p_line_orders, p_line_skus, p_line_quantities) AS l(o, sku, quantity)
             WHERE l.o IS NULL OR l.o NOT BETWEEN 1 AND v_count
                OR l.sku IS NULL OR l.quantity IS NULL OR l.quantity <= 0
        )
        OR (SELECT count(DISTINCT l.o) FROM unnest(p_line_orders) AS l(o)) <> v_count
        OR coalesce(cardinality(p_tracking_orders), 0)
           IS DISTINCT FROM coalesce(cardinality(p_tracking_numbers), 0)
        OR EXISTS (
            SELECT 1
              FROM unnest(p_tracking_orders, p_tracking_numbers) AS n(o, number)
             WHERE n.o IS NULL OR n.o NOT BETWEEN 1 AND v_count OR n.number IS NULL
        )
    THEN
        RAISE EXCEPTION 'record_shipments: malformed lines or tracking numbers'
            USING DETAIL = 'Every shipment needs a line; each line an ordinal, a SKU, a quantity > 0; each tracking number an ordinal.',
                  ERRCODE = 'invalid_parameter_value';
    END IF;

    v_outcome := array_fill('duplicate'::text, ARRAY[v_count]);
    v_by := array_fill(NULL::text, ARRAY[v_count]);
    v_status := array_fill(NULL::text, ARRAY[v_count]);

    -- (a) The webhook ids first: a concurrent duplicate blocks on the primary key until the
    -- first commits, then sees the conflict. 'duplicate' is a placeholder that (e) overwrites.
    WITH src AS (
        SELECT DISTINCT ON (e.webhook_id) e.webhook_id, e.o::integer AS o
          FROM unnest(p_webhook_ids) WITH ORDINALITY AS e(webhook_id, o)
         WHERE e.webhook_id IS NOT NULL
         ORDER BY e.webhook_id, e.o
    ), inserted AS (
        INSERT INTO webhook_inbox (consumer, webhook_id, type, outcome)
        SELECT p_consumer, src.webhook_id, 'shipment.shipped', 'duplicate'
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

    -- (b) The shipments, by their own id; 'discrepancy' is a placeholder that (e) overwrites.
    WITH src AS (
        SELECT DISTINCT ON (p_shipment_ids[h.o]) h.o, p_shipment_ids[h.o] AS shipment_id
          FROM unnest(v_hooked) AS h(o)
         ORDER BY p_shipment_ids[h.o], h.o
    ), inserted AS (
        INSERT INTO warehouse_shipments
               (shipment_id, order_id, fulfilment_order_id, webhook_id, source, shipped_at,
                carrier, tracking_numbers, tracking_url, outcome)
        SELECT src.shipment_id, p_order_ids[src.o], p_fulfilment_order_ids[src.o],
               p_webhook_ids[src.o], p_sources[src.o], p_shipped_at[src.o], p_carriers[src.o],
               coalesce((SELECT array_agg(n.number ORDER BY n.i)
                           FROM unnest(p_tracking_orders, p_tracking_numbers)
                                WITH ORDINALITY AS n(o, number, i)
                          WHERE n.o = src.o), '{}'),
               p_tracking_urls[src.o], 'discrepancy'
          FROM src
         ORDER BY src.shipment_id
        ON CONFLICT DO NOTHING
        RETURNING warehouse_shipments.shipment_id
    )
    SELECT coalesce(array_agg(src.o ORDER BY src.o), '{}')
      INTO v_fresh
      FROM src JOIN inserted USING (shipment_id);
    FOREACH v_o IN ARRAY v_hooked LOOP
        IF NOT v_o = ANY (v_fresh) THEN
            v_by[v_o] := 'change';
        END IF;
    END LOOP;

    IF cardinality(v_fresh) > 0 THEN
        -- (c) The existing rows of the orders, locked in order_id order, then the stock rows
        -- of the SKUs the shipments name, in the one order every writer uses.
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
                        SELECT l.sku
                          FROM unnest(p_line_orders, p_line_skus) AS l(o, sku)
                         WHERE l.o = ANY (v_fresh)
                           AND p_order_ids[l.o] = ANY (k_order)
                       )
                 ORDER BY t.sku COLLATE "C"
                   FOR UPDATE
               ) AS s;

        -- (d) Each new shipment in turn, like warehouse_lifecycle.apply_shipment.
        FOREACH v_o IN ARRAY v_fresh LOOP
            v_order := p_order_ids[v_o];
            v_k := array_position(k_order, v_order);
            v_status[v_o] := k_status[v_k];
            -- Per SKU shipped (merged): what the order holds of it, at most what was sent.
            SELECT array_agg(x.sku ORDER BY x.sku COLLATE "C"),
                   array_agg(x.sent ORDER BY x.sku COLLATE "C"),
                   array_agg(CASE WHEN k_status[v_k] = 'reserved'
                                  THEN least(x.sent, x.held) ELSE 0 END
                             ORDER BY x.sku COLLATE "C"),
                   array_agg(x.has_line ORDER BY x.sku COLLATE "C")
              INTO c_sku, c_sent, c_taken, c_has_line
              FROM (
                    SELECT l.sku, sum(l.quantity)::integer AS sent,
                           coalesce(max(rl.quantity - rl.shipped), 0) AS held,
                           bool_or(rl.sku IS NOT NULL) AS has_line
                      FROM unnest(p_line_orders, p_line_skus, p_line_quantities)
                           AS l(o, sku, quantity)
                      LEFT JOIN reservation_lines AS rl
                             ON rl.order_id = v_order AND rl.sku = l.sku
                     WHERE l.o = v_o
                     GROUP BY l.sku
                   ) AS x;
            INSERT INTO warehouse_shipment_lines (shipment_id, sku, quantity, taken)
            SELECT p_shipment_ids[v_o], c.sku, c.sent, c.taken
              FROM unnest(c_sku, c_sent, c_taken) AS c(sku, sent, taken);

            IF v_k IS NULL THEN
                v_outcome[v_o] := 'discrepancy';
                INSERT INTO warehouse_discrepancies (kind, source, source_id, order_id, sku,
                                                     quantity, order_status)
                SELECT 'unknown_order', 'shipment', p_shipment_ids[v_o], v_order, c.sku,
                       c.sent, NULL
                  FROM unnest(c_sku, c_sent) WITH ORDINALITY AS c(sku, sent, i)
                 ORDER BY c.i;
            ELSIF k_status[v_k] = 'shipped' THEN
                v_outcome[v_o] := 'already_shipped';
            ELSIF k_status[v_k] <> 'reserved' THEN
                v_outcome[v_o] := 'discrepancy';
                INSERT INTO warehouse_discrepancies (kind, source, source_id, order_id, sku,
                                                     quantity, order_status)
                SELECT 'order_not_reserved', 'shipment', p_shipment_ids[v_o], v_order, c.sku,
                       c.sent, k_status[v_k]
                  FROM unnest(c_sku, c_sent) WITH ORDINALITY AS c(sku, sent, i)
                 ORDER BY c.i;
            ELSE
                INSERT INTO warehouse_discrepancies (kind, source, source_id, order_id, sku,
                                                     quantity, order_status)
                SELECT CASE WHEN c.has_line THEN 'more_than_held' ELSE 'sku_not_held' END,
                       'shipment', p_shipment_ids[v_o], v_order, c.sku, c.sent - c.taken,
                       'reserved'
                  FROM unnest(c_sku, c_sent, c_taken, c_has_line)
                       WITH ORDINALITY AS c(sku, sent, taken, has_line, i)
                 WHERE c.sent > c.taken
                 ORDER BY c.i;
                IF NOT EXISTS (SELECT 1 FROM unnest(c_taken) AS c(taken) WHERE c.taken > 0) THEN
                    v_outcome[v_o] := 'discrepancy';
                ELSE
                    v_outcome[v_o] := 'shipped';
                    UPDATE reservation_lines AS rl
                       SET shipped = rl.shipped + c.taken
                      FROM unnest(c_sku, c_taken) AS c(sku, taken)
                     WHERE rl.order_id = v_order AND rl.sku = c.sku AND c.taken > 0;
                    UPDATE stock_levels AS t
                       SET on_hand = greatest(0, t.on_hand - c.taken), reserved = t.reserved - c.taken,
                           shipped = t.shipped + c.taken, updated_at = now()
                      FROM unnest(c_sku, c_taken) AS c(sku, taken)
                     WHERE t.sku = c.sku AND c.taken > 0;
                    IF NOT EXISTS (SELECT 1 FROM reservation_lines AS rl
                                    WHERE rl.order_id = v_order AND rl.quantity > rl.shipped)
                    THEN
                        k_status[v_k] := 'shipped';
                        v_status[v_o] := 'shipped';
                        UPDATE reservations AS r
                           SET status = 'shipped', shipped_at = p_shipped_at[v_o]
                         WHERE r.order_id = v_order;
                        -- Nothing is left to cancel: a cancellation never sent is not sent.
                        UPDATE warehouse_requests AS w
                           SET status = 'withdrawn', answered_at = now()
                         WHERE w.order_id = v_order AND w.kind = 'cancellation'
                           AND w.status = 'pending';
                    END IF;
                    t_order := t_order || ARRAY(SELECT v_o FROM unnest(c_taken) AS c(t)
                                                 WHERE c.t > 0);
                    t_sku := t_sku || ARRAY(SELECT c.sku FROM unnest(c_sku, c_taken)
                                                              WITH ORDINALITY AS c(sku, t, i)
                                             WHERE c.t > 0 ORDER BY c.i);
                    t_quantity := t_quantity || ARRAY(SELECT c.t
                                                        FROM unnest(c_taken)
                                                             WITH ORDINALITY AS c(t, i)
                                                       WHERE c.t > 0 ORDER BY c.i);
                END IF;
            END IF;
        END LOOP;

        -- (e) Each new shipment's row says how it ended; its order's fulfilment order had
        -- news (its rows locked in id order, as its reservation is held: no writer waits).
        UPDATE warehouse_shipments AS s
           SET outcome = v_outcome[f.o], order_status = v_status[f.o]
          FROM unnest(v_fresh) AS f(o)
         WHERE s.shipment_id = p_shipment_ids[f.o];
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

        -- (f) The result events, in arrival order (outbox.id is the relay's publishing
        -- order). Each row's event_id is minted once in the inner SELECT, whose volatile
        -- gen_random_uuid() keeps it from being merged into the outer one, and is written
        -- both as the column and in the body. occurred_at is the transaction's time.
        IF cardinality(t_order) > 0 THEN
            INSERT INTO outbox (event_id, order_id, routing_key, body, traceparent)
            SELECT e.event_id, e.order_id, 'stock.shipped',
                   jsonb_build_object(
                       'version', 1, 'event_id', e.event_id, 'causation_id', e.causation_id,
                       'order_id', e.order_id, 'occurred_at', now(), 'lines', e.lines,
                       'shipment_id', p_shipment_ids[e.o], 'carrier', p_carriers[e.o],
                       'tracking_numbers',
                       coalesce((SELECT jsonb_agg(n.number ORDER BY n.i)
                                   FROM unnest(p_tracking_orders, p_tracking_numbers)
                                        WITH ORDINALITY AS n(o, number, i)
                                  WHERE n.o = e.o), '[]'::jsonb),
                       'tracking_url', p_tracking_urls[e.o], 'order_status', v_status[e.o]),
                   p_traceparents[e.o]
              FROM (
                    SELECT t.o, gen_random_uuid() AS event_id, p_order_ids[t.o] AS order_id,
                           p_event_ids[t.o] AS causation_id,
                           jsonb_agg(jsonb_build_object('sku', t.sku, 'quantity', t.quantity)
                                     ORDER BY t.sku COLLATE "C") AS lines
                      FROM unnest(t_order, t_sku, t_quantity) AS t(o, sku, quantity)
                     GROUP BY t.o
                   ) AS e
             ORDER BY e.o;
            GET DIAGNOSTICS v_written = ROW_COUNT;
            IF v_written > 0 THEN
                PERFORM pg_notify('fulfilment_outbox', '');
            END IF;
        END IF;
    END IF;

    -- (e) The webhook inbox says how each new webhook's shipment ended ('duplicate' for a
    -- shipment applied before under another webhook id, as the placeholder says).
    UPDATE webhook_inbox AS i
       SET outcome = v_outcome[f.o]
      FROM unnest(v_fresh) AS f(o)
     WHERE i.consumer = p_consumer AND i.webhook_id = p_webhook_ids[f.o];

    -- The discrepancies each new shipment kept are read back as written, so that whoever
    -- counts them counts the rows.
    RETURN QUERY
        SELECT g.o, v_outcome[g.o], v_by[g.o], v_status[g.o],
               coalesce(x.skus, '{}'), coalesce(x.quantities, '{}'),
               coalesce(y.kinds, '{}'), coalesce(y.skus, '{}'), coalesce(y.quantities, '{}'),
               coalesce(y.statuses, '{}')
          FROM generate_series(1, v_count) AS g(o)
          LEFT JOIN (
                SELECT t.o, array_agg(t.sku ORDER BY t.sku COLLATE "C") AS skus,
                       array_agg(t.quantity ORDER BY t.sku COLLATE "C") AS quantities
                  FROM unnest(t_order, t_sku, t_quantity) AS t(o, sku, quantity)
                 GROUP BY t.o
               ) AS x ON x.o = g.o
          LEFT JOIN LATERAL (
                SELECT array_agg(d.kind ORDER BY d.sku COLLATE "C") AS kinds,
                       array_agg(d.sku ORDER BY d.sku COLLATE "C") AS skus,
                       array_agg(d.quantity ORDER BY d.sku COLLATE "C") AS quantities,
                       array_agg(d.order_status ORDER BY d.sku COLLATE "C") AS statuses
                  FROM warehouse_discrepancies AS d
                 WHERE g.o = ANY (v_fresh) AND d.source = 'shipment'
                   AND d.source_id = p_shipment_ids[g.o]
               ) AS y ON true
         ORDER BY g.o;
END;
$function$;

COMMENT ON FUNCTION record_shipments(text, uuid[], text[], text[], text[], text[], uuid[], timestamptz[], text[], text[], integer[], text[], integer[], text[], integer[], text[]) IS
'Applies many shipments of the warehouse in one transaction, as if they came one after the
other in array order (fulfilment.domain.warehouse_lifecycle.apply_shipment): once per webhook
id (webhook_inbox, per consumer; NULL for a shipment found by the poll) and once per
shipment_id (warehouse_shipments). Tracking number i belongs to the shipment at position
p_tracking_orders[i], line i to the one at p_line_orders[i] (1-based). A reserved order gives
per SKU what it holds, never more (on_hand and reserved go down, reservation_lines.shipped
and stock_levels.shipped up), and is shipped when it then holds nothing; what could not be
taken is kept in warehouse_discrepancies. Every shipment that took units writes its result
event (stock.shipped, with the shipment''s carrier, tracking numbers and the order status)
to the outbox in the same transaction, with the trace context p_traceparents gives it, and
the relay is notified on fulfilment_outbox. Returns one row per shipment, by ordinal:
(outcome, duplicate_by, the order status after it, the SKUs taken sorted by code point, their
units, and of the warehouse_discrepancies rows it kept, by SKU, the kinds, SKUs, units and
order statuses), where outcome is shipped, already_shipped, discrepancy or duplicate
(duplicate_by webhook or change; status NULL). Run it as a single autocommit statement.';
