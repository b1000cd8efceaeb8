//! `spawn_app()`: a fresh database, a unique queue prefix, the real coordinator on port 0, and
//! typed helpers to talk to it, look into its database and its queues.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use lapin::options::QueueDeclareOptions;
use lapin::types::{FieldTable, ShortString};
use lapin::{Channel, Connection};
use serde_json::Value;
use skilleval_coordinator::startup::Application;
use skilleval_coordinator::state::AppState;
use skilleval_infra::config::{Secret, Settings};
use skilleval_infra::topology::{self, Topology};
use skilleval_test_support::Scratch;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

pub use skilleval_test_support::amqp_url;

pub const WEBHOOK_SECRET: &str = "test-webhook-secret";

/// How a test wants its coordinator.
#[derive(Debug, Clone)]
pub struct AppOptions {
    /// Run the events consumer and the sweeps in the background.
    pub background: bool,
    pub max_upload_bytes: Option<u64>,
    pub publish_grace_secs: u64,
    pub sweep_interval_secs: u64,
    pub auth_tokens: Vec<String>,
    /// `coordinator.risk`.
    pub risk: skilleval_model::package::risk::RiskPolicy,
    /// Model providers of the coordinator itself (`llm.providers`: the blind comparator).
    pub providers: Option<skilleval_providers::Providers>,
}

impl Default for AppOptions {
    fn default() -> Self {
        AppOptions {
            background: false,
            max_upload_bytes: None,
            publish_grace_secs: 30,
            sweep_interval_secs: 1,
            auth_tokens: Vec::new(),
            risk: skilleval_model::package::risk::RiskPolicy::default(),
            providers: None,
        }
    }
}

/// A running coordinator with its own database and queues.
pub struct TestApp {
    pub address: String,
    pub pool: PgPool,
    pub state: AppState,
    pub settings: Settings,
    pub topology: Topology,
    pub client: reqwest::Client,
    pub amqp: Connection,
    pub channel: Channel,
    shutdown: CancellationToken,
    server: Option<tokio::task::JoinHandle<()>>,
    /// The database and the prefix's queues, removed when the test ends however it ends.
    scratch: Scratch,
}

/// The settings of a test coordinator (and of an in-process worker next to it).
pub fn test_settings(db_name: &str, prefix: &str, options: &AppOptions) -> Settings {
    let mut settings = Settings::default();
    settings.database.url = skilleval_infra::config::SecretUrl::new(format!(
        "{}/{db_name}",
        skilleval_test_support::pg_admin_base()
    ));
    settings.database.max_connections = 8;
    settings.amqp.url = skilleval_infra::config::SecretUrl::new(amqp_url());
    settings.amqp.prefix = prefix.to_string();
    settings.coordinator.bind = "127.0.0.1:0".into();
    settings.coordinator.webhook_secret = Some(Secret::new(WEBHOOK_SECRET));
    settings.coordinator.publish_grace_secs = options.publish_grace_secs;
    settings.coordinator.sweep_interval_secs = options.sweep_interval_secs;
    settings.coordinator.auth_tokens = options.auth_tokens.iter().map(Secret::new).collect();
    settings.coordinator.risk = options.risk;
    // The repository's Zod converter (`npm ci` in tools/zod, as scripts/test.sh does).
    settings.coordinator.zod_dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/zod");
    if let Some(n) = options.max_upload_bytes {
        settings.coordinator.max_upload_bytes = n;
    }
    if let Some(providers) = &options.providers {
        settings.llm.providers = providers.clone();
    }
    settings
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(AppOptions::default()).await
}

pub async fn spawn_app_with(options: AppOptions) -> TestApp {
    spawn_app_configured(options, |_| {}).await
}

/// [`spawn_app_with`], with `configure` changing the settings before the coordinator starts.
pub async fn spawn_app_configured(
    options: AppOptions,
    configure: impl FnOnce(&mut Settings),
) -> TestApp {
    init_logs();
    let mut scratch = Scratch::create().await;
    let mut settings = test_settings(&scratch.db_name, &scratch.prefix, &options);
    configure(&mut settings);
    scratch.owns(Topology::from_settings(&settings));
    let app = Application::build_with(settings.clone(), options.background)
        .await
        .expect("build the coordinator");
    let port = app.port();
    let state = app.state().clone();
    let shutdown = app.shutdown_token();
    let server = tokio::spawn(async move {
        if let Err(e) = app.run_until_stopped().await {
            eprintln!("coordinator stopped with an error: {e:#}");
        }
    });
    let amqp = topology::connect(&settings, "skilleval-coordinator-tests")
        .await
        .expect("connect to RabbitMQ");
    let channel = amqp.create_channel().await.expect("open a channel");
    TestApp {
        address: format!("http://127.0.0.1:{port}"),
        pool: state.store.pool().clone(),
        state,
        topology: Topology::from_settings(&settings),
        settings,
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("HTTP client"),
        amqp,
        channel,
        shutdown,
        server: Some(server),
        scratch,
    }
}

fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TEST_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off")),
        )
        .with_test_writer()
        .try_init();
}

impl TestApp {
    pub async fn upload_zip(&self, zip: Vec<u8>, query: &str) -> reqwest::Response {
        self.client
            .post(format!("{}/v1/skills{query}", self.address))
            .header("Content-Type", "application/zip")
            .body(zip)
            .send()
            .await
            .expect("upload request")
    }

    /// Uploads with a bearer token; the upload's JSON answer.
    pub async fn upload_zip_as(&self, zip: Vec<u8>, token: &str) -> Value {
        self.client
            .post(format!("{}/v1/skills", self.address))
            .header("Content-Type", "application/zip")
            .bearer_auth(token)
            .body(zip)
            .send()
            .await
            .expect("upload request")
            .json()
            .await
            .expect("upload answer")
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client
            .get(format!("{}{path}", self.address))
            .send()
            .await
            .expect("GET request")
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> reqwest::Response {
        self.client
            .post(format!("{}{path}", self.address))
            .json(body)
            .send()
            .await
            .expect("POST request")
    }

    pub async fn get_json(&self, path: &str) -> (u16, Value) {
        let r = self.get(path).await;
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Messages ready on a queue.
    pub async fn queue_depth(&self, queue: &str) -> u32 {
        let q = self
            .channel
            .queue_declare(
                ShortString::from(queue),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("inspect the queue");
        q.message_count()
    }

    /// Polls until the jobs queue holds `n` messages (confirms are in, but a quorum queue's
    /// count may lag a moment); returns the depth it saw last. Gives up after 30 s: a guard
    /// against a hang, which the caller's check of the depth then reports.
    pub async fn wait_for_jobs(&self, n: u32) -> u32 {
        let queue = self.topology.jobs_queue();
        let mut depth = 0;
        for _ in 0..300 {
            depth = self.queue_depth(&queue).await;
            if depth == n {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        depth
    }

    /// Takes every message off the jobs queue, decoded.
    pub async fn drain_jobs(&self) -> Vec<skilleval_execution::plan::Job> {
        let queue = self.topology.jobs_queue();
        let mut jobs = Vec::new();
        while let Some(msg) = self
            .channel
            .basic_get(
                ShortString::from(queue.as_str()),
                lapin::options::BasicGetOptions { no_ack: true },
            )
            .await
            .expect("basic.get")
        {
            jobs.push(
                skilleval_infra::messages::decode_job(&msg.delivery.data).expect("a job message"),
            );
        }
        jobs
    }

    pub async fn count(&self, table: &str) -> i64 {
        let sql = format!("SELECT count(*) FROM {table}");
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(&self.pool)
            .await
            .expect("count rows")
    }

    /// Rows in every table of the schema, by table.
    pub async fn all_counts(&self) -> HashMap<&'static str, i64> {
        let mut counts = HashMap::new();
        for table in [
            "skills",
            "skill_versions",
            "eval_configs",
            "runs",
            "eval_results",
            "samples",
            "comparisons",
        ] {
            counts.insert(table, self.count(table).await);
        }
        counts
    }

    /// Stops the server and removes the database and the queues.
    pub async fn cleanup(mut self) {
        self.teardown().await;
    }

    async fn teardown(&mut self) {
        self.shutdown.cancel();
        if let Some(server) = self.server.take() {
            let _ = tokio::time::timeout(Duration::from_secs(30), server).await;
        }
        let _ = self.amqp.close(200, "test done".into()).await;
        self.pool.close().await;
        self.scratch.remove().await;
    }
}

impl Drop for TestApp {
    /// A test that panicked never reached `cleanup`: stop the server; the scratch's own drop
    /// removes the database and the queues.
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// One webhook request as received: its headers (lowercase names) and body.
pub type Delivery = (HashMap<String, String>, Vec<u8>);

/// A tiny HTTP server that records webhook deliveries.
pub struct WebhookReceiver {
    pub url: String,
    pub received: Arc<tokio::sync::Mutex<Vec<Delivery>>>,
    shutdown: CancellationToken,
}

impl WebhookReceiver {
    pub async fn start() -> WebhookReceiver {
        use axum::routing::post;
        let received: Arc<tokio::sync::Mutex<Vec<Delivery>>> = Arc::default();
        let store = received.clone();
        let app = axum::Router::new().route(
            "/hook",
            post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                    let store = store.clone();
                    async move {
                        let headers = headers
                            .iter()
                            .map(|(k, v)| {
                                (
                                    k.as_str().to_string(),
                                    v.to_str().unwrap_or_default().to_string(),
                                )
                            })
                            .collect();
                        store.lock().await.push((headers, body.to_vec()));
                        axum::http::StatusCode::NO_CONTENT
                    }
                },
            ),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the webhook receiver");
        let port = listener.local_addr().expect("address").port();
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await;
        });
        WebhookReceiver {
            url: format!("http://127.0.0.1:{port}/hook"),
            received,
            shutdown,
        }
    }

    /// Waits up to `timeout` for at least `n` deliveries, then returns all of them. The
    /// timeout is a guard against a hang (give 30 s or more): callers check the count.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Delivery> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let got = self.received.lock().await.clone();
            if got.len() >= n || tokio::time::Instant::now() >= deadline {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for WebhookReceiver {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Plays a worker: records a result for each listed case of the run (as the worker's store
/// call does) and returns the events a worker would publish.
pub async fn record_as_worker(
    app: &TestApp,
    run_id: Uuid,
    outcomes: &[(&str, skilleval_execution::result::CaseStatus, f64)],
) -> Vec<skilleval_infra::messages::CaseFinished> {
    let store = skilleval_infra::store::Store::from_pool(app.pool.clone());
    let jobs = planned_jobs(app, run_id).await;
    let mut results = Vec::new();
    for (case_id, status, score) in outcomes {
        let job = jobs
            .iter()
            .find(|j| j.case.id == *case_id)
            .expect("the case is planned");
        let mut r = skilleval_execution::result::JobResult::skipped(job, "placeholder");
        r.status = *status;
        r.score = Some(*score);
        r.details = serde_json::json!({ "simulated": true });
        results.push(r);
    }
    let changed = store
        .record_results(&results)
        .await
        .expect("record results");
    changed
        .into_iter()
        .map(|c| skilleval_infra::messages::CaseFinished {
            run_id: c.run_id,
            test_case_id: c.test_case_id,
            status: c.status,
        })
        .collect()
}

impl TestApp {
    /// Waits until the run's creation pass is over (status no longer `creating`).
    pub async fn wait_created(&self, run_id: Uuid) {
        for _ in 0..1_500 {
            let status: String = sqlx::query_scalar("SELECT status FROM runs WHERE id = $1")
                .bind(run_id)
                .fetch_one(&self.pool)
                .await
                .expect("the run's status");
            if status != "creating" {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("hang guard: run {run_id} still creating after 30 s");
    }
}

/// The run's jobs as its plan gives them (what the coordinator publishes).
pub async fn planned_jobs(app: &TestApp, run_id: Uuid) -> Vec<skilleval_execution::plan::Job> {
    app.state
        .planner
        .plan_of(run_id)
        .await
        .expect("the run's plan")
        .all()
        .await
        .expect("the plan's jobs")
}

/// Serves `router` (a local model server speaking a provider's protocol) on a free port of
/// 127.0.0.1 until the returned task is aborted.
pub async fn serve_local(
    router: axum::Router,
) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    (addr, task)
}

/// An OpenAI-compatible provider `name` serving `model` at the local server `addr`.
pub fn local_provider(
    addr: std::net::SocketAddr,
    name: &str,
    model: &str,
) -> skilleval_providers::ProviderConfig {
    skilleval_providers::ProviderConfig {
        base_url: format!("http://{addr}/v1"),
        ..skilleval_providers::ProviderConfig::new(
            name,
            skilleval_providers::ProviderKind::Openai,
            model,
        )
    }
}

/// `config` as the only provider, the default one.
pub fn only_provider(
    config: skilleval_providers::ProviderConfig,
) -> skilleval_providers::Providers {
    let mut providers = skilleval_providers::Providers::default();
    providers.insert(config, true);
    providers
}
