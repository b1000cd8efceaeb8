-- Issue 18: comparisons are computed when asked (or when a history page needs one) and stored
-- whole; the regression gate a run was created with.

-- A comparison forced over cases whose definition, grader or judge changed is a different
-- answer from the unforced one of the same two runs: the flag is part of what is looked up.
ALTER TABLE comparisons ADD COLUMN forced boolean NOT NULL DEFAULT false;
CREATE INDEX comparisons_pair ON comparisons (candidate_run_id, baseline_run_id, forced);

-- The regression gate asked for at creation (`gate=no_regression`): its thresholds as JSON
-- (`{"alpha": 0.05, "score_margin": -0.02}`); null: no gate.
ALTER TABLE runs ADD COLUMN gate jsonb;

-- The history endpoint pages a skill's versions newest first.
CREATE INDEX skill_versions_skill_created ON skill_versions (skill_id, created_at DESC, id DESC);
