//! The model-call state the whole fleet shares: the response cache and the provider limits.
//!
//! - [`PgResponseCache`] is shared's [`ResponseCache`] on the `llm_cache` table: every worker
//!   reuses every other worker's answers. The callers (shared's call layer) only store answers
//!   they accepted, so errors are never cached. A cache is an optimisation: a failed read is a
//!   miss and a failed write is logged and dropped.
//!   [`WriteBehindCache`] is the one workers use: the same table, with writes batched in the
//!   background so a model call waits for one database round trip, not two, and concurrent
//!   lookups answered together by one statement.
//! - Both link each answer to the run whose job stored it or was served it
//!   (`llm_cache_uses`, from [`CacheOwner::current`]): deleting a run deletes the answers no
//!   other run used ([`release_cached_answers`]). An answer for a run already deleted is not
//!   stored; answers stored with no owner have no link and are left to their TTL.
//! - [`PgRateLimiter`] is shared's [`RateLimiter`] on `provider_rate_windows`: requests and
//!   tokens per minute per provider, counted in fixed 60-second windows on the database's clock.
//!   A request is reserved with one `INSERT ... ON CONFLICT DO UPDATE ... WHERE <under the
//!   limits> RETURNING`; the row lock serialises concurrent reservations, so all workers
//!   together never get more than the limit in a window. When the window is full, `acquire`
//!   sleeps until the next one (the caller bounds the wait: its deadline drops the future).
//!
//! Fixed windows allow up to twice the limit across a window boundary (the end of one and the
//! start of the next); providers count over sliding minutes, so keep the configured limits a
//! little under the key's. The adaptive concurrency limit and the 429 handling of the call
//! layer absorb the rest.
//!
//! The first reservation of a window (its row inserted, not updated) deletes the windows older
//! than [`KEEP_WINDOWS`], so the table stays a few rows per provider.
//!
//! **A database error lets the call through** (with a warning) rather than stalling: the
//! limiter protects the provider key's quota, the provider still enforces it with 429s that the
//! call layer waits out, while a fleet that stops calling models because Postgres blinked would
//! fail every LLM case of every run.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use skilleval_providers::{CacheOwner, Providers, RateLimiter, ResponseCache};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

/// Length of a rate-limit window.
pub const RATE_WINDOW_SECS: i64 = 60;

/// Windows kept behind the current one; older rows are deleted when a new window opens.
pub const KEEP_WINDOWS: u32 = 10;

/// `llm_cache` as a [`ResponseCache`].
#[derive(Debug, Clone)]
pub struct PgResponseCache {
    pool: PgPool,
    ttl: Option<Duration>,
}

impl PgResponseCache {
    /// Entries kept until deleted.
    pub fn new(pool: PgPool) -> Self {
        PgResponseCache { pool, ttl: None }
    }

    /// Entries expire `ttl` after they were stored.
    pub fn with_ttl(mut self, ttl: Option<Duration>) -> Self {
        self.ttl = ttl;
        self
    }
}

#[async_trait]
impl ResponseCache for PgResponseCache {
    async fn get(&self, key: &str) -> Option<Value> {
        let row: Result<Option<(Value,)>, sqlx::Error> = sqlx::query_as(
            "SELECT response FROM llm_cache
             WHERE key = $1 AND (expires_at IS NULL OR expires_at > now())",
        )
        .bind(key)
        .fetch_optional(&self.pool)
        .await;
        match row {
            Ok(row) => {
                let hit = row.map(|(v,)| v);
                if let (Some(_), Some(owner)) = (&hit, CacheOwner::current()) {
                    if let Err(e) = self.put_many(vec![PendingEntry::used(key, owner)]).await {
                        tracing::warn!(error = %e, "linking a cached model response to its run");
                    }
                }
                hit
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the model response cache; treated as a miss");
                None
            }
        }
    }

    async fn put(&self, key: &str, value: &Value) {
        if let Err(e) = self.put_many(vec![PendingEntry::new(key, value)]).await {
            tracing::warn!(error = %e, "writing the model response cache; entry dropped");
        }
    }
}

