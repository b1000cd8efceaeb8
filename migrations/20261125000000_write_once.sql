-- A case's row is written once, when its outcome is known (issue 15): graded by a worker, or
-- skipped by the coordinator when it stops a run. Nothing is inserted `queued` at creation any
-- more: a run keeps its plan (the stored definition, the filter in `request`, `total`) and a
-- published watermark (`published_through`: plan positions below it were confirmed by the
-- broker), and what is pending is derived (planned minus recorded).

-- Rows that only said "queued" go; the watermark of every unfinished run is reset, so the
-- sweeper publishes again what is not recorded (a case recorded since is not published again;
-- a duplicate would be harmless anyway).
DELETE FROM eval_results WHERE status = 'queued';
UPDATE runs SET published_through = 0
WHERE NOT finalised AND status IN ('pending', 'running');

DROP INDEX IF EXISTS eval_results_unpublished;
ALTER TABLE eval_results DROP COLUMN published_at;
ALTER TABLE eval_results DROP COLUMN queued_at;
ALTER TABLE eval_results ALTER COLUMN status DROP DEFAULT;
ALTER TABLE eval_results DROP CONSTRAINT eval_results_status_check;
ALTER TABLE eval_results ADD CONSTRAINT eval_results_status_check
    CHECK (status IN ('passed', 'failed', 'errored', 'skipped'));

-- The lifecycle's states (`infra/src/store/lifecycle.rs` owns them): `creating` while the
-- creator's first publishing pass is under way, then `running`; `completed`, `cancelled` or
-- `failed` at the end. The `creating` flag becomes the status.
ALTER TABLE runs DROP CONSTRAINT runs_status_check;
UPDATE runs SET status = 'running' WHERE status = 'pending' OR (creating AND status = 'running');
ALTER TABLE runs ALTER COLUMN status SET DEFAULT 'creating';
ALTER TABLE runs ADD CONSTRAINT runs_status_check
    CHECK (status IN ('creating', 'running', 'completed', 'failed', 'cancelled'));
DROP INDEX IF EXISTS runs_creating;
ALTER TABLE runs DROP COLUMN creating;

-- Kinds: `upload` and `manual` plan from the stored definition and finalise into a verdict;
-- `rescore` and `samples` are the next issues' (refused at creation until then).
ALTER TABLE runs DROP CONSTRAINT runs_kind_check;
UPDATE runs SET kind = 'samples' WHERE kind = 'sample';
UPDATE runs SET kind = 'manual' WHERE kind = 'comparison';
ALTER TABLE runs ADD CONSTRAINT runs_kind_check
    CHECK (kind IN ('upload', 'manual', 'rescore', 'samples'));

-- Why a run stopped before running every case, typed; the human sentence beside it.
ALTER TABLE runs ADD COLUMN stop_detail text;
UPDATE runs SET stop_detail = stop_reason, stop_reason = 'budget' WHERE stop_reason IS NOT NULL;
UPDATE runs SET stop_reason = 'cancelled', stop_detail = 'the run was cancelled'
WHERE status = 'cancelled' AND stop_reason IS NULL;
ALTER TABLE runs ADD CONSTRAINT runs_stop_reason_check
    CHECK (stop_reason IN ('fail_fast', 'budget', 'cancelled', 'delivery_limit'));
