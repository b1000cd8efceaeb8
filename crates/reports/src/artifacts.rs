//! Files a local run leaves in the skill folder, in the shapes skill authors' tools already read.
//!
//! - `eval/runs/<run-id>/grading/<case-id>.json`: the JSON-shapes seed's per-case file (the
//!   first with-skill attempt), holding both the seed's `grading.json` (assertions with result,
//!   confidence, evidence; overall_score; eval_critique) and skill-creator's
//!   (`expectations[{text, passed, evidence}]`, `summary`), written from the same grade. Their
//!   `timing` objects are merged: every field of both.
//! - `eval/runs/<run-id>/` is also a skill-creator iteration folder, every attempt in its
//!   layout (`crate::skill_creator`).
//! - `eval/version-history.json`: the seed's `benchmark.json` (its history of description
//!   versions) under a name that does not collide with skill-creator's `benchmark.json`; one
//!   entry appended per run, `description_version` going up when the SHA-256 of the skill's
//!   description changes.
//! - `eval/runs/<run-id>/run.json` and `results.jsonl`: what `skilleval compare`, `rescore` and
//!   `export` need and the files above lose: every attempt as a full [`JobResult`] (baseline and
//!   repeats, rubric criteria), what each case asked ([`EvalInput`]) and each case's
//!   [`CaseFingerprint`] under the judge model of the run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use skilleval_analysis::compare::CaseFingerprint;
use skilleval_analysis::expectations::expectations;
use skilleval_analysis::summary::RunSummary;
use skilleval_execution::result::JobResult;

#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    #[error("could not write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} exists but is not a benchmark.json we can extend: {message}")]
    BadBenchmark { path: PathBuf, message: String },
    #[error("could not read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a run file skilleval wrote: {message}")]
    BadRunFile { path: PathBuf, message: String },
}

/// The run file a comparison reads first (`eval/runs/<run-id>/run.json`).
pub const RUN_RECORD_FILE: &str = "run.json";
/// Every attempt of a run (baseline included), one [`JobResult`] per line.
pub const RESULTS_FILE: &str = "results.jsonl";
/// The seed's history of description versions, in the skill's `eval/` folder.
pub const VERSION_HISTORY_FILE: &str = "version-history.json";

/// What a case asked, as a local run records it (results do not carry their input): for
/// skill-creator's `eval_metadata.json` and the outputs viewer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EvalInput {
    /// The prompt as sent (templated).
    pub prompt: String,
    /// Package-relative input files.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
    /// The case's statements to check (`expected.assertions`), when it has them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub assertions: Vec<String>,
}

/// What a local run was: enough to say whether two runs' cases are comparable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub run_id: uuid::Uuid,
    pub skill_name: String,
    /// The skill's version from SKILL.md, when it states one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skill_version: Option<String>,
    /// SHA-256 of the skill's description (what `benchmark.json` versions by).
    pub description_hash: String,
    /// SHA-256 of the package's files.
    pub package_hash: String,
    /// The model that judged the model-graded cases; `None` when no provider was configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge_model: Option<String>,
    /// Attempts per case (`--repeats`).
    pub repeats: u32,
    pub timestamp: DateTime<Utc>,
    /// Per test case id, the definition, grader and judge that graded it.
    pub fingerprints: BTreeMap<String, CaseFingerprint>,
    /// Per test case id, what it asked (absent in runs recorded before it was kept).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub inputs: BTreeMap<String, EvalInput>,
    /// The skill's folder (or ZIP) as given to `skilleval run`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skill_path: Option<String>,
}

