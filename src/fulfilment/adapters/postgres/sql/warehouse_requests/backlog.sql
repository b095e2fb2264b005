SELECT kind, status, count(*), extract(epoch FROM now() - min(created_at))::float8
FROM warehouse_requests GROUP BY kind, status
