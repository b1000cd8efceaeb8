//! The access policy every `/v1` request is checked against: the authentication settings, the
//! quotas, and the per-second rate limiters (process-local: each replica allows the configured
//! rate, documented). The shared state holds one; [`crate::access`] applies it to each request
//! and to the uploads and runs the handlers create. It lives apart from that middleware because
//! the middleware takes the shared state, which holds the policy.

use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use skilleval_infra::config::{QuotaLimits, QuotaSettings};

use crate::auth::{AuthConfig, Principal};

/// Authentication settings, limits and the per-second limiters.
pub struct AccessPolicy {
    pub auth: AuthConfig,
    pub quotas: QuotaSettings,
    publisher_rate: Option<DefaultKeyedRateLimiter<String>>,
    token_rate: Option<DefaultKeyedRateLimiter<String>>,
}

impl std::fmt::Debug for AccessPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessPolicy")
            .field("auth", &self.auth)
            .field("quotas", &self.quotas)
            .finish_non_exhaustive()
    }
}

fn limiter(limits: &QuotaLimits) -> Option<DefaultKeyedRateLimiter<String>> {
    let per_second = NonZeroU32::new(limits.requests_per_second?)?;
    Some(RateLimiter::keyed(Quota::per_second(per_second)))
}

impl AccessPolicy {
    pub fn new(auth: AuthConfig, quotas: QuotaSettings) -> Self {
        AccessPolicy {
            publisher_rate: limiter(&quotas.publisher),
            token_rate: limiter(&quotas.token),
            auth,
            quotas,
        }
    }

    /// Forgets the per-second state of publishers and tokens idle long enough to be back at
    /// a full burst (the keyed limiters would otherwise keep one entry per key ever seen).
    pub fn forget_idle(&self) {
        for limiter in [&self.publisher_rate, &self.token_rate]
            .into_iter()
            .flatten()
        {
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
    }

    /// Counts a request of `principal` against the per-second limits of its publisher and its
    /// token; the first one it is over, by its configuration key, with how long until that
    /// limit allows a request again (`None`: within both).
    pub fn rate_limited(&self, principal: &Principal) -> Option<(&'static str, Duration)> {
        let clock = DefaultClock::default();
        // The keys are made only for the limits that are configured.
        let publisher_key: fn(&Principal) -> String = |p| p.publisher_id.to_string();
        let token_key: fn(&Principal) -> String = Principal::token_key;
        let checks = [
            (
                &self.publisher_rate,
                publisher_key,
                "coordinator.quotas.publisher.requests_per_second",
            ),
            (
                &self.token_rate,
                token_key,
                "coordinator.quotas.token.requests_per_second",
            ),
        ];
        for (limiter, key, name) in checks {
            let Some(limiter) = limiter else { continue };
            if let Err(not_until) = limiter.check_key(&key(principal)) {
                return Some((name, not_until.wait_time_from(clock.now())));
            }
        }
        None
    }
}
