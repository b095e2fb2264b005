SELECT w.id, w.kind, w.status,
      EXISTS (SELECT 1 FROM warehouse_requests AS c
               WHERE c.order_id = w.order_id AND c.kind = 'cancellation'
                 AND c.status = 'withdrawn') AS cancelled_locally
FROM warehouse_requests AS w WHERE w.idempotency_key = :key FOR UPDATE OF w