/// Entries a [`WriteBehindCache`] writes per statement at most.
const WRITE_BEHIND_BATCH: usize = 256;
/// How long the first entry of a batch waits for more.
const WRITE_BEHIND_WAIT: Duration = Duration::from_millis(10);
/// Entries queued for writing before `put` writes inline (back-pressure, never loss).
const WRITE_BEHIND_QUEUE: usize = 4_096;
/// Lookups a [`WriteBehindCache`] answers per statement at most.
const LOOKUP_BATCH: usize = 256;
/// Lookup statements a [`WriteBehindCache`] runs at once.
const LOOKUPS_IN_FLIGHT: usize = 2;

/// A lookup waiting for the reader's next statement.
#[derive(Debug)]
struct Lookup {
    key: String,
    answer: tokio::sync::oneshot::Sender<Option<Value>>,
}

/// One answer to store, or (no `response`) the use of a stored one; `owner` is the run it is
/// linked to.
#[derive(Debug)]
struct PendingEntry {
    key: String,
    provider: Option<String>,
    model: Option<String>,
    response: Option<Value>,
    owner: Option<Uuid>,
}

impl PendingEntry {
    /// An answer to store, owned by the current [`CacheOwner`] (if any).
    fn new(key: &str, value: &Value) -> PendingEntry {
        let field = |name: &str| value.get(name).and_then(Value::as_str).map(str::to_string);
        PendingEntry {
            key: key.to_string(),
            provider: field("provider"),
            model: field("model"),
            response: Some(value.clone()),
            owner: CacheOwner::current().map(|o| o.run_id),
        }
    }

    /// A stored answer `owner` was served.
    fn used(key: &str, owner: CacheOwner) -> PendingEntry {
        PendingEntry {
            key: key.to_string(),
            provider: None,
            model: None,
            response: None,
            owner: Some(owner.run_id),
        }
    }
}

/// Attempts at a batch of cache writes that met a concurrent deletion (a foreign key to a run
/// or entry deleted meanwhile, or a deadlock with the deleting transaction): each retry
/// re-reads which runs and entries still exist.
const WRITE_ATTEMPTS: u32 = 3;

/// [`PgResponseCache`] with its writes taken off the caller's path: `put` queues the entry and
/// returns; a background task stores queued entries in batches (up to 256 per statement, or
/// what arrived within 10 ms). A model call then costs one database round trip (the lookup)
/// instead of two, and the fleet's cache writes one statement per batch instead of one per
/// call. An entry becomes visible to other callers a few milliseconds after `put`; an equal
/// request in that window is a miss (called again), which a cache may be. When the queue is
/// full (the database is slow), `put` writes inline, so answers are not dropped for speed.
///
/// Lookups are batched too, without waiting: a reader task takes the first lookup queued and
/// every other one already queued (up to 256) and answers them all from one statement, up to
/// two statements at once; the lookups that arrive while both run form the next one. A lone
/// lookup costs what it did (one round trip, plus a hand-off); a worker whose calls start
/// together — hundreds in flight against a fast provider come back, and go out again, in
/// waves — sends a couple of statements per wave instead of one per call. One query per call was a fifth of such a
/// worker's CPU (more than the model call's own HTTP), and the calls queued for the pool's
/// connections in front of the provider.
#[derive(Debug, Clone)]
pub struct WriteBehindCache {
    inner: PgResponseCache,
    queue: tokio::sync::mpsc::Sender<PendingEntry>,
    lookups: tokio::sync::mpsc::UnboundedSender<Lookup>,
    statements: Arc<AtomicU64>,
}

impl WriteBehindCache {
    /// Starts the writer and the reader on the current tokio runtime; `None` outside one.
    pub fn start(inner: PgResponseCache) -> Option<WriteBehindCache> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let (queue, rx) = tokio::sync::mpsc::channel(WRITE_BEHIND_QUEUE);
        runtime.spawn(write_entries(inner.clone(), rx));
        // Unbounded: a lookup is a key and a reply slot, and the callers waiting on them are
        // bounded by the model calls in flight.
        let (lookups, lookup_rx) = tokio::sync::mpsc::unbounded_channel();
        let statements = Arc::new(AtomicU64::new(0));
        runtime.spawn(answer_lookups(inner.clone(), lookup_rx, statements.clone()));
        Some(WriteBehindCache {
            inner,
            queue,
            lookups,
            statements,
        })
    }

    /// Lookup statements sent so far (each answers one or more lookups).
    pub fn lookup_statements(&self) -> u64 {
        self.statements.load(Ordering::Relaxed)
    }
}

