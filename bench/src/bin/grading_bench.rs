//! Grading throughput of the deterministic strategies, single-threaded.
//!
//! Run with `cargo run --release -p skilleval-bench --bin grading_bench`. Each strategy
//! compiles one case once, then grades a ~1 KB output repeatedly on a current-thread tokio
//! runtime for about a second (at most 200,000 times), and prints `strategy cases/s`.
//! Targets: >= 100,000 cases/s for exact_match, regex_match and contains; >= 30,000 for
//! json_schema.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use skilleval_grading::{CompileContext, GradeEnv, GradeInput, StrategyRegistry};
use skilleval_model::definition::{Profile, TestCase};
use skilleval_sandbox::Sandbox;

const MAX_ITERATIONS: u64 = 200_000;
const BUDGET: Duration = Duration::from_secs(1);

/// About 1 KB of prose.
fn text() -> String {
    let sentence = "Your refund for order 4217 was approved on 2024-05-03 and the total of $129.99 will reach your card within five business days. ";
    let mut s = String::new();
    while s.len() < 1000 {
        s.push_str(sentence);
    }
    s.trim_end().to_string()
}

/// A nested order document of about 1 KB.
fn order_instance() -> Value {
    let items: Vec<Value> = (0..8)
        .map(|i| {
            json!({
                "sku": format!("SKU-{i:04}"),
                "name": format!("Widget number {i}"),
                "quantity": i + 1,
                "price": {"amount": 9.99 + f64::from(i), "currency": "EUR"}
            })
        })
        .collect();
    json!({
        "id": 4217,
        "customer": {"name": "Ada Lovelace", "email": "ada@example.com", "address": {"street": "1 Analytical Way", "city": "London", "zip": "N1 9GU"}},
        "items": items,
        "total": {"amount": 129.99, "currency": "EUR"},
        "status": "approved"
    })
}

fn order_schema() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "required": ["id", "customer", "items", "total", "status"],
        "properties": {
            "id": {"type": "integer", "minimum": 1},
            "customer": {"$ref": "#/$defs/customer"},
            "items": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/item"}},
            "total": {"$ref": "#/$defs/money"},
            "status": {"enum": ["pending", "approved", "refused"]}
        },
        "$defs": {
            "customer": {
                "type": "object",
                "required": ["name", "email"],
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "email": {"type": "string", "pattern": "^[^@]+@[^@]+$"},
                    "address": {"$ref": "#/$defs/address"}
                }
            },
            "address": {
                "type": "object",
                "properties": {"street": {"type": "string"}, "city": {"type": "string"}, "zip": {"type": "string"}}
            },
            "item": {
                "type": "object",
                "required": ["sku", "quantity", "price"],
                "properties": {
                    "sku": {"type": "string", "pattern": "^SKU-[0-9]{4}$"},
                    "name": {"type": "string"},
                    "quantity": {"type": "integer", "minimum": 1},
                    "price": {"$ref": "#/$defs/money"}
                }
            },
            "money": {
                "type": "object",
                "required": ["amount", "currency"],
                "properties": {"amount": {"type": "number", "minimum": 0}, "currency": {"type": "string", "enum": ["EUR", "USD"]}}
            }
        }
    })
}

fn case(json: Value) -> anyhow::Result<TestCase> {
    let mut json = json;
    json["id"] = json!("bench");
    Ok(serde_json::from_value(json)?)
}

fn main() -> anyhow::Result<()> {
    let text = text();
    let instance = order_instance().to_string();
    let similar = text.replacen("five", "seven", 2);

    let benches: Vec<(&str, TestCase, String)> = vec![
        (
            "exact_match",
            case(json!({"expected": {"output": text}, "evaluation": {"strategy": "exact_match"}}))?,
            text.clone(),
        ),
        (
            "regex_match",
            case(json!({
                "expected": {"patterns": [r"order \d{4}", r"\$\d+\.\d{2}", r"(?i)business days"]},
                "evaluation": {"strategy": "regex_match"}
            }))?,
            text.clone(),
        ),
        (
            "contains",
            case(json!({
                "expected": {"includes": ["refund"], "excludes": ["sorry"], "maxLength": 2000},
                "evaluation": {"strategy": "contains"}
            }))?,
            text.clone(),
        ),
        (
            "json_schema",
            case(
                json!({"expected": {"jsonSchema": order_schema()}, "evaluation": {"strategy": "json_schema"}}),
            )?,
            instance,
        ),
        (
            "lexical_similarity",
            case(
                json!({"expected": {"output": text}, "evaluation": {"strategy": "lexical_similarity"}}),
            )?,
            similar,
        ),
        (
            "keyword_coverage",
            case(json!({
                "evaluation": {"strategy": "keyword_coverage", "options": {"keywords": ["refund", "order", "card", "business days", "approved"]}}
            }))?,
            text.clone(),
        ),
        (
            "sentiment",
            case(
                json!({"evaluation": {"strategy": "sentiment", "options": {"expected": "positive"}}}),
            )?,
            text.clone(),
        ),
        (
            "toxicity",
            case(json!({"evaluation": {"strategy": "toxicity"}}))?,
            text,
        ),
    ];

    let registry = StrategyRegistry::builtin().build();
    let dir = tempfile::tempdir()?;
    let env = GradeEnv {
        sandbox: Arc::new(Sandbox::default()),
        package_root: Arc::from(dir.path()),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;

    println!(
        "{:<20} {:>12} {:>10} {:>8}",
        "strategy", "cases/s", "graded", "passed"
    );
    for (name, case, output) in &benches {
        let ctx = CompileContext {
            registry: &registry,
            package_root: dir.path(),
            file: "eval/tests.json",
            pointer: "/testCases/0".to_string(),
            profile: Profile::Deterministic,
        };
        let grader = registry
            .compile(name, case, &ctx)
            .map_err(|problems| anyhow::anyhow!("{name} does not compile: {problems:?}"))?;
        let input = GradeInput {
            output,
            prompt: "",
            context: None,
            tool_calls: None,
            case,
            files: &[],
        };
        let (graded, elapsed, passed) = runtime.block_on(async {
            // Warm up (lazy DFA caches, allocator).
            for _ in 0..1000 {
                black_box(grader.grade(&input, &env).await?);
            }
            let start = Instant::now();
            let mut graded = 0u64;
            let mut passed = false;
            while graded < MAX_ITERATIONS {
                let grade = grader.grade(black_box(&input), &env).await?;
                passed = grade.passed;
                black_box(grade);
                graded += 1;
                if graded.is_multiple_of(1024) && start.elapsed() >= BUDGET {
                    break;
                }
            }
            Ok::<_, skilleval_model::grade::Fault>((graded, start.elapsed(), passed))
        })?;
        let rate = graded as f64 / elapsed.as_secs_f64();
        println!("{name:<20} {rate:>12.0} {graded:>10} {passed:>8}");
    }
    Ok(())
}
