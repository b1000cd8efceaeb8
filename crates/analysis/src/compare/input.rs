//! What a comparison reads: each run's cases with their attempts, built from stored results.
//!
//! The service builds a [`RunSide`] from `eval_results` rows and the stored definitions, the CLI
//! from `eval/runs/<id>` folders; both go through [`RunSide::from_results`], so a case is
//! grouped, scored and fingerprinted the same way wherever it is compared.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use skilleval_execution::result::{CaseStatus, JobResult};
use skilleval_grading::StrategyRegistry;
use skilleval_model::definition::{EvalConfig, Profile, TestCase};

/// What makes two runs of a case comparable: the same definition, graded the same way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaseFingerprint {
    /// SHA-256 (hex) of what the case asks and expects: input, expected, evaluation, weight.
    pub definition_hash: String,
    /// The strategy that grades it.
    pub grader: String,
    /// The judge model, for LLM-backed strategies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge_model: Option<String>,
}

/// The fingerprint of `case` under `profile` (which gives the strategy when the case names
/// none), graded with `judge_model` where a model judges. Names, descriptions, tags and metadata
/// are left out: renaming a case does not change what it measures.
pub fn fingerprint(
    case: &TestCase,
    profile: Profile,
    judge_model: Option<&str>,
) -> CaseFingerprint {
    let graded = json!({
        "input": case.input,
        "expected": case.expected,
        "evaluation": case.evaluation,
        "weight": case.weight,
        "given": case.given,
    });
    // serde_json keeps map order deterministic for the derive-serialised structs above, so the
    // same definition always hashes the same.
    let digest = Sha256::digest(graded.to_string().as_bytes());
    CaseFingerprint {
        definition_hash: hex::encode(digest),
        grader: case.strategy_name(profile).to_string(),
        judge_model: judge_model.map(str::to_string),
    }
}

/// The fingerprint of every case of `config`, keyed by test case id. `judge_model` is recorded
/// for the cases a model grades (those the registry says need a provider, a `hybrid` when one
/// of its parts does): a judge change makes those cases not comparable and leaves the others
/// alone.
pub fn fingerprints(
    config: &EvalConfig,
    judge_model: Option<&str>,
) -> BTreeMap<String, CaseFingerprint> {
    // Without providers, a model-backed strategy answers that it is missing one: that is what
    // tells a case a model grades.
    let registry = StrategyRegistry::builtin().build();
    config
        .test_cases
        .iter()
        .map(|case| {
            let strategy = case.strategy_name(config.profile);
            let judged = registry.missing_provider(strategy, case).is_some();
            let judge = if judged { judge_model } else { None };
            (case.id.clone(), fingerprint(case, config.profile, judge))
        })
        .collect()
}

/// Why a case's two runs are not comparable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NotComparableReason {
    Definition,
    Grader,
    JudgeModel,
}

impl NotComparableReason {
    pub fn as_str(self) -> &'static str {
        match self {
            NotComparableReason::Definition => "definition",
            NotComparableReason::Grader => "grader",
            NotComparableReason::JudgeModel => "judge_model",
        }
    }
}

/// What differs between two fingerprints; empty when comparable. A case without a fingerprint
/// on either side (an older run that stored none) is taken as comparable.
pub fn differences(
    a: Option<&CaseFingerprint>,
    b: Option<&CaseFingerprint>,
) -> Vec<NotComparableReason> {
    let (Some(a), Some(b)) = (a, b) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if a.definition_hash != b.definition_hash {
        out.push(NotComparableReason::Definition);
    }
    if a.grader != b.grader {
        out.push(NotComparableReason::Grader);
    }
    if a.judge_model != b.judge_model {
        out.push(NotComparableReason::JudgeModel);
    }
    out
}

/// One graded (or errored) attempt at a case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptOutcome {
    pub passed: bool,
    /// `None` when the attempt errored: it counts as not passed but has no score.
    pub score: Option<f64>,
    /// Rubric criteria (normalised to [0, 1]) where the strategy has them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub criteria: BTreeMap<String, f64>,
}

