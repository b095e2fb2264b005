-- The plan of claim_due.sql only while the table's statistics are fresh: a backlog that grew since the
-- last ANALYZE (an outage's, exactly when the claim must keep up) is estimated at a few rows,
-- and PostgreSQL then reads every open request by bitmap, runs the per-order rule on each and
-- sorts them (22 ms per claim with 9,000 open requests never analysed, against 0.5 ms). Off for
-- the claim's transaction only, the ordered index scan is the plan whatever the estimate.
SELECT set_config('enable_bitmapscan', 'off', true), set_config('enable_sort', 'off', true)
