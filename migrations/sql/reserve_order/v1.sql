-- reserve_order(), version 1: one reservation, inbox record included, in one round trip.
--
-- Created by migration 0002. Unused since reserve_orders() took its place (0005); migration
-- 0006 drops it, and its downgrade loads this file again.
--
-- The function body is the transaction: the caller runs it as a single autocommit statement.
-- Its steps run in a fixed order, which is what makes it idempotent and deadlock-free:
--
-- (a) aggregate the demand per SKU;
-- (b) insert the inbox row first: a concurrent duplicate of the same event blocks on the
--     inbox's primary key until the first commits, then sees the conflict and changes nothing;
-- (c) insert the reservation: a second event for an already placed order changes no stock and
--     is recorded in the inbox as duplicate_order;
-- (d) lock the stock rows in COLLATE "C" order, the one order every writer uses;
-- (e) decide like fulfilment.domain.model.decide, the specification of the rule: unknown SKUs
--     win over insufficient stock, offending SKUs sorted by code point;
-- (f) apply the decision, record the demand lines and the inbox outcome.

CREATE OR REPLACE FUNCTION reserve_order(
    p_consumer text,
    p_event_id uuid,
    p_order_id uuid,
    p_placed_at timestamptz,
    p_skus text[],
    p_quantities integer[]
) RETURNS TABLE (outcome text, reason text, skus text[])
LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
    v_skus text[];
    v_quantities integer[];
    v_unknown text[];
    v_short text[];
    v_reason text;
    v_offending text[] := '{}';
    v_rows integer;
BEGIN
    IF p_consumer IS NULL OR p_event_id IS NULL OR p_order_id IS NULL OR p_placed_at IS NULL
    THEN
        RAISE EXCEPTION 'reserve_order: consumer, event id, order id and placed_at are required'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF coalesce(cardinality(p_skus), 0) = 0
        OR cardinality(p_skus) IS DISTINCT FROM cardinality(p_quantities)
    THEN
        RAISE EXCEPTION 'reserve_order: skus and quantities must be non-empty and equally long'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (
        SELECT 1
          FROM unnest(p_skus, p_quantities) AS l(sku, quantity)
         WHERE l.sku IS NULL OR l.quantity IS NULL OR l.quantity <= 0
    ) THEN
        RAISE EXCEPTION 'reserve_order: every line needs a SKU and a quantity > 0'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- (a) One demand per SKU. COLLATE "C" compares bytes, so SKUs that differ only in case
    -- stay apart and the order is the code-point order of the domain's aggregate_demand.
    SELECT array_agg(d.sku ORDER BY d.sku), array_agg(d.quantity ORDER BY d.sku)
      INTO v_skus, v_quantities
      FROM (
            SELECT l.sku COLLATE "C" AS sku, sum(l.quantity)::integer AS quantity
              FROM unnest(p_skus, p_quantities) AS l(sku, quantity)
             GROUP BY 1
           ) AS d;

    -- (b) The inbox first. 'reserved' is a placeholder that steps (c) and (f) overwrite when
    -- the outcome differs; no other transaction can see it before this one commits.
    INSERT INTO inbox_messages (consumer, event_id, order_id, outcome)
    VALUES (p_consumer, p_event_id, p_order_id, 'reserved')
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    IF v_rows = 0 THEN
        RETURN QUERY SELECT 'duplicate'::text, 'event'::text, '{}'::text[];
        RETURN;
    END IF;

    -- (c) One reservation per order, whichever event placed it first.
    INSERT INTO reservations (order_id, event_id, status, placed_at)
    VALUES (p_order_id, p_event_id, 'reserved', p_placed_at)
    ON CONFLICT (order_id) DO NOTHING;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    IF v_rows = 0 THEN
        UPDATE inbox_messages AS i
           SET outcome = 'duplicate_order'
         WHERE i.consumer = p_consumer AND i.event_id = p_event_id;
        RETURN QUERY SELECT 'duplicate'::text, 'order'::text, '{}'::text[];
        RETURN;
    END IF;

    -- (d) Every writer locks stock rows in this one order, so two orders sharing SKUs wait
    -- for each other instead of deadlocking.
    PERFORM 1
       FROM stock_levels AS s
      WHERE s.sku = ANY (v_skus)
      ORDER BY s.sku COLLATE "C"
        FOR UPDATE;

    -- (e) The rows are locked, so what this statement reads stays true until commit.
    SELECT coalesce(array_agg(d.sku ORDER BY d.sku COLLATE "C")
                        FILTER (WHERE s.sku IS NULL), '{}'),
           coalesce(array_agg(d.sku ORDER BY d.sku COLLATE "C")
                        FILTER (WHERE s.on_hand - s.reserved < d.quantity), '{}')
      INTO v_unknown, v_short
      FROM unnest(v_skus, v_quantities) AS d(sku, quantity)
      LEFT JOIN stock_levels AS s ON s.sku = d.sku;
    IF cardinality(v_unknown) > 0 THEN
        v_reason := 'unknown_sku';
        v_offending := v_unknown;
    ELSIF cardinality(v_short) > 0 THEN
        v_reason := 'insufficient_stock';
        v_offending := v_short;
    END IF;

    -- (f) Apply: all lines or none.
    IF v_reason IS NULL THEN
        UPDATE stock_levels AS s
           SET reserved = s.reserved + d.quantity,
               updated_at = now()
          FROM unnest(v_skus, v_quantities) AS d(sku, quantity)
         WHERE s.sku = d.sku;
    ELSE
        UPDATE reservations AS r
           SET status = 'rejected', reason = v_reason, skus = v_offending
         WHERE r.order_id = p_order_id;
        UPDATE inbox_messages AS i
           SET outcome = 'rejected'
         WHERE i.consumer = p_consumer AND i.event_id = p_event_id;
    END IF;
    INSERT INTO reservation_lines (order_id, sku, quantity)
    SELECT p_order_id, d.sku, d.quantity
      FROM unnest(v_skus, v_quantities) AS d(sku, quantity);

    RETURN QUERY
        SELECT CASE WHEN v_reason IS NULL THEN 'reserved' ELSE 'rejected' END,
               v_reason,
               v_offending;
END;
$function$;

COMMENT ON FUNCTION reserve_order(text, uuid, uuid, timestamptz, text[], integer[]) IS
'Reserves stock for one OrderPlaced event, all lines or none, once per (consumer, event_id).
Returns one row: (reserved, NULL, {}), (rejected, unknown_sku|insufficient_stock, offending
SKUs sorted by code point) or (duplicate, event|order, {}). Run it as a single autocommit
statement: the function body is the transaction.';
