//! Which broker node a process talks to: the configured addresses (`amqp.url`, one or several
//! comma-separated), the order a connect tries them in, the node the process is on now, and
//! the backoff between rounds of attempts.
//!
//! One [`BrokerNodes`] is shared by every connection of a process (the coordinator's
//! publisher and consumers, the worker's session), so a process is on one node at a time and
//! readiness can name it. The first connect starts at a node picked by the process id, which
//! spreads a fleet's processes over the nodes without coordination. A connect tries every
//! address once, starting at the preferred node; whichever answers becomes the preferred node
//! of the next connects. A connection that is lost moves the preference past its node, so the
//! reconnect tries the other nodes first: a node that was killed refuses at once, but one being
//! stopped or cut off may still accept a TCP connection for a while, and must not be the first
//! one every reconnect waits on.
//!
//! Between rounds (every node refused), callers wait as [`Backoff`] says: exponential, capped,
//! with jitter so a fleet that lost its node does not come back in step.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::config::{AmqpSettings, SecretUrl};

/// No current node.
const NONE: usize = usize::MAX;

/// The nodes a process may connect to, and which it prefers and is on.
#[derive(Debug)]
pub struct BrokerNodes {
    addresses: Vec<SecretUrl>,
    /// `host:port` of each address: how logs and readiness name a node.
    labels: Vec<String>,
    /// The address the next connect tries first.
    preferred: AtomicUsize,
    /// The address of the last connection made and not reported lost ([`NONE`]: none).
    current: AtomicUsize,
}

impl BrokerNodes {
    /// The configured addresses; the first connect starts at the one the process id picks.
    pub fn from_settings(amqp: &AmqpSettings) -> BrokerNodes {
        let addresses = amqp.connect_urls();
        let start = usize::try_from(std::process::id()).unwrap_or(0);
        BrokerNodes::new(addresses, start)
    }

    /// `addresses` (at least one), the first connect starting at `start` (modulo their number).
    pub fn new(addresses: Vec<SecretUrl>, start: usize) -> BrokerNodes {
        let addresses = if addresses.is_empty() {
            // Settings validation refuses an empty list; the default broker keeps this total.
            AmqpSettings::default().connect_urls()
        } else {
            addresses
        };
        let labels = addresses.iter().map(|a| node_label(a.expose())).collect();
        let start = start % addresses.len();
        BrokerNodes {
            addresses,
            labels,
            preferred: AtomicUsize::new(start),
            current: AtomicUsize::new(NONE),
        }
    }

    pub fn len(&self) -> usize {
        self.addresses.len()
    }

    pub fn is_empty(&self) -> bool {
        self.addresses.is_empty()
    }

    /// The URL of address `i` (with its password: for connecting only).
    pub fn address(&self, i: usize) -> &SecretUrl {
        &self.addresses[i % self.addresses.len()]
    }

    /// `host:port` of address `i`.
    pub fn label(&self, i: usize) -> &str {
        &self.labels[i % self.labels.len()]
    }

    /// The order the next connect tries the addresses in: each once, the preferred first.
    pub fn order(&self) -> Vec<usize> {
        let n = self.addresses.len();
        let start = self.preferred.load(Ordering::SeqCst) % n;
        (0..n).map(|k| (start + k) % n).collect()
    }

    /// A connection to address `i` is up: the process is on that node, and the next connects
    /// (its other connections, a reconnect) try it first.
    pub fn connected(&self, i: usize) {
        let i = i % self.addresses.len();
        self.preferred.store(i, Ordering::SeqCst);
        self.current.store(i, Ordering::SeqCst);
    }

    /// A connection to address `i` was lost: the next connect tries the following node first.
    /// Reported by every connection that was on the node, it moves the preference once.
    pub fn lost(&self, i: usize) {
        let n = self.addresses.len();
        let i = i % n;
        let _ = self
            .preferred
            .compare_exchange(i, (i + 1) % n, Ordering::SeqCst, Ordering::SeqCst);
        let _ = self
            .current
            .compare_exchange(i, NONE, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// `host:port` of the node the process is on, while it has a connection.
    pub fn current(&self) -> Option<&str> {
        match self.current.load(Ordering::SeqCst) {
            NONE => None,
            i => Some(self.label(i)),
        }
    }
}

/// `host:port` of an AMQP URL (the scheme's default port when it names none); the URL redacted
/// when it does not parse.
pub fn node_label(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(parsed) => {
            let host = parsed.host_str().unwrap_or("localhost");
            let port = parsed.port().unwrap_or(if parsed.scheme() == "amqps" {
                5671
            } else {
                5672
            });
            format!("{host}:{port}")
        }
        Err(_) => crate::config::redact_url(url),
    }
}

/// Waits between rounds of connection attempts: `first`, doubling after each failed round up to
/// `cap`, each wait cut by a random part of up to half (jitter); [`Backoff::reset`] after a
/// connection worked.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    cap: Duration,
    failures: u32,
}

impl Backoff {
    pub fn new(first: Duration, cap: Duration) -> Backoff {
        Backoff {
            first,
            cap: cap.max(first),
            failures: 0,
        }
    }

