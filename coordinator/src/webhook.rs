//! Webhooks: what the service announces (a finalised run's summary, ...) is POSTed to the
//! receiver's URL, durably.
//!
//! A delivery is a row of the outbox (`skilleval_infra::store::outbox`), enqueued in the
//! transaction that decides it; [`WebhookOutbox`] sends it. Any coordinator sends any due
//! delivery: the finaliser nudges its own outbox right after the commit (low latency), and
//! every coordinator polls for due ones (retries, and the deliveries of a coordinator that
//! died before sending). A delivery is therefore sent at least once; the
//! `X-Skilleval-Delivery` header carries its id, the same on every attempt and from every
//! coordinator, so a receiver drops duplicates by it.
//!
//! The body is JSON; `X-Skilleval-Signature: sha256=<hex>` is the HMAC-SHA256 of the exact body
//! bytes with `coordinator.webhook_secret`, so a receiver can check the sender and that the
//! body was not changed (without a secret configured, deliveries are unsigned). A failed
//! attempt (connection error, timeout, 5xx, 429, 408) is retried with exponential backoff and
//! jitter up to `coordinator.webhook_max_attempts`, then the delivery is `failed`; a 4xx other
//! than 408/429 is final at once (the receiver rejected it and will keep doing so).

use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, Mac};
use rand::Rng;
use sha2::Sha256;
use skilleval_infra::store::outbox::{AttemptOutcome, ClaimedWebhook};
use skilleval_infra::store::{Store, StoreError};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;
use uuid::Uuid;

use crate::metrics::{Metrics, WebhookOutcome};

/// The header that carries the signature.
pub const SIGNATURE_HEADER: &str = "X-Skilleval-Signature";

/// `sha256=<hex HMAC-SHA256 of body>`.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    // HMAC accepts keys of any length; `new_from_slice` cannot fail for it.
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret) {
        Ok(mac) => mac,
        Err(_) => unreachable_hmac(),
    };
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

#[cold]
fn unreachable_hmac() -> ! {
    panic!("HMAC-SHA256 accepts keys of any length")
}

/// Checks a signature header value in constant time (for receivers and tests).
pub fn verify(secret: &[u8], body: &[u8], header_value: &str) -> bool {
    let Some(hex_sig) = header_value.strip_prefix("sha256=") else {
        return false;
    };
    let Ok(expected) = hex::decode(hex_sig) else {
        return false;
    };
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else {
        return false;
    };
    mac.update(body);
    mac.verify_slice(&expected).is_ok()
}

/// The header that carries the delivery id (a UUID, the same on every attempt).
pub const DELIVERY_HEADER: &str = "X-Skilleval-Delivery";
/// The header that carries the event name.
pub const EVENT_HEADER: &str = "X-Skilleval-Event";
/// The header that carries the attempt number (1-based).
pub const ATTEMPT_HEADER: &str = "X-Skilleval-Delivery-Attempt";

/// How deliveries are sent and retried.
#[derive(Debug, Clone)]
pub struct WebhookPolicy {
    pub max_attempts: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
    /// Per attempt.
    pub timeout: Duration,
    /// How long a claimed delivery is this coordinator's: past it, another may send it (the
    /// sender is presumed dead). Longer than `timeout`.
    pub lease: Duration,
    /// How often every coordinator looks for due deliveries.
    pub poll_interval: Duration,
    /// A delivery is left alone until it is this old (`coordinator.webhook_hold_ms`; 0 in
    /// production). Tests widen the window between finalising and delivering with it.
    pub hold: Duration,
}

impl Default for WebhookPolicy {
    fn default() -> Self {
        WebhookPolicy {
            max_attempts: 6,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(60),
            timeout: Duration::from_secs(10),
            lease: Duration::from_secs(60),
            poll_interval: Duration::from_secs(1),
            hold: Duration::ZERO,
        }
    }
}

