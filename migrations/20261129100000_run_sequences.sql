-- Issue 28, suites with `runInSequence` in the service: each such suite of a run is a chain
-- whose cases are published one at a time, the next once the one before it is recorded. A
-- row is a chain's publish cursor: `published` of its `length` cases (in chain order) were
-- confirmed by the broker or found recorded. The coordinator moves it forward only, under the
-- run's publishing lock, after the confirm; a crash between a result and the next publish
-- leaves the cursor behind its recorded case, which the sweeper repairs (it lists runs with a
-- chain short of its length). Absent rows: the run's chains were not opened yet (its first
-- publishing pass opens them, before it publishes anything else).
CREATE TABLE run_sequences (
    run_id     uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    -- The chain's index among the run's chains, in plan order (the plan names the same chains
    -- every time it is read).
    chain      int NOT NULL CHECK (chain >= 0),
    length     int NOT NULL CHECK (length > 0),
    published  int NOT NULL DEFAULT 0,
    CHECK (published BETWEEN 0 AND length),
    PRIMARY KEY (run_id, chain)
);
-- The sweeper's question: which runs have a chain still to publish.
CREATE INDEX run_sequences_open ON run_sequences (run_id) WHERE published < length;
