//! Web interface page loads (issue 21): how long the run page and its variants take for a
//! 1,000-case and a 10,000-case run.
//!
//! Run with `cargo run --release -p skilleval-bench --bin ui_bench -- [--cases 1000,10000]
//! [--samples 20]`.
//!
//! Against the PostgreSQL and RabbitMQ of this machine (`SKILLEVAL_BENCH_PG`,
//! `SKILLEVAL_BENCH_AMQP`, as the other benchmarks), in a database and queue prefix of its
//! own, removed at the end. A coordinator and a worker run as child processes (this program
//! re-run as `coordinator` / `worker`, as the pipeline benchmark does). For each size N a
//! `given` package of N cases (a third failing, scores spread over [0, 1] by a keyword
//! coverage grader, three tags, two suites of half the cases each) is uploaded and run to completion; then each page
//! is requested `--samples` times over one keep-alive connection and the wall time from request
//! to the last byte of the body is printed as median and p95, with the body size. Pages: the
//! run page (first page of 100 rows, histogram, summary), filtered to failures, sorted by
//! score, page 50 (or the last), a case page, the skills list and the skill page.

use std::io::{Cursor, Write as _};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde_json::{json, Value};
use skilleval_bench::cluster::{self, amqp_url, Proc};
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, ZipWriter};

struct Options {
    cases: Vec<usize>,
    samples: usize,
}

fn options() -> anyhow::Result<Options> {
    let mut o = Options {
        cases: vec![1_000, 10_000],
        samples: 20,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--cases" => {
                o.cases = value()?
                    .split(',')
                    .map(|s| s.trim().parse::<usize>().context("--cases: whole numbers"))
                    .collect::<anyhow::Result<_>>()?;
            }
            "--samples" => o.samples = value()?.parse().context("--samples: a whole number")?,
            other => bail!("unknown argument {other}"),
        }
    }
    Ok(o)
}

fn main() -> anyhow::Result<()> {
    if let Some(outcome) = cluster::child_main() {
        return outcome;
    }
    let opts = options()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(cluster::in_scratch(
        "uibench",
        |db_url, prefix| async move {
            let cache = tempfile::tempdir()?;
            bench(&opts, &db_url, &prefix, cache.path()).await
        },
    ))
}

