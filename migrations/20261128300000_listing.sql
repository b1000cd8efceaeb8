-- Issue 30, `GET /v1/skills` and `GET /v1/runs`: what the lists filter and sort on, indexed.
--
-- The models a version's definition names (`settings.runner.model`, each case's
-- `evaluation.options.model` and `metadata.model`), written at upload: the skills list filters
-- on them. Versions stored before this migration name none (their definitions are deflated,
-- out of SQL's reach).
ALTER TABLE skill_versions ADD COLUMN models text[] NOT NULL DEFAULT '{}';
CREATE INDEX skill_versions_models ON skill_versions USING gin (models);

-- The runs list: newest first (the default), by score, and a version's latest finalised run
-- (the skills list's verdict and pass rate).
CREATE INDEX runs_created_id ON runs (created_at DESC, id DESC);
-- A run without a summary (not finished) sorts as score -1: below every score.
CREATE INDEX runs_score_id ON runs ((COALESCE((summary->>'mean')::float8, -1)), id);
CREATE INDEX runs_version_finished ON runs (version_id, finished_at DESC, id DESC)
    WHERE finalised AND kind IN ('upload', 'manual');
