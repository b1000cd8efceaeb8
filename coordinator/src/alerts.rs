//! Alert evaluation: every monitor's rules judged on a schedule by one coordinator of the
//! fleet at a time, each transition recorded and announced once.
//!
//! A round runs in one transaction holding a transaction-scoped advisory lock
//! ([`Store::try_alert_lease`]): a coordinator that does not get it skips the round (another
//! is evaluating), and the lock goes with the transaction, so a coordinator that dies
//! mid-round holds nothing. A rule evaluated less than `min_gap` ago is skipped, so two
//! coordinators whose rounds follow each other within one interval do not evaluate it twice
//! (which would count one window twice in "2 of the last 3"). Each rule's
//! [`AlertTracker`] is kept in `alert_states`; a transition (`→ firing`, `firing → resolved`)
//! is inserted into `alerts` in the same transaction as the tracker that produced it, with its
//! webhook enqueued in the outbox (`skilleval_infra::store::outbox`) by that transaction too:
//! the delivery exists exactly when the transition does, and is sent (at least once, with a
//! stable delivery id) by whichever coordinator claims it; the round nudges its own outbox
//! after the commit.

use anyhow::Context as _;
use chrono::{DateTime, Duration, Utc};
use serde_json::json;
use skilleval_analysis::quality::alert::Finding;
use skilleval_analysis::quality::alert::{evaluate, AlertTracker, WindowCounts};
use skilleval_execution::monitor::Monitor;
use skilleval_infra::store::outbox::NewWebhook;
use skilleval_infra::store::samples::NewAlert;
use skilleval_infra::store::Store;
use uuid::Uuid;

use crate::webhook::WebhookOutbox;

/// Evaluates alert rules and announces transitions.
#[derive(Debug, Clone)]
pub struct AlertScheduler {
    store: Store,
    webhooks: Option<WebhookOutbox>,
    /// A rule evaluated more recently than this is left alone this round.
    min_gap: Duration,
}

/// A recorded transition.
#[derive(Debug, Clone)]
pub struct PendingAlert {
    pub alert_id: Uuid,
    pub skill: String,
    /// `alert.firing` or `alert.resolved`.
    pub event: &'static str,
    /// Its webhook in the outbox (none without a callback URL).
    pub delivery: Option<Uuid>,
}

/// What a round did.
#[derive(Debug, Default)]
pub struct Round {
    /// False: another coordinator held the lease.
    pub leased: bool,
    /// Rules evaluated.
    pub evaluated: usize,
    pub transitions: Vec<PendingAlert>,
}

impl AlertScheduler {
    pub fn new(
        store: Store,
        webhooks: Option<WebhookOutbox>,
        min_gap: std::time::Duration,
    ) -> Self {
        AlertScheduler {
            store,
            webhooks,
            min_gap: Duration::from_std(min_gap).unwrap_or(Duration::zero()),
        }
    }

    /// One round at `now` (the scheduler passes the clock; tests pass the times they
    /// inject), then its transitions' webhooks sent at once (the outbox's poll would send them
    /// too, a little later).
    pub async fn round(&self, now: DateTime<Utc>) -> anyhow::Result<Round> {
        let round = self.evaluate_at(now).await?;
        let ids: Vec<Uuid> = round
            .transitions
            .iter()
            .filter_map(|a| a.delivery)
            .collect();
        if let (false, Some(outbox)) = (ids.is_empty(), &self.webhooks) {
            outbox.nudge(ids);
        }
        Ok(round)
    }

