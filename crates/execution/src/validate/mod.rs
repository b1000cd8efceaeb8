//! Package validation: every problem at once, each with its file and JSON pointer, and a
//! compiled grader for every case that compiles.
//!
//! Checked here: the loading problems (SKILL.md, JSON, conversion, templating); at least one
//! test case; non-empty, unique ids (a duplicate is reported at the second occurrence); each
//! case compiles with its strategy (the strategy checks its own fields, custom scripts
//! included); `input.files` and fixture paths in `input.context` (strings starting with
//! `fixtures/` or `eval/fixtures/`) exist and stay inside the package; `weight >= 0`;
//! timeouts `> 0`; thresholds in [0, 1]; `settings.runner` is `agent`, `command`, `given` or
//! `llm`, a `command` runner's script exists and an `agent` runner's options are valid; setup/teardown scripts exist; suite ids exist.
//!
//! Strategies that need a model (`llm_judge`, `assertions`, `semantic_sim`) check their fields
//! the same whether or not a provider is configured (e.g. `skilleval validate` has none), so
//! validation needs nothing of them beyond compiling.
//! Problems found in a converted format (v1, eval_metadata, skill-creator) point at the field
//! the author wrote, not at the converted v2 field.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use skilleval_grading::{CompileContext, DefinitionKey, Grader, StrategyRegistry};
use skilleval_model::definition::{RunnerSpec, TestCase};
use skilleval_model::package::{paths, Package, PackageError, PackageLimits};
use skilleval_model::problem::{escape_token, Problem};

/// Runner names `settings.runner` accepts.
pub const RUNNERS: &[&str] = &["agent", "command", "given", "llm"];

/// The outcome of validating a package.
#[derive(Debug, Default)]
pub struct Validation {
    /// Errors and warnings, in the order found (loading first, then per case).
    pub problems: Vec<skilleval_model::problem::Problem>,
    /// Case id -> compiled grader, for every case that compiled (empty from [`check`]).
    /// Cases with the same definition ([`DefinitionKey`]) share one grader.
    pub graders: BTreeMap<String, Arc<dyn Grader>>,
}

impl Validation {
    /// No error-severity problem.
    pub fn is_ok(&self) -> bool {
        !self.problems.iter().any(Problem::is_error)
    }

    pub fn errors(&self) -> impl Iterator<Item = &Problem> {
        self.problems.iter().filter(|p| p.is_error())
    }

    pub fn warnings(&self) -> impl Iterator<Item = &Problem> {
        self.problems.iter().filter(|p| !p.is_error())
    }
}

/// Validates a package against a strategy registry, keeping the compiled graders (to prime
/// an executor that runs the package next).
pub fn validate(pkg: &Package, registry: &StrategyRegistry) -> Validation {
    validate_with(pkg, registry, true)
}

/// Validates a package without keeping its compiled graders: what a service that stores the
/// package and runs it elsewhere needs. Each distinct definition still compiles once (that is
/// what finds a bad regex or schema), then is dropped, so memory does not grow with the cases.
pub fn check(pkg: &Package, registry: &StrategyRegistry) -> Validation {
    validate_with(pkg, registry, false)
}

fn validate_with(pkg: &Package, registry: &StrategyRegistry, keep_graders: bool) -> Validation {
    let mut v = Validator {
        pkg,
        registry,
        problems: pkg.problems.clone(),
        graders: BTreeMap::new(),
        seen: Seen::default(),
        keep_graders,
    };
    if pkg.format.is_some() {
        v.cases();
        v.settings();
        v.suites();
    }
    v.finish()
}

