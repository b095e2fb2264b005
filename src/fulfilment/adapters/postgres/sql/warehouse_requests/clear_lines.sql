DELETE FROM reservation_lines WHERE order_id = :order_id
