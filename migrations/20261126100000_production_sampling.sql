-- Production sampling (issue 17): monitors and their revisions, ingested samples, the graded
-- results read through a view, alert states and transitions.

-- The init schema's `samples` table was never written (no endpoint produced samples); its
-- shape (prompt/response, one status per sample) is replaced by the one below.
DROP TABLE IF EXISTS samples;

-- A skill's monitor. `id` is the sampling identity: which samples are taken is a hash of
-- (id, sample_id), so editing the criteria (a new revision) does not reshuffle the traffic.
CREATE TABLE monitors (
    id          uuid PRIMARY KEY,
    skill_id    uuid NOT NULL UNIQUE REFERENCES skills (id) ON DELETE CASCADE,
    -- The current revision (the highest in monitor_revisions).
    revision    integer NOT NULL CHECK (revision >= 1),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Every revision a monitor had; results record the one they were graded with.
CREATE TABLE monitor_revisions (
    monitor_id  uuid NOT NULL REFERENCES monitors (id) ON DELETE CASCADE,
    revision    integer NOT NULL CHECK (revision >= 1),
    -- The document as it was given (package section or API body).
    document    jsonb NOT NULL,
    -- The validated monitor, defaults applied (what jobs are built from).
    monitor     jsonb NOT NULL,
    source      text NOT NULL CHECK (source IN ('package', 'api')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (monitor_id, revision)
);

-- One row per ingested sample; (skill, sample_id) is the idempotency key, so a re-sent
-- sample is a duplicate and never graded twice. `disposition` says whether it was graded and
-- if not why. A sampled row names its samples run and its position in that run's plan (the
-- job's case index); its result is that run's `eval_results` row for test case `sample_id`.
CREATE TABLE samples (
    skill_id          uuid NOT NULL REFERENCES skills (id) ON DELETE CASCADE,
    sample_id         text NOT NULL,
    disposition       text NOT NULL
                      CHECK (disposition IN ('sampled', 'unsampled', 'filtered',
                                             'over_hourly_cap', 'over_daily_cost')),
    run_id            uuid REFERENCES runs (id) ON DELETE CASCADE,
    position          integer CHECK (position >= 0),
    monitor_revision  integer,
    version           text,
    -- The sample's `observed_at`, or its arrival when it had none: what quality buckets by.
    observed_at       timestamptz NOT NULL,
    received_at       timestamptz NOT NULL DEFAULT now(),
    -- The sample as JSON (sampled rows only: what the job is built from).
    body              text,
    PRIMARY KEY (skill_id, sample_id),
    CHECK ((disposition = 'sampled') = (run_id IS NOT NULL AND position IS NOT NULL
                                        AND body IS NOT NULL AND monitor_revision IS NOT NULL))
);
-- Quality and alerts: graded samples of a skill in a time range.
CREATE INDEX samples_skill_observed ON samples (skill_id, observed_at)
    WHERE disposition = 'sampled';
-- A samples run's plan, read a chunk at a time in position order.
CREATE INDEX samples_run_position ON samples (run_id, position) WHERE run_id IS NOT NULL;
-- The hourly cap (samples taken this hour) and the retention sweep.
CREATE INDEX samples_skill_received ON samples (skill_id, received_at);
CREATE INDEX samples_received ON samples (received_at);

-- A sampled item's result: the row its samples run recorded, written once by the workers'
-- batch (`ON CONFLICT (run_id, test_case_id) DO NOTHING`), with the revision it was graded
-- with. A view, not a copy: nothing is written twice, and exactly-once is the runs' own.
CREATE VIEW sample_results AS
SELECT s.skill_id, s.sample_id, s.observed_at, s.version, s.monitor_revision, s.run_id,
       r.status, r.score, r.details, r.grade_cost_usd, r.finished_at
FROM samples s
JOIN eval_results r ON r.run_id = s.run_id AND r.test_case_id = s.sample_id
WHERE s.disposition = 'sampled';

-- An alert rule's state between evaluations (the tracker of `shared::monitor::alert`).
CREATE TABLE alert_states (
    monitor_id    uuid NOT NULL REFERENCES monitors (id) ON DELETE CASCADE,
    rule          text NOT NULL,
    state         text NOT NULL CHECK (state IN ('no_data', 'ok', 'firing', 'resolved')),
    tracker       jsonb NOT NULL,
    evaluated_at  timestamptz NOT NULL,
    PRIMARY KEY (monitor_id, rule)
);

-- Every transition worth telling someone about: one row, one webhook.
CREATE TABLE alerts (
    id           uuid PRIMARY KEY,
    skill_id     uuid NOT NULL REFERENCES skills (id) ON DELETE CASCADE,
    monitor_id   uuid NOT NULL REFERENCES monitors (id) ON DELETE CASCADE,
    rule         text NOT NULL,
    from_state   text NOT NULL CHECK (from_state IN ('no_data', 'ok', 'firing', 'resolved')),
    to_state     text NOT NULL CHECK (to_state IN ('firing', 'resolved')),
    evaluation   jsonb NOT NULL,
    at           timestamptz NOT NULL DEFAULT now(),
    -- The webhook's outcome (`delivered`, `failed`, `no_url`), set after delivery.
    delivery     text
);
CREATE INDEX alerts_skill_at ON alerts (skill_id, at DESC);

-- Where a skill's alert webhooks go (set with the monitor; null: transitions are recorded only).
ALTER TABLE monitors ADD COLUMN callback_url text;
