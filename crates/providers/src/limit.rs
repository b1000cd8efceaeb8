//! Limits on how hard this process presses a provider.
//!
//! - [`AdaptiveLimiter`]: requests in flight per provider, adapted AIMD-style — halved on a
//!   429 (at most once per [`CUT_COOLDOWN`], so one burst of 429s is one cut), grown by about
//!   one slot per window of successes, never above the configured ceiling nor under one.
//! - [`RateLimiter`]: requests and tokens per minute. [`LocalRateLimiter`] keeps token buckets
//!   in this process (the CLI); the service plugs in one shared through Postgres, so the whole
//!   fleet stays under the provider key's limits.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::Notify;

/// Shortest time between two cuts of the concurrency limit.
pub const CUT_COOLDOWN: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct LimiterState {
    limit: f64,
    in_flight: usize,
    last_cut: Option<Instant>,
}

/// A semaphore whose size adapts to the provider's 429s.
#[derive(Debug)]
pub struct AdaptiveLimiter {
    state: Mutex<LimiterState>,
    notify: Notify,
    max: f64,
}

/// One request's slot; released on drop.
#[derive(Debug)]
pub struct Permit<'a> {
    limiter: &'a AdaptiveLimiter,
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if let Ok(mut s) = self.limiter.state.lock() {
            s.in_flight = s.in_flight.saturating_sub(1);
        }
        self.limiter.notify.notify_waiters();
    }
}

impl AdaptiveLimiter {
    /// Starts at `max` slots (at least one).
    pub fn new(max: u32) -> Self {
        let max = f64::from(max.max(1));
        AdaptiveLimiter {
            state: Mutex::new(LimiterState {
                limit: max,
                in_flight: 0,
                last_cut: None,
            }),
            notify: Notify::new(),
            max,
        }
    }

    /// The current number of slots.
    pub fn limit(&self) -> usize {
        self.state
            .lock()
            .map(|s| s.limit.floor().max(1.0) as usize)
            .unwrap_or(1)
    }

    pub fn in_flight(&self) -> usize {
        self.state.lock().map(|s| s.in_flight).unwrap_or(0)
    }

    fn try_acquire(&self) -> bool {
        match self.state.lock() {
            Ok(mut s) => {
                if (s.in_flight as f64) < s.limit.floor().max(1.0) {
                    s.in_flight += 1;
                    true
                } else {
                    false
                }
            }
            // A poisoned lock must not stall every call: let the request through.
            Err(_) => true,
        }
    }

    /// Waits for a slot.
    pub async fn acquire(&self) -> Permit<'_> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Registered before the check, so a release between the check and the wait is seen.
            notified.as_mut().enable();
            if self.try_acquire() {
                return Permit { limiter: self };
            }
            notified.await;
        }
    }

    /// A request went through: grow by 1/limit (about one slot per window of successes).
    pub fn on_success(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.limit = (s.limit + 1.0 / s.limit.max(1.0)).min(self.max);
        }
        self.notify.notify_waiters();
    }

    /// The provider said "too many": halve, unless we just did.
    pub fn on_overload(&self) {
        self.on_overload_at(Instant::now());
    }

    fn on_overload_at(&self, now: Instant) {
        if let Ok(mut s) = self.state.lock() {
            let recent = s
                .last_cut
                .is_some_and(|t| now.saturating_duration_since(t) < CUT_COOLDOWN);
            if !recent {
                s.limit = (s.limit / 2.0).max(1.0);
                s.last_cut = Some(now);
            }
        }
    }
}

/// Requests- and tokens-per-minute limits per provider.
#[async_trait]
pub trait RateLimiter: Send + Sync + fmt::Debug {
    /// Waits until `provider` may send one more request using about `estimated_tokens`.
    async fn acquire(&self, provider: &str, estimated_tokens: u64);
    /// Corrects the estimate once the call says what it used.
    fn record(&self, provider: &str, estimated_tokens: u64, actual_tokens: u64);
}

/// No limit.
#[derive(Debug, Default, Clone, Copy)]
pub struct Unlimited;

#[async_trait]
impl RateLimiter for Unlimited {
    async fn acquire(&self, _provider: &str, _estimated_tokens: u64) {}
    fn record(&self, _provider: &str, _estimated_tokens: u64, _actual_tokens: u64) {}
}

/// A bucket refilled continuously at `capacity` per minute.
#[derive(Debug, Clone)]
struct Bucket {
    capacity: f64,
    level: f64,
    at: Instant,
}

impl Bucket {
    fn new(per_minute: f64, now: Instant) -> Self {
        Bucket {
            capacity: per_minute,
            level: per_minute,
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let secs = now.saturating_duration_since(self.at).as_secs_f64();
        self.level = (self.level + secs * self.capacity / 60.0).min(self.capacity);
        self.at = now;
    }

    /// How long until `amount` is available (a request larger than the bucket waits for a
    /// full one, then may go: the bucket goes into debt).
    fn wait_for(&self, amount: f64) -> Duration {
        let needed = amount.min(self.capacity) - self.level;
        if needed <= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(needed * 60.0 / self.capacity)
        }
    }
}

