UPDATE stock_levels AS t SET reserved = t.reserved - c.quantity, updated_at = now()
FROM unnest(CAST(:skus AS text[]), CAST(:quantities AS integer[])) AS c(sku, quantity)
WHERE t.sku = c.sku
