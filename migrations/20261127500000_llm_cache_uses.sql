-- Issue 20, deletion: which runs used each cached model answer, so deleting a run (or the
-- version or skill it belongs to, or the retention sweep) also removes the answers only it
-- used. A worker records a link when a job of the run stores an answer or is served one;
-- entries with no link at all (written outside any run) are left to their TTL.
CREATE TABLE llm_cache_uses (
    key     text NOT NULL REFERENCES llm_cache (key) ON DELETE CASCADE,
    run_id  uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    PRIMARY KEY (key, run_id)
);
-- Deletion looks links up by run.
CREATE INDEX llm_cache_uses_run ON llm_cache_uses (run_id);
