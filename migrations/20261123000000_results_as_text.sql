-- A result row is written whole once, by a worker's batch, and read back whole (the
-- summary, the results page): `result` is JSON the service itself produced, so storing it as
-- `text` spares PostgreSQL a parse on every write and a print on every read (the batch
-- statement spent a fifth of its time in `jsonb_recv` at 100,000 cases). A JSON `null` (no
-- writer ever stored one; the readers guarded against it) becomes SQL NULL here, once, so a
-- row has a result exactly when `result IS NOT NULL`.
ALTER TABLE eval_results ALTER COLUMN result TYPE text USING NULLIF(result, 'null'::jsonb)::text;

-- A row's `job` is what the coordinator publishes (and republishes) while the case is
-- queued, and what describes a case that never ran. Once a worker records a result nothing
-- reads it again: the worker's batch clears it, so the new row version stays under
-- PostgreSQL's 2 kB TOAST threshold and is not compressed on every update.
ALTER TABLE eval_results ALTER COLUMN job DROP NOT NULL;

-- A result row is found by its run and case (every statement that reads or writes one says
-- so; nothing ever read the surrogate `id`). The random `id` key cost an index entry on a
-- random page for every insert and every update (each update writes a new row version):
-- without it, inserting 100,000 queued rows took 22-25 % less time, and recording their
-- results as much. The natural key becomes the primary key.
ALTER TABLE eval_results DROP CONSTRAINT eval_results_pkey;
ALTER TABLE eval_results DROP COLUMN id;
ALTER TABLE eval_results DROP CONSTRAINT eval_results_run_id_test_case_id_key;
ALTER TABLE eval_results ADD PRIMARY KEY (run_id, test_case_id);
