-- The lines given back whole: nothing of them held or shipped is left.
DELETE FROM reservation_lines AS l
USING unnest(CAST(:skus AS text[]), CAST(:quantities AS integer[])) AS r(sku, quantity)
WHERE l.order_id = :order_id AND l.sku = r.sku AND l.quantity = r.quantity
