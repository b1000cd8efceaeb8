//! Settling deliveries with as few frames as is safe.
//!
//! A committed batch of 200 results used to send 200 `basic.ack` frames; each one is a
//! command the broker applies to the queue (a quorum queue appends it to its log). One ack
//! with `multiple` set settles every unsettled delivery up to its tag on the channel, but
//! deliveries finish out of order: a `multiple` ack must never reach a delivery that is still
//! being graded, waiting in another batch, or about to be nacked.
//!
//! So each consumer channel has an [`AckWindow`]: the delivery tags received and not yet
//! settled. A batch is acked with one `multiple` ack up to the highest of its tags below the
//! lowest tag outside the batch still unsettled (everything under that tag is either in the
//! batch or already settled), and one ack per delivery for the rest. Every settlement of the
//! channel (acks, nacks, batch acks) goes through the window's send lock and leaves the
//! window only once its frame is sent, so a `multiple` ack never overtakes an individual
//! settlement it would cover (the broker closes the channel on a tag settled twice).
//!
//! lapin has no such tracking (its `Acker` settles one tag, or blindly all up to it), hence
//! this module.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use lapin::options::{BasicAckOptions, BasicNackOptions};
use lapin::Acker;

/// The unsettled deliveries of one consumer channel.
#[derive(Debug, Default)]
pub struct AckWindow {
    /// Delivery tags received and not settled (their frame not sent yet).
    unsettled: Mutex<BTreeSet<u64>>,
    /// Held while a settlement is computed and sent.
    sending: tokio::sync::Mutex<()>,
}

/// A delivery to settle, with its channel's window.
#[derive(Debug, Clone)]
pub struct Pending {
    acker: Acker,
    tag: u64,
    window: Arc<AckWindow>,
}

impl AckWindow {
    pub fn new() -> Arc<AckWindow> {
        Arc::new(AckWindow::default())
    }

    /// Registers a delivery as it arrives (in the channel's order, before it is handed to a
    /// task).
    pub fn received(self: &Arc<Self>, acker: Acker, tag: u64) -> Pending {
        self.set().insert(tag);
        Pending {
            acker,
            tag,
            window: self.clone(),
        }
    }

    fn set(&self) -> std::sync::MutexGuard<'_, BTreeSet<u64>> {
        // A panic while the lock was held cannot leave the set half-changed (each use is one
        // insert, remove or read), so a poisoned lock is still usable.
        self.unsettled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Pending {
    /// Acks this delivery alone. `false` when the frame could not be sent (the channel is
    /// gone: the broker redelivers the message).
    pub async fn ack(&self) -> bool {
        let _sending = self.window.sending.lock().await;
        let sent = matches!(self.acker.ack(BasicAckOptions::default()).await, Ok(true));
        self.window.set().remove(&self.tag);
        sent
    }

    /// Returns the delivery to its queue.
    pub async fn nack_requeue(&self) -> bool {
        let _sending = self.window.sending.lock().await;
        let sent = matches!(
            self.acker
                .nack(BasicNackOptions {
                    requeue: true,
                    ..BasicNackOptions::default()
                })
                .await,
            Ok(true)
        );
        self.window.set().remove(&self.tag);
        sent
    }
}

/// Acks a committed batch: per channel, one `multiple` ack for the deliveries it may cover and
/// single acks for the others. Returns how many deliveries could not be acked (their frames
/// not sent: the broker redelivers them).
pub async fn ack_batch(batch: Vec<Pending>) -> usize {
    let mut failed = 0;
    let mut rest = batch;
    while let Some(first) = rest.first() {
        let window = first.window.clone();
        let (mine, others): (Vec<Pending>, Vec<Pending>) = rest
            .into_iter()
            .partition(|p| Arc::ptr_eq(&p.window, &window));
        rest = others;
        failed += ack_on_window(&window, mine).await;
    }
    failed
}

async fn ack_on_window(window: &AckWindow, mut batch: Vec<Pending>) -> usize {
    batch.sort_unstable_by_key(|p| p.tag);
    let tags: Vec<u64> = batch.iter().map(|p| p.tag).collect();
    let _sending = window.sending.lock().await;
    let through = {
        let unsettled = window.set();
        multiple_through(&unsettled, &tags)
    };
    let mut failed = 0;
    let mut singles = Vec::new();
    match through {
        Some(through) => {
            let covered = tags.iter().take_while(|t| **t <= through).count();
            // The delivery with the highest covered tag carries the `multiple` ack; the
            // others it covers are settled with it.
            let carrier = &batch[covered - 1];
            let sent = matches!(
                carrier.acker.ack(BasicAckOptions { multiple: true }).await,
                Ok(true)
            );
            if !sent {
                failed += covered;
            }
            singles.extend(&batch[covered..]);
        }
        None => singles.extend(&batch),
    }
    for p in singles {
        if !matches!(p.acker.ack(BasicAckOptions::default()).await, Ok(true)) {
            failed += 1;
        }
    }
    let mut unsettled = window.set();
    for tag in &tags {
        unsettled.remove(tag);
    }
    failed
}

/// The tag a `multiple` ack for `batch` (sorted, all unsettled) may go up to: the highest
/// tag of the batch below every unsettled tag outside it, when that covers at least two of
/// the batch's deliveries (one alone is a single ack); `None` otherwise.
fn multiple_through(unsettled: &BTreeSet<u64>, batch: &[u64]) -> Option<u64> {
    let first_outside = unsettled
        .iter()
        .find(|t| batch.binary_search(t).is_err())
        .copied();
    let covered: Vec<u64> = batch
        .iter()
        .copied()
        .take_while(|t| first_outside.is_none_or(|outside| *t < outside))
        .collect();
    (covered.len() >= 2).then(|| covered[covered.len() - 1])
}

#[cfg(test)]
mod tests {
    use super::multiple_through;
    use std::collections::BTreeSet;

    fn set(tags: &[u64]) -> BTreeSet<u64> {
        tags.iter().copied().collect()
    }

    #[test]
    fn a_batch_holding_every_unsettled_delivery_is_one_multiple_ack_to_its_last_tag() {
        assert_eq!(
            multiple_through(&set(&[3, 4, 5, 6]), &[3, 4, 5, 6]),
            Some(6)
        );
    }

    #[test]
    fn a_multiple_ack_stops_below_the_first_delivery_still_unsettled_outside_the_batch() {
        // 5 is still being graded (or waits in another batch): 3 and 4 go as one multiple
        // ack, 6 and 8 singly.
        let unsettled = set(&[3, 4, 5, 6, 7, 8]);
        assert_eq!(multiple_through(&unsettled, &[3, 4, 6, 8]), Some(4));
    }

    #[test]
    fn settled_tags_below_the_batch_do_not_stop_it() {
        // 1 and 2 were settled already (not in the window): a multiple ack from 0 to 9 only
        // reaches the batch's own deliveries.
        assert_eq!(multiple_through(&set(&[7, 8, 9, 12]), &[7, 8, 9]), Some(9));
    }

    #[test]
    fn a_batch_whose_lowest_tag_is_not_the_lowest_unsettled_is_acked_singly() {
        assert_eq!(multiple_through(&set(&[2, 5, 6, 7]), &[5, 6, 7]), None);
    }

    #[test]
    fn one_covered_delivery_is_a_single_ack() {
        assert_eq!(multiple_through(&set(&[5, 6, 7]), &[5, 7]), None);
        assert_eq!(multiple_through(&set(&[5]), &[5]), None);
    }
}
