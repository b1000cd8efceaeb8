//! A run as a skill-creator iteration folder: the layout Anthropic's skill-creator reads with
//! its aggregator (`scripts/aggregate_benchmark.py`) and its review viewer
//! (`eval-viewer/generate_review.py`), from the same grades as every other file.
//!
//! ```text
//! <iteration>/
//!   benchmark.json                       skill-creator's shape (metadata, runs, run_summary)
//!   eval-<id>[-<case>]/
//!     eval_metadata.json                 {eval_id, eval_name, prompt, assertions}
//!     with_skill/run-<n>/                one per attempt; without_skill/ for a baseline
//!       eval_metadata.json               (the viewer looks beside the run, the aggregator above)
//!       grading.json                     expectations, summary, execution_metrics, timing, …
//!       timing.json                      total_tokens, duration_ms, total_duration_seconds, …
//!       outputs/                         output.md or output.json, produced files, metrics.json
//! ```
//!
//! `<id>` is the case's integer eval id ([`EvalNumbering`]); the case id follows it when it is
//! not that number, so a folder says which case it holds. The viewer names a run by its path
//! below the iteration (`eval-1-with_skill-run-1`): [`viewer_run_id`] gives that name, and
//! [`ViewerRuns`] reads one back to its case.
//!
//! One choice differs from skill-creator's grader: a run's total time and tokens are in
//! `timing.json`, and `grading.json`'s `timing` carries the executor and grader split only.
//! skill-creator's aggregator reads tokens from `timing.json` only when `grading.json` has no
//! total time (else it counts output characters as tokens), so this is what makes its token
//! column the tokens the run spent.
//!
//! Skipped attempts (not run: failFast, a budget, a runner with no baseline) have no folder,
//! as skill-creator has no run for them; trigger queries are not cases and have none either.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};

use skilleval_analysis::benchmark::{
    run_notes, tool_call_counts, BenchmarkMetadata, EvalNumbering, Extras,
};
use skilleval_analysis::expectations::expectations;
use skilleval_execution::result::{CaseStatus, JobResult};
use skilleval_execution::variant::Configuration;

use crate::artifacts::{grading_json, safe_file_name, ArtifactError, EvalInput};

/// The output's file name in `outputs/` when it is not JSON.
pub const OUTPUT_TEXT_FILE: &str = "output.md";
/// The output's file name in `outputs/` when it is a JSON object or array.
pub const OUTPUT_JSON_FILE: &str = "output.json";
/// An errored attempt's reason, in `outputs/`.
pub const ERROR_FILE: &str = "error.txt";

/// One file of the folder: its path below the iteration (`/`-separated) and its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceFile {
    pub path: String,
    pub bytes: Vec<u8>,
}

/// The eval folder of each case of a run, by case id.
#[derive(Debug, Clone)]
pub struct EvalDirs {
    numbering: EvalNumbering,
    by_case: BTreeMap<String, (u64, String)>,
}

impl EvalDirs {
    /// The folders of the cases of `results`.
    pub fn of(results: &[JobResult]) -> Self {
        let numbering = EvalNumbering::of(results.iter().map(|r| r.test_case_id.as_str()));
        let mut by_case = BTreeMap::new();
        for r in results {
            by_case.entry(r.test_case_id.clone()).or_insert_with(|| {
                let id = numbering.eval_id(&r.test_case_id, r.case_index);
                let dir = if numbering.is_case_id() {
                    format!("eval-{id}")
                } else {
                    format!("eval-{id}-{}", safe_file_name(&r.test_case_id))
                };
                (id, dir)
            });
        }
        EvalDirs { numbering, by_case }
    }

    /// The case's eval id and folder name.
    pub fn get(&self, case_id: &str) -> Option<(u64, &str)> {
        self.by_case
            .get(case_id)
            .map(|(id, dir)| (*id, dir.as_str()))
    }

    /// How the run numbers its cases.
    pub fn numbering(&self) -> EvalNumbering {
        self.numbering
    }
}

/// The viewer's name of a run: its path below the iteration with `/` as `-`.
pub fn viewer_run_id(eval_dir: &str, configuration: Configuration, run_number: u32) -> String {
    format!("{eval_dir}-{}-run-{run_number}", configuration.as_str())
}

/// The runs of a run's cases by the viewer's names, to read a `feedback.json` back.
#[derive(Debug, Clone)]
pub struct ViewerRuns {
    by_name: BTreeMap<String, (String, Configuration, u32)>,
}