#[async_trait]
impl ResponseCache for WriteBehindCache {
    async fn get(&self, key: &str) -> Option<Value> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let lookup = Lookup {
            key: key.to_string(),
            answer,
        };
        if self.lookups.send(lookup).is_err() {
            // The reader is gone (its runtime is shutting down): look it up here.
            return self.inner.get(key).await;
        }
        // A reader that drops the reply without answering is gone too: a miss, as a failed
        // read is.
        let hit = answered.await.unwrap_or(None);
        if let (Some(_), Some(owner)) = (&hit, CacheOwner::current()) {
            // The link is written behind, as answers are.
            self.enqueue(PendingEntry::used(key, owner)).await;
        }
        hit
    }

    async fn put(&self, key: &str, value: &Value) {
        self.enqueue(PendingEntry::new(key, value)).await;
    }
}

impl WriteBehindCache {
    async fn enqueue(&self, entry: PendingEntry) {
        if let Err(e) = self.queue.try_send(entry) {
            // Full (or the writer is gone): store it now rather than lose it.
            if let Err(e) = self.inner.put_many(vec![e.into_inner()]).await {
                tracing::warn!(error = %e, "writing the model response cache; entry dropped");
            }
        }
    }
}

/// The writer: batches of queued entries, one statement each, until every sender is gone.
async fn write_entries(cache: PgResponseCache, mut rx: tokio::sync::mpsc::Receiver<PendingEntry>) {
    while let Some(first) = rx.recv().await {
        let deadline = tokio::time::Instant::now() + WRITE_BEHIND_WAIT;
        let mut batch = vec![first];
        while batch.len() < WRITE_BEHIND_BATCH {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(next)) => batch.push(next),
                Ok(None) | Err(_) => break,
            }
        }
        if let Err(e) = cache.put_many(batch).await {
            tracing::warn!(error = %e, "writing model responses to the cache; entries dropped");
        }
    }
}

/// The reader: the first waiting lookup and every other one already queued, answered by one
/// statement, until every sender is gone. Up to [`LOOKUPS_IN_FLIGHT`] statements run at once,
/// so a lookup waits for a free one, not for the statement before it; the lookups that arrive
/// while all are busy go out together in the next. A failed statement is a miss for each of
/// its lookups.
async fn answer_lookups(
    cache: PgResponseCache,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Lookup>,
    statements: Arc<AtomicU64>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(LOOKUPS_IN_FLIGHT));
    while let Some(first) = rx.recv().await {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return; // never closed
        };
        // Everything queued while waiting for the slot goes in this statement.
        let mut batch = vec![first];
        while batch.len() < LOOKUP_BATCH {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        statements.fetch_add(1, Ordering::Relaxed);
        let cache = cache.clone();
        tokio::spawn(async move {
            let keys: Vec<&str> = batch.iter().map(|l| l.key.as_str()).collect();
            let found = match cache.get_many(&keys).await {
                Ok(found) => found,
                Err(e) => {
                    tracing::warn!(error = %e, lookups = batch.len(), "reading the model response cache; treated as misses");
                    HashMap::new()
                }
            };
            drop(slot);
            for lookup in batch {
                // The caller may have gone (its deadline passed): nothing to answer then.
                let _ = lookup.answer.send(found.get(&lookup.key).cloned());
            }
        });
    }
}