/// [`check`] for a package opened with [`Package::from_zip_bytes_streamed`], without holding
/// its cases at once: a v2 definition's cases are read again from the eval file, `chunk` at
/// a time, converted, templated and checked, then handed to `write` (in order) and dropped.
/// Gives the problems [`check`] gives for the package opened whole, in the same order, and
/// leaves the package as [`Package::from_zip_bytes`] would have, without its cases and their
/// pointers. A package read whole (another format, a file that is not a v2 list) is checked
/// by [`check`] and its cases handed to `write` at once. The cases handed over hold their Zod
/// schemas converted ([`skilleval_grading::zod::inline_converted`]): what is stored for
/// workers to grade is a plain JSON Schema.
pub fn check_in_chunks(
    pkg: &mut Package,
    registry: &StrategyRegistry,
    chunk: usize,
    mut write: impl FnMut(Vec<TestCase>),
) -> Result<Validation, PackageError> {
    let mut checking = Vec::new();
    let mut seen = Seen::default();
    let streamed = pkg.stream_cases(chunk, |pkg| {
        let mut v = Validator {
            pkg,
            registry,
            problems: Vec::new(),
            graders: BTreeMap::new(),
            seen: std::mem::take(&mut seen),
            keep_graders: false,
        };
        v.case_checks();
        checking.append(&mut v.problems);
        seen = v.seen;
        skilleval_grading::zod::inline_converted(registry, &mut pkg.config.test_cases);
        write(std::mem::take(&mut pkg.config.test_cases));
    })?;
    let Some(converted) = streamed else {
        let validation = check(pkg, registry);
        skilleval_grading::zod::inline_converted(registry, &mut pkg.config.test_cases);
        write(std::mem::take(&mut pkg.config.test_cases));
        pkg.case_pointers = Vec::new();
        return Ok(validation);
    };
    let mut v = Validator {
        pkg,
        registry,
        problems: pkg.problems.clone(),
        graders: BTreeMap::new(),
        seen,
        keep_graders: false,
    };
    if converted == 0 {
        v.no_cases();
    }
    v.problems.append(&mut checking);
    v.settings();
    v.suites();
    Ok(v.finish())
}

struct Validator<'a> {
    pkg: &'a Package,
    registry: &'a StrategyRegistry,
    problems: Vec<Problem>,
    graders: BTreeMap<String, Arc<dyn Grader>>,
    /// What earlier cases left for later ones (all of them, or earlier chunks).
    seen: Seen,
    keep_graders: bool,
}

/// What checking a case leaves for the next ones.
#[derive(Default)]
struct Seen {
    /// Definitions compiled without problems (with their grader when kept).
    compiled: HashMap<DefinitionKey, Option<Arc<dyn Grader>>>,
    /// Each non-blank case id with the pointer of its first case.
    first_use: HashMap<String, String>,
    /// Blank case ids (each an error, but a suite may still name one).
    blank_ids: HashSet<String>,
}

