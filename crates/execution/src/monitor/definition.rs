//! The monitor document: which criteria judge production samples, how many samples are taken,
//! and when an alert fires.
//!
//! The same document is an eval definition's top-level `monitoring` section and the body of
//! `PUT /v1/skills/{name}/monitor`. Its own keys are snake_case like the rest of the HTTP API;
//! a criterion's `expected` and `options` are the test-case shapes verbatim (camelCase), so a
//! criterion is configured exactly as a test case graded by the same strategy would be.
//!
//! [`parse`] reports every problem at once, each with a JSON pointer and the rule, as package
//! validation does; each criterion is compiled with the strategy registry, so a bad regex or
//! schema is refused where it is written. A strategy that compares with an expected output
//! (`exact_match`, `lexical_similarity`, `semantic_sim`) is refused: production has none.

use std::collections::BTreeMap;
use std::path::Path;

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use skilleval_grading::{CompileContext, StrategyRegistry};
use skilleval_model::definition::{Expected, Profile, TestCase};
use skilleval_model::package::formats::typed;
use skilleval_model::problem::{escape_token, Problem};

/// Share of ingested samples graded when the monitor sets no `sample_rate`.
pub const DEFAULT_SAMPLE_RATE: f64 = 0.1;
/// Longest criterion name.
pub const MAX_CRITERION_NAME: usize = 64;

/// Strategies that grade by comparing with an expected output, which production lacks.
pub const NEEDS_EXPECTED_OUTPUT: &[&str] = &["exact_match", "lexical_similarity", "semantic_sim"];

/// The keys a monitor document may have.
const MONITOR_KEYS: &[&str] = &[
    "criteria",
    "sample_rate",
    "filters",
    "max_samples_per_hour",
    "max_cost_usd_per_day",
    "alerts",
    "timeout_ms",
];
const CRITERION_KEYS: &[&str] = &["name", "strategy", "expected", "options", "weight"];

/// A validated monitor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Monitor {
    /// Applied to every sampled item; a sample passes when every criterion passes.
    pub criteria: Vec<Criterion>,
    /// Share of ingested samples graded, in [0, 1].
    pub sample_rate: f64,
    /// Metadata a sample must carry to be considered: key -> accepted values (any of them).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub filters: BTreeMap<String, Vec<Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_samples_per_hour: Option<u64>,
    /// Spending cap of the model-backed criteria per UTC day; past it they stop (recorded as
    /// skipped on each sample) until the next day.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd_per_day: Option<f64>,
    /// Rules evaluated on the graded samples; the default rule when the document names none.
    pub alerts: Vec<AlertRule>,
    /// Grading limit per sample (milliseconds).
    pub timeout_ms: u64,
}

/// One named criterion: a strategy and its configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Criterion {
    pub name: String,
    pub strategy: String,
    /// As a test case's `expected` (patterns, jsonSchema, rubric, customScript, assertions, and
    /// the strategy's short-form options).
    #[serde(default)]
    pub expected: Expected,
    /// As a test case's `evaluation.options`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub options: BTreeMap<String, Value>,
    /// Share of the sample's score (normalised over the criteria).
    #[serde(default = "one")]
    pub weight: f64,
}

fn one() -> f64 {
    1.0
}

impl Criterion {
    /// Whether grading it calls a model (and so spends from `max_cost_usd_per_day`).
    pub fn needs_model(&self) -> bool {
        // A registry without providers answers, for each strategy, whether it needs one.
        static UNCONFIGURED: std::sync::LazyLock<StrategyRegistry> =
            std::sync::LazyLock::new(|| StrategyRegistry::builtin().build());
        UNCONFIGURED
            .missing_provider(&self.strategy, &self.as_case())
            .is_some()
    }

    /// The criterion as a test case of its own strategy (how it is validated).
    pub fn as_case(&self) -> TestCase {
        let mut case = TestCase {
            id: self.name.clone(),
            name: self.name.clone(),
            expected: self.expected.clone(),
            ..TestCase::default()
        };
        case.evaluation.strategy.clone_from(&self.strategy);
        case.evaluation.options = self.options.clone();
        case
    }
}

impl Monitor {
    /// The criterion graded by `strategy` (each strategy appears at most once).
    pub fn criterion_of_strategy(&self, strategy: &str) -> Option<&Criterion> {
        self.criteria.iter().find(|c| c.strategy == strategy)
    }

