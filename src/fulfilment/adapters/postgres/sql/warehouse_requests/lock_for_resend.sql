SELECT r.status FROM reservations AS r
WHERE r.order_id = (SELECT w.order_id FROM warehouse_requests AS w
                     WHERE w.idempotency_key = :key)
FOR UPDATE
