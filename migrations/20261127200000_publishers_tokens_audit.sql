-- Multi-publisher tenancy (docs/security.md): publishers own skills; API tokens belong to a
-- publisher and carry scopes; every state-changing request is audited; durable quotas are
-- counted here so they hold across coordinator replicas.

CREATE TABLE publishers (
    id          uuid PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- The implicit publisher of the static `coordinator.auth_tokens` (and of requests when
-- authentication is off): every skill uploaded before publishers existed is its.
INSERT INTO publishers (id, name) VALUES ('00000000-0000-0000-0000-000000000001', 'default');

ALTER TABLE skills ADD COLUMN publisher_id uuid NOT NULL
    DEFAULT '00000000-0000-0000-0000-000000000001' REFERENCES publishers (id) ON DELETE CASCADE;
CREATE INDEX skills_publisher ON skills (publisher_id);

-- Only the SHA-256 of a token is stored; `prefix` (its first characters, not secret) is what
-- listings and the audit log show.
CREATE TABLE api_tokens (
    id            uuid PRIMARY KEY,
    publisher_id  uuid NOT NULL REFERENCES publishers (id) ON DELETE CASCADE,
    prefix        text NOT NULL UNIQUE,
    token_hash    bytea NOT NULL UNIQUE,
    scopes        text[] NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_used_at  timestamptz,
    revoked_at    timestamptz
);

-- The token a run was created with (per-token concurrent-run quota); NULL for static tokens.
ALTER TABLE runs ADD COLUMN token_id uuid REFERENCES api_tokens (id) ON DELETE SET NULL;

-- Durable quota ledger: one row per counted event (an upload, a run's cases). Windows are
-- sliding (`at` within the last hour or day); rows older than a day are swept.
CREATE TABLE quota_events (
    id            bigserial PRIMARY KEY,
    publisher_id  uuid NOT NULL REFERENCES publishers (id) ON DELETE CASCADE,
    token_id      uuid REFERENCES api_tokens (id) ON DELETE CASCADE,
    kind          text NOT NULL CHECK (kind IN ('upload', 'cases')),
    amount        bigint NOT NULL CHECK (amount >= 0),
    at            timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX quota_events_publisher ON quota_events (publisher_id, kind, at);
CREATE INDEX quota_events_token ON quota_events (token_id, kind, at) WHERE token_id IS NOT NULL;

-- Every state-changing request. No foreign keys: the record outlives what it names.
CREATE TABLE audit_log (
    id            bigserial PRIMARY KEY,
    at            timestamptz NOT NULL DEFAULT now(),
    publisher_id  uuid,
    token_prefix  text,
    request_id    text NOT NULL,
    method        text NOT NULL,
    route         text NOT NULL,
    path          text NOT NULL,
    status        integer NOT NULL,
    outcome       text NOT NULL CHECK (outcome IN ('succeeded', 'refused', 'failed'))
);
CREATE INDEX audit_log_at ON audit_log (at);