impl PgResponseCache {
    /// The live entries among `keys`, in one statement.
    async fn get_many(&self, keys: &[&str]) -> Result<HashMap<String, Value>, sqlx::Error> {
        let rows: Vec<(String, Value)> = sqlx::query_as(
            "SELECT key, response FROM llm_cache
             WHERE key = ANY($1) AND (expires_at IS NULL OR expires_at > now())",
        )
        .bind(keys)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().collect())
    }

    /// Stores answers and links them to their owners, in one statement (the last one wins
    /// for a key given twice). An answer whose owner run no longer exists is not stored, nor is
    /// a link to it; a link to an entry that is gone is dropped.
    async fn put_many(&self, entries: Vec<PendingEntry>) -> Result<(), sqlx::Error> {
        let (mut keys, mut providers, mut models, mut responses, mut owners) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut links = std::collections::BTreeSet::new();
        for e in entries {
            if let Some(owner) = e.owner {
                links.insert((e.key.clone(), owner));
            }
            // An answer holding the NUL character cannot be stored (`jsonb` refuses it) and
            // must not be replayed altered: it is not cached (the request is sent again).
            if let Some(response) = e
                .response
                .filter(|r| skilleval_model::text::first_nul(r).is_none())
            {
                keys.push(e.key);
                providers.push(e.provider);
                models.push(e.model);
                responses.push(response);
                owners.push(e.owner);
            }
        }
        // Sorted (the set's order), so concurrent batches lock links in one order.
        let (link_keys, link_runs): (Vec<String>, Vec<Uuid>) = links.into_iter().unzip();
        let mut attempt = 1;
        loop {
            // The entries deduplicated in SQL after dropping those of deleted runs (so a live
            // run's answer to an equal request still lands), in key order (lock order).
            let written = sqlx::query(
                "WITH t AS (
                    SELECT DISTINCT ON (t.key) t.key, t.provider, t.model, t.response
                    FROM UNNEST($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::uuid[])
                         WITH ORDINALITY AS t(key, provider, model, response, run_id, n)
                    WHERE t.run_id IS NULL
                       OR EXISTS (SELECT 1 FROM runs r WHERE r.id = t.run_id)
                    ORDER BY t.key, t.n DESC
                 ), stored AS (
                    INSERT INTO llm_cache (key, provider, model, response, created_at, expires_at)
                    SELECT t.key, t.provider, t.model, t.response, now(),
                           now() + make_interval(secs => $6::float8)
                    FROM t
                    ON CONFLICT (key) DO UPDATE
                       SET provider = EXCLUDED.provider, model = EXCLUDED.model,
                           response = EXCLUDED.response, created_at = EXCLUDED.created_at,
                           expires_at = EXCLUDED.expires_at
                    RETURNING key
                 )
                 INSERT INTO llm_cache_uses (key, run_id)
                 SELECT u.key, u.run_id FROM UNNEST($7::text[], $8::uuid[]) AS u(key, run_id)
                 WHERE EXISTS (SELECT 1 FROM runs r WHERE r.id = u.run_id)
                   AND (u.key IN (SELECT key FROM stored)
                        OR EXISTS (SELECT 1 FROM llm_cache c WHERE c.key = u.key))
                 ON CONFLICT DO NOTHING",
            )
            .bind(&keys)
            .bind(&providers)
            .bind(&models)
            .bind(&responses)
            .bind(&owners)
            .bind(self.ttl.map(|t| t.as_secs_f64()))
            .bind(&link_keys)
            .bind(&link_runs)
            .execute(&self.pool)
            .await;
            match written {
                Ok(_) => return Ok(()),
                Err(e) if attempt < WRITE_ATTEMPTS && met_a_deletion(&e) => {
                    tracing::debug!(error = %e, attempt, "a cache write met a deletion; retrying");
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// A foreign-key violation (the run or entry a link names was deleted after the statement
/// looked) or a deadlock (with a deleting transaction).
fn met_a_deletion(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|code| code == "23503" || code == "40P01")
}

/// Deletes the links of `run_ids` to cached answers, and the answers no other run is linked
/// to; returns how many answers went. Call it in the transaction that deletes the runs, after
/// locking their rows (`FOR UPDATE`): a cache write linking one of them then waits for that
/// transaction and, once it commits, fails its foreign key and retries without it, so no
/// answer of a deleted run is left behind unlinked.
pub(super) async fn release_cached_answers(
    conn: &mut PgConnection,
    run_ids: &[Uuid],
) -> Result<u64, sqlx::Error> {
    if run_ids.is_empty() {
        return Ok(0);
    }
    // One statement: the subquery sees the links as they were before the CTE deleted these
    // runs' links, so it leaves those out itself.
    let done = sqlx::query(
        "WITH gone AS (
            DELETE FROM llm_cache_uses WHERE run_id = ANY($1) RETURNING key
         )
         DELETE FROM llm_cache c
         WHERE c.key IN (SELECT key FROM gone)
           AND NOT EXISTS (SELECT 1 FROM llm_cache_uses u
                           WHERE u.key = c.key AND u.run_id <> ALL($1))",
    )
    .bind(run_ids)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected())
}