impl ViewerRuns {
    /// Every (case, configuration, attempt) of `results` by its viewer name.
    pub fn of(results: &[JobResult]) -> Self {
        let dirs = EvalDirs::of(results);
        let by_name = results
            .iter()
            .filter_map(|r| {
                let (_, dir) = dirs.get(&r.test_case_id)?;
                let v = r.variant;
                Some((
                    viewer_run_id(dir, v.configuration, v.run_number),
                    (r.test_case_id.clone(), v.configuration, v.run_number),
                ))
            })
            .collect();
        ViewerRuns { by_name }
    }

    /// The case id, configuration and attempt a viewer run id names.
    pub fn get(&self, run_id: &str) -> Option<(&str, Configuration, u32)> {
        self.by_name
            .get(run_id)
            .map(|(case, c, n)| (case.as_str(), *c, *n))
    }
}

/// `execution_metrics` of a result (skill-creator's `metrics.json`, as its grader copies it).
fn execution_metrics(r: &JobResult, files_created: &[String], output_chars: usize) -> Value {
    let tools = tool_call_counts(r);
    let transcript_chars = r
        .details
        .pointer("/runner/transcript")
        .map_or(0, |t| t.to_string().chars().count());
    json!({
        "tool_calls": tools,
        "total_tool_calls": tools.values().sum::<u64>(),
        "total_steps": r.details.pointer("/runner/turns").and_then(Value::as_u64).unwrap_or(1),
        "files_created": files_created,
        "errors_encountered": u64::from(r.status == CaseStatus::Errored),
        "output_chars": output_chars,
        "transcript_chars": transcript_chars,
    })
}

/// The last attempt's split into producing and grading, and its start and end.
struct Timing {
    start: chrono::DateTime<chrono::Utc>,
    executor_end: chrono::DateTime<chrono::Utc>,
    end: chrono::DateTime<chrono::Utc>,
    executor_seconds: f64,
    grader_seconds: f64,
    total_seconds: f64,
}

fn timing_of(r: &JobResult) -> Timing {
    let grade_ms = r
        .attempts
        .last()
        .map_or(0, |a| a.grade_ms)
        .min(r.duration_ms);
    let total = i64::try_from(r.duration_ms).unwrap_or(i64::MAX);
    let grade = i64::try_from(grade_ms).unwrap_or(0);
    let end = r.finished_at;
    let start = end - chrono::Duration::milliseconds(total);
    Timing {
        start,
        executor_end: end - chrono::Duration::milliseconds(grade),
        end,
        executor_seconds: (r.duration_ms - grade_ms) as f64 / 1000.0,
        grader_seconds: grade_ms as f64 / 1000.0,
        total_seconds: r.duration_ms as f64 / 1000.0,
    }
}

/// skill-creator's `timing.json` of a result: the last attempt's times (what the benchmark's
/// `time_seconds` is) and the tokens spent producing (its `tokens`).
pub fn timing_json(r: &JobResult) -> Value {
    let t = timing_of(r);
    json!({
        "total_tokens": r.produce_usage.total_tokens(),
        "duration_ms": r.duration_ms,
        "total_duration_seconds": t.total_seconds,
        "executor_start": t.start.to_rfc3339(),
        "executor_end": t.executor_end.to_rfc3339(),
        "executor_duration_seconds": t.executor_seconds,
        "grader_start": t.executor_end.to_rfc3339(),
        "grader_end": t.end.to_rfc3339(),
        "grader_duration_seconds": t.grader_seconds,
    })
}