impl Validator<'_> {
    fn file(&self) -> &str {
        &self.pkg.eval_file
    }

    /// A problem below case `i` at a v2 `suffix`, pointed into the source file.
    fn case_error(&mut self, i: usize, suffix: &str, message: impl Into<String>) {
        let base = self.pkg.case_pointers.get(i).cloned().unwrap_or_default();
        let problem = Problem::error(self.file(), format!("{base}{suffix}"), message);
        let problem = self.pkg.remap_problem(i, problem);
        self.problems.push(problem);
    }

    fn error(&mut self, pointer: impl Into<String>, message: impl Into<String>) {
        let problem = Problem::error(self.file(), pointer, message);
        self.problems.push(problem);
    }

    fn cases(&mut self) {
        if self.pkg.config.test_cases.is_empty() {
            self.no_cases();
        }
        self.case_checks();
    }

    /// A definition without cases is an error, unless the eval file has errors already
    /// (its cases may have failed to load).
    fn no_cases(&mut self) {
        let file = self.file().to_string();
        let eval_file_has_errors = self.problems.iter().any(|p| p.is_error() && p.file == file);
        if !eval_file_has_errors {
            self.error(
                self.pkg.list_pointer(),
                "the eval definition has no test cases; add at least one",
            );
        }
    }

    /// Each case of `pkg.config.test_cases`, after those of [`Seen`].
    fn case_checks(&mut self) {
        let pkg = self.pkg;
        for (i, case) in pkg.config.test_cases.iter().enumerate() {
            if case.id.trim().is_empty() {
                self.case_error(i, "/id", "test case id must not be empty");
                self.seen.blank_ids.insert(case.id.clone());
            } else if let Some(first_at) = self.seen.first_use.get(case.id.as_str()) {
                let message = format!(
                    "duplicate test case id `{}` (first used by the case at {first_at})",
                    case.id
                );
                self.case_error(i, "/id", message);
            } else {
                let at = pkg.case_pointers.get(i).cloned().unwrap_or_default();
                self.seen.first_use.insert(case.id.clone(), at);
            }
            self.compile(i, case);
            self.references(i, case);
            self.numbers(i, case);
        }
    }

    /// The problems, each once, and the graders kept.
    fn finish(mut self) -> Validation {
        // The `monitoring` section, if any: production criteria, validated like the cases.
        (self.problems).extend(crate::monitor::package_problems(self.pkg, self.registry));
        Validation {
            problems: unique(self.problems),
            graders: self.graders,
        }
    }

    fn compile(&mut self, i: usize, case: &TestCase) {
        let pkg = self.pkg;
        let profile = pkg.config.profile;
        let name = case.strategy_name(profile);
        let key = DefinitionKey::of(&pkg.content_hash, profile, case);
        if let Some(known) = self.seen.compiled.get(&key) {
            if let Some(grader) = known {
                self.graders
                    .entry(case.id.clone())
                    .or_insert_with(|| grader.clone());
            }
            return;
        }
        let file = self.file().to_string();
        let ctx = CompileContext {
            registry: self.registry,
            package_root: pkg.root(),
            file: &file,
            pointer: pkg.case_pointers.get(i).cloned().unwrap_or_default(),
            profile,
        };
        match self.registry.compile(name, case, &ctx) {
            Ok(grader) => {
                if self.keep_graders {
                    self.graders
                        .entry(case.id.clone())
                        .or_insert_with(|| grader.clone());
                    self.seen.compiled.insert(key, Some(grader));
                } else {
                    self.seen.compiled.insert(key, None);
                }
            }
            Err(problems) => {
                for p in problems {
                    let p = pkg.remap_problem(i, p);
                    self.problems.push(p);
                }
            }
        }
    }

    /// `input.files` and fixture paths in `input.context`.
    fn references(&mut self, i: usize, case: &TestCase) {
        let root = self.pkg.root().to_path_buf();
        for (k, f) in case.input.files.iter().enumerate() {
            if let Err(message) = paths::check_reference(&root, f) {
                self.case_error(i, &format!("/input/files/{k}"), message);
            }
        }
        if let Some(context) = &case.input.context {
            let mut found = Vec::new();
            fixture_strings(context, "/input/context", &mut found);
            for (suffix, raw) in found {
                if let Err(message) = check_fixture(&root, &raw) {
                    self.case_error(i, &suffix, message);
                }
            }
        }
    }

    fn numbers(&mut self, i: usize, case: &TestCase) {
        if !(case.weight.is_finite() && case.weight >= 0.0) {
            self.case_error(
                i,
                "/weight",
                format!("weight must be a number >= 0, not {}", case.weight),
            );
        }
        if case.evaluation.timeout == Some(0) {
            self.case_error(
                i,
                "/evaluation/timeout",
                "timeout must be greater than 0 ms",
            );
        }
        if let Some(t) = case.evaluation.passing_threshold {
            if !(0.0..=1.0).contains(&t) {
                self.case_error(
                    i,
                    "/evaluation/passingThreshold",
                    format!("must be between 0 and 1, not {t}"),
                );
            }
        }
        if let Some(target) = &case.evaluation.target {
            let file = target.strip_prefix("file:").map(str::trim);
            if target != "output" && !file.is_some_and(|f| !f.is_empty() && !f.contains("..")) {
                self.case_error(
                    i,
                    "/evaluation/target",
                    format!("must be `output` or `file:PATH` (a path relative to the workspace, no `..`), not `{target}`"),
                );
            }
        }
        for (k, f) in case.expected.files.iter().enumerate() {
            if f.path.trim().is_empty() || f.path.contains("..") || f.path.starts_with('/') {
                self.case_error(
                    i,
                    &format!("/expected/files/{k}/path"),
                    "must be a path relative to the workspace, without `..`",
                );
            }
            if let (Some(min), Some(max)) = (f.min_size, f.max_size) {
                if min > max {
                    self.case_error(
                        i,
                        &format!("/expected/files/{k}/minSize"),
                        format!("minSize {min} is over maxSize {max}"),
                    );
                }
            }
        }
    }

    fn settings(&mut self) {
        let config = &self.pkg.config;
        let root = self.pkg.root().to_path_buf();
        let s = &config.settings;
        if s.default_timeout == Some(0) {
            self.error(
                "/settings/defaultTimeout",
                "defaultTimeout must be greater than 0 ms",
            );
        }
        if s.max_concurrent_tests == Some(0) {
            self.error(
                "/settings/maxConcurrentTests",
                "maxConcurrentTests must be at least 1",
            );
        }
        for (field, value) in [
            ("passThreshold", s.pass_threshold),
            ("scoreThreshold", s.score_threshold),
        ] {
            if let Some(t) = value {
                if !(0.0..=1.0).contains(&t) {
                    self.error(
                        format!("/settings/{field}"),
                        format!("{field} must be between 0 and 1, not {t}"),
                    );
                }
            }
        }
        if let Some(runner) = &s.runner {
            let cfg = runner.config();
            let (kind_at, script_at) = match runner {
                RunnerSpec::Name(_) => ("/settings/runner", "/settings/runner"),
                RunnerSpec::Detailed(_) => ("/settings/runner/type", "/settings/runner/script"),
            };
            if !RUNNERS.contains(&cfg.kind.as_str()) {
                self.error(
                    kind_at,
                    format!(
                        "unknown runner `{}`; known: {}",
                        cfg.kind,
                        RUNNERS.join(", ")
                    ),
                );
            } else if cfg.kind == "agent" {
                if let Err(e) = crate::runner::agent::AgentOptions::check(&cfg) {
                    let at = match runner {
                        RunnerSpec::Detailed(_) if e.field != "." => format!(
                            "/settings/runner/{}",
                            e.field.replace(['.', '['], "/").replace(']', "")
                        ),
                        _ => "/settings/runner".to_string(),
                    };
                    self.error(at, e.to_string());
                }
            } else if cfg.kind == "command" {
                match &cfg.script {
                    None => self.error(
                        script_at,
                        "the `command` runner needs a `script`, e.g. {\"type\": \"command\", \"script\": \"scripts/run.py\"}",
                    ),
                    Some(script) => {
                        if let Err(message) = paths::check_reference(&root, script) {
                            self.error(script_at, format!("runner script {message}"));
                        }
                    }
                }
            }
        }
        let scripts = [
            (
                "/setup/script",
                config.setup.as_ref().and_then(|s| s.script.clone()),
            ),
            (
                "/teardown/script",
                config.teardown.as_ref().and_then(|t| t.script.clone()),
            ),
        ];
        for (at, script) in scripts {
            if let Some(script) = script {
                if let Err(message) = paths::check_reference(&root, &script) {
                    self.error(at, format!("script {message}"));
                } else if crate::case_scripts::interpreter_of(&script).is_none() {
                    self.error(
                        at,
                        format!(
                            "script `{script}` must end in .py (python3), .js (node) or .sh (sh)"
                        ),
                    );
                }
            }
        }
    }

    fn suites(&mut self) {
        let config = &self.pkg.config;
        let mut names: BTreeMap<&str, usize> = BTreeMap::new();
        for (j, suite) in config.suites.iter().enumerate() {
            if suite.name.trim().is_empty() {
                self.error(format!("/suites/{j}/name"), "suite name must not be empty");
            } else if let Some(first) = names.get(suite.name.as_str()) {
                self.error(
                    format!("/suites/{j}/name"),
                    format!(
                        "duplicate suite name `{}` (first used by /suites/{first})",
                        suite.name
                    ),
                );
            } else {
                names.insert(&suite.name, j);
            }
            for (k, id) in suite.test_ids.iter().enumerate() {
                if !(self.seen.first_use.contains_key(id) || self.seen.blank_ids.contains(id)) {
                    self.error(
                        format!("/suites/{j}/testIds/{k}"),
                        format!("unknown test case id `{id}`"),
                    );
                }
            }
        }
    }
}

