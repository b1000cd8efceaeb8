-- Issue 4 item 5, the service side: what a run spent and the budget that may stop it.

-- The caps a run was created with (null: no cap on that measure).
ALTER TABLE runs ADD COLUMN budget_max_cost_usd double precision NULL
    CHECK (budget_max_cost_usd > 0);
ALTER TABLE runs ADD COLUMN budget_max_tokens bigint NULL CHECK (budget_max_tokens >= 1);
-- What the run's recorded cases spent, producing and grading together. Advanced by the same
-- statement that moves rows out of `queued` (by exactly those rows), so the totals always equal
-- the sum over the run's results.
ALTER TABLE runs ADD COLUMN cost_usd double precision NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN tokens bigint NOT NULL DEFAULT 0;
-- Why the run stopped before running every case (set once, when a budget is exceeded); the
-- finalised verdict is then `fail` with this reason first.
ALTER TABLE runs ADD COLUMN stop_reason text NULL;