/// Writes `run.json` and `results.jsonl` (every attempt) under `run_dir`.
pub fn write_run_record(
    run_dir: &Path,
    record: &RunRecord,
    results: &[JobResult],
) -> Result<(), ArtifactError> {
    std::fs::create_dir_all(run_dir).map_err(|source| ArtifactError::Write {
        path: run_dir.to_path_buf(),
        source,
    })?;
    write_json(
        &run_dir.join(RUN_RECORD_FILE),
        &serde_json::to_value(record).unwrap_or_default(),
    )?;
    let mut lines = String::new();
    for r in results {
        // A JobResult is plain data (strings, numbers, JSON values): it always serialises.
        lines.push_str(&serde_json::to_string(r).unwrap_or_default());
        lines.push('\n');
    }
    let path = run_dir.join(RESULTS_FILE);
    std::fs::write(&path, lines).map_err(|source| ArtifactError::Write { path, source })
}

/// Reads back what [`write_run_record`] wrote: the record and the run proper, its with-skill
/// attempts (what a comparison and a rescore read).
pub fn read_run_record(run_dir: &Path) -> Result<(RunRecord, Vec<JobResult>), ArtifactError> {
    let (record, mut results) = read_run_attempts(run_dir)?;
    results.retain(|r| {
        r.variant.configuration == skilleval_execution::variant::Configuration::WithSkill
    });
    Ok((record, results))
}

/// Reads back what [`write_run_record`] wrote: the record and every attempt.
pub fn read_run_attempts(run_dir: &Path) -> Result<(RunRecord, Vec<JobResult>), ArtifactError> {
    let read = |name: &str| {
        let path = run_dir.join(name);
        std::fs::read_to_string(&path)
            .map(|text| (path.clone(), text))
            .map_err(|source| ArtifactError::Read { path, source })
    };
    let (path, text) = read(RUN_RECORD_FILE)?;
    let record: RunRecord = serde_json::from_str(&text).map_err(|e| ArtifactError::BadRunFile {
        path,
        message: e.to_string(),
    })?;
    let (path, text) = read(RESULTS_FILE)?;
    let mut results = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let r: JobResult = serde_json::from_str(line).map_err(|e| ArtifactError::BadRunFile {
            path: path.clone(),
            message: format!("line {}: {e}", i + 1),
        })?;
        results.push(r);
    }
    Ok((record, results))
}

/// SHA-256 hex of a description.
pub fn description_hash(description: &str) -> String {
    hex::encode(Sha256::digest(description.as_bytes()))
}

/// The merged `grading.json` of one case.
pub fn grading_json(r: &JobResult) -> Value {
    let exps = expectations(r);
    let passed = exps.iter().filter(|e| e.passed).count();
    let total = exps.len();
    let assertions: Vec<Value> = match r.details.get("assertions").and_then(Value::as_array) {
        Some(items) => items.clone(),
        None => exps
            .iter()
            .map(|e| {
                json!({
                    "assertion": e.text,
                    "result": if e.passed { "pass" } else { "fail" },
                    "confidence": "high",
                    "evidence": e.evidence,
                })
            })
            .collect(),
    };
    let duration = (r.finished_at - r.started_at).num_milliseconds().max(0) as f64 / 1000.0;
    let graded = r.duration_ms as f64 / 1000.0;
    // The last attempt's split: grading, and producing (the rest of the attempt).
    let grading = r.attempts.last().map_or(0, |a| a.grade_ms) as f64 / 1000.0;
    json!({
        "test_case_id": r.test_case_id,
        "run_id": r.run_id,
        "timestamp": r.finished_at.to_rfc3339(),
        "status": r.status.as_str(),
        "strategy": r.strategy,
        "score": r.score,
        "assertions": assertions,
        "overall_score": r.score.unwrap_or(0.0),
        "factual_issues": r.details.get("factual_issues").cloned().unwrap_or_else(|| json!([])),
        "eval_critique": r.details.get("eval_critique").cloned().unwrap_or_else(|| json!({
            "vague_assertions": [], "missing_coverage": [], "suggested_assertions": []
        })),
        "expectations": exps,
        "summary": {
            "passed": passed,
            "failed": total - passed,
            "total": total,
            "pass_rate": if total == 0 { 0.0 } else { passed as f64 / total as f64 },
        },
        "timing": {
            "start": r.started_at.to_rfc3339(),
            "end": r.finished_at.to_rfc3339(),
            "duration_seconds": duration,
            "executor_duration_seconds": (graded - grading).max(0.0),
            "grader_duration_seconds": grading,
            "total_duration_seconds": duration.max(graded),
        },
        "details": r.details,
        "error": r.error,
        "attempts": r.attempts,
    })
}