/// Limits of one provider: (requests per minute, tokens per minute).
type Limits = (Option<u32>, Option<u64>);

/// `provider_rate_windows` as a fleet-wide [`RateLimiter`].
#[derive(Debug, Clone)]
pub struct PgRateLimiter {
    pool: PgPool,
    limits: HashMap<String, Limits>,
}

/// What one reservation attempt said.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reservation {
    Granted,
    /// The window is full: try again after this long (the next window).
    Full(Duration),
}

impl PgRateLimiter {
    /// Limits per provider name; providers without limits are not counted.
    pub fn new(pool: PgPool, limits: HashMap<String, Limits>) -> Self {
        let limits = limits
            .into_iter()
            .filter(|(_, (rpm, tpm))| rpm.is_some_and(|r| r > 0) || tpm.is_some_and(|t| t > 0))
            .collect();
        PgRateLimiter { pool, limits }
    }

    /// The limits the providers configure (`requests_per_minute`, `tokens_per_minute`).
    pub fn for_providers(pool: PgPool, providers: &Providers) -> Self {
        let limits = providers
            .providers
            .values()
            .map(|p| (p.name.clone(), (p.requests_per_minute, p.tokens_per_minute)))
            .collect();
        PgRateLimiter::new(pool, limits)
    }

    /// Tries to reserve one request of about `tokens` in the current window. A request larger
    /// than the whole token limit is granted in a window that has used no tokens yet.
    pub async fn try_reserve(
        &self,
        provider: &str,
        tokens: u64,
    ) -> Result<Reservation, sqlx::Error> {
        let Some(&(rpm, tpm)) = self.limits.get(provider) else {
            return Ok(Reservation::Granted);
        };
        let rpm = rpm.filter(|r| *r > 0).map(i64::from);
        let tpm = tpm
            .filter(|t| *t > 0)
            .map(|t| i64::try_from(t).unwrap_or(i64::MAX));
        let tokens = i64::try_from(tokens).unwrap_or(i64::MAX);
        let (granted, fresh, wait_secs): (bool, bool, f64) = sqlx::query_as(
            "WITH w AS (
                SELECT to_timestamp(floor(extract(epoch FROM now()) / $5) * $5) AS start
             ), reserved AS (
                INSERT INTO provider_rate_windows AS r (provider, window_start, requests, tokens)
                SELECT $1, w.start, 1, $2 FROM w
                ON CONFLICT (provider, window_start) DO UPDATE
                   SET requests = r.requests + 1, tokens = r.tokens + EXCLUDED.tokens
                   WHERE ($3::bigint IS NULL OR r.requests + 1 <= $3)
                     AND ($4::bigint IS NULL OR r.tokens + EXCLUDED.tokens <= $4 OR r.tokens = 0)
                RETURNING (r.xmax = 0) AS fresh
             )
             SELECT EXISTS (SELECT 1 FROM reserved),
                    coalesce((SELECT fresh FROM reserved), false),
                    extract(epoch FROM (w.start + make_interval(secs => $5) - now()))::float8
             FROM w",
        )
        .bind(provider)
        .bind(tokens)
        .bind(rpm)
        .bind(tpm)
        .bind(RATE_WINDOW_SECS as f64)
        .fetch_one(&self.pool)
        .await?;
        if fresh {
            // The first request of a window: drop the windows nobody needs any more.
            let pruner = self.clone();
            tokio::spawn(async move {
                if let Err(e) = pruner.prune(KEEP_WINDOWS).await {
                    tracing::debug!(error = %e, "pruning old rate-limit windows");
                }
            });
        }
        if granted {
            Ok(Reservation::Granted)
        } else {
            // A little past the boundary, so the next attempt lands in the next window.
            let wait = Duration::from_secs_f64(wait_secs.clamp(0.0, RATE_WINDOW_SECS as f64))
                + Duration::from_millis(20);
            Ok(Reservation::Full(wait))
        }
    }

    /// Deletes windows that ended more than `keep` windows ago (`provider_rate_windows` only
    /// matters for the current minute).
    pub async fn prune(&self, keep: u32) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(
            "DELETE FROM provider_rate_windows
             WHERE window_start < now() - make_interval(secs => $1::float8)",
        )
        .bind(f64::from(keep.max(1)) * RATE_WINDOW_SECS as f64)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }
}

