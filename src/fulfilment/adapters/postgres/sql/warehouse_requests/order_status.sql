-- An order left holding nothing that shipped some is shipped, at its last shipment's time
-- (the CHECK reservations_shipped_at_iff_shipped).
UPDATE reservations
SET status = CAST(:status AS text), cancelled_at = now(),
    shipped_at = CASE WHEN CAST(:status AS text) = 'shipped' THEN
                      coalesce((SELECT max(s.shipped_at) FROM warehouse_shipments AS s
                                 WHERE s.order_id = :order_id AND s.outcome = 'shipped'),
                               now())
                 END
WHERE order_id = :order_id