/// Writes `grading/<case-id>.json` for every result under `run_dir`; returns the files written.
pub fn write_grading(run_dir: &Path, results: &[JobResult]) -> Result<Vec<PathBuf>, ArtifactError> {
    let dir = run_dir.join("grading");
    std::fs::create_dir_all(&dir).map_err(|source| ArtifactError::Write {
        path: dir.clone(),
        source,
    })?;
    let mut written = Vec::with_capacity(results.len());
    for r in results {
        let path = dir.join(format!("{}.json", safe_file_name(&r.test_case_id)));
        write_json(&path, &grading_json(r))?;
        written.push(path);
    }
    Ok(written)
}

/// Case ids become file names: anything but `[A-Za-z0-9._-]` turns into `_`.
pub fn safe_file_name(id: &str) -> String {
    let s: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() || s.chars().all(|c| c == '.') {
        "_".into()
    } else {
        s
    }
}

fn write_json(path: &Path, value: &Value) -> Result<(), ArtifactError> {
    let text = serde_json::to_string_pretty(value).unwrap_or_default();
    std::fs::write(path, text + "\n").map_err(|source| ArtifactError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// Appends this run to the version history at `path` (`eval/version-history.json`, created
/// when missing), returning the entry's description version.
pub fn append_benchmark(
    path: &Path,
    skill_name: &str,
    description: &str,
    run_id: uuid::Uuid,
    results: &[JobResult],
    summary: &RunSummary,
    now: DateTime<Utc>,
) -> Result<u64, ArtifactError> {
    let mut doc: Value = match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text).map_err(|e| ArtifactError::BadBenchmark {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => json!({
            "skill_name": skill_name,
            "description_version": 0,
            "created_at": now.to_rfc3339(),
            "entries": [],
        }),
        Err(source) => {
            return Err(ArtifactError::Write {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let hash = description_hash(description);
    let Some(obj) = doc.as_object_mut() else {
        return Err(ArtifactError::BadBenchmark {
            path: path.to_path_buf(),
            message: "the top level is not an object".into(),
        });
    };
    let entries = obj.entry("entries").or_insert_with(|| json!([]));
    let Some(entries) = entries.as_array_mut() else {
        return Err(ArtifactError::BadBenchmark {
            path: path.to_path_buf(),
            message: "`entries` is not an array".into(),
        });
    };
    let last = entries.last();
    let last_version = last
        .and_then(|e| e.get("description_version"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let last_hash = last
        .and_then(|e| e.get("description_hash"))
        .and_then(Value::as_str);
    let version = match last_hash {
        Some(h) if h == hash => last_version.max(1),
        _ => last_version + 1,
    };
    let mut per_case: Vec<&JobResult> = results.iter().collect();
    per_case.sort_by_key(|r| r.case_index);
    entries.push(json!({
        "description_version": version,
        "description_hash": hash,
        "timestamp": now.to_rfc3339(),
        "run_id": run_id,
        "scores": {
            "mean": summary.mean,
            "median": summary.median,
            "std_dev": summary.std_dev,
            "min": summary.min,
            "max": summary.max,
        },
        "pass_rate": summary.pass_rate,
        "verdict": summary.verdict.as_str(),
        "per_test_case": per_case.iter().map(|r| json!({
            "test_case_id": r.test_case_id,
            "score": r.score.unwrap_or(0.0),
            "status": r.status.as_str(),
            "duration_seconds": r.duration_ms as f64 / 1000.0,
        })).collect::<Vec<_>>(),
        "total_duration_seconds": summary.durations.wall_ms as f64 / 1000.0,
        "num_test_cases": results.len(),
    }));
    obj.insert("description_version".into(), json!(version));
    obj.insert("skill_name".into(), json!(skill_name));
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|source| ArtifactError::Write {
            path: parent.to_path_buf(),
            source,
        })?;
    }
    write_json(path, &doc)?;
    Ok(version)
}

#[cfg(test)]
mod tests {
    use super::*;
    use skilleval_analysis::summary::summarize;
    use skilleval_execution::result::test_result;
    use skilleval_execution::result::CaseStatus;
    use skilleval_model::definition::EvalSettings;
    use uuid::Uuid;

    fn result(id: &str, details: Value, status: CaseStatus) -> JobResult {
        let score = Some(if status == CaseStatus::Passed {
            1.0
        } else {
            0.5
        });
        JobResult {
            strategy: "regex_match".into(),
            details,
            duration_ms: 1500,
            ..test_result(id, status, score)
        }
    }

    #[test]
    fn grading_json_has_both_shapes() {
        let r = result(
            "tc/1",
            json!({"checks": [{"check": "calls search", "passed": true, "detail": "1 call"}, {"check": "order", "passed": false, "detail": "b before a"}]}),
            CaseStatus::Failed,
        );
        let g = grading_json(&r);
        assert_eq!(
            g["expectations"][0],
            json!({"text": "calls search", "passed": true, "evidence": "1 call"})
        );
        assert_eq!(
            g["summary"],
            json!({"passed": 1, "failed": 1, "total": 2, "pass_rate": 0.5})
        );
        assert_eq!(g["assertions"][1]["result"], "fail");
        assert_eq!(g["overall_score"], 0.5);
        assert_eq!(g["timing"]["executor_duration_seconds"], 1.5);
        assert!(g["eval_critique"]["vague_assertions"].is_array());
    }

    #[test]
    fn grading_json_splits_the_last_attempt_into_producing_and_grading() {
        let mut r = result("tc/2", json!({}), CaseStatus::Passed);
        r.attempts = vec![skilleval_execution::result::Attempt {
            number: 1,
            status: CaseStatus::Passed,
            score: Some(1.0),
            duration_ms: 1500,
            grade_ms: 250,
            error: None,
        }];
        let g = grading_json(&r);
        assert_eq!(g["timing"]["grader_duration_seconds"], 0.25);
        assert_eq!(g["timing"]["executor_duration_seconds"], 1.25);
    }

    #[test]
    fn grading_files_use_safe_names() {
        let dir = tempfile::tempdir().unwrap();
        let files = write_grading(
            dir.path(),
            &[result("../tc 1", json!({}), CaseStatus::Passed)],
        )
        .unwrap();
        assert_eq!(files[0], dir.path().join("grading").join(".._tc_1.json"));
        assert!(files[0].exists());
        assert_eq!(safe_file_name(".."), "_");
    }

    #[test]
    fn benchmark_versions_follow_the_description_hash() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("eval/benchmark.json");
        let rs = vec![result("a", json!({}), CaseStatus::Passed)];
        let s = summarize(&rs, &EvalSettings::default());
        let now = Utc::now();
        assert_eq!(
            append_benchmark(&path, "calc", "v1 text", Uuid::nil(), &rs, &s, now).unwrap(),
            1
        );
        assert_eq!(
            append_benchmark(&path, "calc", "v1 text", Uuid::nil(), &rs, &s, now).unwrap(),
            1
        );
        assert_eq!(
            append_benchmark(&path, "calc", "v2 text", Uuid::nil(), &rs, &s, now).unwrap(),
            2
        );
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let entries = doc["entries"].as_array().unwrap();
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[2]["description_hash"], description_hash("v2 text"));
        assert_eq!(doc["description_version"], 2);
        assert_eq!(entries[0]["per_test_case"][0]["duration_seconds"], 1.5);
        // SHA-256 of "abc" (FIPS 180-2 test vector).
        assert_eq!(
            description_hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn run_record_round_trips_with_every_attempt() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = test_result("tc-1", CaseStatus::Passed, Some(1.0));
        a.rubric_scores = Some(json!({"clarity": {"normalized": 0.75}}));
        let b = test_result("tc-1", CaseStatus::Failed, Some(0.2));
        let mut fingerprints = BTreeMap::new();
        fingerprints.insert(
            "tc-1".to_string(),
            CaseFingerprint {
                definition_hash: "abc".into(),
                grader: "llm_judge".into(),
                judge_model: Some("judge-1".into()),
            },
        );
        let record = RunRecord {
            run_id: uuid::Uuid::now_v7(),
            skill_name: "s".into(),
            skill_version: Some("1.2.0".into()),
            description_hash: description_hash("d"),
            package_hash: "p".into(),
            judge_model: Some("judge-1".into()),
            repeats: 2,
            timestamp: Utc::now(),
            fingerprints,
            inputs: BTreeMap::from([(
                "tc-1".to_string(),
                EvalInput {
                    prompt: "p".into(),
                    ..EvalInput::default()
                },
            )]),
            skill_path: Some("skills/s".into()),
        };
        let run_dir = dir.path().join("runs/x");
        let mut baseline = test_result("tc-1", CaseStatus::Failed, Some(0.0));
        baseline.variant.configuration = skilleval_execution::variant::Configuration::WithoutSkill;
        write_run_record(&run_dir, &record, &[a.clone(), b.clone(), baseline]).unwrap();
        let (back, results) = read_run_record(&run_dir).unwrap();
        assert_eq!(back, record);
        assert_eq!(results.len(), 2, "the run proper: the with-skill attempts");
        assert_eq!(read_run_attempts(&run_dir).unwrap().1.len(), 3);
        assert_eq!(results[0].rubric_scores, a.rubric_scores);
        assert_eq!(results[1].status, CaseStatus::Failed);
        assert_eq!(results[1].score, b.score);
    }

    #[test]
    fn a_missing_or_broken_run_file_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let err = read_run_record(dir.path()).unwrap_err().to_string();
        assert!(err.contains("run.json"), "{err}");
        std::fs::write(dir.path().join("run.json"), "{}").unwrap();
        let err = read_run_record(dir.path()).unwrap_err().to_string();
        assert!(err.contains("not a run file"), "{err}");
    }

    /// What the `assertions` grader writes in a grade's details reaches both `grading.json`
    /// shapes: skill-creator's expectations and the JSON-shapes seed's assertions.
    #[test]
    fn an_assertions_grade_becomes_the_grading_shapes() {
        use skilleval_grading::assertions::{grade_answer, interpret};
        let v = json!({
            "assertions": [
                {"assertion": "mentions the refund", "result": "pass", "confidence": "high", "evidence": "\"your refund of $20 is on its way\""},
                {"assertion": "is polite", "result": "FAIL", "confidence": "sure", "evidence": "It says \"whatever, read the manual\""}
            ],
            "factual_issues": ["claims a 3-day delay not in the context"],
            "eval_critique": {"vague_assertions": ["is polite"], "missing_coverage": [], "suggested_assertions": ["states the amount"]}
        });
        let texts = vec!["mentions the refund".to_string(), "is polite".to_string()];
        let answer = interpret(&v, &texts).unwrap();
        let output = "Hi! Your refund of $20 is on its way. Whatever, read the manual.";
        let g = grade_answer(&answer, output, None);
        let r = JobResult {
            strategy: "assertions".into(),
            details: g.details,
            duration_ms: 1,
            ..test_result("1", CaseStatus::Failed, Some(g.score))
        };
        let doc = grading_json(&r);
        assert_eq!(
            doc["expectations"][0],
            json!({"text": "mentions the refund", "passed": true, "evidence": "\"your refund of $20 is on its way\""})
        );
        assert_eq!(doc["summary"]["failed"], 1);
        assert_eq!(doc["assertions"][0]["confidence"], "high");
        assert_eq!(
            doc["factual_issues"][0],
            "claims a 3-day delay not in the context"
        );
    }
}