impl AttemptOutcome {
    /// The outcome of a stored result; `None` for a case that never ran (skipped, queued),
    /// which says nothing about the skill.
    pub fn from_result(r: &JobResult) -> Option<AttemptOutcome> {
        if matches!(r.status, CaseStatus::Skipped | CaseStatus::Queued) {
            return None;
        }
        Some(AttemptOutcome {
            passed: r.status == CaseStatus::Passed,
            score: r.score.filter(|s| s.is_finite()),
            criteria: r
                .rubric_scores
                .as_ref()
                .map(criteria_of)
                .unwrap_or_default(),
        })
    }
}

/// `{name: {normalized, score, ...}}` -> `{name: normalized}` (the raw score when it is
/// already in [0, 1] and no normalised one was stored).
fn criteria_of(rubric: &Value) -> BTreeMap<String, f64> {
    let Some(map) = rubric.as_object() else {
        return BTreeMap::new();
    };
    map.iter()
        .filter_map(|(name, v)| {
            let normalized = v.get("normalized").and_then(Value::as_f64).or_else(|| {
                v.get("score")
                    .and_then(Value::as_f64)
                    .filter(|s| (0.0..=1.0).contains(s))
            })?;
            normalized.is_finite().then(|| (name.clone(), normalized))
        })
        .collect()
}

/// One case of a run: its attempts (repeats, `retryCount` re-runs arrive as separate results
/// or as one result's attempts; either way they are nested here).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseRecord {
    pub test_case_id: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<CaseFingerprint>,
    pub attempts: Vec<AttemptOutcome>,
}

impl CaseRecord {
    /// Attempts that passed over attempts that ran.
    pub fn pass_rate(&self) -> Option<f64> {
        if self.attempts.is_empty() {
            return None;
        }
        let passed = self.attempts.iter().filter(|a| a.passed).count();
        Some(passed as f64 / self.attempts.len() as f64)
    }

    /// Mean score of the graded attempts.
    pub fn mean_score(&self) -> Option<f64> {
        mean(self.attempts.iter().filter_map(|a| a.score))
    }

    /// Mean of one criterion over the attempts that have it.
    pub fn criterion_mean(&self, criterion: &str) -> Option<f64> {
        mean(
            self.attempts
                .iter()
                .filter_map(|a| a.criteria.get(criterion).copied()),
        )
    }

    /// Passed for the McNemar test: at least half its attempts passed (the rule trigger evals
    /// use for "triggered"; with one attempt, simply passed).
    pub fn passed(&self) -> bool {
        self.pass_rate().is_some_and(|r| r >= 0.5)
    }
}

fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values.fold((0.0, 0u64), |(s, n), v| (s + v, n + 1));
    (n > 0).then(|| sum / n as f64)
}

/// One run, ready to be compared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSide {
    pub run_id: String,
    /// What the report calls this side: a version number, a description version, a label.
    pub version: Value,
    pub cases: Vec<CaseRecord>,
}

impl RunSide {
    /// Groups `results` by test case id (repeats nested under their case; skipped attempts
    /// left out, so a case that never ran has none), in first-seen order, each with its fingerprint from `fingerprints` (keyed by test
    /// case id; a missing one means "unknown", see [`differences`]).
    pub fn from_results(
        run_id: impl Into<String>,
        version: Value,
        results: &[JobResult],
        fingerprints: &BTreeMap<String, CaseFingerprint>,
    ) -> RunSide {
        let mut cases: Vec<CaseRecord> = Vec::new();
        let mut index: BTreeMap<&str, usize> = BTreeMap::new();
        // A run's baseline (its cases run without the skill) is not the run: only the
        // with-skill attempts are compared.
        let with_skill = results.iter().filter(|r| {
            r.variant.configuration == skilleval_execution::variant::Configuration::WithSkill
        });
        for r in with_skill {
            let i = *index.entry(r.test_case_id.as_str()).or_insert_with(|| {
                cases.push(CaseRecord {
                    test_case_id: r.test_case_id.clone(),
                    name: r.name.clone(),
                    fingerprint: fingerprints.get(&r.test_case_id).cloned(),
                    attempts: Vec::new(),
                });
                cases.len() - 1
            });
            if let Some(a) = AttemptOutcome::from_result(r) {
                cases[i].attempts.push(a);
            }
        }
        RunSide {
            run_id: run_id.into(),
            version,
            cases,
        }
    }
}