impl WebhookPolicy {
    /// The policy `coordinator.webhook_*` configure.
    pub fn from_settings(c: &skilleval_infra::config::CoordinatorSettings) -> Self {
        let timeout = Duration::from_secs(c.webhook_timeout_secs.max(1));
        WebhookPolicy {
            max_attempts: c.webhook_max_attempts.max(1),
            timeout,
            lease: (timeout * 3).max(Duration::from_secs(30)),
            poll_interval: Duration::from_millis(c.webhook_poll_interval_ms.max(50)),
            hold: Duration::from_millis(c.webhook_hold_ms),
            ..WebhookPolicy::default()
        }
    }

    /// Delay before attempt `n` (2-based): base * 2^(n-2), with up to 50% jitter, capped.
    fn delay(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(2).min(20);
        let raw = self
            .base_delay
            .saturating_mul(1u32 << exp)
            .min(self.max_delay);
        let jitter = rand::thread_rng().gen_range(0.5..=1.0);
        raw.mul_f64(jitter)
    }
}

/// Sends the outbox's due deliveries: one attempt per claim, its outcome recorded on the row.
/// Cheap to clone.
#[derive(Debug, Clone)]
pub struct WebhookOutbox {
    store: Store,
    client: reqwest::Client,
    /// `None`: deliveries carry no signature header.
    secret: Option<Arc<[u8]>>,
    policy: WebhookPolicy,
    metrics: Arc<Metrics>,
}

/// Deliveries claimed per round.
const CLAIM_BATCH: i64 = 32;

impl WebhookOutbox {
    pub fn new(
        store: Store,
        secret: Option<&[u8]>,
        policy: WebhookPolicy,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        let client = reqwest::Client::builder()
            .timeout(policy.timeout)
            .user_agent(concat!("skilleval-coordinator/", env!("CARGO_PKG_VERSION")))
            .build()
            .context("building the webhook HTTP client")?;
        Ok(WebhookOutbox {
            store,
            client,
            secret: secret.map(Arc::from),
            policy,
            metrics,
        })
    }

    pub fn policy(&self) -> &WebhookPolicy {
        &self.policy
    }

    /// Sends the given just-committed deliveries now, in the background (the poll would
    /// find them too, a moment later). Nothing when a hold is configured: the poll sends them.
    pub fn nudge(&self, ids: Vec<Uuid>) {
        if ids.is_empty() || !self.policy.hold.is_zero() {
            return;
        }
        let outbox = self.clone();
        tokio::spawn(async move {
            if let Err(e) = outbox.deliver_due(Some(&ids)).await {
                tracing::warn!(error = %e, "sending new webhooks failed; the poll retries");
            }
        });
    }

    /// One round: claims due deliveries (only `ids`, when given) and sends each once,
    /// concurrently. Returns how many it claimed.
    pub async fn deliver_due(&self, ids: Option<&[Uuid]>) -> Result<usize, StoreError> {
        let claimed = self
            .store
            .claim_webhooks(CLAIM_BATCH, self.policy.lease, self.policy.hold, ids)
            .await?;
        let n = claimed.len();
        futures::future::join_all(claimed.into_iter().map(|c| self.attempt(c))).await;
        Ok(n)
    }

