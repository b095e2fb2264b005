INSERT INTO warehouse_request_audit (idempotency_key, action, status_before, operator)
VALUES (:key, 'resent', :status_before, :operator)
