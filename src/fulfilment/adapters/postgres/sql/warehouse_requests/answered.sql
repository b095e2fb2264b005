-- Final answers, one or many: each request's status, answer and the warehouse's id.
UPDATE warehouse_requests AS w
SET status = b.status, answered_at = now(), last_status_code = b.status_code,
    last_answer = b.answer, warehouse_id = coalesce(b.warehouse_id, w.warehouse_id)
FROM unnest(CAST(:ids AS bigint[]), CAST(:statuses AS text[]),
            CAST(:status_codes AS integer[]), CAST(:answers AS text[]),
            CAST(:warehouse_ids AS text[]))
     AS b(id, status, status_code, answer, warehouse_id)
WHERE w.id = b.id
