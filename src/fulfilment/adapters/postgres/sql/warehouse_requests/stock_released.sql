-- The result events, built as the SQL functions build theirs: event_id minted here once and
-- written as the column and in the body, occurred_at the transaction's time.
INSERT INTO outbox (event_id, order_id, routing_key, body, traceparent)
SELECT e.event_id, :order_id, 'stock.released',
       jsonb_build_object('version', 1, 'event_id', e.event_id,
                          'causation_id', CAST(:causation_id AS uuid),
                          'order_id', CAST(:order_id AS uuid),
                          'occurred_at', now(), 'lines', CAST(:lines AS jsonb),
                          'order_status', CAST(:order_status AS text),
                          'reason', 'cancelled', 'warehouse_reason', NULL),
       :traceparent
FROM (SELECT gen_random_uuid() AS event_id) AS e