    /// Polls for due deliveries until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.policy.poll_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            loop {
                match self.deliver_due(None).await {
                    // A full batch: more may be due.
                    Ok(n) if n as i64 >= CLAIM_BATCH => {}
                    Ok(_) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "claiming webhook deliveries failed");
                        break;
                    }
                }
            }
        }
    }

    /// One attempt of a claimed delivery, and its outcome recorded: a CLIENT span in the trace
    /// of whatever enqueued it (a run's finalisation).
    async fn attempt(&self, claimed: ClaimedWebhook) {
        let span = tracing::info_span!(
            "webhook",
            otel.name = %format!("POST {} webhook", claimed.event),
            otel.kind = "client",
            skilleval.run_id = tracing::field::Empty,
            http.request.method = "POST",
            url.full = %claimed.url,
            skilleval.webhook.outcome = tracing::field::Empty,
            delivery_id = %claimed.id,
            event = %claimed.event,
            attempt = claimed.attempts,
        );
        if let Some(run_id) = claimed.run_id {
            span.record("skilleval.run_id", run_id.to_string());
        }
        skilleval_infra::telemetry::set_parent(&span, claimed.traceparent.as_deref());
        self.attempt_in_span(claimed).instrument(span).await;
    }

    async fn attempt_in_span(&self, claimed: ClaimedWebhook) {
        let attempt = u32::try_from(claimed.attempts).unwrap_or(u32::MAX);
        let (outcome, recorded) = self.send(&claimed, attempt).await;
        tracing::Span::current().record("skilleval.webhook.outcome", outcome.as_str());
        Metrics::count(&self.metrics.webhooks, outcome.as_str());
        match self.store.settle_webhook(&claimed, &recorded).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(
                    "the delivery's lease ran out while sending; another sender owns it now"
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, "recording the webhook attempt failed; it is sent again when its lease ends");
            }
        }
    }

    /// POSTs the delivery once.
    async fn send(
        &self,
        claimed: &ClaimedWebhook,
        attempt: u32,
    ) -> (WebhookOutcome, AttemptOutcome) {
        let mut request = self
            .client
            .post(&claimed.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(EVENT_HEADER, &claimed.event)
            .header(DELIVERY_HEADER, claimed.id.to_string())
            .header(ATTEMPT_HEADER, attempt.to_string());
        if let Some(secret) = &self.secret {
            request = request.header(SIGNATURE_HEADER, sign(secret, &claimed.body));
        }
        let (status, error) = match request.body(claimed.body.clone()).send().await {
            Ok(response) => {
                let status = response.status();
                if status.is_success() {
                    tracing::info!(status = status.as_u16(), "webhook delivered");
                    return (
                        WebhookOutcome::Delivered,
                        AttemptOutcome::Delivered {
                            status: status.as_u16(),
                        },
                    );
                }
                let retryable = status.is_server_error()
                    || status == reqwest::StatusCode::TOO_MANY_REQUESTS
                    || status == reqwest::StatusCode::REQUEST_TIMEOUT;
                if !retryable {
                    tracing::warn!(status = status.as_u16(), "webhook rejected by the receiver");
                    return (
                        WebhookOutcome::Rejected,
                        AttemptOutcome::Failed {
                            status: Some(status.as_u16()),
                            error: format!("HTTP {status}"),
                        },
                    );
                }
                (Some(status.as_u16()), format!("HTTP {status}"))
            }
            Err(e) => (None, e.to_string()),
        };
        if attempt >= self.policy.max_attempts {
            tracing::warn!(%error, "webhook delivery gave up");
            return (
                WebhookOutcome::GaveUp,
                AttemptOutcome::Failed { status, error },
            );
        }
        let after = self.policy.delay(attempt + 1);
        tracing::info!(%error, retry_in = ?after, "webhook attempt failed; will retry");
        (
            WebhookOutcome::Retried,
            AttemptOutcome::Retry {
                status,
                error,
                after,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_matches_a_known_vector() {
        // RFC 4231 test case 2.
        let sig = sign(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            sig,
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert!(verify(b"Jefe", b"what do ya want for nothing?", &sig));
        assert!(!verify(b"Jefe", b"what do ya want for nothing!", &sig));
        assert!(!verify(b"other", b"what do ya want for nothing?", &sig));
    }

    #[test]
    fn delays_grow_and_are_capped() {
        let p = WebhookPolicy::default();
        assert!(p.delay(2) <= Duration::from_millis(500));
        assert!(
            p.delay(4) >= Duration::from_millis(1000) && p.delay(4) <= Duration::from_millis(2000)
        );
        assert!(p.delay(30) <= p.max_delay);
    }
}
