-- Per line, the units it holds (its quantity less what the warehouse's shipments took of it,
-- migration 0014) and the units that shipped.
SELECT sku, quantity - shipped AS held, shipped FROM reservation_lines
WHERE order_id = :order_id
ORDER BY sku COLLATE "C"