    /// Whether a sample's metadata passes the monitor's filters (every key present with one of
    /// its accepted values).
    pub fn accepts_metadata(&self, metadata: Option<&Map<String, Value>>) -> bool {
        self.filters.iter().all(|(key, accepted)| {
            metadata
                .and_then(|m| m.get(key))
                .is_some_and(|v| accepted.contains(v))
        })
    }
}

/// Where a monitor document is and what it may refer to.
pub struct MonitorSource<'a> {
    /// The file problems are reported against (`eval/tests.json`, or `monitor` for an API body).
    pub file: &'a str,
    /// Pointer of the document in that file (`/monitoring`, or empty for an API body).
    pub pointer: &'a str,
    /// The package custom graders are looked up in.
    pub package_root: &'a Path,
}

impl MonitorSource<'_> {
    fn problem(&self, suffix: &str, message: impl Into<String>) -> Problem {
        Problem::error(self.file, format!("{}{suffix}", self.pointer), message)
    }
}

/// Parses and validates a monitor document. `Ok` only when there is no error; warnings (unknown
/// keys) come back with the monitor.
pub fn parse(
    value: &Value,
    source: &MonitorSource<'_>,
    registry: &StrategyRegistry,
) -> Result<(Monitor, Vec<Problem>), Vec<Problem>> {
    let mut problems = Vec::new();
    let Value::Object(doc) = value else {
        return Err(vec![source.problem("", "the monitor must be a JSON object")]);
    };
    for key in doc.keys() {
        if !MONITOR_KEYS.contains(&key.as_str()) {
            problems.push(Problem::warning(
                source.file,
                format!("{}/{}", source.pointer, escape_token(key)),
                format!(
                    "unknown monitor key `{key}` (ignored); known: {}",
                    MONITOR_KEYS.join(", ")
                ),
            ));
        }
    }
    let sample_rate = match doc.get("sample_rate") {
        None | Some(Value::Null) => DEFAULT_SAMPLE_RATE,
        Some(v) => match v.as_f64() {
            Some(r) if (0.0..=1.0).contains(&r) => r,
            _ => {
                problems.push(source.problem(
                    "/sample_rate",
                    format!("sample_rate must be a number between 0 and 1, not {v}"),
                ));
                DEFAULT_SAMPLE_RATE
            }
        },
    };
    let max_samples_per_hour = match doc.get("max_samples_per_hour") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(n) if n > 0 => Some(n),
            _ => {
                problems.push(source.problem(
                    "/max_samples_per_hour",
                    format!("max_samples_per_hour must be a positive integer, not {v}"),
                ));
                None
            }
        },
    };
    let max_cost_usd_per_day = match doc.get("max_cost_usd_per_day") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_f64() {
            Some(c) if c.is_finite() && c >= 0.0 => Some(c),
            _ => {
                problems.push(source.problem(
                    "/max_cost_usd_per_day",
                    format!("max_cost_usd_per_day must be a number of dollars >= 0, not {v}"),
                ));
                None
            }
        },
    };
    let timeout_ms = match doc.get("timeout_ms") {
        None | Some(Value::Null) => skilleval_model::definition::DEFAULT_TIMEOUT_MS,
        Some(v) => match v.as_u64() {
            Some(n) if n > 0 => n,
            _ => {
                problems.push(source.problem(
                    "/timeout_ms",
                    format!("timeout_ms must be a positive integer (milliseconds), not {v}"),
                ));
                skilleval_model::definition::DEFAULT_TIMEOUT_MS
            }
        },
    };
    let filters = parse_filters(doc.get("filters"), source, &mut problems);
    let criteria = parse_criteria(doc.get("criteria"), source, registry, &mut problems);
    let alerts = parse_alerts(doc.get("alerts"), source, &mut problems);
    if problems.iter().any(Problem::is_error) {
        return Err(problems);
    }
    Ok((
        Monitor {
            criteria,
            sample_rate,
            filters,
            max_samples_per_hour,
            max_cost_usd_per_day,
            alerts,
            timeout_ms,
        },
        problems,
    ))
}

fn parse_filters(
    value: Option<&Value>,
    source: &MonitorSource<'_>,
    problems: &mut Vec<Problem>,
) -> BTreeMap<String, Vec<Value>> {
    let mut filters = BTreeMap::new();
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return filters;
    };
    let Value::Object(map) = value else {
        problems.push(source.problem(
            "/filters",
            "filters must be an object: metadata key -> accepted value or list of values",
        ));
        return filters;
    };
    for (key, accepted) in map {
        let at = format!("/filters/{}", escape_token(key));
        let values = match accepted {
            Value::Array(items) if !items.is_empty() => items.clone(),
            Value::Array(_) => {
                problems.push(source.problem(&at, "a filter's list of values must not be empty"));
                continue;
            }
            scalar => vec![scalar.clone()],
        };
        if let Some(i) = values.iter().position(|v| v.is_object() || v.is_array()) {
            let at = if accepted.is_array() {
                format!("{at}/{i}")
            } else {
                at
            };
            problems.push(source.problem(
                &at,
                "a filter value must be a string, number, boolean or null",
            ));
            continue;
        }
        filters.insert(key.clone(), values);
    }
    filters
}

