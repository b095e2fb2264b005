SELECT sku, quantity FROM reservation_lines WHERE order_id = :order_id
ORDER BY sku COLLATE "C"
