-- The other lines released shrink by what they gave back (run after delete_released_lines,
-- whose rows are gone); what shipped of them stays.
UPDATE reservation_lines AS l SET quantity = l.quantity - r.quantity
FROM unnest(CAST(:skus AS text[]), CAST(:quantities AS integer[])) AS r(sku, quantity)
WHERE l.order_id = :order_id AND l.sku = r.sku
