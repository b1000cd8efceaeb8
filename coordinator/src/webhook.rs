//! Webhooks: when a run is finalised, its summary is POSTed to the run's `callback_url`.
//!
//! The body is JSON; `X-Skilleval-Signature: sha256=<hex>` is the HMAC-SHA256 of the exact body
//! bytes with `coordinator.webhook_secret`, so a receiver can check the sender and that the
//! body was not changed (without a secret configured, deliveries are unsigned). A failed
//! delivery (connection error, timeout, 5xx, 429) is retried with
//! exponential backoff and jitter up to a maximum number of attempts; a 4xx other than 408/429
//! is final (the receiver rejected it and will keep doing so).

use std::time::Duration;

use hmac::{Hmac, Mac};
use rand::Rng;
use sha2::Sha256;

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

/// How deliveries are retried.
#[derive(Debug, Clone)]
pub struct WebhookPolicy {
    pub max_attempts: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
    /// Per attempt.
    pub timeout: Duration,
}

impl Default for WebhookPolicy {
    fn default() -> Self {
        WebhookPolicy {
            max_attempts: 6,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(60),
            timeout: Duration::from_secs(10),
        }
    }
}

impl WebhookPolicy {
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

/// What became of a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    Delivered { attempts: u32, status: u16 },
    Rejected { attempts: u32, status: u16 },
    GaveUp { attempts: u32, last_error: String },
}

impl Delivery {
    pub fn outcome(&self) -> &'static str {
        match self {
            Delivery::Delivered { .. } => "delivered",
            Delivery::Rejected { .. } => "rejected",
            Delivery::GaveUp { .. } => "gave_up",
        }
    }
}

/// Sends one webhook with retries.
#[derive(Debug, Clone)]
pub struct WebhookSender {
    client: reqwest::Client,
    /// `None`: deliveries carry no signature header.
    secret: Option<Vec<u8>>,
    policy: WebhookPolicy,
}

impl WebhookSender {
    pub fn new(secret: Option<&[u8]>, policy: WebhookPolicy) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        let client = reqwest::Client::builder()
            .timeout(policy.timeout)
            .user_agent(concat!("skilleval-coordinator/", env!("CARGO_PKG_VERSION")))
            .build()
            .context("building the webhook HTTP client")?;
        Ok(WebhookSender {
            client,
            secret: secret.map(<[u8]>::to_vec),
            policy,
        })
    }

    #[tracing::instrument(skip(self, body), fields(url = %url))]
    pub async fn deliver(&self, url: &str, event: &str, body: &[u8]) -> Delivery {
        let signature = self.secret.as_deref().map(|secret| sign(secret, body));
        let mut last_error = String::new();
        for attempt in 1..=self.policy.max_attempts.max(1) {
            if attempt > 1 {
                tokio::time::sleep(self.policy.delay(attempt)).await;
            }
            let mut request = self.client.post(url);
            if let Some(signature) = &signature {
                request = request.header(SIGNATURE_HEADER, signature);
            }
            let sent = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .header("X-Skilleval-Event", event)
                .header("X-Skilleval-Delivery-Attempt", attempt.to_string())
                .body(body.to_vec())
                .send()
                .await;
            match sent {
                Ok(response) => {
                    let status = response.status();
                    if status.is_success() {
                        return Delivery::Delivered {
                            attempts: attempt,
                            status: status.as_u16(),
                        };
                    }
                    let retryable = status.is_server_error()
                        || status == reqwest::StatusCode::TOO_MANY_REQUESTS
                        || status == reqwest::StatusCode::REQUEST_TIMEOUT;
                    if !retryable {
                        tracing::warn!(
                            status = status.as_u16(),
                            "webhook rejected by the receiver"
                        );
                        return Delivery::Rejected {
                            attempts: attempt,
                            status: status.as_u16(),
                        };
                    }
                    last_error = format!("HTTP {status}");
                }
                Err(e) => last_error = e.to_string(),
            }
            tracing::info!(attempt, error = %last_error, "webhook delivery failed; will retry");
        }
        tracing::warn!(error = %last_error, "webhook delivery gave up");
        Delivery::GaveUp {
            attempts: self.policy.max_attempts.max(1),
            last_error,
        }
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
