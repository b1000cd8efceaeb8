-- Issue 33, catalogue collisions (docs/catalogue.md). Each uploaded version leaves a catalogue
-- card: its description and should-trigger queries as the collision eval reads them, and
-- whether its publisher marked it public (a public card is a neighbour for every publisher; a
-- private one only for its own). The version's collision matrix is stored as its uploader may
-- see it: another publisher's queries are never written here, only counts and rates.

CREATE TABLE catalogue_cards (
    version_id   uuid PRIMARY KEY REFERENCES skill_versions (id) ON DELETE CASCADE,
    skill_id     uuid NOT NULL REFERENCES skills (id) ON DELETE CASCADE,
    description  text NOT NULL,
    -- ["query", ...]: the should-trigger queries.
    queries      jsonb NOT NULL,
    public       boolean NOT NULL DEFAULT false,
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX catalogue_cards_latest ON catalogue_cards (skill_id, created_at DESC);

CREATE TABLE version_collisions (
    version_id   uuid PRIMARY KEY REFERENCES skill_versions (id) ON DELETE CASCADE,
    status       text NOT NULL CHECK (status IN ('pending', 'completed', 'failed')),
    -- skilleval_analysis::collisions::CollisionMatrix, as the uploader may see it.
    matrix       jsonb,
    -- skilleval_analysis::collisions::CollisionGate when the upload asked for gate=no_collision.
    gate         jsonb,
    -- The neighbours' skill ids, so a neighbour's owner finds the matrices naming it.
    neighbours   uuid[] NOT NULL DEFAULT '{}',
    error        text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz
);
CREATE INDEX version_collisions_neighbours ON version_collisions USING gin (neighbours);