/// Each problem once, where it was first found. With a set of the ones kept: a definition of
/// 100,000 broken cases has as many problems, and comparing each with every one kept took
/// `skilleval validate` 17 s.
fn unique(found: Vec<Problem>) -> Vec<Problem> {
    let mut seen: HashSet<Problem> = HashSet::with_capacity(found.len());
    let mut problems = Vec::with_capacity(found.len());
    for p in found {
        if !seen.contains(&p) {
            seen.insert(p.clone());
            problems.push(p);
        }
    }
    problems
}

/// Collects `(pointer suffix, string)` for every string in `value` that names a fixture.
fn fixture_strings(value: &Value, at: &str, out: &mut Vec<(String, String)>) {
    match value {
        Value::String(s) => {
            let s2 = s.strip_prefix("./").unwrap_or(s);
            if s2.starts_with("fixtures/") || s2.starts_with("eval/fixtures/") {
                out.push((at.to_string(), s.clone()));
            }
        }
        Value::Array(items) => {
            for (k, item) in items.iter().enumerate() {
                fixture_strings(item, &format!("{at}/{k}"), out);
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                fixture_strings(item, &format!("{at}/{}", escape_token(key)), out);
            }
        }
        _ => {}
    }
}

/// `eval/fixtures/x` is package-relative; `fixtures/x` is looked for in `eval/` (as the test
/// file's folder, the seed's convention) and then at the root.
fn check_fixture(root: &std::path::Path, raw: &str) -> Result<(), String> {
    let normalized = paths::normalize_file(raw)
        .map_err(|issue| format!("fixture `{raw}`: {}", issue.describe()))?;
    let candidates = if normalized.starts_with("eval/") {
        vec![normalized]
    } else {
        vec![format!("eval/{normalized}"), normalized]
    };
    if candidates.iter().any(|c| paths::join(root, c).is_file()) {
        Ok(())
    } else {
        Err(format!(
            "fixture `{raw}` does not exist (looked for {})",
            candidates.join(" and ")
        ))
    }
}

/// Opens and validates; any error problem gives [`PackageError::Invalid`] listing every
/// problem (warnings included).
pub fn open_validated(
    path: &Path,
    limits: &PackageLimits,
    registry: &StrategyRegistry,
) -> Result<(Package, Validation), PackageError> {
    let package = Package::open(path, limits)?;
    let validation = validate(&package, registry);
    if validation.is_ok() {
        Ok((package, validation))
    } else {
        Err(PackageError::Invalid(validation.problems))
    }
}

#[cfg(test)]
mod package_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_problem_is_kept_once_where_it_was_first_found() {
        let e = |pointer: &str| Problem::error("eval/tests.json", pointer, "bad");
        let w = |pointer: &str| Problem::warning("eval/tests.json", pointer, "bad");
        let found = vec![
            e("/a"),
            w("/a"),
            e("/b"),
            e("/a"),
            w("/a"),
            e("/c"),
            e("/b"),
        ];
        assert_eq!(unique(found), [e("/a"), w("/a"), e("/b"), e("/c")]);
    }
}
