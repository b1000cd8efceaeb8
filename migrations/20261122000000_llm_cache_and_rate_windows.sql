-- Issue 4, the service side: the model response cache and the fleet-wide provider limits.

-- Model answers by cache key (SHA-256 of provider, endpoint, model, messages, parameters; see
-- `shared/src/llm/cache.rs`). Only answers the caller accepted are stored, never errors.
-- `expires_at` NULL: kept until deleted.
CREATE TABLE llm_cache (
    key         text PRIMARY KEY,
    provider    text,
    model       text,
    response    jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NULL
);
CREATE INDEX llm_cache_expires_at ON llm_cache (expires_at) WHERE expires_at IS NOT NULL;

-- Requests and tokens granted per provider per fixed 60-second window (window_start is a
-- multiple of 60 s since the epoch, on the database's clock). Every worker reserves a request
-- with one INSERT ... ON CONFLICT DO UPDATE ... WHERE <under the limits> RETURNING: the row
-- lock makes concurrent reservations serialise, so the fleet together never gets more than the
-- limit within a window. Old windows are useless after a minute; workers delete them now and
-- then.
CREATE TABLE provider_rate_windows (
    provider      text NOT NULL,
    window_start  timestamptz NOT NULL,
    requests      integer NOT NULL DEFAULT 0,
    tokens        bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (provider, window_start)
);
