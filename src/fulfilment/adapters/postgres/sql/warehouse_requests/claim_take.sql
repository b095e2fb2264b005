UPDATE warehouse_requests AS w
SET attempts = w.attempts + 1, status = 'sending',
    first_attempt_at = coalesce(w.first_attempt_at, now()), last_attempt_at = now(),
    body = coalesce(w.body, b.body),
    next_attempt_at = now() + make_interval(secs => :lease_seconds),
    warehouse_id = coalesce(w.warehouse_id, (
        SELECT f.warehouse_id FROM warehouse_requests AS f
         WHERE f.order_id = w.order_id AND f.kind = 'fulfilment_order'))
FROM unnest(CAST(:ids AS bigint[]), CAST(:bodies AS bytea[])) AS b(id, body)
WHERE w.id = b.id
RETURNING w.id, w.idempotency_key, w.kind, w.order_id, w.causation_id, w.body,
          w.attempts, w.first_attempt_at, w.warehouse_id, w.traceparent