#[async_trait]
impl RateLimiter for PgRateLimiter {
    async fn acquire(&self, provider: &str, estimated_tokens: u64) {
        if !self.limits.contains_key(provider) {
            return;
        }
        loop {
            match self.try_reserve(provider, estimated_tokens).await {
                Ok(Reservation::Granted) => return,
                // Waiting for the next window is the limiter's whole job; the caller's
                // deadline bounds it by dropping this future.
                Ok(Reservation::Full(wait)) => tokio::time::sleep(wait).await,
                Err(e) => {
                    tracing::warn!(
                        provider,
                        error = %e,
                        "fleet rate limit unavailable (database error); allowing the call"
                    );
                    return;
                }
            }
        }
    }

    fn record(&self, provider: &str, estimated_tokens: u64, actual_tokens: u64) {
        let Some(&(_, Some(tpm))) = self.limits.get(provider) else {
            return;
        };
        if tpm == 0 || estimated_tokens == actual_tokens {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let delta = i64::try_from(actual_tokens)
            .unwrap_or(i64::MAX)
            .saturating_sub(i64::try_from(estimated_tokens).unwrap_or(i64::MAX));
        let pool = self.pool.clone();
        let provider = provider.to_string();
        // Best effort, in the current window (the reservation's, unless it just ended).
        handle.spawn(async move {
            let done = sqlx::query(
                "UPDATE provider_rate_windows SET tokens = greatest(0, tokens + $2)
                 WHERE provider = $1
                   AND window_start = to_timestamp(floor(extract(epoch FROM now()) / $3) * $3)",
            )
            .bind(&provider)
            .bind(delta)
            .bind(RATE_WINDOW_SECS as f64)
            .execute(&pool)
            .await;
            if let Err(e) = done {
                tracing::debug!(provider, error = %e, "correcting the fleet token count");
            }
        });
    }
}

/// Expired `llm_cache` rows deleted per statement: short transactions that never hold many
/// row locks, however much expired since the last sweep.
pub const EXPIRED_DELETE_BATCH: i64 = 5_000;

impl super::Store {
    /// Deletes the `llm_cache` rows past their `expires_at` (reads already ignore them; this
    /// keeps the table from growing), [`EXPIRED_DELETE_BATCH`] per statement until none is
    /// left. Returns how many rows went. The coordinator's periodic sweep calls it.
    pub async fn delete_expired_llm_cache(&self) -> Result<u64, super::StoreError> {
        let mut deleted = 0;
        loop {
            let n = sqlx::query(
                "DELETE FROM llm_cache WHERE key IN (
                     SELECT key FROM llm_cache
                     WHERE expires_at IS NOT NULL AND expires_at <= now()
                     LIMIT $1
                     FOR UPDATE SKIP LOCKED)",
            )
            .bind(EXPIRED_DELETE_BATCH)
            .execute(self.pool())
            .await
            .map_err(super::StoreError::query(
                "deleting expired model cache entries",
            ))?
            .rows_affected();
            deleted += n;
            if n < EXPIRED_DELETE_BATCH as u64 {
                return Ok(deleted);
            }
        }
    }
}
