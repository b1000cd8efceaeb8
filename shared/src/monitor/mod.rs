//! Production monitoring: judging real traffic continuously, with criteria of its own.
//!
//! A skill's **monitor** ([`definition`]) names the criteria production samples are graded by
//! (strategies that need no expected output), how many samples are taken, and the alert rules.
//! A **sample** ([`sample`]) is one real `(input, output, tool calls)`; whether it is graded is
//! decided by [`sampling`] from a hash, so retries and rate changes are stable. A sampled item
//! becomes an ordinary [`crate::plan::Job`] with runner `given` ([`job`]) and is graded by the
//! same [`crate::executor::Executor`] as any run. Graded samples are summarised over time by
//! [`quality`] (and rendered by [`render`]), and judged against their own past by [`alert`].
//!
//! Everything here is pure: the service's ingest endpoint, store and scheduler, and the CLI's
//! `skilleval monitor`, feed it and keep what it returns.

pub mod alert;
pub mod definition;
pub mod job;
pub mod quality;
pub mod render;
pub mod sample;
pub mod sampling;

pub use alert::{
    evaluate, AlertRule, AlertState, AlertTracker, Evaluation, Finding, Transition, WindowCounts,
};
pub use definition::{from_package, package_problems, parse, Criterion, Monitor, MonitorSource};
pub use job::{
    graded_sample, job_info, sample_job, CriteriaSelection, SampleJobContext, SampleJobInfo,
};
pub use quality::{quality, BucketSize, GradedSample, QualityQuery, QualityReport, SampleStatus};
pub use sample::{parse_batch, parse_jsonl, BatchError, BatchLimits, Sample, SampleError};
pub use sampling::{is_sampled, sample_point};

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::needless_pass_by_value)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use chrono::{TimeZone, Utc};
    use serde_json::json;
    use uuid::Uuid;

    use super::*;
    use crate::executor::Executor;
    use crate::runner::RunnerRegistry;
    use crate::sandbox::Sandbox;
    use crate::strategy::StrategyRegistry;

    fn source(root: &Path) -> MonitorSource<'_> {
        MonitorSource {
            file: "eval/tests.json",
            pointer: "/monitoring",
            package_root: root,
        }
    }

    fn registry() -> StrategyRegistry {
        StrategyRegistry::builtin().build()
    }

    fn monitor_doc() -> serde_json::Value {
        json!({
            "sample_rate": 0.5,
            "filters": {"channel": ["web", "email"]},
            "criteria": [
                {"name": "states-decision", "strategy": "regex_match", "expected": {"patterns": ["APPROVED|DECLINED"]}},
                {"name": "polite", "strategy": "contains", "options": {"includes": ["thank"], "caseSensitive": false}, "weight": 0.5},
                {"name": "looked-up", "strategy": "tool_usage", "expected": {"tools": ["lookup_order"], "forbidden": ["delete_order"]}},
                {"name": "judge", "strategy": "llm_judge"}
            ]
        })
    }

    #[test]
    fn a_valid_monitor_gets_the_defaults() {
        let root = tempfile::tempdir().unwrap();
        let (m, warnings) = parse(&monitor_doc(), &source(root.path()), &registry()).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(m.sample_rate, 0.5);
        assert_eq!(m.criteria.len(), 4);
        assert_eq!(m.alerts, vec![AlertRule::default()]);
        assert_eq!(m.timeout_ms, crate::model::DEFAULT_TIMEOUT_MS);
        assert!(m.accepts_metadata(json!({"channel": "web"}).as_object()));
        assert!(!m.accepts_metadata(json!({"channel": "phone"}).as_object()));
        assert!(!m.accepts_metadata(None));
        let (m, _) = parse(
            &json!({"criteria": [{"name": "x", "strategy": "toxicity"}]}),
            &source(root.path()),
            &registry(),
        )
        .unwrap();
        assert_eq!(m.sample_rate, definition::DEFAULT_SAMPLE_RATE);
    }

    #[test]
    fn every_problem_is_reported_with_its_pointer() {
        let root = tempfile::tempdir().unwrap();
        let doc = json!({
            "sample_rate": 1.5,
            "max_samples_per_hour": 0,
            "max_cost_usd_per_day": -1,
            "filters": {"region": [{"nested": true}]},
            "alerts": [{"name": "a", "breaches": 5}, {"name": "b", "min_samples": "many"}, {"name": "c", "windw": 1}],
            "typo": 1,
            "criteria": [
                {"name": "exact", "strategy": "exact_match", "expected": {"output": "x"}},
                {"name": "re", "strategy": "regex_match", "expected": {"patterns": ["(", "ok"]}},
                {"name": "re", "strategy": "contains", "options": {"includes": 3}},
                {"name": "again", "strategy": "regex_match", "expected": {"patterns": ["x"]}},
                {"name": "mix", "strategy": "hybrid"},
                {"name": "who", "strategy": "nope"},
                {"name": "", "strategy": "toxicity", "weight": 0},
                {"name": "deep", "strategy": "json_schema", "expected": {"patterns": ["a", 7]}}
            ]
        });
        let problems = parse(&doc, &source(root.path()), &registry()).unwrap_err();
        let pointers: Vec<(&str, bool)> = problems
            .iter()
            .map(|p| (p.pointer.as_str(), p.is_error()))
            .collect();
        for expected in [
            ("/monitoring/typo", false),
            ("/monitoring/sample_rate", true),
            ("/monitoring/max_samples_per_hour", true),
            ("/monitoring/max_cost_usd_per_day", true),
            ("/monitoring/filters/region/0", true),
            ("/monitoring/criteria/0/strategy", true),
            ("/monitoring/criteria/1/expected/patterns/0", true),
            ("/monitoring/criteria/2/name", true),
            ("/monitoring/criteria/3/strategy", true),
            ("/monitoring/criteria/4/strategy", true),
            ("/monitoring/criteria/5/strategy", true),
            ("/monitoring/criteria/6/name", true),
            ("/monitoring/criteria/6/weight", true),
            ("/monitoring/alerts/0/breaches", true),
            ("/monitoring/alerts/1/min_samples", true),
            ("/monitoring/alerts/2/windw", true),
            ("/monitoring/criteria/7/expected/patterns/1", true),
        ] {
            assert!(
                pointers.contains(&expected),
                "{expected:?} not in {problems:#?}"
            );
        }
        let exact = problems
            .iter()
            .find(|p| p.pointer == "/monitoring/criteria/0/strategy")
            .unwrap();
        assert!(
            exact.message.contains("expected output"),
            "{}",
            exact.message
        );
        // contains' `includes` of the wrong type is reported where it is written, under options.
        assert!(
            problems.iter().any(|p| p
                .pointer
                .starts_with("/monitoring/criteria/2/options/includes")),
            "{problems:#?}"
        );
        assert!(parse(&json!({"criteria": []}), &source(root.path()), &registry()).is_err());
        assert!(parse(&json!([1]), &source(root.path()), &registry()).is_err());
    }

    fn sample(id: &str, output: &str, tools: &[&str]) -> Sample {
        let tool_calls = tools
            .iter()
            .map(|t| json!({"name": t, "arguments": {}}))
            .collect::<Vec<_>>();
        sample::parse_sample(
            0,
            &json!({
                "sample_id": id, "version": "1.2.0", "observed_at": "2026-03-01T10:00:00Z",
                "input": "refund A-1001 please", "output": output, "tool_calls": tool_calls
            }),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn a_sample_is_graded_as_a_given_job_by_the_executor() {
        let root = tempfile::tempdir().unwrap();
        let (m, _) = parse(&monitor_doc(), &source(root.path()), &registry()).unwrap();
        let ctx = SampleJobContext {
            run_id: Uuid::nil(),
            package_hash: "hash",
            monitor_revision: 3,
            selection: CriteriaSelection::WithoutModel,
        };
        let executor = Executor::new(
            registry(),
            RunnerRegistry::builtin(),
            Arc::new(Sandbox::default()),
        );
        let good = sample_job(
            &m,
            &sample("s1", "Thank you: APPROVED", &["lookup_order"]),
            0,
            &ctx,
        )
        .unwrap();
        assert_eq!(good.runner.kind, "given");
        assert_eq!(good.strategy(), "hybrid");
        let info = job_info(&good).unwrap();
        assert_eq!(info.monitor_revision, 3);
        assert_eq!(info.skipped_criteria, ["judge"]);
        let result = executor.execute(&good, root.path()).await;
        let graded = graded_sample(&good, &result, Utc::now());
        assert_eq!(graded.status, SampleStatus::Passed, "{result:#?}");
        assert_eq!(graded.monitor_revision, 3);
        assert_eq!(graded.version.as_deref(), Some("1.2.0"));
        assert_eq!(
            graded.observed_at,
            Utc.with_ymd_and_hms(2026, 3, 1, 10, 0, 0).unwrap()
        );
        assert_eq!(graded.score, Some(1.0));
        let names: Vec<&String> = graded.criteria.keys().collect();
        assert_eq!(names, ["looked-up", "polite", "states-decision"]);

        // Impolite, called a forbidden tool: two criteria fail; the score is the weighted
        // mean (regex 1 x 1, contains 0 x 0.5, tool_usage 2 of 3 checks... x 1) / 2.5.
        let bad = sample_job(
            &m,
            &sample("s2", "APPROVED", &["lookup_order", "delete_order"]),
            1,
            &ctx,
        )
        .unwrap();
        let result = executor.execute(&bad, root.path()).await;
        let graded = graded_sample(&bad, &result, Utc::now());
        assert_eq!(graded.status, SampleStatus::Failed);
        assert!(graded.criteria["states-decision"].passed);
        assert!(!graded.criteria["polite"].passed);
        assert!(!graded.criteria["looked-up"].passed);
        let tools = graded.criteria["looked-up"].score;
        let expect = (1.0 + 0.0 * 0.5 + tools) / 2.5;
        assert!((graded.score.unwrap() - expect).abs() < 1e-9, "{graded:?}");

        // With the budget available, the model criterion is in the job (and, with no model
        // provider configured, the sample errors rather than passing without it).
        let all = SampleJobContext {
            selection: CriteriaSelection::All,
            ..ctx
        };
        let job = sample_job(
            &m,
            &sample("s3", "Thank you: APPROVED", &["lookup_order"]),
            2,
            &all,
        )
        .unwrap();
        assert!(job.case.evaluation.weights.contains_key("llm_judge"));
        let result = executor.execute(&job, root.path()).await;
        assert_eq!(
            graded_sample(&job, &result, Utc::now()).status,
            SampleStatus::Errored
        );

        // Only model criteria and no budget: no job at all.
        let (judge_only, _) = parse(&json!({"criteria": [{"name": "j", "strategy": "assertions", "expected": {"assertions": ["is polite"]}}]}), &source(root.path()), &registry()).unwrap();
        assert!(sample_job(&judge_only, &sample("s4", "x", &[]), 0, &ctx).is_none());
    }

    fn package_with(monitoring: serde_json::Value) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("SKILL.md"),
            "---\nname: demo\ndescription: A demo skill.\n---\nBody.\n",
        )
        .unwrap();
        std::fs::create_dir(dir.path().join("eval")).unwrap();
        let doc = json!({
            "version": "2.0",
            "testCases": [{"id": "a", "given": {"output": "ok"}, "expected": {"output": "ok"}}],
            "monitoring": monitoring
        });
        std::fs::write(dir.path().join("eval/tests.json"), doc.to_string()).unwrap();
        dir
    }

    #[test]
    fn package_validation_reports_the_monitoring_section() {
        use crate::package::{validate, Package, PackageLimits};
        let good = package_with(json!({"criteria": [{"name": "clean", "strategy": "toxicity"}]}));
        let pkg = Package::open(good.path(), &PackageLimits::default()).unwrap();
        let v = validate(&pkg, &registry());
        assert!(v.is_ok() && v.problems.is_empty(), "{:?}", v.problems);
        let (m, _) = from_package(&pkg, &registry()).unwrap().unwrap();
        assert_eq!(m.criteria[0].name, "clean");

        let bad = package_with(
            json!({"sample_rate": 2, "criteria": [{"name": "x", "strategy": "exact_match"}]}),
        );
        let pkg = Package::open(bad.path(), &PackageLimits::default()).unwrap();
        let v = validate(&pkg, &registry());
        let errors: Vec<String> = v.errors().map(ToString::to_string).collect();
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(
            errors[0].starts_with("error: eval/tests.json#/monitoring/sample_rate"),
            "{errors:?}"
        );
        assert!(
            errors[1].contains("/monitoring/criteria/0/strategy"),
            "{errors:?}"
        );

        // No section: no monitor, no problem.
        let none = package_with(serde_json::Value::Null);
        let pkg = Package::open(none.path(), &PackageLimits::default()).unwrap();
        assert!(from_package(&pkg, &registry()).unwrap().is_none());
        assert!(validate(&pkg, &registry()).is_ok());
    }
}
