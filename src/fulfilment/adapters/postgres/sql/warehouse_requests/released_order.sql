UPDATE warehouse_requests SET released_order = true WHERE id = :id