/// The judge's critique of the assertions as skill-creator's `eval_feedback`, when it has one.
fn eval_feedback(r: &JobResult) -> Option<Value> {
    let critique = r.details.get("eval_critique")?;
    let list = |k: &str| -> Vec<String> {
        critique
            .get(k)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut suggestions: Vec<Value> = list("vague_assertions")
        .into_iter()
        .map(|a| json!({"assertion": a, "reason": "vague: a wrong output could pass it"}))
        .collect();
    suggestions.extend(
        list("missing_coverage")
            .into_iter()
            .map(|m| json!({"reason": format!("not covered: {m}")})),
    );
    suggestions.extend(
        list("suggested_assertions")
            .into_iter()
            .map(|a| json!({"reason": format!("add: {a}")})),
    );
    (!suggestions.is_empty()).then(|| {
        json!({
            "suggestions": suggestions,
            "overall": critique.get("overall").and_then(Value::as_str)
                .unwrap_or("The judge raised the suggestions above about these assertions."),
        })
    })
}

/// The workspace `grading.json` of a result: the merged grading file plus skill-creator's
/// `execution_metrics`, `user_notes_summary` (our notes, as its aggregator collects them),
/// `claims` and `eval_feedback` where the judge gave them, and `timing` without the total
/// (see the module's doc).
pub fn workspace_grading_json(
    r: &JobResult,
    files_created: &[String],
    output_chars: usize,
) -> Value {
    let mut g = grading_json(r);
    let t = timing_of(r);
    g["timing"] = json!({
        "start": t.start.to_rfc3339(),
        "end": t.end.to_rfc3339(),
        "duration_seconds": t.total_seconds,
        "executor_duration_seconds": t.executor_seconds,
        "grader_duration_seconds": t.grader_seconds,
    });
    g["execution_metrics"] = execution_metrics(r, files_created, output_chars);
    g["user_notes_summary"] = json!({
        "uncertainties": [],
        "needs_review": run_notes(r),
        "workarounds": [],
    });
    let issues: Vec<Value> = r
        .details
        .get("factual_issues")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|i| {
                    json!({
                        "claim": i.as_str().map_or_else(|| i.to_string(), str::to_string),
                        "type": "factual",
                        "verified": false,
                        "evidence": "the judge reported it as a factual issue of the output",
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    g["claims"] = Value::Array(issues);
    if let Some(feedback) = eval_feedback(r) {
        g["eval_feedback"] = feedback;
    }
    g
}

/// The files of `outputs/`: the output (JSON when it is, else text), an errored attempt's
/// reason, the text files the runner left (an agent's workspace), flattened to file names.
fn output_files(r: &JobResult) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    if let Some(output) = r.output.as_deref().filter(|o| !o.is_empty()) {
        let is_json = matches!(
            serde_json::from_str::<Value>(output),
            Ok(Value::Object(_) | Value::Array(_))
        );
        let name = if is_json {
            OUTPUT_JSON_FILE
        } else {
            OUTPUT_TEXT_FILE
        };
        files.push((name.to_string(), output.as_bytes().to_vec()));
    }
    if let Some(e) = &r.error {
        files.push((ERROR_FILE.to_string(), format!("{e}\n").into_bytes()));
    }
    for a in r
        .details
        .pointer("/runner/artifacts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let (Some(path), Some(text)) = (
            a.get("path").and_then(Value::as_str),
            a.get("text").and_then(Value::as_str),
        ) else {
            continue;
        };
        let mut name = safe_file_name(path);
        if files.iter().any(|(n, _)| *n == name) || name == "metrics.json" {
            name = format!("file_{name}");
        }
        files.push((name, text.as_bytes().to_vec()));
    }
    files
}

fn pretty(v: &Value) -> Vec<u8> {
    (serde_json::to_string_pretty(v).unwrap_or_default() + "\n").into_bytes()
}

/// The iteration folder of a run: every attempt of `results` (with and without the skill,
/// every repeat), `inputs` saying what each case asked, and `benchmark.json` built by the code
/// every benchmark is ([`Extras`]) with `meta` and `notes`.
pub fn workspace(
    results: &[JobResult],
    inputs: &BTreeMap<String, EvalInput>,
    meta: &BenchmarkMetadata,
    notes: &[String],
) -> Vec<WorkspaceFile> {
    let cases: Vec<JobResult> = results
        .iter()
        .filter(|r| r.variant.configuration != Configuration::Trigger)
        .cloned()
        .collect();
    let dirs = EvalDirs::of(&cases);
    let mut files = Vec::new();
    let mut metadata_written: BTreeMap<String, Value> = BTreeMap::new();
    for r in &cases {
        if matches!(r.status, CaseStatus::Skipped | CaseStatus::Queued) {
            continue;
        }
        let Some((eval_id, dir)) = dirs.get(&r.test_case_id) else {
            continue;
        };
        let metadata = metadata_written
            .entry(dir.to_string())
            .or_insert_with(|| {
                let input = inputs.get(&r.test_case_id);
                let assertions: Vec<String> = match input {
                    Some(i) if !i.assertions.is_empty() => i.assertions.clone(),
                    _ => expectations(r).into_iter().map(|e| e.text).collect(),
                };
                json!({
                    "eval_id": eval_id,
                    "eval_name": r.name,
                    "case_id": r.test_case_id,
                    "prompt": input.map(|i| i.prompt.as_str()).unwrap_or(""),
                    "files": input.map(|i| i.files.clone()).unwrap_or_default(),
                    "assertions": assertions,
                })
            })
            .clone();
        let run_dir = format!(
            "{dir}/{}/run-{}",
            r.variant.configuration.as_str(),
            r.variant.run_number
        );
        let outputs = output_files(r);
        let output_chars: usize = outputs
            .iter()
            .filter(|(name, _)| name != ERROR_FILE)
            .map(|(_, bytes)| String::from_utf8_lossy(bytes).chars().count())
            .sum();
        let created: Vec<String> = outputs.iter().map(|(n, _)| n.clone()).collect();
        files.push(WorkspaceFile {
            path: format!("{run_dir}/eval_metadata.json"),
            bytes: pretty(&metadata),
        });
        files.push(WorkspaceFile {
            path: format!("{run_dir}/grading.json"),
            bytes: pretty(&workspace_grading_json(r, &created, output_chars)),
        });
        files.push(WorkspaceFile {
            path: format!("{run_dir}/timing.json"),
            bytes: pretty(&timing_json(r)),
        });
        files.push(WorkspaceFile {
            path: format!("{run_dir}/outputs/metrics.json"),
            bytes: pretty(&execution_metrics(r, &created, output_chars)),
        });
        for (name, bytes) in outputs {
            files.push(WorkspaceFile {
                path: format!("{run_dir}/outputs/{name}"),
                bytes,
            });
        }
    }
    for (dir, metadata) in &metadata_written {
        files.push(WorkspaceFile {
            path: format!("{dir}/eval_metadata.json"),
            bytes: pretty(metadata),
        });
    }
    let repeats = cases
        .iter()
        .map(|r| r.variant.run_number)
        .max()
        .unwrap_or(1);
    let extras = Extras::build(&cases, repeats);
    files.push(WorkspaceFile {
        path: "benchmark.json".to_string(),
        bytes: pretty(&extras.benchmark_json(meta, notes)),
    });
    files
}

/// Writes the files of [`workspace`] under `dir`.
pub fn write_workspace(dir: &Path, files: &[WorkspaceFile]) -> Result<(), ArtifactError> {
    for f in files {
        let path = dir.join(&f.path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| ArtifactError::Write {
                path: parent.to_path_buf(),
                source,
            })?;
        }
        std::fs::write(&path, &f.bytes).map_err(|source| ArtifactError::Write { path, source })?;
    }
    Ok(())
}

/// `metadata.skill_path` of a run of the service, which has no folder: the skill's name and
/// version label.
pub fn service_skill_path(skill: &str, version: &str) -> String {
    format!("skilleval:{skill}@{version}")
}

/// skill-creator's `feedback.json` key of a case's first with-skill attempt, where the
/// service's reviews attach.
pub fn review_run_id(dirs: &EvalDirs, case_id: &str) -> Option<String> {
    dirs.get(case_id)
        .map(|(_, dir)| viewer_run_id(dir, Configuration::WithSkill, 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use skilleval_execution::result::test_result;
    use skilleval_execution::variant::Variant;

    fn attempt(id: &str, index: u32, c: Configuration, n: u32, status: CaseStatus) -> JobResult {
        JobResult {
            case_index: index,
            output: Some(format!("output of {id}")),
            variant: Variant {
                configuration: c,
                run_number: n,
            },
            ..test_result(id, status, Some(1.0))
        }
    }

    #[test]
    fn folders_are_numbered_by_id_or_position_and_named_for_the_viewer() {
        let numeric = [attempt(
            "3",
            0,
            Configuration::WithSkill,
            1,
            CaseStatus::Passed,
        )];
        assert_eq!(EvalDirs::of(&numeric).get("3"), Some((3, "eval-3")));
        let named = [
            attempt("add", 0, Configuration::WithSkill, 1, CaseStatus::Passed),
            attempt("a/b", 4, Configuration::WithoutSkill, 2, CaseStatus::Failed),
        ];
        let dirs = EvalDirs::of(&named);
        assert_eq!(dirs.get("add"), Some((1, "eval-1-add")));
        assert_eq!(dirs.get("a/b"), Some((5, "eval-5-a_b")));
        let runs = ViewerRuns::of(&named);
        assert_eq!(
            runs.get("eval-5-a_b-without_skill-run-2"),
            Some(("a/b", Configuration::WithoutSkill, 2))
        );
        assert_eq!(
            review_run_id(&dirs, "add").as_deref(),
            Some("eval-1-add-with_skill-run-1")
        );
    }

    #[test]
    fn skipped_attempts_and_trigger_queries_get_no_folder() {
        let results = [
            attempt("1", 0, Configuration::WithSkill, 1, CaseStatus::Passed),
            attempt("1", 0, Configuration::WithoutSkill, 1, CaseStatus::Skipped),
            attempt("q", 1, Configuration::Trigger, 1, CaseStatus::Passed),
        ];
        let meta = BenchmarkMetadata::of("s", "p", "t", &results);
        let files = workspace(&results, &BTreeMap::new(), &meta, &[]);
        let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        assert!(
            paths.contains(&"eval-1/with_skill/run-1/outputs/output.md"),
            "{paths:?}"
        );
        assert!(
            !paths
                .iter()
                .any(|p| p.contains("without_skill") || p.contains("-q")),
            "{paths:?}"
        );
    }
}
