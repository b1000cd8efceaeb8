//! Durable webhooks: a delivery is enqueued with the run's finalisation and survives the
//! coordinator that finalised it (SIGKILLed before sending, the next coordinators send it,
//! each delivery id exactly once); a failing receiver is retried with backoff up to `failed`,
//! and a rejecting one fails at once.

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use skilleval_coordinator::metrics::{Metrics, OutcomeLabels};
use skilleval_coordinator::webhook::{self, WebhookOutbox, WebhookPolicy};
use skilleval_execution::plan::{plan, CaseFilter};
use skilleval_execution::result::{CaseStatus, JobResult};
use skilleval_infra::config::Settings;
use skilleval_infra::store::outbox::{DeliveryState, NewWebhook};
use skilleval_infra::store::Store;
use skilleval_infra::topology::Topology;
use skilleval_model::package::Package;
use skilleval_test_support::Scratch;
use uuid::Uuid;

use crate::helpers::{amqp_url, spawn_app, WebhookReceiver, WEBHOOK_SECRET};
use crate::packages::given_package;

/// A `skilleval-coordinator serve` process, SIGKILLed when dropped.
struct CoordinatorProcess {
    child: Child,
    base: String,
}

impl CoordinatorProcess {
    /// Starts one on a free port against `scratch`, with extra `SKILLEVAL__...` variables, and
    /// waits until it answers `/readyz`.
    async fn start(scratch: &Scratch, extra: &[(&str, &str)]) -> CoordinatorProcess {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_skilleval-coordinator"));
        cmd.arg("serve")
            .env("SKILLEVAL_CONFIG_DIR", "/nonexistent-skilleval-config")
            .env("DATABASE_URL", &scratch.db_url)
            .env("AMQP_URL", amqp_url())
            .env("SKILLEVAL__AMQP__PREFIX", &scratch.prefix)
            .env("SKILLEVAL__COORDINATOR__BIND", format!("127.0.0.1:{port}"))
            .env("SKILLEVAL__COORDINATOR__WEBHOOK_SECRET", WEBHOOK_SECRET)
            .env("SKILLEVAL__COORDINATOR__SWEEP_INTERVAL_SECS", "1")
            .env("SKILLEVAL__COORDINATOR__WEBHOOK_POLL_INTERVAL_MS", "100")
            .env("SKILLEVAL_LOG_FORMAT", "text")
            .env(
                "RUST_LOG",
                std::env::var("TEST_LOG").unwrap_or_else(|_| "error".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        for (k, v) in extra {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("start skilleval-coordinator");
        let mut process = CoordinatorProcess {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        let client = reqwest::Client::new();
        for _ in 0..300 {
            if let Ok(r) = client.get(format!("{}/readyz", process.base)).send().await {
                if r.status().is_success() {
                    return process;
                }
            }
            assert!(
                process.child.try_wait().unwrap().is_none(),
                "the coordinator exited while starting"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("hang guard: the coordinator was not ready after 30 s");
    }

    /// SIGKILL: no shutdown path runs.
    fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for CoordinatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn urlencode(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// Every case of `run_id` recorded `passed`, as workers would (the plan from the package).
async fn pass_every_case(store: &Store, zip: &[u8], run_id: Uuid) {
    let package =
        Package::from_zip_bytes(zip, &Settings::default().limits, None).expect("the package");
    let jobs = plan(
        &package.config,
        &package.content_hash,
        run_id,
        &CaseFilter::default(),
        None,
    )
    .unwrap();
    let results: Vec<JobResult> = jobs
        .iter()
        .map(|job| {
            let mut r = JobResult::skipped(job, "placeholder");
            r.status = CaseStatus::Passed;
            r.score = Some(1.0);
            r
        })
        .collect();
    let changed = store.record_results(&results).await.unwrap();
    assert_eq!(changed.len(), jobs.len());
}

async fn state_of(store: &Store) -> BTreeMap<Uuid, (DeliveryState, i32)> {
    store
        .webhook_deliveries()
        .await
        .unwrap()
        .into_iter()
        .map(|d| (d.id, (d.state, d.attempts)))
        .collect()
}

#[tokio::test]
async fn a_coordinator_killed_between_finalising_and_delivering_loses_no_webhook() {
    let mut scratch = Scratch::create().await;
    let mut topology_settings = Settings::default();
    topology_settings.amqp.prefix = scratch.prefix.clone();
    scratch.owns(Topology::from_settings(&topology_settings));
    let hook = WebhookReceiver::start().await;
    let query = format!("?callback_url={}", urlencode(&hook.url));
    let client = reqwest::Client::new();

    // The first coordinator holds every delivery for 10 minutes: it finalises, never sends.
    let first = CoordinatorProcess::start(
        &scratch,
        &[("SKILLEVAL__COORDINATOR__WEBHOOK_HOLD_MS", "600000")],
    )
    .await;
    let store = Store::connect_url(&scratch.db_url, 2).await.unwrap();
    let mut runs = Vec::new();
    for name in ["durable-a", "durable-b"] {
        let zip = given_package(name, &["ok", "ok"], json!({}));
        let upload: Value = client
            .post(format!("{}/v1/skills{query}", first.base))
            .header("Content-Type", "application/zip")
            .body(zip.clone())
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let run_id: Uuid = upload["run_id"].as_str().unwrap().parse().unwrap();
        runs.push((run_id, zip));
    }
    // One run completes (its cases recorded; the coordinator's sweep finalises it), the other
    // is cancelled (finalised by the request).
    pass_every_case(&store, &runs[0].1, runs[0].0).await;
    let cancelled = client
        .post(format!("{}/v1/runs/{}/cancel", first.base, runs[1].0))
        .send()
        .await
        .unwrap();
    assert_eq!(cancelled.status().as_u16(), 202);
    let mut finalised = 0;
    for _ in 0..300 {
        finalised = sqlx::query_scalar::<_, i64>("SELECT count(*) FROM runs WHERE finalised")
            .fetch_one(store.pool())
            .await
            .unwrap();
        if finalised == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        finalised, 2,
        "both runs are finalised (hang guard: waited up to 30 s)"
    );
    let enqueued = state_of(&store).await;
    assert_eq!(enqueued.len(), 2, "one delivery per finalised run");
    assert!(
        enqueued.values().all(|s| *s == (DeliveryState::Pending, 0)),
        "held, not attempted: {enqueued:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(hook.received.lock().await.is_empty(), "nothing sent yet");

    first.kill();

    // Two coordinators start (the next one and a second replica): between them each delivery
    // is sent once.
    let (second, third) = tokio::join!(
        CoordinatorProcess::start(&scratch, &[]),
        CoordinatorProcess::start(&scratch, &[])
    );
    let deliveries = hook.wait_for(2, Duration::from_secs(30)).await;
    assert_eq!(
        deliveries.len(),
        2,
        "both webhooks arrive after the restart"
    );
    // Several polls later, still nothing more.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let deliveries = hook.received.lock().await.clone();
    let ids: Vec<Uuid> = deliveries
        .iter()
        .map(|(headers, _)| {
            headers
                .get("x-skilleval-delivery")
                .expect("a delivery id header")
                .parse()
                .expect("a UUID")
        })
        .collect();
    let unique: BTreeSet<Uuid> = ids.iter().copied().collect();
    assert_eq!(ids.len(), 2, "no duplicate sends: {ids:?}");
    assert_eq!(unique.len(), 2, "each delivery id exactly once: {ids:?}");
    assert_eq!(
        unique,
        enqueued.keys().copied().collect::<BTreeSet<_>>(),
        "the ids are the outbox rows'"
    );
    let mut announced = BTreeSet::new();
    for (headers, body) in &deliveries {
        assert!(webhook::verify(
            WEBHOOK_SECRET.as_bytes(),
            body,
            &headers["x-skilleval-signature"]
        ));
        assert_eq!(headers["x-skilleval-event"], "run.finished");
        let payload: Value = serde_json::from_slice(body).unwrap();
        announced.insert((
            payload["run"]["run_id"].as_str().unwrap().to_string(),
            payload["run"]["status"].as_str().unwrap().to_string(),
        ));
    }
    assert_eq!(
        announced,
        BTreeSet::from([
            (runs[0].0.to_string(), "completed".to_string()),
            (runs[1].0.to_string(), "cancelled".to_string()),
        ])
    );
    let settled = state_of(&store).await;
    assert!(
        settled
            .values()
            .all(|s| *s == (DeliveryState::Delivered, 1)),
        "{settled:?}"
    );
    second.kill();
    third.kill();
    store.pool().close().await;
    scratch.remove().await;
}

/// A receiver that answers every request with `status` and counts them.
async fn answering(status: u16) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move || {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                axum::http::StatusCode::from_u16(status).unwrap()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://127.0.0.1:{port}/hook"), hits)
}

#[tokio::test]
async fn failing_deliveries_are_retried_with_backoff_then_failed_and_rejections_fail_at_once() {
    let app = spawn_app().await;
    let store = app.state.store.clone();
    let (broken, broken_hits) = answering(503).await;
    let (rejecting, rejecting_hits) = answering(410).await;
    // Any part of the service enqueues through the generic API, in its own transaction.
    let mut tx = app.pool.begin().await.unwrap();
    let retried = store
        .enqueue_webhook(
            &mut tx,
            &NewWebhook {
                event: "alert.fired",
                url: &broken,
                body: br#"{"event":"alert.fired"}"#,
                run_id: None,
                traceparent: None,
            },
        )
        .await
        .unwrap();
    let rejected = store
        .enqueue_webhook(
            &mut tx,
            &NewWebhook {
                event: "alert.fired",
                url: &rejecting,
                body: br#"{"event":"alert.fired"}"#,
                run_id: None,
                traceparent: None,
            },
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let scraped = app.get("/metrics").await.text().await.unwrap();
    assert!(
        scraped.contains("skilleval_coordinator_webhooks_pending 2"),
        "the backlog is exported:\n{scraped}"
    );

    let metrics = Metrics::new();
    let policy = WebhookPolicy {
        max_attempts: 3,
        base_delay: Duration::from_millis(300),
        max_delay: Duration::from_secs(1),
        timeout: Duration::from_secs(5),
        ..WebhookPolicy::default()
    };
    let outbox = WebhookOutbox::new(store.clone(), None, policy, metrics.clone()).unwrap();
    // The first round sends both once; the rejected one is final, the other waits its backoff.
    assert_eq!(outbox.deliver_due(None).await.unwrap(), 2);
    assert_eq!(
        outbox.deliver_due(None).await.unwrap(),
        0,
        "nothing is due during the backoff"
    );
    let mut rounds = 0;
    while state_of(&store).await[&retried].0 == DeliveryState::Pending {
        tokio::time::sleep(Duration::from_millis(50)).await;
        outbox.deliver_due(None).await.unwrap();
        rounds += 1;
        assert!(rounds < 200, "the broken delivery never failed");
    }
    let states = state_of(&store).await;
    assert_eq!(states[&retried], (DeliveryState::Failed, 3));
    assert_eq!(states[&rejected], (DeliveryState::Failed, 1));
    use std::sync::atomic::Ordering;
    assert_eq!(broken_hits.load(Ordering::SeqCst), 3);
    assert_eq!(rejecting_hits.load(Ordering::SeqCst), 1);
    let count = |outcome: &str| {
        metrics
            .webhooks
            .get_or_create(&OutcomeLabels {
                outcome: outcome.into(),
            })
            .get()
    };
    assert_eq!(
        (
            count("retried"),
            count("gave_up"),
            count("rejected"),
            count("delivered")
        ),
        (2, 1, 1, 0)
    );
    let rows = store.webhook_deliveries().await.unwrap();
    let row = rows.iter().find(|r| r.id == retried).unwrap();
    assert_eq!(row.last_status, Some(503));
    assert!(row.finished_at.is_some());
    app.cleanup().await;
}

#[tokio::test]
async fn a_claimed_delivery_is_nobody_elses_until_its_lease_ends_then_it_keeps_its_id() {
    let app = spawn_app().await;
    let store = app.state.store.clone();
    let mut tx = app.pool.begin().await.unwrap();
    let mut ids = BTreeSet::new();
    for n in 0..6 {
        let body = format!(r#"{{"n":{n}}}"#);
        let webhook = NewWebhook {
            event: "test.event",
            url: "http://127.0.0.1:9/unused",
            body: body.as_bytes(),
            run_id: None,
            traceparent: None,
        };
        ids.insert(store.enqueue_webhook(&mut tx, &webhook).await.unwrap());
    }
    // Not committed yet: nothing to claim.
    let none = store
        .claim_webhooks(10, Duration::from_secs(1), Duration::ZERO, None)
        .await
        .unwrap();
    assert!(none.is_empty());
    tx.commit().await.unwrap();

    // Two replicas claim at once: between them every row once.
    let lease = Duration::from_millis(800);
    let (a, b) = tokio::join!(
        store.claim_webhooks(4, lease, Duration::ZERO, None),
        store.claim_webhooks(4, lease, Duration::ZERO, None)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    let mut claimed: Vec<Uuid> = a.iter().chain(&b).map(|c| c.id).collect();
    claimed.sort();
    claimed.dedup();
    assert_eq!(claimed.len(), a.len() + b.len(), "no row claimed twice");
    let rest = store
        .claim_webhooks(10, lease, Duration::ZERO, None)
        .await
        .unwrap();
    assert_eq!(a.len() + b.len() + rest.len(), 6);
    assert!(
        store
            .claim_webhooks(10, lease, Duration::ZERO, None)
            .await
            .unwrap()
            .is_empty(),
        "every row is leased"
    );

    // Their senders died: once the lease is over, the rows are claimable again, same ids.
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    let again = store
        .claim_webhooks(10, lease, Duration::ZERO, None)
        .await
        .unwrap();
    assert_eq!(
        again.iter().map(|c| c.id).collect::<BTreeSet<_>>(),
        ids,
        "the same delivery ids"
    );
    assert!(again.iter().all(|c| c.attempts == 2));
    // A settle with the old lease records nothing: the row is the new claimant's.
    let stale = &a[0];
    let outcome = skilleval_infra::store::outbox::AttemptOutcome::Delivered { status: 200 };
    assert!(!store.settle_webhook(stale, &outcome).await.unwrap());
    let current = again.iter().find(|c| c.id == stale.id).unwrap();
    assert!(store.settle_webhook(current, &outcome).await.unwrap());
    assert_eq!(
        state_of(&store).await[&stale.id],
        (DeliveryState::Delivered, 2)
    );
    app.cleanup().await;
}
