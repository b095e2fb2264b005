SELECT sku FROM stock_levels WHERE sku = ANY (CAST(:skus AS text[]))
ORDER BY sku COLLATE "C" FOR UPDATE
