UPDATE warehouse_requests AS w
SET next_attempt_at = now() + make_interval(secs => b.seconds),
    last_status_code = b.status_code, last_answer = b.answer
FROM unnest(CAST(:ids AS bigint[]), CAST(:seconds AS float8[]),
            CAST(:status_codes AS integer[]), CAST(:answers AS text[]))
     AS b(id, seconds, status_code, answer)
WHERE w.id = b.id
