//! API answer times (issue 30): p50 and p99 of every non-evaluation GET with 10,000 runs and
//! 1,000,000 results stored, against the report spec seed's targets (200 ms per answer; a
//! report over fewer than 100 runs in 1 s), and whether any of them scanned the results table.
//!
//! Run with `cargo run --release -p skilleval-bench --bin api_bench -- [--runs 10000]
//! [--cases 100] [--skills 100] [--samples 200]`.
//!
//! Against this machine's PostgreSQL and RabbitMQ (`SKILLEVAL_BENCH_PG`, `SKILLEVAL_BENCH_AMQP`,
//! as the other benchmarks), in a database and a queue prefix of its own, removed at the end.
//! The coordinator runs in this process. `--skills` skills are uploaded through the API (a
//! `given` package of `--cases` cases each, two versions for the first); the first version's
//! run is recorded as a worker records it and finalised. That run is then copied, results and
//! all, until `--runs` runs exist, spread over every version, two days apart down to a minute,
//! with scores, verdicts and kinds varied (SQL here, as the pipeline benchmark seeds its own
//! tables: the service's statements stay in `infra/src/store`). After `ANALYZE`, each GET is
//! timed `--samples` times over one keep-alive connection, from request to the body's last
//! byte. `pg_stat_user_tables` counts the sequential scans of `eval_results` around the timed
//! requests: the figure printed must be 0.

use std::io::{Cursor, Write as _};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde_json::{json, Value};
use skilleval_bench::cluster::{self, amqp_url};
use skilleval_coordinator::startup::Application;
use skilleval_execution::result::{CaseStatus, JobResult};
use skilleval_infra::config::{SecretUrl, Settings};
use skilleval_infra::store::Store;
use sqlx::{AssertSqlSafe, PgPool};
use uuid::Uuid;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipWriter};

struct Options {
    runs: usize,
    cases: usize,
    skills: usize,
    samples: usize,
}

fn options() -> anyhow::Result<Options> {
    let mut o = Options {
        runs: 10_000,
        cases: 100,
        skills: 100,
        samples: 200,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || -> anyhow::Result<usize> {
            args.next()
                .with_context(|| format!("{a} needs a value"))?
                .parse()
                .with_context(|| format!("{a}: a whole number"))
        };
        match a.as_str() {
            "--runs" => o.runs = value()?,
            "--cases" => o.cases = value()?,
            "--skills" => o.skills = value()?,
            "--samples" => o.samples = value()?,
            other => bail!("unknown argument {other}"),
        }
    }
    if o.runs < 2 || o.cases < 1 || o.skills < 1 || o.samples < 1 {
        bail!("--runs must be at least 2, the others at least 1");
    }
    Ok(o)
}

fn main() -> anyhow::Result<()> {
    let opts = options()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(cluster::in_scratch(
        "apibench",
        |db_url, prefix| async move { Box::pin(bench(&opts, &db_url, &prefix)).await },
    ))
}

/// A `given` package: `cases` cases graded by exact match, a third of them failing.
fn package(name: &str, body: &str, cases: usize) -> anyhow::Result<Vec<u8>> {
    let tests: Vec<Value> = (0..cases)
        .map(|i| {
            let tag = ["math", "text", "edge"][i % 3];
            let output = if i % 3 == 0 { "no" } else { "ok" };
            json!({
                "id": format!("case-{i:04}"),
                "name": format!("Case {i}"),
                "tags": [tag],
                "input": {"prompt": "say ok"},
                "expected": {"output": "ok"},
                "given": {"output": output},
                "evaluation": {"strategy": "exact_match"},
            })
        })
        .collect();
    let profile = ["deterministic", "structured", "flexible"][name.len() % 3];
    let tests = json!({"version": "2.0", "profile": profile,
                       "settings": {"runner": "given", "passThreshold": 0.5}, "testCases": tests});
    let skill = format!(
        "---\nname: {name}\ndescription: Answers ok, for the API latency benchmark ({name}).\n---\n\n{body}\n"
    );
    let mut w = ZipWriter::new(Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default().compression_method(CompressionMethod::Deflated);
    w.start_file("SKILL.md", options)?;
    w.write_all(skill.as_bytes())?;
    w.start_file("eval/tests.json", options)?;
    w.write_all(&serde_json::to_vec(&tests)?)?;
    Ok(w.finish()?.into_inner())
}

async fn upload(
    http: &reqwest::Client,
    base: &str,
    zip: Vec<u8>,
    run: bool,
) -> anyhow::Result<Value> {
    let query = if run { "" } else { "?run=false" };
    let response = http
        .post(format!("{base}/v1/skills{query}"))
        .header("Content-Type", "application/zip")
        .body(zip)
        .send()
        .await?;
    cluster::expect_status(response, 201, "the upload").await
}

/// The columns of `table`, in order.
async fn columns(pool: &PgPool, table: &str) -> anyhow::Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT column_name::text FROM information_schema.columns
         WHERE table_schema = 'public' AND table_name = $1 ORDER BY ordinal_position",
    )
    .bind(table)
    .fetch_all(pool)
    .await?)
}

