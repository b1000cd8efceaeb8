-- The coordinator stores a version's eval definition deflated (`config_deflate`): a
-- 100,000-case definition is 44 MB of JSON text and about 2 MB deflated at the fastest level.
-- Sending and storing 44 MB cost an upload most of its "store" time (PostgreSQL compressed it
-- again with pglz) and the coordinator three copies of it in memory (the text, sqlx's
-- argument buffer and the connection's write buffer); reading it back for every
-- `POST /v1/runs` cost as much. Versions stored before keep their plain `config` text; a
-- row has exactly one of the two.
ALTER TABLE eval_configs ALTER COLUMN config DROP NOT NULL;
ALTER TABLE eval_configs ADD COLUMN config_deflate bytea;
-- Already compressed: PostgreSQL does not try again.
ALTER TABLE eval_configs ALTER COLUMN config_deflate SET STORAGE EXTERNAL;
ALTER TABLE eval_configs ADD CONSTRAINT eval_configs_one_definition
    CHECK ((config IS NULL) <> (config_deflate IS NULL));
