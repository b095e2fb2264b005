UPDATE warehouse_requests SET status = 'expired'
WHERE status IN ('pending', 'sending')
  AND first_attempt_at < now() - make_interval(secs => :retention_seconds)
