SELECT id FROM warehouse_requests
WHERE id = ANY (CAST(:ids AS bigint[])) AND status = 'sending' ORDER BY id FOR UPDATE
