-- The fulfilment orders due to be asked about (FulfilmentOrderPolls.due_polls): accepted,
-- their order still reserved (it holds units), and last heard of an interval ago or more. Last
-- heard of is the latest of the last shipment or cancellation recorded (news_at), the last
-- poll (polled_at) and the acceptance (answered_at): a coalesce would stop at an old news_at
-- and ask again at every turn once that was an interval old, whatever polls came since.
-- Driven by the reserved orders, the few that still hold units (reservations_reserved_idx),
-- not by every accepted fulfilment order ever recorded. The due ones are gathered first
-- (MATERIALIZED), then sorted: with the LIMIT in the same query the planner walks
-- warehouse_requests_without_news_idx in order instead, through the fulfilment orders of
-- every order shipped long ago, before it meets a reserved one (6 s at 1,000,000 orders,
-- 0.05 s this way; migration 0017).
WITH due AS MATERIALIZED (
    SELECT f.id, f.order_id, f.warehouse_id,
           greatest(f.news_at, f.polled_at, f.answered_at) AS heard_at
    FROM reservations AS r
    JOIN warehouse_requests AS f ON f.order_id = r.order_id AND f.kind = 'fulfilment_order'
    WHERE r.status = 'reserved' AND f.status = 'accepted' AND f.warehouse_id IS NOT NULL
      AND greatest(f.news_at, f.polled_at, f.answered_at)
          <= now() - make_interval(secs => :after_seconds)
      AND f.id <> ALL (CAST(:excluding AS bigint[]))
)
SELECT id, order_id, warehouse_id
FROM due
ORDER BY heard_at, id
LIMIT :limit
