//! How often each rule of the package risk scan is wrong on real skills: the scan over a
//! checkout of Anthropic's public skills repository, each finding compared with a reviewed
//! label (`bench/data/risk_labels.json`: a person read the line and said whether the rule's
//! claim holds), and per rule the files it read, its findings, the false ones and the
//! false-positive rate (false findings / findings).
//!
//! Run with `cargo run -p skilleval-bench --bin risk_precision -- PATH` where `PATH` is a
//! checkout of <https://github.com/anthropics/skills> at the commit the labels name
//! (`git clone https://github.com/anthropics/skills && git -C skills checkout COMMIT`). Every
//! folder of it holding a `SKILL.md` is scanned as a package. A finding with no label is
//! printed and counted apart: someone has to judge it before the figures mean anything, so the
//! program exits 1 when there is one. docs/security.md has the figures.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use serde_json::Value;
use skilleval_model::package::risk::{self, RuleId};
use skilleval_model::package::{Package, PackageLimits};

/// A reviewed finding: whether the rule's claim holds.
struct Label {
    truly: bool,
}

/// Labels by (package folder, file, rule).
type Labels = BTreeMap<(String, String, String), Label>;

fn read_labels(path: &Path) -> anyhow::Result<(String, Labels)> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let doc: Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let commit = doc["commit"].as_str().unwrap_or("?").to_string();
    let mut labels = BTreeMap::new();
    for (i, item) in doc["findings"].as_array().into_iter().flatten().enumerate() {
        let field = |k: &str| {
            item[k]
                .as_str()
                .map(str::to_string)
                .with_context(|| format!("{}: findings[{i}].{k} is missing", path.display()))
        };
        let truly = match field("label")?.as_str() {
            "true_positive" => true,
            "false_positive" => false,
            other => bail!(
                "{}: findings[{i}].label is `{other}`, not true_positive or false_positive",
                path.display()
            ),
        };
        labels.insert(
            (field("package")?, field("file")?, field("rule")?),
            Label { truly },
        );
    }
    Ok((commit, labels))
}

/// Every folder under `root` (at any depth, skipping `.git`) that holds a `SKILL.md`.
fn skill_folders(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        if dir.join("SKILL.md").is_file() {
            found.push(dir);
            continue;
        }
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))?
        {
            let path = entry?.path();
            if path.is_dir() && path.file_name().is_some_and(|n| n != ".git") {
                stack.push(path);
            }
        }
    }
    found.sort();
    Ok(found)
}

#[derive(Default)]
struct Tally {
    findings: u64,
    false_positives: u64,
    unlabelled: u64,
}

fn main() -> anyhow::Result<ExitCode> {
    let root = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .context("usage: risk_precision PATH-TO-A-CHECKOUT-OF-anthropics/skills")?;
    let labels_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/risk_labels.json");
    let (commit, labels) = read_labels(&labels_path)?;
    let folders = skill_folders(&root)?;
    let mut tally: BTreeMap<RuleId, Tally> = risk::rules()
        .map(|(id, _)| (id, Tally::default()))
        .collect();
    let mut unlabelled = Vec::new();
    for dir in &folders {
        let package = Package::open(dir, &PackageLimits::default())
            .with_context(|| format!("opening {}", dir.display()))?;
        let name = dir.strip_prefix(&root).unwrap_or(dir).display().to_string();
        for f in &package.risk_report().findings {
            let t = tally.entry(f.rule).or_default();
            t.findings += 1;
            match labels.get(&(name.clone(), f.file.clone(), f.rule.as_str().to_string())) {
                Some(label) if !label.truly => t.false_positives += 1,
                Some(_) => {}
                None => {
                    t.unlabelled += 1;
                    unlabelled.push(format!("{name}/{f}"));
                }
            }
        }
    }
    println!(
        "risk scan over {} skill folders of {} (labels for commit {commit})",
        folders.len(),
        root.display()
    );
    println!(
        "{:<16} {:>8} {:>6} {:>10} {:>8}",
        "rule", "findings", "false", "unlabelled", "FP rate"
    );
    for (rule, t) in &tally {
        let rate = if t.findings == 0 {
            "-".to_string()
        } else {
            format!(
                "{:.0} %",
                100.0 * t.false_positives as f64 / t.findings as f64
            )
        };
        println!(
            "{:<16} {:>8} {:>6} {:>10} {:>8}",
            rule.as_str(),
            t.findings,
            t.false_positives,
            t.unlabelled,
            rate
        );
    }
    if unlabelled.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "\nfindings with no label (judge them in {}):",
        labels_path.display()
    );
    for u in &unlabelled {
        println!("  {u}");
    }
    Ok(ExitCode::FAILURE)
}
