//! `deploy/monitoring/`: promtool accepts the alert rules and their unit tests pass, and every
//! metric the rules and the Grafana dashboard name is exported by the real coordinator and
//! worker (scraped from their `/metrics`).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use serde_json::{json, Value};
use skilleval_infra::store::Store;
use skilleval_providers::{ProviderConfig, ProviderKind, Providers};
use tokio_util::sync::CancellationToken;

use crate::e2e::wait_for_verdict;
use crate::helpers::{spawn_app_with, AppOptions};
use crate::packages::given_package;

fn monitoring_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring")
}

fn promtool(args: &[&str]) -> std::process::Output {
    Command::new("promtool")
        .args(args)
        .current_dir(monitoring_dir())
        .output()
        .expect("promtool is not installed: install Debian's `prometheus` package (scripts/test.sh does)")
}

#[test]
fn alert_rules_pass_promtool_check_and_their_unit_tests() {
    for args in [
        &["check", "rules", "alerts.yaml"][..],
        &["test", "rules", "alerts.test.yaml"][..],
    ] {
        let out = promtool(args);
        assert!(
            out.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The `skilleval_*` names in a PromQL expression.
fn metric_names(expr: &str, into: &mut BTreeSet<String>) {
    let mut rest = expr;
    while let Some(at) = rest.find("skilleval_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        into.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
}

/// Every metric the alert rules and the dashboard's queries name.
fn referenced_metrics() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let rules: serde_yaml_ng::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(monitoring_dir().join("alerts.yaml")).unwrap(),
    )
    .unwrap();
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            metric_names(rule["expr"].as_str().unwrap(), &mut names);
        }
    }
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(monitoring_dir().join("grafana-dashboard.json")).unwrap(),
    )
    .unwrap();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            metric_names(target["expr"].as_str().unwrap(), &mut names);
        }
    }
    names
}

/// The sample names a `/metrics` text exports: those present, and those every declared
/// family will have (a counter's `_total`, a histogram's `_bucket`, `_sum`, `_count`), so a
/// family without a labelled child yet still counts as exported.
fn exported_metrics(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(decl) = line.strip_prefix("# TYPE ") {
            let mut parts = decl.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            match kind {
                "counter" => {
                    names.insert(format!("{}_total", name.trim_end_matches("_total")));
                }
                "histogram" => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        names.insert(format!("{name}{suffix}"));
                    }
                }
                _ => {
                    names.insert(name.to_string());
                }
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_string());
        }
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_the_rules_name_is_exported() {
    let app = spawn_app_with(AppOptions {
        background: true,
        ..AppOptions::default()
    })
    .await;
    // A worker as deployed, with a model provider configured (it is never called here) so its
    // provider metrics exist.
    let mut settings = app.settings.clone();
    let mut providers = Providers::default();
    providers.insert(
        ProviderConfig {
            base_url: "http://127.0.0.1:9/v1".into(),
            ..ProviderConfig::new("local", ProviderKind::Openai, "some-model")
        },
        true,
    );
    settings.llm.providers = providers;
    settings.worker.http_port = 0;
    let cache = tempfile::tempdir().unwrap();
    settings.worker.package_cache_dir = cache.path().to_path_buf();
    let store = Store::connect(&settings.database).await.unwrap();
    let worker = Arc::new(skilleval_worker::Worker::new(settings, store).unwrap());
    let stop = CancellationToken::new();
    let (addr, http) = worker.serve_http(stop.clone()).await.unwrap();
    let running = tokio::spawn({
        let worker = worker.clone();
        let stop = stop.clone();
        async move { worker.run(stop).await }
    });

    // One run through both, so the families whose children appear with work (latencies by
    // route, grader time by strategy) have them, as they do in production.
    let zip = given_package("monitored", &["ok", "ok", "no"], json!({}));
    let upload: Value = app.upload_zip(zip, "").await.json().await.unwrap();
    let run_id = upload["run_id"].as_str().expect("a run").to_string();
    wait_for_verdict(&app, &run_id).await;

    let coordinator_text = app.get("/metrics").await.text().await.unwrap();
    let worker_text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let coordinator = exported_metrics(&coordinator_text);
    let worker_names = exported_metrics(&worker_text);
    assert!(coordinator.contains("skilleval_coordinator_queue_messages_ready"));
    assert!(worker_names.contains("skilleval_worker_provider_requests_total"));
    // Every job carries its publish time, so each delivery's wait is recorded.
    let waits = worker_text
        .lines()
        .find(|l| l.starts_with("skilleval_worker_queue_wait_seconds_count{lane=\"ci\"}"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|n| n.parse::<f64>().ok());
    assert!(waits.is_some_and(|n| n >= 3.0), "{worker_text}");

    let referenced = referenced_metrics();
    assert!(referenced.len() > 20, "{referenced:?}");
    let missing: Vec<&String> = referenced
        .iter()
        .filter(|n| !coordinator.contains(*n) && !worker_names.contains(*n))
        .collect();
    assert!(
        missing.is_empty(),
        "named in deploy/monitoring but exported by neither process: {missing:?}"
    );

    stop.cancel();
    let _ = running.await;
    let _ = http.await;
}
