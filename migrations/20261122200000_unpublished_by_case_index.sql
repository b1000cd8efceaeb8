-- Releases read a run's unpublished rows a page at a time in case order (keyset on
-- case_index). Keyed by queued_at, the partial index made each page read and sort every
-- unpublished row of the run (a 30,000-case upload spent 130 ms per 2,000-row page, growing
-- with the run); keyed by case_index, a page is one range scan. The sweeper, which looks for
-- old unpublished rows across runs, filters queued_at on the few rows this index returns.
DROP INDEX IF EXISTS eval_results_unpublished;
CREATE INDEX eval_results_unpublished ON eval_results (run_id, case_index)
    WHERE status = 'queued' AND published_at IS NULL;
