-- Due, open, and allowed by the per-order rule: nothing earlier of the same order still open,
-- and a cancellation only once its order's fulfilment order is accepted. The subqueries read
-- without locking; a row another claimer holds is skipped, never waited for. The plan walks
-- warehouse_requests_due_idx (next_attempt_at, id) in order and stops at the limit (migration
-- 0012); the order's fulfilment order is a scalar subquery on its unique index, because an
-- EXISTS there was planned as a hash of every accepted request, built by a scan of the table.
-- A cancellation's body is fixed at its first send from the order as it is then
-- (fulfilment.domain.handoff.cancellation_to_send): its status and the units it holds (its
-- lines less what the warehouse's shipments took) come with it.
SELECT w.id, w.kind, w.order_id, w.lines, w.body, w.created_at,
      CASE WHEN w.kind = 'cancellation' AND w.body IS NULL THEN
           (SELECT r.status FROM reservations AS r WHERE r.order_id = w.order_id)
      END AS order_status,
      CASE WHEN w.kind = 'cancellation' AND w.body IS NULL THEN
           (SELECT jsonb_object_agg(l.sku, l.quantity - l.shipped) FROM reservation_lines AS l
             WHERE l.order_id = w.order_id AND l.quantity > l.shipped)
      END AS order_lines
FROM warehouse_requests AS w
WHERE w.status IN ('pending', 'sending') AND w.next_attempt_at <= now()
  AND NOT EXISTS (SELECT 1 FROM warehouse_requests AS e
                  WHERE e.order_id = w.order_id AND e.id < w.id
                    AND e.status IN ('pending', 'sending'))
  AND (w.kind = 'fulfilment_order' OR (
       SELECT f.status FROM warehouse_requests AS f
        WHERE f.order_id = w.order_id AND f.kind = 'fulfilment_order') = 'accepted')
ORDER BY w.next_attempt_at, w.id
LIMIT :limit
FOR UPDATE OF w SKIP LOCKED
