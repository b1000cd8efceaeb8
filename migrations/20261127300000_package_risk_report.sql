-- The static risk report of a version's package (skilleval::package::risk): what its scripts
-- and SKILL.md ask for, each finding with file, line, rule and severity. NULL for versions
-- stored before the report existed.
ALTER TABLE skill_versions ADD COLUMN risk_report jsonb;
