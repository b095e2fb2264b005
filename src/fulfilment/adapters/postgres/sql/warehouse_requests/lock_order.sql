SELECT status FROM reservations WHERE order_id = :order_id FOR UPDATE
