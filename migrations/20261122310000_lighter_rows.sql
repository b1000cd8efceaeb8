-- Less work for PostgreSQL per case (issue 5), measured with the pipeline benchmark.

-- The job a row keeps (to republish it, or describe a case that never ran) is only ever
-- written whole and read whole as text: stored as text it is no longer parsed into jsonb on
-- every insert and printed back on every read.
ALTER TABLE eval_results ALTER COLUMN job TYPE text USING job::text;

-- Nothing reads rows by (run, status) through this index any more: the worker's update keeps
-- the planner off it, results pages walk (run_id, case_index), the sweeper has its partial
-- index. Each row's insert and its result's update maintained it for nothing.
DROP INDEX IF EXISTS eval_results_run_status;

-- A definition is written once and read whole (to plan a run) as text; only its `settings`
-- are read on their own (on every poll of a run), so they get a column of their own. The
-- definition of a 100,000-case suite is tens of MB: parsing it into jsonb took seconds of
-- every upload, and compressing it more. Stored uncompressed (EXTERNAL).
ALTER TABLE eval_configs ADD COLUMN settings jsonb NOT NULL DEFAULT 'null'::jsonb;
UPDATE eval_configs SET settings = COALESCE(config->'settings', 'null'::jsonb);
ALTER TABLE eval_configs ALTER COLUMN config TYPE text USING config::text;
ALTER TABLE eval_configs ALTER COLUMN config SET STORAGE EXTERNAL;
