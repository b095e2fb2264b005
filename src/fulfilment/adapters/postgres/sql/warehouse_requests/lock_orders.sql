-- The answers that change the request's row only (_changes_the_request_only), one or many:
-- the order rows first, in order_id order as cancel_orders() takes them, then the requests
-- still sending, in id order; nothing else is locked.
SELECT order_id FROM reservations WHERE order_id = ANY (CAST(:order_ids AS uuid[]))
ORDER BY order_id FOR UPDATE
