-- record_adjustments(), version 2: version 1, with the level after each adjustment written to
-- its warehouse_adjustments row in one statement after the loop, not one per adjustment.
--
-- Created by migration 0019. To change it, add v3.sql beside this file (see ../README.md).
-- Read it as a diff:
--   git diff --no-index migrations/sql/record_adjustments/v1.sql migrations/sql/record_adjustments/v2.sql
--
-- Changed from version 1 (issue 37, an adjustment's cost on the intake's path): version 1
-- updated the row of each new adjustment inside the loop, one UPDATE by adjustment_id per
-- adjustment. PL/pgSQL keeps the plan of that statement for the session; planned while
-- warehouse_adjustments held a page or two (or with statistics saying so, the table analysed
-- empty and not since), it is a sequential scan, kept as the table grows: every adjustment
-- read the whole table (a burst of 20,000 webhooks read 199 million rows). Version 2 keeps
-- the values in the arrays the loop already fills and writes them in one UPDATE per call,
-- like record_shipments() writes its outcomes. The outcomes, the locks and their order, the
-- rows and the events are those of version 1.
--
-- What an adjustment does is specified by fulfilment.domain.adjustments.apply_adjustment
-- (product contract, "Hearing back from the warehouse"), which the in-memory stock store of
-- the tests runs; the contract cases and property tests hold the two to the same answers.
--
-- The outcome of each adjustment is the one it gets when they are applied one after the
-- other in the order of the arrays (their arrival order):
--
-- (a) insert the webhook_inbox rows of those that came with a webhook id (an operator's has
--     none), in webhook_id order; one whose id was there, or came earlier in this call, is a
--     duplicate by its webhook ('webhook') and changes nothing else;
-- (b) insert the warehouse_adjustments rows of the others, in adjustment_id order; one whose
--     id was there, or came earlier in this call, is a duplicate by its change ('change'):
--     its new webhook id stays recorded (outcome 'duplicate'), nothing else;
-- (c) lock the stock rows of every SKU the new adjustments name, in COLLATE "C" order, then
--     create at 0 on hand those unknown so far that a positive delta names (INSERT ... ON
--     CONFLICT DO UPDATE ... WHERE false, which also locks a row another call committed in
--     between); a SKU unknown so far that only losses name gets no row;
-- (d) apply every new adjustment in turn: on_hand goes up by delta, or down by it but never
--     below 0 (applied = greatest(delta, -on_hand)); the rest of a loss is a discrepancy
--     (more_than_on_hand, source adjustment). reserved never changes here, so a loss may
--     leave reserved > on_hand: the SKU is short, and the trigger of stock_levels
--     (stock_shortage_event(), migration 0016) writes stock.shortage in this transaction;
--     after the loop, the rows of the new adjustments keep what each applied and the level
--     after it (one UPDATE);
-- (e) record 'adjusted' in the webhook_inbox row of each new adjustment;
-- (f) write the result event (stock.adjusted) of every new adjustment to the outbox right
--     after its change (after the trigger's stock.shortage of the same change), keyed by its
--     SKU (outbox.sku: published in order per SKU), and notify the relay on the channel
--     fulfilment_outbox.
--
-- Locks: webhook_inbox, then warehouse_adjustments (each a primary key), then stock in
-- COLLATE "C" order, the order of every other writer (place_orders() locks its SKUs in the
-- same order; no writer holds a stock row and waits for an inbox row), so concurrent calls
-- wait for each other instead of deadlocking. Two calls with the same webhook id or
-- adjustment_id (two replicas of the intake) meet on the primary key in (a) or (b): the
-- second waits for the first to commit, then finds its row and is a duplicate.

CREATE OR REPLACE FUNCTION record_adjustments(
    p_consumer text,
    p_event_ids uuid[],
    p_adjustment_ids text[],
    p_webhook_ids text[],
    p_sources text[],
    p_skus text[],
    p_deltas integer[],
    p_reasons text[],
    p_occurred_at timestamptz[],
    p_operators text[],
    p_comments text[],
    p_os_users text[],
    p_hosts text[],
    p_traceparents text[] DEFAULT NULL
) RETURNS TABLE (ordinal integer, outcome text, duplicate_by text, on_hand integer,
                 reserved integer, applied integer, discrepancy integer)
LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
    v_count integer := coalesce(cardinality(p_event_ids), 0);
    v_outcome text[];
    v_by text[];
    v_on_hand integer[];
    v_reserved integer[];
    v_applied integer[];
    v_missing integer[];
    v_hooked integer[];   -- ordinals whose webhook id is new (or that have none), ascending
    v_fresh integer[];    -- ordinals whose adjustment is new, ascending
    v_o integer;
    v_level_on_hand integer;
    v_level_reserved integer;
    v_locked integer;
    v_event_id uuid;
BEGIN
    IF p_consumer IS NULL OR v_count = 0
        OR cardinality(p_adjustment_ids) IS DISTINCT FROM v_count
        OR cardinality(p_webhook_ids) IS DISTINCT FROM v_count
        OR cardinality(p_sources) IS DISTINCT FROM v_count
        OR cardinality(p_skus) IS DISTINCT FROM v_count
        OR cardinality(p_deltas) IS DISTINCT FROM v_count
        OR cardinality(p_reasons) IS DISTINCT FROM v_count
        OR cardinality(p_occurred_at) IS DISTINCT FROM v_count
        OR cardinality(p_operators) IS DISTINCT FROM v_count
        OR cardinality(p_comments) IS DISTINCT FROM v_count
        OR cardinality(p_os_users) IS DISTINCT FROM v_count
        OR cardinality(p_hosts) IS DISTINCT FROM v_count
        OR array_position(p_event_ids, NULL) IS NOT NULL
        OR array_position(p_adjustment_ids, NULL) IS NOT NULL
        OR array_position(p_sources, NULL) IS NOT NULL
        OR array_position(p_skus, NULL) IS NOT NULL
        OR array_position(p_deltas, NULL) IS NOT NULL
        OR array_position(p_deltas, 0) IS NOT NULL
        OR array_position(p_reasons, NULL) IS NOT NULL
        OR array_position(p_occurred_at, NULL) IS NOT NULL
    THEN
        RAISE EXCEPTION 'record_adjustments: consumer, and per adjustment every array'
            USING DETAIL = 'A consumer and equally long adjustment arrays are required, deltas non-zero; only webhook ids and the operator''s fields may be NULL.',
                  ERRCODE = 'null_value_not_allowed';
    END IF;

    v_outcome := array_fill('duplicate'::text, ARRAY[v_count]);
    v_by := array_fill(NULL::text, ARRAY[v_count]);
    v_on_hand := array_fill(NULL::integer, ARRAY[v_count]);
    v_reserved := array_fill(NULL::integer, ARRAY[v_count]);
    v_applied := array_fill(NULL::integer, ARRAY[v_count]);
    v_missing := array_fill(NULL::integer, ARRAY[v_count]);

    -- (a) The webhook ids first: a concurrent duplicate blocks on the primary key until the
    -- first commits, then sees the conflict. 'duplicate' is a placeholder that (e) overwrites.
    WITH src AS (
        SELECT DISTINCT ON (e.webhook_id) e.webhook_id, e.o::integer AS o
          FROM unnest(p_webhook_ids) WITH ORDINALITY AS e(webhook_id, o)
         WHERE e.webhook_id IS NOT NULL
         ORDER BY e.webhook_id, e.o
    ), inserted AS (
        INSERT INTO webhook_inbox (consumer, webhook_id, type, outcome)
        SELECT p_consumer, src.webhook_id, 'inventory.adjusted', 'duplicate'
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

    -- (b) The adjustments, by their own id; applied and the level after it are placeholders
    -- that (d) overwrites.
    WITH src AS (
        SELECT DISTINCT ON (p_adjustment_ids[h.o]) h.o, p_adjustment_ids[h.o] AS adjustment_id
          FROM unnest(v_hooked) AS h(o)
         ORDER BY p_adjustment_ids[h.o], h.o
    ), inserted AS (
        INSERT INTO warehouse_adjustments
               (adjustment_id, sku, delta, applied, reason, webhook_id, source, occurred_at,
                on_hand_after, reserved_after, operator, comment, os_user, host)
        SELECT src.adjustment_id, p_skus[src.o], p_deltas[src.o], greatest(p_deltas[src.o], 0),
               p_reasons[src.o],
               p_webhook_ids[src.o], p_sources[src.o], p_occurred_at[src.o], 0, 0,
               p_operators[src.o], p_comments[src.o], p_os_users[src.o], p_hosts[src.o]
          FROM src
         ORDER BY src.adjustment_id
        ON CONFLICT DO NOTHING
        RETURNING warehouse_adjustments.adjustment_id
    )
    SELECT coalesce(array_agg(src.o ORDER BY src.o), '{}')
      INTO v_fresh
      FROM src JOIN inserted USING (adjustment_id);
    FOREACH v_o IN ARRAY v_hooked LOOP
        IF NOT v_o = ANY (v_fresh) THEN
            v_by[v_o] := 'change';
        END IF;
    END LOOP;

    IF cardinality(v_fresh) > 0 THEN
        -- (c) Every SKU named, locked in the one order every writer uses; a SKU unknown so
        -- far is created at 0 when a positive delta names it (the loop then adds to it).
        SELECT count(*)
          INTO v_locked
          FROM (
                SELECT t.sku
                  FROM stock_levels AS t
                 WHERE t.sku IN (SELECT p_skus[f.o] FROM unnest(v_fresh) AS f(o))
                 ORDER BY t.sku COLLATE "C"
                   FOR UPDATE
               ) AS s;
        -- New rows are seen by no other writer until this commits; a concurrent call that
        -- creates the same SKU waits on it here, after both took their existing rows.
        INSERT INTO stock_levels AS t (sku, on_hand)
        SELECT p_skus[f.o], 0
          FROM unnest(v_fresh) AS f(o)
         WHERE p_deltas[f.o] > 0
         GROUP BY p_skus[f.o]
         ORDER BY p_skus[f.o] COLLATE "C"
        ON CONFLICT (sku) DO UPDATE SET on_hand = t.on_hand WHERE false;

        -- (d) Each new adjustment in turn, like adjustments.apply_adjustment.
        FOREACH v_o IN ARRAY v_fresh LOOP
            v_outcome[v_o] := 'adjusted';
            SELECT t.on_hand, t.reserved INTO v_level_on_hand, v_level_reserved
              FROM stock_levels AS t
             WHERE t.sku = p_skus[v_o];
            IF NOT FOUND THEN
                -- A loss of a SKU the service never stocked: all of it a discrepancy.
                v_applied[v_o] := 0;
                v_on_hand[v_o] := 0;
                v_reserved[v_o] := 0;
            ELSE
                v_applied[v_o] := greatest(p_deltas[v_o], -v_level_on_hand);
                IF v_applied[v_o] <> 0 THEN
                    UPDATE stock_levels AS t
                       SET on_hand = t.on_hand + v_applied[v_o], updated_at = now()
                     WHERE t.sku = p_skus[v_o]
                    RETURNING t.on_hand, t.reserved INTO v_level_on_hand, v_level_reserved;
                END IF;
                v_on_hand[v_o] := v_level_on_hand;
                v_reserved[v_o] := v_level_reserved;
            END IF;
            v_missing[v_o] := v_applied[v_o] - p_deltas[v_o];
            IF v_missing[v_o] > 0 THEN
                INSERT INTO warehouse_discrepancies (kind, source, source_id, order_id, sku,
                                                     quantity, order_status)
                VALUES ('more_than_on_hand', 'adjustment', p_adjustment_ids[v_o], NULL,
                        p_skus[v_o], v_missing[v_o], NULL);
            END IF;
            -- (f) Its result event, right after the change it reports, so that the rows of a
            -- SKU (this one, and the trigger's stock.shortage) are in the order of the changes
            -- (outbox.id is the relay's publishing order). occurred_at is the transaction's
            -- time.
            v_event_id := gen_random_uuid();
            INSERT INTO outbox (event_id, order_id, sku, routing_key, body, traceparent)
            VALUES (v_event_id, NULL, p_skus[v_o], 'stock.adjusted',
                    jsonb_build_object(
                        'version', 1, 'event_id', v_event_id, 'causation_id', p_event_ids[v_o],
                        'occurred_at', now(), 'adjustment_id', p_adjustment_ids[v_o],
                        'sku', p_skus[v_o], 'delta', p_deltas[v_o], 'applied', v_applied[v_o],
                        'reason', p_reasons[v_o], 'source', p_sources[v_o],
                        'on_hand', v_on_hand[v_o], 'reserved', v_reserved[v_o],
                        'available', greatest(0, v_on_hand[v_o] - v_reserved[v_o])),
                    p_traceparents[v_o]);
        END LOOP;

        -- The rows (b) inserted keep what each applied and the level after it: one statement
        -- for the call, as a statement per adjustment runs a plan kept for the session, made
        -- while the table was small (a sequential scan).
        UPDATE warehouse_adjustments AS a
           SET applied = v_applied[f.o], on_hand_after = v_on_hand[f.o],
               reserved_after = v_reserved[f.o]
          FROM unnest(v_fresh) AS f(o)
         WHERE a.adjustment_id = p_adjustment_ids[f.o];

        PERFORM pg_notify('fulfilment_outbox', '');
    END IF;

    -- (e) The webhook inbox says how each new webhook's adjustment ended ('duplicate' for an
    -- adjustment applied before under another webhook id, as the placeholder says).
    UPDATE webhook_inbox AS i
       SET outcome = v_outcome[f.o]
      FROM unnest(v_fresh) AS f(o)
     WHERE i.consumer = p_consumer AND i.webhook_id = p_webhook_ids[f.o];

    RETURN QUERY
        SELECT g.o, v_outcome[g.o], v_by[g.o], v_on_hand[g.o], v_reserved[g.o],
               v_applied[g.o], v_missing[g.o]
          FROM generate_series(1, v_count) AS g(o)
         ORDER BY g.o;
END;
$function$;

COMMENT ON FUNCTION record_adjustments(text, uuid[], text[], text[], text[], text[], integer[], text[], timestamptz[], text[], text[], text[], text[], text[]) IS
'Applies many adjustments of on_hand in one transaction, as if they came one after the other
in array order (fulfilment.domain.adjustments.apply_adjustment): once per webhook id
(webhook_inbox, per consumer; NULL for an operator''s) and once per adjustment_id
(warehouse_adjustments, with the operator''s name, comment, OS user and host for an
operator''s). on_hand changes by delta but never goes below 0: the rest of a loss is a
more_than_on_hand discrepancy; a positive delta of an unknown SKU creates it; reserved never
changes, so a loss may leave the SKU short (stock.shortage, by the trigger of stock_levels).
Every new adjustment writes stock.adjusted to the outbox (keyed by its SKU) in the same
transaction, with the trace context p_traceparents gives it, and notifies fulfilment_outbox.
Returns one row per adjustment, by ordinal: (outcome adjusted or duplicate, duplicate_by
webhook or change, on_hand and reserved after it, the units applied, the units not applied);
the last four NULL for a duplicate. Run it as a single autocommit statement.';