    /// What the service's reconnect loops use: 200 ms, doubling up to 15 s.
    pub fn reconnect() -> Backoff {
        Backoff::new(Duration::from_millis(200), Duration::from_secs(15))
    }

    /// Failed rounds since the last reset.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The wait after one more failed round, with a random jitter.
    pub fn next_wait(&mut self) -> Duration {
        self.next_wait_with(rand::random::<f64>())
    }

    /// The wait after one more failed round: the full step scaled by `1 - jitter / 2`, where
    /// `jitter` is in `[0, 1]` (clamped).
    pub fn next_wait_with(&mut self, jitter: f64) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let doublings = (self.failures - 1).min(20);
        let step = self.first.saturating_mul(1u32 << doublings).min(self.cap);
        step.mul_f64(1.0 - jitter.clamp(0.0, 1.0) / 2.0)
    }

    /// A connection worked: the next failure waits `first` again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: usize, start: usize) -> BrokerNodes {
        BrokerNodes::new(
            (0..n)
                .map(|i| SecretUrl::new(format!("amqp://g:g@10.0.0.{i}:{}/%2f", 5672 + i)))
                .collect(),
            start,
        )
    }

    #[test]
    fn a_connect_tries_every_node_once_starting_at_the_preferred_one() {
        let b = nodes(3, 4);
        assert_eq!(
            b.order(),
            vec![1, 2, 0],
            "the start is taken modulo the nodes"
        );
        assert_eq!(b.current(), None);
        b.connected(2);
        assert_eq!(b.order(), vec![2, 0, 1]);
        assert_eq!(b.current(), Some("10.0.0.2:5674"));
    }

    #[test]
    fn a_lost_node_is_tried_last_and_the_process_follows_the_new_one() {
        let b = nodes(3, 0);
        b.connected(0);
        b.lost(0);
        assert_eq!(b.current(), None, "no node while reconnecting");
        assert_eq!(b.order(), vec![1, 2, 0], "the lost node is tried last");
        // The reconnect lands on node 1; the process's other connections, which were on
        // node 0 too, report their loss after it: the preference stays on node 1.
        b.connected(1);
        b.lost(0);
        assert_eq!(b.order(), vec![1, 2, 0]);
        assert_eq!(b.current(), Some("10.0.0.1:5673"));
        // Node 1 goes too, then node 2: the rotation wraps round.
        b.lost(1);
        assert_eq!(b.order(), vec![2, 0, 1]);
        b.connected(2);
        b.lost(2);
        assert_eq!(b.order(), vec![0, 1, 2]);
    }

    #[test]
    fn one_address_is_always_the_one_tried() {
        let b = nodes(1, 7);
        assert_eq!(b.order(), vec![0]);
        b.connected(0);
        b.lost(0);
        assert_eq!(b.order(), vec![0]);
        assert_eq!(b.current(), None);
    }

    #[test]
    fn nodes_are_named_by_host_and_port() {
        assert_eq!(node_label("amqp://g:g@rabbit-1:5673/%2f"), "rabbit-1:5673");
        assert_eq!(node_label("amqp://g:g@rabbit-1/%2f"), "rabbit-1:5672");
        assert_eq!(node_label("amqps://g:g@rabbit-1/%2f"), "rabbit-1:5671");
        assert_eq!(node_label("not a url"), "***");
    }

    #[test]
    fn the_backoff_doubles_up_to_its_cap_and_starts_over_after_a_reset() {
        let mut b = Backoff::new(Duration::from_millis(200), Duration::from_secs(2));
        let waits: Vec<u128> = (0..6).map(|_| b.next_wait_with(0.0).as_millis()).collect();
        assert_eq!(waits, vec![200, 400, 800, 1_600, 2_000, 2_000]);
        assert_eq!(b.failures(), 6);
        b.reset();
        assert_eq!(b.next_wait_with(0.0), Duration::from_millis(200));
    }

    #[test]
    fn jitter_cuts_a_wait_by_at_most_half() {
        let mut b = Backoff::new(Duration::from_millis(1_000), Duration::from_secs(60));
        assert_eq!(b.next_wait_with(1.0), Duration::from_millis(500));
        assert_eq!(b.next_wait_with(0.5), Duration::from_millis(1_500));
        assert_eq!(
            b.next_wait_with(7.0),
            Duration::from_millis(2_000),
            "clamped"
        );
        for _ in 0..100 {
            let mut fresh = Backoff::new(Duration::from_millis(1_000), Duration::from_secs(60));
            let wait = fresh.next_wait();
            assert!(
                wait >= Duration::from_millis(500) && wait <= Duration::from_millis(1_000),
                "{wait:?}"
            );
        }
    }

    #[test]
    fn many_failures_stay_at_the_cap() {
        let mut b = Backoff::reconnect();
        for _ in 0..100 {
            b.next_wait_with(0.0);
        }
        assert_eq!(b.next_wait_with(0.0), Duration::from_secs(15));
    }
}
