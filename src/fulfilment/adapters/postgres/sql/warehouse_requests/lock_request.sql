SELECT id, kind, status, order_id, causation_id, lines, warehouse_id, traceparent
FROM warehouse_requests WHERE id = :id FOR UPDATE
