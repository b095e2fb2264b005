INSERT INTO reservation_lines (order_id, sku, quantity)
SELECT :order_id, l.sku, l.quantity
FROM unnest(CAST(:skus AS text[]), CAST(:quantities AS integer[])) AS l(sku, quantity)