/// `cols` as a select list, each overridden column replaced by its expression.
fn select_list(cols: &[String], overrides: &[(&str, &str)]) -> String {
    cols.iter()
        .map(|c| {
            overrides
                .iter()
                .find(|(name, _)| name == c)
                .map_or_else(|| format!("t.\"{c}\""), |(_, e)| (*e).to_string())
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Copies the template run (with its results) until `total` runs exist.
async fn seed(
    pool: &PgPool,
    template: Uuid,
    total: usize,
    versions: &[Uuid],
) -> anyhow::Result<()> {
    let run_cols = columns(pool, "runs").await?;
    let result_cols = columns(pool, "eval_results").await?;
    let quoted = |cols: &[String]| {
        cols.iter()
            .map(|c| format!("\"{c}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    // Run i: a version in turn, created i minutes before now, a mean score of (i % 101) / 100,
    // a tenth manual, a third failing, one in fifty still running (no summary, not finalised).
    let runs_sql = format!(
        "INSERT INTO runs ({}) SELECT {} FROM runs t, unnest($2::uuid[], $3::int[]) AS g(id, i)
         WHERE t.id = $1",
        quoted(&run_cols),
        select_list(
            &run_cols,
            &[
                ("id", "g.id"),
                ("version_id", "($4::uuid[])[1 + g.i % cardinality($4::uuid[])]"),
                ("idempotency_key", "NULL"),
                ("created_at", "now() - make_interval(mins => g.i)"),
                ("kind", "CASE WHEN g.i % 10 = 0 THEN 'manual' ELSE t.kind END"),
                ("status", "CASE WHEN g.i % 50 = 0 THEN 'running' ELSE t.status END"),
                ("finalised", "g.i % 50 <> 0"),
                ("verdict", "CASE WHEN g.i % 50 = 0 THEN NULL WHEN g.i % 3 = 0 THEN 'fail' ELSE 'pass' END"),
                (
                    "summary",
                    "CASE WHEN g.i % 50 = 0 THEN NULL ELSE jsonb_set(jsonb_set(t.summary, '{mean}', to_jsonb((g.i % 101) / 100.0)), '{verdict}', to_jsonb(CASE WHEN g.i % 3 = 0 THEN 'fail' ELSE 'pass' END)) END",
                ),
            ],
        )
    );
    let results_sql = format!(
        "INSERT INTO eval_results ({}) SELECT {} FROM eval_results t, unnest($2::uuid[]) AS g(id)
         WHERE t.run_id = $1",
        quoted(&result_cols),
        select_list(&result_cols, &[("run_id", "g.id")])
    );
    let batch = 200;
    let started = Instant::now();
    let mut made = 1;
    while made < total {
        let n = batch.min(total - made);
        let ids: Vec<Uuid> = (0..n).map(|_| Uuid::now_v7()).collect();
        let idx: Vec<i32> = (made..made + n)
            .map(|i| i32::try_from(i).unwrap_or(i32::MAX))
            .collect();
        let mut tx = pool.begin().await?;
        sqlx::query(AssertSqlSafe(runs_sql.clone()))
            .bind(template)
            .bind(&ids)
            .bind(&idx)
            .bind(versions)
            .execute(&mut *tx)
            .await
            .context("copying runs")?;
        sqlx::query(AssertSqlSafe(results_sql.clone()))
            .bind(template)
            .bind(&ids)
            .execute(&mut *tx)
            .await
            .context("copying results")?;
        tx.commit().await?;
        made += n;
        if made % 2_000 < batch {
            eprintln!(
                "  {made} runs stored ({:.0} s)",
                started.elapsed().as_secs_f64()
            );
        }
    }
    sqlx::query("ANALYZE").execute(pool).await?;
    Ok(())
}

/// Sequential scans of `eval_results` so far (after the backends' statistics were flushed:
/// a backend reports them when idle, at most once a second).
async fn results_seq_scans(pool: &PgPool) -> anyhow::Result<i64> {
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let mut conn = pool.acquire().await?;
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(&mut *conn)
        .await?;
    Ok(sqlx::query_scalar(
        "SELECT COALESCE(seq_scan, 0) FROM pg_stat_user_tables WHERE relname = 'eval_results'",
    )
    .fetch_one(&mut *conn)
    .await?)
}

/// p50 and p99 (nearest rank) of `samples` requests, and the last body's size.
async fn time_get(
    http: &reqwest::Client,
    url: &str,
    samples: usize,
) -> anyhow::Result<(f64, f64, usize)> {
    // One untimed request: the connection and the statement caches warm.
    let warm = http.get(url).send().await?;
    if !warm.status().is_success() {
        bail!("{url}: {}", warm.status());
    }
    warm.bytes().await?;
    let mut times = Vec::with_capacity(samples);
    let mut size = 0;
    for _ in 0..samples {
        let started = Instant::now();
        let response = http.get(url).send().await?;
        let status = response.status();
        let body = response.bytes().await?;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
        if !status.is_success() {
            bail!("{url}: {status}");
        }
        size = body.len();
    }
    times.sort_by(f64::total_cmp);
    let rank = |p: f64| times[((p * times.len() as f64).ceil() as usize).clamp(1, times.len()) - 1];
    Ok((rank(0.5), rank(0.99), size))
}

async fn bench(opts: &Options, db_url: &str, prefix: &str) -> anyhow::Result<()> {
    let mut settings = Settings::default();
    settings.database.url = SecretUrl::new(db_url);
    settings.database.max_connections = 16;
    settings.amqp.url = SecretUrl::new(amqp_url());
    settings.amqp.prefix = prefix.to_string();
    settings.coordinator.bind = "127.0.0.1:0".into();
    settings.log.filter = "warn".into();
    let app = Application::build_with(settings, false).await?;
    let base = format!("http://127.0.0.1:{}", app.port());
    let state = app.state().clone();
    let shutdown = app.shutdown_token();
    let server = tokio::spawn(app.run_until_stopped());
    let outcome = measure(opts, &base, &state).await;
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(30), server).await;
    outcome
}

async fn measure(
    opts: &Options,
    base: &str,
    state: &skilleval_coordinator::state::AppState,
) -> anyhow::Result<()> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()?;
    let store: &Store = &state.store;
    let pool = store.pool().clone();
    eprintln!("uploading {} skills of {} cases", opts.skills, opts.cases);
    let first = upload(
        &http,
        base,
        package("bench-skill-0000", "Say ok.", opts.cases)?,
        true,
    )
    .await?;
    let template: Uuid = first["run_id"].as_str().context("no run")?.parse()?;
    for i in 1..opts.skills {
        upload(
            &http,
            base,
            package(&format!("bench-skill-{i:04}"), "Say ok.", opts.cases)?,
            false,
        )
        .await?;
    }
    // A second version of the first skill, for its history.
    upload(
        &http,
        base,
        package("bench-skill-0000", "Say ok, version two.", opts.cases)?,
        false,
    )
    .await?;
    // The template run, recorded as a worker records it.
    let started = Instant::now();
    loop {
        let status: String = sqlx::query_scalar("SELECT status FROM runs WHERE id = $1")
            .bind(template)
            .fetch_one(&pool)
            .await?;
        if status != "creating" {
            break;
        }
        if started.elapsed() > Duration::from_secs(120) {
            bail!("the template run was still being created after 2 minutes");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let jobs = state.planner.plan_of(template).await?.all().await?;
    let results: Vec<JobResult> = jobs
        .iter()
        .map(|job| {
            let mut r = JobResult::skipped(job, "recorded by the benchmark");
            let passed = job.case_index % 3 != 0;
            r.status = if passed {
                CaseStatus::Passed
            } else {
                CaseStatus::Failed
            };
            r.score = Some(if passed { 1.0 } else { 0.0 });
            r.output = Some(if passed { "ok".into() } else { "no".into() });
            r
        })
        .collect();
    store.record_results(&results).await?;
    if !state.aggregator.finalise(template).await? {
        bail!("the template run did not finalise");
    }
    let versions: Vec<Uuid> =
        sqlx::query_scalar("SELECT id FROM skill_versions ORDER BY created_at, id")
            .fetch_all(&pool)
            .await?;
    eprintln!(
        "copying the run until {} runs ({} results) are stored",
        opts.runs,
        opts.runs * opts.cases
    );
    let seeding = Instant::now();
    seed(&pool, template, opts.runs, &versions).await?;
    let (runs, results): (i64, i64) =
        sqlx::query_as("SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM eval_results)")
            .fetch_one(&pool)
            .await?;
    eprintln!(
        "stored {runs} runs and {results} results in {:.0} s",
        seeding.elapsed().as_secs_f64()
    );

    // A report over 100 runs (a write, timed apart) and what the GETs name.
    let some_runs: Vec<Uuid> = sqlx::query_scalar(
        "SELECT r.id FROM runs r JOIN skill_versions v ON v.id = r.version_id JOIN skills s ON s.id = v.skill_id
         WHERE s.name = 'bench-skill-0000' AND r.status = 'completed' ORDER BY r.created_at DESC LIMIT 99",
    )
    .fetch_all(&pool)
    .await?;
    let mut report_ms = Vec::new();
    let mut report_id = String::new();
    for _ in 0..opts.samples.min(20) {
        let started = Instant::now();
        let response = http
            .post(format!("{base}/v1/reports"))
            .json(&json!({ "skill": "bench-skill-0000", "run_ids": some_runs, "format": "json" }))
            .send()
            .await?;
        let body = cluster::expect_status(response, 201, "the report").await?;
        report_ms.push(started.elapsed().as_secs_f64() * 1000.0);
        report_id = body["id"].as_str().context("no report id")?.to_string();
    }
    report_ms.sort_by(f64::total_cmp);
    let page2: Value = http
        .get(format!("{base}/v1/runs?limit=50"))
        .send()
        .await?
        .json()
        .await?;
    let cursor = page2["next_cursor"]
        .as_str()
        .context("no second page")?
        .to_string();

    let run = template;
    let gets: Vec<(&str, String, f64)> = vec![
        ("skills list", "/v1/skills".into(), 200.0),
        ("skills list, sort=pass_rate", "/v1/skills?sort=pass_rate".into(), 200.0),
        ("skills list, search + filters", "/v1/skills?search=skill-00&verdict=pass&profile=deterministic".into(), 200.0),
        ("skills list, sort=updated&order=asc", "/v1/skills?sort=updated&order=asc".into(), 200.0),
        ("runs list", "/v1/runs".into(), 200.0),
        ("runs list, page 2", format!("/v1/runs?limit=50&cursor={cursor}"), 200.0),
        ("runs list, sort=score", "/v1/runs?sort=score".into(), 200.0),
        ("runs list, skill + status", "/v1/runs?skill=bench-skill-0042&status=completed".into(), 200.0),
        ("runs list, kind + verdict", "/v1/runs?kind=manual&verdict=fail".into(), 200.0),
        ("runs list, created range", "/v1/runs?created_after=2000-01-01T00:00:00Z&created_before=2100-01-01T00:00:00Z&sort=created&order=asc".into(), 200.0),
        ("run view", format!("/v1/runs/{run}"), 200.0),
        ("results page (100)", format!("/v1/runs/{run}/results"), 200.0),
        ("results page, status=failed", format!("/v1/runs/{run}/results?status=failed"), 200.0),
        ("run report (json)", format!("/v1/runs/{run}/report?format=json"), 200.0),
        ("versions", "/v1/skills/bench-skill-0000/versions".into(), 200.0),
        ("history", "/v1/skills/bench-skill-0000/history".into(), 200.0),
        ("quality", "/v1/skills/bench-skill-0000/quality".into(), 200.0),
        ("report over 99 runs (stored)", format!("/v1/reports/{report_id}?format=json"), 200.0),
    ];
    let scans_before = results_seq_scans(&pool).await?;
    println!(
        "\n{runs} runs, {results} results; {} samples per GET over one keep-alive connection\n",
        opts.samples
    );
    println!(
        "{:<40} {:>9} {:>9} {:>9} {:>8}  target",
        "GET", "p50 ms", "p99 ms", "bytes", ""
    );
    for (name, path, target) in &gets {
        let (p50, p99, size) = time_get(&http, &format!("{base}{path}"), opts.samples).await?;
        let verdict = if p99 < *target { "ok" } else { "OVER" };
        println!("{name:<40} {p50:>9.2} {p99:>9.2} {size:>9} {verdict:>8}  {target:.0} ms");
    }
    let scans_after = results_seq_scans(&pool).await?;
    let rank = |p: f64| {
        report_ms[((p * report_ms.len() as f64).ceil() as usize).clamp(1, report_ms.len()) - 1]
    };
    println!(
        "{:<40} {:>9.2} {:>9.2} {:>9} {:>8}  1000 ms ({} samples)",
        "POST /v1/reports over 99 runs",
        rank(0.5),
        rank(0.99),
        "",
        if rank(0.99) < 1000.0 { "ok" } else { "OVER" },
        report_ms.len()
    );
    println!(
        "\nsequential scans of eval_results during the timed GETs: {}",
        scans_after - scans_before
    );
    Ok(())
}