    /// Evaluates every rule of every monitor at `now` under the fleet's lease, recording
    /// trackers, transitions and their webhook deliveries in one transaction. Sends nothing.
    pub async fn evaluate_at(&self, now: DateTime<Utc>) -> anyhow::Result<Round> {
        let mut tx = self.store.pool().begin().await.context("alert round")?;
        if !self.store.try_alert_lease(&mut tx).await? {
            return Ok(Round::default());
        }
        let mut round = Round {
            leased: true,
            ..Round::default()
        };
        for m in self.store.monitors_to_evaluate(&mut tx).await? {
            let monitor: Monitor = match serde_json::from_value(m.monitor.clone()) {
                Ok(monitor) => monitor,
                Err(e) => {
                    tracing::warn!(skill = %m.skill, error = %e, "stored monitor does not parse; skipped");
                    continue;
                }
            };
            let first = self.store.first_graded_sample(m.skill_id).await?;
            for rule in &monitor.alerts {
                let stored = self
                    .store
                    .alert_tracker(&mut tx, m.monitor_id, &rule.name)
                    .await?;
                if stored
                    .as_ref()
                    .is_some_and(|(_, at)| now - *at < self.min_gap)
                {
                    continue;
                }
                let mut tracker: AlertTracker = stored
                    .and_then(|(t, _)| serde_json::from_value(t).ok())
                    .unwrap_or_default();
                let (ws, we) = rule.window(now);
                let (bs, be) = rule.baseline(now);
                let window = self.counts(m.skill_id, ws, we).await?;
                let baseline = self.counts(m.skill_id, bs, be).await?;
                let mut evaluation = evaluate(rule, now, window, baseline);
                // A history younger than a baseline and a window is not the skill's normal.
                if first.is_none_or(|first| now < rule.ready_at(first)) {
                    evaluation.finding = Finding::NoData;
                }
                round.evaluated += 1;
                let transition = tracker.step(rule, evaluation);
                let tracker_json = serde_json::to_value(&tracker).context("alert tracker")?;
                self.store
                    .save_alert_tracker(
                        &mut tx,
                        m.monitor_id,
                        &rule.name,
                        tracker.state.as_str(),
                        &tracker_json,
                        now,
                    )
                    .await?;
                let Some(t) = transition else { continue };
                let alert_id = Uuid::now_v7();
                let evaluation = serde_json::to_value(&t.evaluation).context("evaluation")?;
                let event = if t.to == skilleval_analysis::quality::alert::AlertState::Firing {
                    "alert.firing"
                } else {
                    "alert.resolved"
                };
                let delivery = match m.callback_url.as_deref() {
                    Some(url) => {
                        let body = serde_json::to_vec(&json!({
                            "event": event,
                            "alert_id": alert_id,
                            "skill": m.skill,
                            "rule": rule.name,
                            "from": t.from.as_str(),
                            "to": t.to.as_str(),
                            "evaluation": evaluation,
                        }))
                        .context("alert webhook body")?;
                        let webhook = NewWebhook {
                            event,
                            url,
                            body: &body,
                            run_id: None,
                            traceparent: None,
                        };
                        Some(self.store.enqueue_webhook(&mut tx, &webhook).await?)
                    }
                    None => None,
                };
                self.store
                    .insert_alert(
                        &mut tx,
                        &NewAlert {
                            id: alert_id,
                            skill_id: m.skill_id,
                            monitor_id: m.monitor_id,
                            rule: &rule.name,
                            from_state: t.from.as_str(),
                            to_state: t.to.as_str(),
                            evaluation: &evaluation,
                            delivery,
                        },
                    )
                    .await?;
                tracing::info!(skill = %m.skill, rule = %rule.name, from = t.from.as_str(), to = t.to.as_str(), "alert transition");
                round.transitions.push(PendingAlert {
                    alert_id,
                    skill: m.skill.clone(),
                    event,
                    delivery,
                });
            }
        }
        tx.commit().await.context("committing the alert round")?;
        Ok(round)
    }

    async fn counts(
        &self,
        skill_id: Uuid,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
    ) -> anyhow::Result<WindowCounts> {
        let (passed, n) = self.store.sample_counts(skill_id, start, end).await?;
        Ok(WindowCounts {
            passed: u64::try_from(passed).unwrap_or(0),
            n: u64::try_from(n).unwrap_or(0),
        })
    }
}
