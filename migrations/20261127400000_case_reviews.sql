-- Human reviews of a run's automatic grades (issue 21): a reviewer agrees or disagrees with a
-- case's grade, or with one rubric criterion's, with a note. The grade reviewed is kept with
-- the review (whether it said pass, and which judge gave it: the judge model, else the
-- strategy), so judge agreement is computed from the reviews alone, per criterion and judge.
CREATE TABLE case_reviews (
    run_id        uuid NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    test_case_id  text NOT NULL,
    -- '' for the case's grade, else the rubric criterion's name.
    criterion     text NOT NULL DEFAULT '',
    -- Who reviewed ('' when the reviewer gave no name); one review per reviewer and grade,
    -- a later one replaces it.
    reviewer      text NOT NULL DEFAULT '',
    verdict       text NOT NULL CHECK (verdict IN ('agree', 'disagree')),
    note          text NOT NULL DEFAULT '',
    judge_pass    boolean NOT NULL,
    judge         text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, test_case_id, criterion, reviewer)
);
