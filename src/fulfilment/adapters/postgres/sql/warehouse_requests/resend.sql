UPDATE warehouse_requests
SET status = 'sending', next_attempt_at = now(), answered_at = NULL WHERE id = :id
