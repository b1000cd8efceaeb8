-- Issue 28, a delivery that outlives the broker's consumer acknowledgement timeout: the broker
-- closes the worker's channel and delivers the job again while the first copy still runs. A
-- claim says which copy of a case runs: taken by a copy that runs long (after
-- `worker.claim_after_ms`) or at once by a copy the broker delivered again, kept by renewing
-- its lease while it runs, and let lapse when it ends (its result is committed within the
-- lease). A copy that finds the claim held by another live copy does not run the case: it
-- goes to a delay queue and looks again when it comes back.
-- Keyed like a result row (run, case, variant) and by the job's attempt: a retry is a job
-- of its own, published once the attempt before it ended, and never waits for that
-- attempt's claim to lapse.
CREATE TABLE case_claims (
    run_id         uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    test_case_id   text NOT NULL,
    configuration  text NOT NULL,
    run_number     int NOT NULL,
    attempt        int NOT NULL,
    -- The copy holding the claim (a random id per delivery a worker runs).
    holder         uuid NOT NULL,
    expires_at     timestamptz NOT NULL,
    PRIMARY KEY (run_id, test_case_id, configuration, run_number, attempt)
);
