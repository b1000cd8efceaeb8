-- Streamed run creation (issue 5): a large run's rows are inserted and published chunk by
-- chunk, each chunk committed before its jobs are published, instead of in one transaction
-- followed by a release that reads every row back and marks each one published.

-- True while the process creating the run is still inserting its rows (the run is `running`
-- from the start, so its first jobs are worked on while later ones are inserted). A run is
-- finalised only once this is false; a run left creating by a coordinator that died is
-- resumed by the sweeper (it holds no release lock any more), which inserts the missing rows.
ALTER TABLE runs ADD COLUMN creating boolean NOT NULL DEFAULT false;

-- Every row of the run with `case_index` below this was confirmed by the broker: one write
-- per chunk instead of one per row. Rows at or past it are published when `published_at` is
-- set (a release's per-row mark, as before); the sweeper republishes the rest.
ALTER TABLE runs ADD COLUMN published_through integer NOT NULL DEFAULT 0
    CHECK (published_through >= 0);

-- The resume sweep: runs still being created.
CREATE INDEX runs_creating ON runs (created_at) WHERE creating;
