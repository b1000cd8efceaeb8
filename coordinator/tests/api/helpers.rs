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
use sqlx::{Connection as _, PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The maintenance database (test databases are created and dropped through it).
pub fn admin_url() -> String {
    std::env::var("SKILLEVAL_TEST_ADMIN_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

pub fn amqp_url() -> String {
    std::env::var("SKILLEVAL_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

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
}

impl Default for AppOptions {
    fn default() -> Self {
        AppOptions {
            background: false,
            max_upload_bytes: None,
            publish_grace_secs: 30,
            sweep_interval_secs: 1,
            auth_tokens: Vec::new(),
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
    pub db_name: String,
    pub client: reqwest::Client,
    pub amqp: Connection,
    pub channel: Channel,
    shutdown: CancellationToken,
    server: Option<tokio::task::JoinHandle<()>>,
}

/// The settings of a test coordinator (and of an in-process worker next to it).
pub fn test_settings(db_name: &str, prefix: &str, options: &AppOptions) -> Settings {
    let mut settings = Settings::default();
    let admin = admin_url();
    let base = admin
        .rsplit_once('/')
        .map_or(admin.as_str(), |(b, _)| b)
        .to_string();
    settings.database.url = skilleval_infra::config::SecretUrl::new(format!("{base}/{db_name}"));
    settings.database.max_connections = 8;
    settings.amqp.url = skilleval_infra::config::SecretUrl::new(amqp_url());
    settings.amqp.prefix = prefix.to_string();
    settings.coordinator.bind = "127.0.0.1:0".into();
    settings.coordinator.webhook_secret = Some(Secret::new(WEBHOOK_SECRET));
    settings.coordinator.publish_grace_secs = options.publish_grace_secs;
    settings.coordinator.sweep_interval_secs = options.sweep_interval_secs;
    settings.coordinator.auth_tokens = options.auth_tokens.iter().map(Secret::new).collect();
    if let Some(n) = options.max_upload_bytes {
        settings.coordinator.max_upload_bytes = n;
    }
    settings
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(AppOptions::default()).await
}

pub async fn spawn_app_with(options: AppOptions) -> TestApp {
    init_logs();
    let db_name = format!("skilleval_test_{}", Uuid::new_v4().simple());
    let prefix = format!("test-{}", Uuid::new_v4().simple());
    let mut admin = PgConnection::connect(&admin_url())
        .await
        .expect("connect to the maintenance database");
    let create = format!(r#"CREATE DATABASE "{db_name}""#);
    sqlx::raw_sql(sqlx::AssertSqlSafe(create))
        .execute(&mut admin)
        .await
        .expect("create the test database");
    let settings = test_settings(&db_name, &prefix, &options);
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
        pool: state.pool.clone(),
        state,
        topology: Topology::from_settings(&settings),
        settings,
        db_name,
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("HTTP client"),
        amqp,
        channel,
        shutdown,
        server: Some(server),
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
    /// count may lag a moment).
    pub async fn wait_for_jobs(&self, n: u32) -> u32 {
        let queue = self.topology.jobs_queue();
        let mut depth = 0;
        for _ in 0..50 {
            depth = self.queue_depth(&queue).await;
            if depth == n {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        depth
    }

    /// Takes every message off the jobs queue, decoded.
    pub async fn drain_jobs(&self) -> Vec<skilleval::plan::Job> {
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
        let _ = self.topology.delete(&self.channel).await;
        let _ = self.amqp.close(200, "test done".into()).await;
        self.pool.close().await;
        drop_database(&self.db_name).await;
    }
}

pub async fn drop_database(db_name: &str) {
    if let Ok(mut admin) = PgConnection::connect(&admin_url()).await {
        let drop = format!(r#"DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)"#);
        let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(drop))
            .execute(&mut admin)
            .await;
    }
}

impl Drop for TestApp {
    /// A test that panicked never reached `cleanup`: clean up on a helper thread with its own
    /// runtime (Drop cannot await).
    fn drop(&mut self) {
        if self.server.is_none() {
            return;
        }
        self.shutdown.cancel();
        let db_name = self.db_name.clone();
        let topology = self.topology.clone();
        let settings = self.settings.clone();
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                if let Ok(conn) = topology::connect(&settings, "skilleval-test-cleanup").await {
                    if let Ok(ch) = conn.create_channel().await {
                        let _ = topology.delete(&ch).await;
                    }
                    let _ = conn.close(200, "cleanup".into()).await;
                }
                drop_database(&db_name).await;
            });
        })
        .join();
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

    /// Waits up to `timeout` for at least `n` deliveries, then returns all of them.
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
    outcomes: &[(&str, skilleval::executor::CaseStatus, f64)],
) -> Vec<skilleval_infra::messages::CaseFinished> {
    let store = skilleval_infra::store::Store::from_pool(app.pool.clone());
    let mut results = Vec::new();
    for (case_id, status, score) in outcomes {
        let job: String = sqlx::query_scalar(
            "SELECT job FROM eval_results WHERE run_id = $1 AND test_case_id = $2",
        )
        .bind(run_id)
        .bind(case_id)
        .fetch_one(&app.pool)
        .await
        .expect("the case's job");
        let job: skilleval::plan::Job = serde_json::from_str(&job).expect("a job");
        let mut r = skilleval::executor::JobResult::skipped(&job, "placeholder");
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