fn parse_criteria(
    value: Option<&Value>,
    source: &MonitorSource<'_>,
    registry: &StrategyRegistry,
    problems: &mut Vec<Problem>,
) -> Vec<Criterion> {
    let items = match value {
        Some(Value::Array(items)) if !items.is_empty() => items,
        Some(Value::Array(_)) | None | Some(Value::Null) => {
            problems.push(source.problem(
                "/criteria",
                "a monitor needs at least one criterion: [{\"name\", \"strategy\", \"expected\", \"options\"}]",
            ));
            return Vec::new();
        }
        Some(_) => {
            problems.push(source.problem("/criteria", "criteria must be a list"));
            return Vec::new();
        }
    };
    let mut criteria = Vec::new();
    let mut names: BTreeMap<String, usize> = BTreeMap::new();
    let mut strategies: BTreeMap<String, usize> = BTreeMap::new();
    let mut fields: BTreeMap<&'static str, (usize, Value)> = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("/criteria/{i}");
        let Value::Object(obj) = item else {
            problems.push(source.problem(&at, "a criterion must be a JSON object"));
            continue;
        };
        for key in obj.keys() {
            if !CRITERION_KEYS.contains(&key.as_str()) {
                problems.push(Problem::warning(
                    source.file,
                    format!("{}{at}/{}", source.pointer, escape_token(key)),
                    format!(
                        "unknown criterion key `{key}` (ignored); known: {}",
                        CRITERION_KEYS.join(", ")
                    ),
                ));
            }
        }
        let before = problems.len();
        let known: Map<String, Value> = obj
            .iter()
            .filter(|(k, _)| CRITERION_KEYS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let base = format!("{}{at}", source.pointer);
        let criterion: Criterion = match typed(&Value::Object(known), source.file, &base) {
            Ok(c) => c,
            Err(problem) => {
                problems.push(problem);
                continue;
            }
        };
        let name = criterion.name.trim();
        if name.is_empty() {
            problems.push(source.problem(
                &format!("{at}/name"),
                "a criterion's name must not be empty",
            ));
        } else if name.chars().count() > MAX_CRITERION_NAME {
            problems.push(source.problem(
                &format!("{at}/name"),
                format!("a criterion's name must be at most {MAX_CRITERION_NAME} characters"),
            ));
        } else if let Some(first) = names.get(name) {
            problems.push(source.problem(
                &format!("{at}/name"),
                format!("duplicate criterion name `{name}` (first used by /criteria/{first})"),
            ));
        } else {
            names.insert(name.to_string(), i);
        }
        if !(criterion.weight.is_finite() && criterion.weight > 0.0) {
            problems.push(source.problem(
                &format!("{at}/weight"),
                format!("weight must be a positive number, not {}", criterion.weight),
            ));
        }
        let strategy = criterion.strategy.clone();
        let strategy = strategy.as_str();
        let canonical = registry.get(strategy).map_or(strategy, |s| s.name());
        if NEEDS_EXPECTED_OUTPUT.contains(&canonical) {
            problems.push(source.problem(
                &format!("{at}/strategy"),
                format!(
                    "strategy `{strategy}` compares the output with an expected output, which production samples do not have; \
                     use one that judges the output on its own: llm_judge, assertions, json_schema, regex_match, contains, \
                     keyword_coverage, toxicity, sentiment, tool_usage or custom"
                ),
            ));
            continue;
        }
        if canonical == "hybrid" {
            problems.push(source.problem(
                &format!("{at}/strategy"),
                "a criterion is one strategy: list each part of a hybrid as its own criterion (the monitor blends them by weight)",
            ));
            continue;
        }
        if let Some(first) = strategies.get(canonical) {
            problems.push(source.problem(
                &format!("{at}/strategy"),
                format!(
                    "strategy `{canonical}` is already used by /criteria/{first}; a monitor grades each strategy once \
                     (put every check of that strategy in one criterion: all patterns, all rules, one rubric)"
                ),
            ));
            continue;
        }
        strategies.insert(canonical.to_string(), i);
        // The criteria share one graded case, so a named `expected` field belongs to one of them.
        for (field, value) in named_expected_fields(&criterion.expected) {
            if let Some((first, earlier)) = fields.get(field) {
                if *earlier != value {
                    problems.push(source.problem(
                        &format!("{at}/expected/{field}"),
                        format!("expected.{field} is already set differently by /criteria/{first}; a field belongs to one criterion"),
                    ));
                }
            } else {
                fields.insert(field, (i, value));
            }
        }
        let mut case = criterion.as_case();
        case.evaluation.strategy = canonical.to_string();
        let ctx = CompileContext {
            registry,
            package_root: source.package_root,
            file: source.file,
            pointer: format!("{}{at}", source.pointer),
            profile: Profile::default(),
        };
        if let Err(found) = registry.compile(canonical, &case, &ctx) {
            let base = ctx.pointer.clone();
            problems.extend(found.into_iter().map(|mut p| {
                if let Some(rest) = p.pointer.strip_prefix(&base) {
                    let rest = rest
                        .strip_prefix("/evaluation/options")
                        .map(|r| format!("/options{r}"))
                        .or_else(|| {
                            rest.strip_prefix("/evaluation/strategy")
                                .map(|r| format!("/strategy{r}"))
                        })
                        .unwrap_or_else(|| rest.to_string());
                    p.pointer = format!("{base}{rest}");
                }
                p
            }));
        }
        if problems[before..].iter().any(Problem::is_error) {
            continue;
        }
        let mut criterion = criterion;
        criterion.name = criterion.name.trim().to_string();
        criterion.strategy = canonical.to_string();
        criteria.push(criterion);
    }
    criteria
}

