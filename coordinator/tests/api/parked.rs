//! Parked jobs: a job the broker dead-letters at the jobs queue's delivery limit becomes an
//! `errored` result with the reason, the run finalises and its results and report say why;
//! an operator lists parked jobs and requeues one, which gives the case back to its run (it
//! finalises again); a message no worker can read is listed as `unmatched`.

use std::time::Duration;

use lapin::options::{BasicAckOptions, BasicGetOptions, BasicNackOptions, BasicPublishOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::BasicProperties;
use serde_json::{json, Value};
use skilleval_execution::result::CaseStatus;
use skilleval_infra::topology::{DELIVERY_LIMIT, PARKED_FROM_HEADER, PARKED_REASON_HEADER};
use uuid::Uuid;

use crate::e2e::wait_for_verdict;
use crate::helpers::{record_as_worker, spawn_app_with, AppOptions, TestApp, WebhookReceiver};
use crate::openapi::{check_response, doc};
use crate::packages::given_package;

/// Plays workers that die on `poison` every time: each delivery of it goes back to the queue
/// unacked (a nack with requeue, as the broker does for a dead consumer's deliveries) until
/// the broker's delivery limit dead-letters it; the other jobs are acked. Returns how often
/// the poison job was delivered.
async fn kill_workers_on(app: &TestApp, poison: &str) -> u32 {
    let queue = app.topology.jobs_queue();
    let mut poison_deliveries = 0;
    let mut empty_polls = 0;
    while empty_polls < 20 {
        let got = app
            .channel
            .basic_get(
                ShortString::from(queue.as_str()),
                BasicGetOptions { no_ack: false },
            )
            .await
            .unwrap();
        let Some(message) = got else {
            empty_polls += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        empty_polls = 0;
        let job = skilleval_infra::messages::decode_job(&message.delivery.data).unwrap();
        if job.case.id == poison {
            poison_deliveries += 1;
            message
                .delivery
                .nack(BasicNackOptions {
                    requeue: true,
                    ..BasicNackOptions::default()
                })
                .await
                .unwrap();
        } else {
            message
                .delivery
                .ack(BasicAckOptions::default())
                .await
                .unwrap();
        }
        assert!(
            poison_deliveries <= 3 * DELIVERY_LIMIT,
            "never dead-lettered"
        );
    }
    poison_deliveries
}

async fn parked(app: &TestApp, query: &str) -> Vec<Value> {
    let (status, body) = app.get_json(&format!("/v1/admin/parked{query}")).await;
    assert_eq!(status, 200, "{body}");
    body["parked"].as_array().unwrap().clone()
}

#[tokio::test]
async fn a_job_past_its_delivery_limit_is_errored_and_can_be_requeued() {
    let app = spawn_app_with(AppOptions {
        background: true,
        ..AppOptions::default()
    })
    .await;
    let hook = WebhookReceiver::start().await;
    let query = format!(
        "?callback_url={}",
        form_urlencoded::byte_serialize(hook.url.as_bytes()).collect::<String>()
    );
    let upload: Value = app
        .upload_zip(
            given_package("poisoned", &["ok", "ok", "ok"], json!({})),
            &query,
        )
        .await
        .json()
        .await
        .unwrap();
    let run_id: Uuid = upload["run_id"].as_str().unwrap().parse().unwrap();
    app.wait_created(run_id).await;
    assert_eq!(app.wait_for_jobs(3).await, 3);
    record_as_worker(
        &app,
        run_id,
        &[
            ("case-000", CaseStatus::Passed, 1.0),
            ("case-002", CaseStatus::Passed, 1.0),
        ],
    )
    .await;
    let delivered = kill_workers_on(&app, "case-001").await;
    assert!(
        delivered > DELIVERY_LIMIT,
        "delivered {delivered} times before the broker parked it"
    );

    // The coordinator drains the parking queue: the case is errored, the run finalises.
    let run = wait_for_verdict(&app, &run_id.to_string()).await;
    assert_eq!(run["status"], "completed");
    assert_eq!(run["verdict"], "fail");
    assert_eq!(run["counters"]["errored"], 1);
    assert_eq!(run["counters"]["passed"], 2);
    let (_, results) = app
        .get_json(&format!("/v1/runs/{run_id}/results?status=errored"))
        .await;
    let errored = &results["results"][0];
    assert_eq!(errored["test_case_id"], "case-001");
    let error = errored["error"].as_str().unwrap();
    assert!(
        error.contains("parked") && error.contains("delivery limit"),
        "the result says why: {error}"
    );
    let report = app
        .get(&format!("/v1/runs/{run_id}/report"))
        .await
        .text()
        .await
        .unwrap();
    assert!(
        report.contains("delivery limit"),
        "the report says why:\n{report}"
    );

    // An operator lists it...
    let listed = parked(&app, "").await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["state"], "errored");
    assert_eq!(listed[0]["run_id"], run_id.to_string());
    assert_eq!(listed[0]["test_case_id"], "case-001");
    assert_eq!(listed[0]["from_queue"], app.topology.jobs_queue());
    assert!(listed[0]["reason"]
        .as_str()
        .unwrap()
        .contains("delivery limit"));
    let doc = doc();
    check_response(
        &doc,
        "get",
        "/v1/admin/parked",
        app.get("/v1/admin/parked").await,
    )
    .await;
    let parked_id = listed[0]["id"].as_str().unwrap().to_string();

    // ...and requeues it: the case is the run's again, the job is published again.
    let requeue = format!("/v1/admin/parked/{parked_id}/requeue");
    let r = app.post_json(&requeue, &json!({})).await;
    assert_eq!(r.status().as_u16(), 202);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["reopened"], true);
    assert_eq!(body["state"], "requeued");
    let (_, reopened) = app.get_json(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(reopened["status"], "running");
    assert!(reopened["verdict"].is_null());
    assert_eq!(reopened["counters"]["completed"], 2);
    assert_eq!(reopened["counters"]["errored"], 0);
    let republished = app.drain_jobs().await;
    assert_eq!(
        republished
            .iter()
            .map(|j| j.case.id.as_str())
            .collect::<Vec<_>>(),
        ["case-001"]
    );
    // A worker runs it this time; the sweep finalises the run again.
    record_as_worker(&app, run_id, &[("case-001", CaseStatus::Passed, 1.0)]).await;
    let run = wait_for_verdict(&app, &run_id.to_string()).await;
    assert_eq!(run["verdict"], "pass");
    assert_eq!(run["counters"]["passed"], 3);
    // Both finalisations were announced, each under its own delivery id.
    let deliveries = hook.wait_for(2, Duration::from_secs(30)).await;
    assert_eq!(deliveries.len(), 2);
    assert_ne!(
        deliveries[0].0["x-skilleval-delivery"],
        deliveries[1].0["x-skilleval-delivery"]
    );

    // Requeued once; not twice. Unknown and malformed ids name the problem.
    let again = app.post_json(&requeue, &json!({})).await;
    assert_eq!(again.status().as_u16(), 409);
    check_response(&doc, "post", "/v1/admin/parked/{id}/requeue", again).await;
    let missing = app
        .post_json(
            &format!("/v1/admin/parked/{}/requeue", Uuid::now_v7()),
            &json!({}),
        )
        .await;
    assert_eq!(missing.status().as_u16(), 404);
    let (status, bad) = app.get_json("/v1/admin/parked?limit=0").await;
    assert_eq!(status, 400);
    assert_eq!(bad["error"]["details"]["field"], "limit");
    assert_eq!(parked(&app, "?state=requeued").await.len(), 1);
    assert_eq!(parked(&app, "?state=errored").await.len(), 0);
    app.cleanup().await;
}

#[tokio::test]
async fn a_message_no_worker_can_read_is_listed_unmatched() {
    let app = spawn_app_with(AppOptions {
        background: true,
        ..AppOptions::default()
    })
    .await;
    // What a worker does with an unparseable delivery: park it with the reason.
    let mut headers = FieldTable::default();
    headers.insert(
        PARKED_REASON_HEADER.into(),
        AMQPValue::LongString(LongString::from("not a job: expected value at line 1")),
    );
    headers.insert(
        PARKED_FROM_HEADER.into(),
        AMQPValue::LongString(LongString::from(app.topology.jobs_queue().as_str())),
    );
    app.channel
        .basic_publish(
            ShortString::from(app.topology.parking_exchange().as_str()),
            ShortString::from(""),
            BasicPublishOptions::default(),
            b"{garbage",
            BasicProperties::default().with_headers(headers),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let mut listed = Vec::new();
    for _ in 0..300 {
        listed = parked(&app, "?state=unmatched").await;
        if !listed.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        listed.len(),
        1,
        "drained into the table (hang guard: waited up to 30 s)"
    );
    assert!(listed[0]["run_id"].is_null());
    assert!(listed[0]["reason"]
        .as_str()
        .unwrap()
        .contains("could not read it (not a job"));
    assert_eq!(
        app.queue_depth(&app.topology.parking_queue()).await,
        0,
        "the parking queue is drained"
    );

    // The same from the command line: list, then requeue (the message goes back to the
    // queue it was parked from, as it was).
    let listed = admin(&app, &["list", "--state", "unmatched"]);
    assert_eq!(listed["parked"].as_array().unwrap().len(), 1, "{listed}");
    let id = listed["parked"][0]["id"].as_str().unwrap().to_string();
    let requeued = admin(&app, &["requeue", &id]);
    assert_eq!(requeued["state"], "requeued");
    assert_eq!(requeued["reopened"], false);
    assert_eq!(app.wait_for_jobs(1).await, 1, "back in the jobs queue");
    let listed = admin(&app, &["list", "--state", "requeued"]);
    assert_eq!(listed["parked"][0]["id"], id.as_str());
    app.cleanup().await;
}

/// `skilleval-coordinator admin parked <args>` against the app's database and broker; its
/// JSON answer.
fn admin(app: &TestApp, args: &[&str]) -> Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_skilleval-coordinator"))
        .args(["admin", "parked"])
        .args(args)
        .env("SKILLEVAL_CONFIG_DIR", "/nonexistent-skilleval-config")
        .env("DATABASE_URL", app.settings.database.url.expose())
        .env("AMQP_URL", app.settings.amqp.url.expose())
        .env("SKILLEVAL__AMQP__PREFIX", &app.settings.amqp.prefix)
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "admin parked {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}
