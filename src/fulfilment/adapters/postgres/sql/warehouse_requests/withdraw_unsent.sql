UPDATE warehouse_requests SET status = 'withdrawn', answered_at = now()
WHERE id = ANY (CAST(:ids AS bigint[]))