/// The named fields of `expected` a criterion sets (its `extra` options stay its own).
fn named_expected_fields(e: &Expected) -> Vec<(&'static str, Value)> {
    let mut out = Vec::new();
    let mut put = |name: &'static str, v: Result<Value, serde_json::Error>| {
        if let Ok(v) = v {
            out.push((name, v));
        }
    };
    if let Some(o) = &e.output {
        put("output", Ok(Value::String(o.clone())));
    }
    if !e.patterns.is_empty() {
        put("patterns", serde_json::to_value(&e.patterns));
    }
    if let Some(s) = &e.json_schema {
        put("jsonSchema", Ok(s.clone()));
    }
    if let Some(t) = e.semantic_threshold {
        put("semanticThreshold", serde_json::to_value(t));
    }
    if let Some(r) = &e.rubric {
        put("rubric", serde_json::to_value(r));
    }
    if let Some(s) = &e.custom_script {
        put("customScript", Ok(Value::String(s.clone())));
    }
    if !e.assertions.is_empty() {
        put("assertions", serde_json::to_value(&e.assertions));
    }
    out
}

fn parse_alerts(
    value: Option<&Value>,
    source: &MonitorSource<'_>,
    problems: &mut Vec<Problem>,
) -> Vec<AlertRule> {
    let items = match value {
        None | Some(Value::Null) => return vec![AlertRule::default()],
        Some(Value::Array(items)) => items,
        Some(_) => {
            problems.push(source.problem(
                "/alerts",
                "alerts must be a list of rules (an empty list turns alerting off)",
            ));
            return Vec::new();
        }
    };
    let mut rules = Vec::new();
    let mut names: BTreeMap<String, usize> = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("/alerts/{i}");
        let base = format!("{}{at}", source.pointer);
        let rule: AlertRule = match typed(item, source.file, &base) {
            Ok(r) => r,
            Err(problem) => {
                problems.push(problem);
                continue;
            }
        };
        let broken = rule.problems();
        for (field, rule_text) in &broken {
            problems.push(source.problem(&format!("{at}/{field}"), *rule_text));
        }
        if let Some(first) = names.get(&rule.name) {
            problems.push(source.problem(
                &format!("{at}/name"),
                format!(
                    "duplicate alert rule name `{}` (first used by /alerts/{first})",
                    rule.name
                ),
            ));
            continue;
        }
        names.insert(rule.name.clone(), i);
        if broken.is_empty() {
            rules.push(rule);
        }
    }
    rules
}

/// The key of an eval definition that holds its monitor.
pub const MONITORING_KEY: &str = "monitoring";

/// Reads a v2 eval file's `monitoring` section without building the rest of the document
/// (its test cases are skipped by the parser, so a large definition costs no memory).
pub fn read_section(path: &Path) -> Result<Option<Value>, String> {
    #[derive(Deserialize)]
    struct Top {
        #[serde(default)]
        monitoring: Option<Value>,
    }
    let file =
        std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let top: Top = serde_json::from_reader(std::io::BufReader::new(file))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(top.monitoring.filter(|v| !v.is_null()))
}