fn package(name: &str, cases: usize) -> anyhow::Result<Vec<u8>> {
    let words = [
        "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
    ];
    let tests: Vec<Value> = (0..cases)
        .map(|i| {
            // Case i mentions (i % 11) of the ten keywords: scores 0.0, 0.1, ... 1.0.
            let output = words[..(i % 11).min(10)].join(" ");
            let tag = ["math", "text", "edge"][i % 3];
            json!({
                "id": format!("case-{i:06}"),
                "name": format!("Case {i}"),
                "tags": [tag],
                "input": {"prompt": "list the keywords"},
                "given": {"output": output},
                "evaluation": {"strategy": "keyword_coverage",
                               "options": {"keywords": words, "threshold": 0.4}},
            })
        })
        .collect();
    // Two suites: the even cases and the odd ones.
    let ids = |parity: usize| -> Vec<String> {
        (0..cases)
            .filter(|i| i % 2 == parity)
            .map(|i| format!("case-{i:06}"))
            .collect()
    };
    let tests = json!({"version": "2.0", "settings": {"runner": "given"}, "testCases": tests,
                       "suites": [{"name": "smoke", "testIds": ids(0)}, {"name": "full", "testIds": ids(1)}]});
    let skill = format!("---\nname: {name}\ndescription: Keyword lists, for the page-load benchmark.\n---\n\nList them.\n");
    let mut w = ZipWriter::new(Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default().compression_method(CompressionMethod::Deflated);
    w.start_file("SKILL.md", options)?;
    w.write_all(skill.as_bytes())?;
    w.start_file("eval/tests.json", options)?;
    w.write_all(&serde_json::to_vec(&tests)?)?;
    Ok(w.finish()?.into_inner())
}

async fn run_to_completion(
    http: &reqwest::Client,
    base: &str,
    zip: Vec<u8>,
) -> anyhow::Result<(String, Duration)> {
    let started = Instant::now();
    let response = http
        .post(format!("{base}/v1/skills"))
        .header("Content-Type", "application/zip")
        .body(zip)
        .send()
        .await?;
    let body = cluster::expect_status(response, 201, "the upload").await?;
    let run_id = body["run_id"].as_str().context("no run")?.to_string();
    loop {
        let run: Value = http
            .get(format!("{base}/v1/runs/{run_id}"))
            .send()
            .await?
            .json()
            .await?;
        if run["verdict"].is_string() {
            return Ok((run_id, started.elapsed()));
        }
        if started.elapsed() > Duration::from_secs(1_800) {
            bail!("the run did not finish in 30 minutes: {run}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Median and p95 (nearest rank) of the times, and the body size.
async fn time_page(
    http: &reqwest::Client,
    url: &str,
    samples: usize,
) -> anyhow::Result<(f64, f64, usize)> {
    let mut times = Vec::with_capacity(samples);
    let mut size = 0;
    // One untimed request: connection set up, statement caches warm.
    http.get(url).send().await?.bytes().await?;
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
    Ok((rank(0.5), rank(0.95), size))
}

async fn bench(
    opts: &Options,
    db_url: &str,
    prefix: &str,
    cache: &std::path::Path,
) -> anyhow::Result<()> {
    let env: Vec<(String, String)> = [
        ("DATABASE_URL", db_url.to_string()),
        ("AMQP_URL", amqp_url()),
        ("SKILLEVAL__AMQP__PREFIX", prefix.to_string()),
        ("SKILLEVAL__COORDINATOR__BIND", "127.0.0.1:0".into()),
        ("SKILLEVAL__WORKER__HTTP_PORT", "0".into()),
        ("SKILLEVAL__WORKER__CONCURRENCY", "64".into()),
        (
            "SKILLEVAL__WORKER__PACKAGE_CACHE_DIR",
            cache.display().to_string(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let (_coordinator, port) = Proc::spawn("coordinator", &env)?;
    let base = format!("http://127.0.0.1:{}", port.context("no port")?);
    let _worker = Proc::spawn("worker", &env)?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(1)
        .build()?;
    println!(
        "ui_bench: {} samples per page, {} cores, times from request to the body's last byte",
        opts.samples,
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get)
    );
    for &n in &opts.cases {
        let name = format!("pages-{n}");
        let (run_id, took) = run_to_completion(&http, &base, package(&name, n)?).await?;
        println!("\n{n} cases: run completed in {:.1} s", took.as_secs_f64());
        let last_page = n.div_ceil(100).min(50);
        let pages = [
            (
                "run page (first 100 rows, summary, histogram)",
                format!("/ui/runs/{run_id}"),
            ),
            (
                "run page, failures only",
                format!("/ui/runs/{run_id}?status=failed"),
            ),
            (
                "run page, sorted by score",
                format!("/ui/runs/{run_id}?sort=-score"),
            ),
            (
                "run page, tag + suite filter",
                format!("/ui/runs/{run_id}?tag=math&suite=full"),
            ),
            (
                &*Box::leak(format!("run page, page {last_page}").into_boxed_str()),
                format!("/ui/runs/{run_id}?page={last_page}"),
            ),
            ("case page", format!("/ui/runs/{run_id}/cases/{}", n / 2)),
            ("skills list", "/ui/".to_string()),
            ("skill page", format!("/ui/skills/{name}")),
        ];
        println!(
            "{:<48} {:>10} {:>10} {:>10}",
            "page", "median ms", "p95 ms", "bytes"
        );
        for (label, path) in pages {
            let (median, p95, size) =
                time_page(&http, &format!("{base}{path}"), opts.samples).await?;
            println!("{label:<48} {median:>10.1} {p95:>10.1} {size:>10}");
        }
    }
    Ok(())
}
