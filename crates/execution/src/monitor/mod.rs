//! Production monitoring: judging real traffic continuously, with criteria of its own.
//!
//! A skill's **monitor** ([`definition`]) names the criteria production samples are graded by
//! (strategies that need no expected output), how many samples are taken, and the alert rules.
//! A **sample** ([`sample`]) is one real `(input, output, tool calls)`; whether it is graded is
//! decided by [`sampling`] from a hash, so retries and rate changes are stable. A sampled item
//! becomes an ordinary [`crate::plan::Job`] with runner `given` ([`job`]) and is graded by the
//! same [`crate::executor::Executor`] as any run. What graded samples add up to (quality over
//! time, alerts) is the analysis layer's `skilleval_analysis::quality`.
//!
//! Everything here is pure: the service's ingest endpoint, store and scheduler, and the CLI's
//! `skilleval monitor`, feed it and keep what it returns.

pub mod definition;
pub mod job;
pub mod sample;
pub mod sampling;

pub use definition::{
    from_package, package_problems, parse, AlertRule, Criterion, Monitor, MonitorSource,
};
pub use job::{job_info, sample_job, CriteriaSelection, SampleJobContext, SampleJobInfo};
pub use sample::{parse_batch, parse_jsonl, BatchError, BatchLimits, Sample, SampleError};
pub use sampling::{is_sampled, sample_point};

/// A monitor definition and where it was read from, for the tests of this crate and of the
/// crates above it (`test-util`).
#[cfg(any(test, feature = "test-util"))]
pub mod fixtures {
    use std::path::Path;

    use serde_json::json;

    use super::definition::MonitorSource;

    /// The monitoring section of `eval/tests.json` in a package rooted at `root`.
    pub fn source(root: &Path) -> MonitorSource<'_> {
        MonitorSource {
            file: "eval/tests.json",
            pointer: "/monitoring",
            package_root: root,
        }
    }

    /// A monitor with one criterion of each kind a sample is graded by: a regex, a rule, a
    /// tool-usage check and a model judge; half the samples taken, two channels.
    pub fn monitor_doc() -> serde_json::Value {
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
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::needless_pass_by_value)]
mod tests {

    use serde_json::json;

    use super::fixtures::{monitor_doc, source};
    use super::*;
    use skilleval_grading::StrategyRegistry;

    fn registry() -> StrategyRegistry {
        StrategyRegistry::builtin().build()
    }

    #[test]
    fn a_valid_monitor_gets_the_defaults() {
        let root = tempfile::tempdir().unwrap();
        let (m, warnings) = parse(&monitor_doc(), &source(root.path()), &registry()).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(m.sample_rate, 0.5);
        assert_eq!(m.criteria.len(), 4);
        assert_eq!(m.alerts, vec![AlertRule::default()]);
        assert_eq!(
            m.timeout_ms,
            skilleval_model::definition::DEFAULT_TIMEOUT_MS
        );
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
        use crate::validate::validate;
        use skilleval_model::package::{Package, PackageLimits};
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
