UPDATE warehouse_requests SET status = 'withdrawn' WHERE id = ANY (CAST(:ids AS bigint[]))
