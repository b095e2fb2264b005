SELECT id, causation_id, lines, traceparent FROM warehouse_requests
WHERE order_id = :order_id AND kind = 'cancellation' AND status IN ('pending', 'sending')
ORDER BY id FOR UPDATE
