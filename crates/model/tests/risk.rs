//! The package risk report on real packages: the example skills carry no high-severity
//! finding, and the fixture package has exactly one finding of each rule.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use skilleval_model::package::risk::{self, RuleId, Severity};
use skilleval_model::package::{Package, PackageLimits};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn the_example_skills_have_no_high_severity_finding() {
    let mut seen = 0;
    for entry in std::fs::read_dir(repo().join("examples/skills")).expect("examples") {
        let dir = entry.expect("entry").path();
        if !dir.is_dir() {
            continue;
        }
        let package = Package::open(&dir, &PackageLimits::default()).expect("example opens");
        let report = package.risk_report();
        let high: Vec<_> = report.at_least(Severity::High).collect();
        assert!(high.is_empty(), "{}: {high:?}", dir.display());
        seen += 1;
    }
    assert!(seen >= 5, "only {seen} example skills found");
}

#[test]
fn the_fixture_package_has_exactly_one_finding_of_each_rule() {
    let dir = repo().join("crates/model/tests/fixtures/risky-skill");
    let package = Package::open(&dir, &PackageLimits::default()).expect("fixture opens");
    let report = package.risk_report();
    let mut per_rule: BTreeMap<RuleId, usize> = BTreeMap::new();
    for finding in &report.findings {
        *per_rule.entry(finding.rule).or_default() += 1;
    }
    let every: BTreeMap<RuleId, usize> = risk::rules().map(|(id, _)| (id, 1)).collect();
    assert_eq!(per_rule, every, "{:#?}", report.findings);
    let at = |rule| {
        report
            .findings
            .iter()
            .find(|f| f.rule == rule)
            .map(|f| (f.file.as_str(), f.line, f.severity))
    };
    assert_eq!(
        at(RuleId::JudgeInjection),
        Some(("SKILL.md", Some(9), Severity::High))
    );
    assert_eq!(
        at(RuleId::NetworkAccess),
        Some(("scripts/collect.py", Some(4), Severity::Medium))
    );
    assert_eq!(
        at(RuleId::EnvironmentRead),
        Some(("scripts/collect.py", Some(6), Severity::Low))
    );
    assert_eq!(
        at(RuleId::HomeFiles),
        Some(("scripts/collect.py", Some(7), Severity::High))
    );
    assert_eq!(
        at(RuleId::ShellSpawn),
        Some(("scripts/collect.py", Some(8), Severity::Medium))
    );
    assert_eq!(
        at(RuleId::ObfuscatedCode),
        Some(("scripts/collect.py", Some(9), Severity::High))
    );
    assert_eq!(
        at(RuleId::LargeBinary),
        Some(("assets/model.bin", None, Severity::Medium))
    );
    assert_eq!(report.max_severity(), Some(Severity::High));
}
