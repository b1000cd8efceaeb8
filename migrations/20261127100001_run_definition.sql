-- Issue 18, re-scoring with an inline `eval_config`: the rescore run grades against a
-- definition that is no version's. The run keeps it (deflated, like `eval_configs`), with its
-- profile and settings (what the run's summary and verdict read); null: its version's.
ALTER TABLE runs ADD COLUMN definition_deflate bytea;
ALTER TABLE runs ADD COLUMN definition_profile text;
ALTER TABLE runs ADD COLUMN definition_settings jsonb;
