//! The webhook outbox: deliveries as rows, written in the transaction that decides them, sent
//! by whichever coordinator claims them.
//!
//! ```text
//!   enqueue_webhook ──> pending ──claim (lease)──> sent ──2xx──> delivered
//!                          ^                         ├──5xx/429/408/network, attempts left──> pending (later)
//!                          │                         └──4xx, or no attempts left──> failed
//!                          └── lease expired (the sender died): claimable again
//! ```
//!
//! **Enqueueing** ([`Store::enqueue_webhook`]) takes the caller's transaction: the row exists
//! exactly when what it announces was committed (a finalised run, a fired alert), so a process
//! that dies right after the commit loses nothing. The API is generic (event name, URL, body):
//! any part of the service that announces something by webhook enqueues through it.
//!
//! **Claiming** ([`Store::claim_webhooks`]) picks due pending rows with `FOR UPDATE SKIP
//! LOCKED` (replicas claiming at once never take the same row) and leases them: a claimed row
//! is not claimable again until its lease passes, so a coordinator killed while sending leaves
//! it to another (or to itself after a restart) once the lease is over. A delivery can thus be
//! sent more than once (the receiver answered, the sender died before recording it): the row's
//! id is the stable delivery id receivers deduplicate on.
//!
//! **Settling** ([`Store::settle_webhook`]) records an attempt's outcome, only while the
//! settler still holds the lease it claimed with (a sender whose lease ran out and was taken
//! over records nothing).

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{Store, StoreError};

/// Where a delivery is (`webhook_deliveries.state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, sqlx::Type, serde::Serialize)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// Not delivered yet: due at `next_attempt_at` (or being sent under a lease).
    Pending,
    /// The receiver answered 2xx.
    Delivered,
    /// Final: the receiver rejected it (4xx other than 408/429), or every attempt failed.
    Failed,
}

/// A delivery to enqueue.
#[derive(Debug, Clone)]
pub struct NewWebhook<'a> {
    /// Sent as `X-Skilleval-Event` (`run.finished`, ...).
    pub event: &'a str,
    pub url: &'a str,
    /// The exact bytes to POST (signed as they are).
    pub body: &'a [u8],
    /// The run the delivery announces, if any (`skilleval.run_id` of its span).
    pub run_id: Option<Uuid>,
    /// The W3C trace context the delivery is sent in (the enqueuer's span), if any.
    pub traceparent: Option<&'a str>,
}

/// A claimed delivery, to send now.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ClaimedWebhook {
    /// The delivery id (`X-Skilleval-Delivery`): the same on every attempt.
    pub id: Uuid,
    pub event: String,
    pub url: String,
    pub body: Vec<u8>,
    /// This attempt's number (1-based).
    pub attempts: i32,
    /// The lease this claim holds; settling needs it.
    pub leased_until: DateTime<Utc>,
    /// See [`NewWebhook::run_id`].
    pub run_id: Option<Uuid>,
    /// See [`NewWebhook::traceparent`].
    pub traceparent: Option<String>,
}

/// What an attempt came to, for [`Store::settle_webhook`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// 2xx.
    Delivered { status: u16 },
    /// Final failure (a 4xx the receiver will repeat, or the last attempt failed).
    Failed { status: Option<u16>, error: String },
    /// Try again after `after`.
    Retry {
        status: Option<u16>,
        error: String,
        after: Duration,
    },
}

/// A delivery as stored (tests and operators).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct WebhookRow {
    pub id: Uuid,
    pub event: String,
    pub url: String,
    pub state: DeliveryState,
    pub attempts: i32,
    pub last_status: Option<i32>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// Seconds as PostgreSQL's `make_interval(secs => ..)` takes them.
fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

