-- Issue 33: a matrix's creation is resumable and idempotent. The matrix row is written first,
-- `creating`, with every planned cell (`plan`); each cell's run is then created with an
-- idempotency key derived from the matrix and the cell's position, and linked; the matrix
-- becomes `created` once every cell is linked. A replay of the request with the same
-- `idempotency_key` (per publisher) answers the same matrix and completes the missing cells.
ALTER TABLE matrices
    ADD COLUMN idempotency_key text CHECK (char_length(idempotency_key) BETWEEN 1 AND 200),
    -- Matrices stored before this migration had their cells created in the request itself.
    ADD COLUMN status text NOT NULL DEFAULT 'created' CHECK (status IN ('creating', 'created')),
    -- The planned cells, in position order, as the coordinator re-drives them (NULL for
    -- matrices stored before this migration, which are all `created`).
    ADD COLUMN plan jsonb;
CREATE UNIQUE INDEX matrices_idempotency ON matrices (publisher_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
