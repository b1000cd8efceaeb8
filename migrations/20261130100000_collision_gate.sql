-- The `no_collision` gate decides the upload's run (docs/catalogue.md), and a collision eval
-- survives the coordinator that started it.
--
-- `gated`: the upload asked for gate=no_collision, so the version's upload runs wait for the
-- eval before they are finalised, and its verdict is part of theirs.
-- `attempts` and `lease_until`: a coordinator claims a pending eval for a lease it renews
-- while the eval runs; an eval whose holder died (lease lapsed) or that was never started
-- (the coordinator stopped between the upload's commit and its task) is claimed again by the
-- next sweep of any coordinator. A host fault (the judge or the embeddings provider failing)
-- releases the claim until `lease_until` and is retried; after the last attempt the eval is
-- `failed`. `error` keeps the last attempt's fault meanwhile.
ALTER TABLE version_collisions
    ADD COLUMN gated        boolean NOT NULL DEFAULT false,
    ADD COLUMN attempts     integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    ADD COLUMN lease_until  timestamptz;

CREATE INDEX version_collisions_pending ON version_collisions (lease_until)
    WHERE status = 'pending';
