//! Which copy of a case runs when the broker delivered its job more than once.
//!
//! The broker delivers a job again while the first copy still runs when that copy's channel
//! closes: its connection was lost, or it held the delivery unacknowledged past the broker's
//! `consumer_timeout` (RabbitMQ then closes the channel with `PRECONDITION_FAILED` and requeues
//! every delivery the channel held). The first copy goes on (its result is committed; its ack
//! fails with the old channel), so without more the second would run the case again: a case
//! graded twice, its model calls paid twice. The store's claim on the case
//! (`Store::claim_case`, a lease keyed like the result row) decides which copy runs:
//!
//! - a copy delivered for the first time runs without a claim for `worker.claim_after_ms`
//!   (most jobs end sooner: no write), then claims the case and renews the claim's lease every
//!   third of `worker.claim_lease_secs` while it runs; it claims at once when its session is
//!   lost (the broker is about to deliver it again);
//! - a copy delivered again (or put off before) claims the case before it runs; when another
//!   live copy holds it, it is put off into a delay queue, marked to look again
//!   (`topology::DEFERRED_HEADER`), and acked: when it comes back the case is recorded (it is
//!   acked without running) or its claim lapsed (its holder died: it runs);
//! - a copy that finds the claim taken by another copy while it runs (it claimed late, or its
//!   lease ran out while it could not renew it) stops, and is put off like a copy delivered
//!   again: the case is run by the holder, or, should the holder die, by this copy when it
//!   comes back; never by both at once, and never by nobody.
//!
//! A claim is per attempt: a retry is a job of its own, published once the attempt before it
//! ended, and does not wait for that attempt's claim to lapse.
//!
//! Nothing releases a claim: it lapses a lease after the holder's last renewal, by which time
//! the result is committed (a batch commits within milliseconds); recording stays
//! exactly-once whatever happens, the claim only saves the second run.

use std::future::Future;
use std::time::Duration;

use skilleval_execution::variant::Variant;
use skilleval_infra::store::results::Claim;
use skilleval_infra::store::Store;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The claim of one copy of a case: what it is on and who holds it.
#[derive(Debug)]
pub struct CaseClaim<'a> {
    pub store: &'a Store,
    pub run_id: Uuid,
    pub test_case_id: &'a str,
    pub variant: Variant,
    /// The job's attempt (a retry claims apart from the attempt before it).
    pub attempt: u32,
    /// This copy (random per delivery run).
    pub holder: Uuid,
    pub after: Duration,
    pub lease: Duration,
}

impl CaseClaim<'_> {
    /// Takes or renews the claim once.
    pub async fn take(&self) -> Result<Claim, skilleval_infra::store::StoreError> {
        self.store
            .claim_case(
                self.run_id,
                self.test_case_id,
                self.variant,
                self.attempt,
                self.holder,
                self.lease,
            )
            .await
    }

    /// Runs `work` while keeping the claim (held already when `held`, else taken after
    /// `after` or when `lost` fires). `None`: another copy took the claim, and `work` was
    /// dropped (a sandbox's processes die with it).
    pub async fn keep_while<F: Future>(
        &self,
        held: bool,
        lost: &CancellationToken,
        work: F,
    ) -> Option<F::Output> {
        tokio::select! {
            out = work => Some(out),
            () = self.kept(held, lost) => None,
        }
    }

    /// Renews the claim until it is found held by another copy (then returns); a renewal
    /// that fails (the database unreachable) is retried at the next turn, the job going on.
    async fn kept(&self, held: bool, lost: &CancellationToken) {
        if held {
            tokio::time::sleep(self.lease / 3).await;
        } else {
            tokio::select! {
                () = tokio::time::sleep(self.after) => {}
                () = lost.cancelled() => {}
            }
        }
        loop {
            match self.take().await {
                Ok(Claim::Held) => {}
                Ok(Claim::Elsewhere) => {
                    tracing::warn!(
                        run_id = %self.run_id,
                        test_case_id = self.test_case_id,
                        "another copy of the job holds the case's claim; this copy stops"
                    );
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "renewing the case's claim failed; the job goes on");
                }
            }
            tokio::time::sleep(self.lease / 3).await;
        }
    }
}