#[derive(Debug, Clone)]
struct ProviderBuckets {
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
}

/// Token buckets in this process, per provider.
#[derive(Debug, Default)]
pub struct LocalRateLimiter {
    limits: HashMap<String, (Option<u32>, Option<u64>)>,
    buckets: Mutex<HashMap<String, ProviderBuckets>>,
}

impl LocalRateLimiter {
    /// Limits per provider name: (requests per minute, tokens per minute).
    pub fn new(limits: HashMap<String, (Option<u32>, Option<u64>)>) -> Self {
        LocalRateLimiter {
            limits,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes the request if possible now; else how long to wait.
    fn try_take(&self, provider: &str, tokens: u64, now: Instant) -> Duration {
        let Some(&(rpm, tpm)) = self.limits.get(provider) else {
            return Duration::ZERO;
        };
        let Ok(mut all) = self.buckets.lock() else {
            return Duration::ZERO;
        };
        let b = all
            .entry(provider.to_string())
            .or_insert_with(|| ProviderBuckets {
                requests: rpm
                    .filter(|r| *r > 0)
                    .map(|r| Bucket::new(f64::from(r), now)),
                tokens: tpm.filter(|t| *t > 0).map(|t| Bucket::new(t as f64, now)),
            });
        let tokens = tokens as f64;
        let mut wait = Duration::ZERO;
        if let Some(r) = &mut b.requests {
            r.refill(now);
            wait = wait.max(r.wait_for(1.0));
        }
        if let Some(t) = &mut b.tokens {
            t.refill(now);
            wait = wait.max(t.wait_for(tokens));
        }
        if wait.is_zero() {
            if let Some(r) = &mut b.requests {
                r.level -= 1.0;
            }
            if let Some(t) = &mut b.tokens {
                t.level -= tokens;
            }
        }
        wait
    }
}

#[async_trait]
impl RateLimiter for LocalRateLimiter {
    async fn acquire(&self, provider: &str, estimated_tokens: u64) {
        loop {
            let wait = self.try_take(provider, estimated_tokens, Instant::now());
            if wait.is_zero() {
                return;
            }
            // Waiting for the bucket to refill is the limiter's whole job.
            tokio::time::sleep(wait).await;
        }
    }

    fn record(&self, provider: &str, estimated_tokens: u64, actual_tokens: u64) {
        if let Ok(mut all) = self.buckets.lock() {
            if let Some(t) = all.get_mut(provider).and_then(|b| b.tokens.as_mut()) {
                t.level += estimated_tokens as f64 - actual_tokens as f64;
                t.level = t.level.min(t.capacity);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn aimd_cuts_once_per_burst_and_grows_back_slowly() {
        let l = AdaptiveLimiter::new(16);
        assert_eq!(l.limit(), 16);
        let t0 = Instant::now();
        l.on_overload_at(t0);
        l.on_overload_at(t0 + Duration::from_millis(10));
        assert_eq!(l.limit(), 8, "a burst of 429s is one cut");
        l.on_overload_at(t0 + CUT_COOLDOWN + Duration::from_millis(1));
        assert_eq!(l.limit(), 4);
        // About one slot per window of `limit` successes.
        for _ in 0..4 {
            l.on_success();
        }
        assert_eq!(l.limit(), 4);
        l.on_success();
        assert_eq!(l.limit(), 5);
        for _ in 0..200 {
            l.on_success();
        }
        assert_eq!(l.limit(), 16, "never above the ceiling");
        let one = AdaptiveLimiter::new(1);
        one.on_overload();
        assert_eq!(one.limit(), 1, "never under one");
    }

    #[tokio::test]
    async fn permits_cap_requests_in_flight() {
        let l = Arc::new(AdaptiveLimiter::new(2));
        let a = l.acquire().await;
        let _b = l.acquire().await;
        assert_eq!(l.in_flight(), 2);
        let l2 = l.clone();
        let waiter = tokio::spawn(async move {
            let _c = l2.acquire().await;
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!waiter.is_finished(), "a third request waits");
        drop(a);
        tokio::time::timeout(Duration::from_secs(30), waiter)
            .await
            .expect("hang guard: the third request had no permit 30 s after one was released")
            .unwrap();
    }

    #[test]
    fn buckets_admit_up_to_the_rate_then_say_how_long_to_wait() {
        let limiter =
            LocalRateLimiter::new(HashMap::from([("p".to_string(), (Some(60), Some(1_000)))]));
        let t0 = Instant::now();
        assert_eq!(limiter.try_take("p", 600, t0), Duration::ZERO);
        // 400 tokens left; 600 more need 200 refilled at 1000/min = 12 s.
        let wait = limiter.try_take("p", 600, t0);
        assert!((wait.as_secs_f64() - 12.0).abs() < 0.01, "{wait:?}");
        limiter.record("p", 600, 100);
        assert_eq!(
            limiter.try_take("p", 600, t0),
            Duration::ZERO,
            "the estimate was corrected"
        );
        assert_eq!(limiter.try_take("other", 1_000_000, t0), Duration::ZERO);
    }
}