/// The package's monitor, from its eval definition's `monitoring` section: `Ok(None)` when it
/// has none, the problems (every one) when it is invalid. Only a v2 definition carries one.
pub fn from_package(
    package: &skilleval_model::package::Package,
    registry: &StrategyRegistry,
) -> Result<Option<(Monitor, Vec<Problem>)>, Vec<Problem>> {
    if package.format != Some(skilleval_model::package::EvalFormat::V2) {
        return Ok(None);
    }
    let path = package.root().join(&package.eval_file);
    let section = match read_section(&path) {
        Ok(Some(section)) => section,
        Ok(None) => return Ok(None),
        // The loader already reported a file that does not parse.
        Err(_) => return Ok(None),
    };
    let source = MonitorSource {
        file: &package.eval_file,
        pointer: "/monitoring",
        package_root: package.root(),
    };
    parse(&section, &source, registry).map(Some)
}

/// The monitor's problems for package validation (nothing when there is no monitor).
pub fn package_problems(
    package: &skilleval_model::package::Package,
    registry: &StrategyRegistry,
) -> Vec<Problem> {
    match from_package(package, registry) {
        Ok(Some((_, warnings))) => warnings,
        Ok(None) => Vec::new(),
        Err(problems) => problems,
    }
}

/// A pass-rate-drop rule; [`Default`] is the documented default rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AlertRule {
    pub name: String,
    /// The window judged, ending at the evaluation time.
    pub window_hours: u32,
    /// The baseline: this many days before the window.
    pub baseline_days: u32,
    /// Fewer graded samples in the window is `no_data`.
    pub min_samples: u64,
    /// The smallest drop (0.05 = five points) worth an alert, however significant.
    pub min_drop: f64,
    /// The z-test's p-value must be below this.
    pub max_p_value: f64,
    /// Breached evaluations, among the last `of_last`, that fire the alert.
    pub breaches: u32,
    pub of_last: u32,
}

impl Default for AlertRule {
    fn default() -> Self {
        AlertRule {
            name: "pass-rate-drop".into(),
            window_hours: 24,
            baseline_days: 7,
            min_samples: 100,
            min_drop: 0.05,
            max_p_value: 0.01,
            breaches: 2,
            of_last: 3,
        }
    }
}

impl AlertRule {
    /// Each field that breaks a rule, with the rule.
    pub fn problems(&self) -> Vec<(&'static str, &'static str)> {
        let mut out = Vec::new();
        if self.name.trim().is_empty() {
            out.push(("name", "an alert rule needs a name"));
        }
        if self.window_hours == 0 {
            out.push(("window_hours", "window_hours must be at least 1"));
        }
        if self.baseline_days == 0 {
            out.push(("baseline_days", "baseline_days must be at least 1"));
        }
        if self.min_samples == 0 {
            out.push(("min_samples", "min_samples must be at least 1"));
        }
        if !(self.min_drop.is_finite() && (0.0..1.0).contains(&self.min_drop)) {
            out.push((
                "min_drop",
                "min_drop must be at least 0 and below 1 (0.05 = five points)",
            ));
        }
        if !(self.max_p_value > 0.0 && self.max_p_value < 1.0) {
            out.push((
                "max_p_value",
                "max_p_value must be strictly between 0 and 1",
            ));
        }
        if self.of_last == 0 {
            out.push(("of_last", "of_last must be at least 1"));
        }
        if self.breaches == 0 || self.breaches > self.of_last {
            out.push((
                "breaches",
                "breaches must be at least 1 and at most of_last",
            ));
        }
        out
    }

    /// The window `[start, end)` judged at `now`.
    pub fn window(&self, now: DateTime<Utc>) -> (DateTime<Utc>, DateTime<Utc>) {
        (now - Duration::hours(i64::from(self.window_hours)), now)
    }

    /// When a history whose first sample is `first` can first be judged: once it covers a
    /// whole baseline and a whole window.
    pub fn ready_at(&self, first: DateTime<Utc>) -> DateTime<Utc> {
        first
            + Duration::days(i64::from(self.baseline_days))
            + Duration::hours(i64::from(self.window_hours))
    }

    /// The baseline `[start, end)` at `now`: the days before the window.
    pub fn baseline(&self, now: DateTime<Utc>) -> (DateTime<Utc>, DateTime<Utc>) {
        let (start, _) = self.window(now);
        (start - Duration::days(i64::from(self.baseline_days)), start)
    }
}
