-- Asked about now: the next poll of these fulfilment orders is an interval from now.
UPDATE warehouse_requests SET polled_at = now()
WHERE id = ANY (CAST(:ids AS bigint[])) AND kind = 'fulfilment_order'
