-- Issue 18, baselines, repeats and trigger evals in the service: a case of a run asked for a
-- baseline or repeats runs once per variant, (configuration, attempt): `with_skill` or
-- `without_skill` (the skill left out, the runner's baseline), attempt 1..k; a trigger eval
-- query is a job of configuration `trigger`. Each variant's row is written once, so the key of
-- a result grows by both; a run without baseline or repeats has only the primary variant
-- (`with_skill`, 1), which every existing row is.
ALTER TABLE eval_results ADD COLUMN configuration text NOT NULL DEFAULT 'with_skill'
    CHECK (configuration IN ('with_skill', 'without_skill', 'trigger'));
ALTER TABLE eval_results ADD COLUMN run_number integer NOT NULL DEFAULT 1
    CHECK (run_number >= 1);
ALTER TABLE eval_results DROP CONSTRAINT eval_results_pkey;
ALTER TABLE eval_results ADD PRIMARY KEY (run_id, test_case_id, configuration, run_number);

-- A parked job is one variant's job: one live parked row per variant, and a requeue gives
-- back that variant's errored row only.
ALTER TABLE parked_jobs ADD COLUMN configuration text NOT NULL DEFAULT 'with_skill'
    CHECK (configuration IN ('with_skill', 'without_skill', 'trigger'));
ALTER TABLE parked_jobs ADD COLUMN run_number integer NOT NULL DEFAULT 1
    CHECK (run_number >= 1);
DROP INDEX parked_jobs_case;
CREATE UNIQUE INDEX parked_jobs_case ON parked_jobs (run_id, test_case_id, configuration, run_number)
    WHERE run_id IS NOT NULL AND state <> 'requeued';
