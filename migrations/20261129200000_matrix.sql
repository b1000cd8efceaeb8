-- Issue 33: a model matrix runs chosen skills' latest passing versions against several
-- provider settings; each cell is an ordinary run, linked here with the run it is compared
-- with (the version's reference run: its latest completed run outside any matrix).
CREATE TABLE matrices (
    id            uuid PRIMARY KEY,
    publisher_id  uuid NOT NULL REFERENCES publishers (id) ON DELETE CASCADE,
    -- The models as asked (provider names) and the budget, as the request gave them.
    request       jsonb NOT NULL,
    -- The cost estimate made before any run was created.
    estimate      jsonb NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX matrices_publisher ON matrices (publisher_id, created_at DESC);

CREATE TABLE matrix_runs (
    matrix_id         uuid NOT NULL REFERENCES matrices (id) ON DELETE CASCADE,
    -- Row-major: skill by skill, each skill's models in the request's order.
    position          integer NOT NULL CHECK (position >= 0),
    version_id        uuid NOT NULL REFERENCES skill_versions (id) ON DELETE CASCADE,
    -- The provider name the cell's run produced with.
    model             text NOT NULL,
    run_id            uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    reference_run_id  uuid REFERENCES runs (id) ON DELETE SET NULL,
    PRIMARY KEY (matrix_id, position)
);
-- A version's reference run leaves out matrix runs: looked up by run.
CREATE INDEX matrix_runs_run ON matrix_runs (run_id);
