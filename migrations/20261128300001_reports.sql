-- Issue 30, `POST /v1/reports`: reports over chosen runs of a skill, stored and read again.
CREATE TABLE reports (
    id          uuid PRIMARY KEY,
    skill_id    uuid NOT NULL REFERENCES skills (id) ON DELETE CASCADE,
    -- The rendering asked for (`GET /v1/reports/{id}` answers in it unless told otherwise).
    format      text NOT NULL CHECK (format IN ('markdown', 'json')),
    -- The report as the seed's EvaluationReport (its `content` is the Markdown).
    report      jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX reports_skill ON reports (skill_id, created_at DESC);

-- The runs a report covers. A report describes exactly its runs: deleting one of them (by
-- hand, with its version or skill, or by retention) deletes the report too, so no row is left
-- naming a deleted run.
CREATE TABLE report_runs (
    report_id  uuid NOT NULL REFERENCES reports (id) ON DELETE CASCADE,
    run_id     uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    PRIMARY KEY (report_id, run_id)
);
CREATE INDEX report_runs_run ON report_runs (run_id);

CREATE FUNCTION reports_go_with_their_runs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM reports WHERE id = OLD.report_id;
    RETURN NULL;
END
$$;
CREATE TRIGGER report_runs_deleted AFTER DELETE ON report_runs
    FOR EACH ROW EXECUTE FUNCTION reports_go_with_their_runs();
