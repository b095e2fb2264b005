UPDATE reservations SET status = :status, cancelled_at = now() WHERE order_id = :order_id