impl Store {
    /// Enqueues a webhook delivery in the caller's transaction (commit it with what the
    /// delivery announces). Returns its delivery id. Any coordinator delivers it once it is
    /// committed; see the module documentation for the guarantees.
    pub async fn enqueue_webhook(
        &self,
        conn: &mut sqlx::PgConnection,
        webhook: &NewWebhook<'_>,
    ) -> Result<Uuid, StoreError> {
        let id = Uuid::now_v7();
        sqlx::query(
            "INSERT INTO webhook_deliveries (id, event, url, body, run_id, traceparent)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(id)
        .bind(webhook.event)
        .bind(webhook.url)
        .bind(webhook.body)
        .bind(webhook.run_id)
        .bind(webhook.traceparent)
        .execute(conn)
        .await
        .map_err(StoreError::query("enqueueing a webhook"))?;
        Ok(id)
    }

    /// Claims up to `limit` due deliveries enqueued at least `min_age` ago (`ids`: only
    /// those), leasing each for `lease`; counts the attempt.
    pub async fn claim_webhooks(
        &self,
        limit: i64,
        lease: Duration,
        min_age: Duration,
        ids: Option<&[Uuid]>,
    ) -> Result<Vec<ClaimedWebhook>, StoreError> {
        sqlx::query_as(
            "WITH due AS (
                 SELECT id FROM webhook_deliveries
                 WHERE state = 'pending' AND next_attempt_at <= now()
                   AND (leased_until IS NULL OR leased_until < now())
                   AND created_at <= now() - make_interval(secs => $3::float8)
                   AND ($4::uuid[] IS NULL OR id = ANY($4))
                 ORDER BY next_attempt_at
                 LIMIT $1
                 FOR UPDATE SKIP LOCKED
             )
             UPDATE webhook_deliveries w
             SET leased_until = now() + make_interval(secs => $2::float8),
                 attempts = w.attempts + 1
             FROM due WHERE w.id = due.id
             RETURNING w.id, w.event, w.url, w.body, w.attempts, w.leased_until, w.run_id,
                       w.traceparent",
        )
        .bind(limit)
        .bind(secs(lease))
        .bind(secs(min_age))
        .bind(ids)
        .fetch_all(self.pool())
        .await
        .map_err(StoreError::query("claiming webhook deliveries"))
    }

    /// Records an attempt's outcome, if `claimed`'s lease is still the row's (returns whether
    /// it was).
    pub async fn settle_webhook(
        &self,
        claimed: &ClaimedWebhook,
        outcome: &AttemptOutcome,
    ) -> Result<bool, StoreError> {
        let (state, status, error, after) = match outcome {
            AttemptOutcome::Delivered { status } => (
                DeliveryState::Delivered,
                Some(*status),
                None,
                Duration::ZERO,
            ),
            AttemptOutcome::Failed { status, error } => (
                DeliveryState::Failed,
                *status,
                Some(error.as_str()),
                Duration::ZERO,
            ),
            AttemptOutcome::Retry {
                status,
                error,
                after,
            } => (
                DeliveryState::Pending,
                *status,
                Some(error.as_str()),
                *after,
            ),
        };
        let done = sqlx::query(
            "UPDATE webhook_deliveries
             SET state = $3, last_status = $4, last_error = $5, leased_until = NULL,
                 next_attempt_at = now() + make_interval(secs => $6::float8),
                 finished_at = CASE WHEN $3 = 'pending' THEN NULL ELSE now() END
             WHERE id = $1 AND state = 'pending' AND leased_until = $2",
        )
        .bind(claimed.id)
        .bind(claimed.leased_until)
        .bind(state)
        .bind(status.map(i32::from))
        .bind(error)
        .bind(secs(after))
        .execute(self.pool())
        .await
        .map_err(StoreError::query("settling a webhook delivery"))?;
        Ok(done.rows_affected() == 1)
    }

    /// Deliveries still pending, and how long the oldest has waited since it was enqueued
    /// (seconds; 0 when none), for `/metrics`.
    pub async fn webhook_backlog(&self) -> Result<(i64, f64), StoreError> {
        sqlx::query_as(
            "SELECT count(*),
                    COALESCE(EXTRACT(EPOCH FROM now() - min(created_at))::float8, 0)
             FROM webhook_deliveries WHERE state = 'pending'",
        )
        .fetch_one(self.pool())
        .await
        .map_err(StoreError::query("reading the webhook backlog"))
    }

    /// Every delivery, oldest first (tests and operators).
    pub async fn webhook_deliveries(&self) -> Result<Vec<WebhookRow>, StoreError> {
        sqlx::query_as(
            "SELECT id, event, url, state, attempts, last_status, last_error, created_at,
                    finished_at
             FROM webhook_deliveries ORDER BY created_at, id",
        )
        .fetch_all(self.pool())
        .await
        .map_err(StoreError::query("listing webhook deliveries"))
    }
}
