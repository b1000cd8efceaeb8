-- Durable webhooks (issue 19): a delivery is a row written in the transaction that decides it
-- (a run's finalisation, an alert), so a coordinator that dies before sending loses nothing.
-- Any coordinator claims due rows (FOR UPDATE SKIP LOCKED, then a lease while it sends), and
-- the row's id is the delivery id receivers use to drop duplicates.
CREATE TABLE webhook_deliveries (
    id               uuid PRIMARY KEY,
    -- `run.finished`, ...: sent as `X-Skilleval-Event`.
    event            text NOT NULL,
    url              text NOT NULL,
    -- The exact bytes sent (and signed).
    body             bytea NOT NULL,
    -- `infra/src/store/outbox.rs` owns the states.
    state            text NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts         integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    -- A pending row is due from then on.
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    -- Set while a coordinator sends it; another may take it over once this has passed.
    leased_until     timestamptz,
    last_status      integer,
    last_error       text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz
);
-- The deliverer's claim: due pending rows in order.
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at)
    WHERE state = 'pending';

-- Jobs taken off the parking queue (issue 19): what the coordinator drained, why it was
-- parked, and what became of it. `infra/src/store/parked.rs` owns the states.
CREATE TABLE parked_jobs (
    id            uuid PRIMARY KEY,
    -- Null when the message is no job (unparseable).
    run_id        uuid REFERENCES runs (id) ON DELETE CASCADE,
    test_case_id  text,
    -- The queue it was parked from (requeue sends it back there).
    from_queue    text NOT NULL,
    reason        text NOT NULL,
    -- The message as parked.
    body          bytea NOT NULL,
    state         text NOT NULL
                  CHECK (state IN ('errored', 'unmatched', 'requeued')),
    parked_at     timestamptz NOT NULL DEFAULT now(),
    requeued_at   timestamptz
);
-- A case is parked once until requeued: draining the same message twice (a coordinator that
-- died before acking it) adds nothing.
CREATE UNIQUE INDEX parked_jobs_case ON parked_jobs (run_id, test_case_id)
    WHERE run_id IS NOT NULL AND state <> 'requeued';
CREATE INDEX parked_jobs_parked_at ON parked_jobs (parked_at DESC);
