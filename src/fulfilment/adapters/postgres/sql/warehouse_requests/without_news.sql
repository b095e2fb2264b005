-- The gauge fulfilment_warehouse_orders_without_news: accepted fulfilment orders whose order
-- still holds units and whose last news (a shipment or cancellation recorded, else the
-- acceptance) is an interval old or more. A poll that found nothing is no news.
SELECT count(*)
FROM reservations AS r
JOIN warehouse_requests AS f ON f.order_id = r.order_id AND f.kind = 'fulfilment_order'
WHERE r.status = 'reserved' AND f.status = 'accepted'
  AND greatest(f.news_at, f.answered_at) <= now() - make_interval(secs => :after_seconds)
