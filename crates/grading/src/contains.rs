//! `contains` (alias `rule_based`): fast deterministic checks on the output, the evaluator
//! seed's rule-based evaluator: one strategy whose rules each name a criterion.
//!
//! Rules come from option `rules`, an array of objects `{"type", "criterion", ...}`, and/or
//! from the short forms `includes: [..]`, `excludes: [..]`, `minLength`, `maxLength`,
//! `jsonParse: true`, `regex: [..]` (in `evaluation.options` or `expected`). The types:
//!
//! - `includes`, `excludes`, `regex`: `value` (a string, or an array: one rule per item),
//!   `caseSensitive`;
//! - `length`: `unit` (`characters`, the default, or `words`), `min` and/or `max` (inclusive);
//! - `min_length`, `max_length`: `value`, in characters;
//! - `keyword_count`: `keywords` (or `value`; a string or an array), `min` (default 1): the
//!   occurrences of the keywords, added up, must reach `min`; `caseSensitive`,
//!   `matchWholeWord` (default true);
//! - `json_parse`: `value` (default true; false requires the output *not* to be JSON).
//!
//! Option `caseSensitive` (default true) applies to rules that do not set their own. Lengths
//! count the trimmed output: characters, or words (runs of non-whitespace). A rule's
//! `criterion` (default: its type) names what it checks; when any rule names one, the grade
//! carries `rubric_scores`, per criterion the fraction of its rules passed, weighted by its
//! share of the rules (so the weighted sum is the score), which the run summary's criteria
//! breakdown reads. A field a rule type does not know is a problem, as is a rule without what
//! its type needs.
//!
//! Score = rules passed / rules; passed when every rule passes. Details: `rules: [{rule,
//! criterion, passed, detail}]`. Regexes are compiled once; no rules at all is a problem.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use regex::Regex;
use serde::de::IgnoredAny;
use serde_json::{json, Map, Value};

use super::options::{describe, option_pointer, OptionReader};
use super::text::{has_uppercase, term_pattern, user_regex};
use super::{CompileContext, GradeEnv, GradeInput, Grader, Strategy};
use skilleval_model::definition::TestCase;
use skilleval_model::grade::{Fault, Grade};
use skilleval_model::problem::Problem;

const RULE_TYPES: &str =
    "includes, excludes, regex, length, min_length, max_length, keyword_count, json_parse";

/// The fields a rule object of each type may have (besides `type` and `criterion`).
fn known_fields(kind: &str) -> &'static [&'static str] {
    match kind {
        "includes" | "excludes" | "regex" => &["value", "caseSensitive"],
        "min_length" | "max_length" | "json_parse" => &["value"],
        "length" => &["unit", "min", "max"],
        "keyword_count" => &[
            "keywords",
            "value",
            "min",
            "caseSensitive",
            "matchWholeWord",
        ],
        _ => &[],
    }
}

pub struct Contains;

impl Strategy for Contains {
    fn name(&self) -> &'static str {
        "contains"
    }

    fn compile(
        &self,
        case: &TestCase,
        ctx: &CompileContext<'_>,
    ) -> Result<Arc<dyn Grader>, Vec<Problem>> {
        let mut opts = OptionReader::new(case, ctx, "contains");
        let case_sensitive = opts.bool("caseSensitive", true);
        let mut rules = Vec::new();
        let mut named_criteria = false;

        if let Some(value) = opts.raw("rules") {
            let base = option_pointer(case, "rules");
            match value {
                Value::Array(items) => {
                    for (i, item) in items.iter().enumerate() {
                        let before = rules.len();
                        rule_object(
                            item,
                            &format!("{base}/{i}"),
                            case_sensitive,
                            &mut opts,
                            &mut rules,
                        );
                        named_criteria |= rules.len() > before
                            && item.get("criterion").is_some_and(Value::is_string);
                    }
                }
                other => opts.problem(
                    &base,
                    format!(
                        "contains: option `rules` must be an array of rule objects, not {}",
                        describe(other)
                    ),
                ),
            }
        }

        for (key, kind) in [
            ("includes", "includes"),
            ("excludes", "excludes"),
            ("regex", "regex"),
        ] {
            if let Some(items) = opts.string_list(key) {
                let base = option_pointer(case, key);
                for (i, item) in items.iter().enumerate() {
                    let pointer = format!("{base}/{i}");
                    if let Some(check) = text_check(kind, item, case_sensitive, &pointer, &mut opts)
                    {
                        rules.push(Rule::new(check, kind));
                    }
                }
            }
        }
        if let Some(n) = opts.u64("minLength") {
            rules.push(Rule::new(Check::MinLength(n as usize), "min_length"));
        }
        if let Some(n) = opts.u64("maxLength") {
            rules.push(Rule::new(Check::MaxLength(n as usize), "max_length"));
        }
        if opts.bool("jsonParse", false) {
            rules.push(Rule::new(Check::JsonParse(true), "json_parse"));
        }

        if rules.is_empty() && opts.problems.is_empty() {
            opts.problem(
                "/expected",
                "contains needs at least one rule: set evaluation.options.rules, or includes, excludes, minLength, maxLength, jsonParse or regex",
            );
        }
        let any_insensitive = rules.iter().any(|r| {
            matches!(
                r.check,
                Check::Includes {
                    case_sensitive: false,
                    ..
                } | Check::Excludes {
                    case_sensitive: false,
                    ..
                }
            )
        });
        opts.finish(Arc::new(ContainsGrader {
            rules,
            any_insensitive,
            named_criteria,
        }) as Arc<dyn Grader>)
    }
}

/// Reads one rule object of option `rules`.
fn rule_object(
    item: &Value,
    pointer: &str,
    default_cs: bool,
    opts: &mut OptionReader<'_, '_>,
    rules: &mut Vec<Rule>,
) {
    let Some(obj) = item.as_object() else {
        opts.problem(
            pointer,
            format!(
                "contains: a rule must be an object {{\"type\", \"value\"}}, not {}",
                describe(item)
            ),
        );
        return;
    };
    let Some(kind) = obj.get("type").and_then(Value::as_str) else {
        opts.problem(
            &format!("{pointer}/type"),
            format!("contains: a rule needs a `type`, one of {RULE_TYPES}"),
        );
        return;
    };
    let known = known_fields(kind);
    if known.is_empty() {
        opts.problem(
            &format!("{pointer}/type"),
            format!("contains: unknown rule type `{kind}`; use one of {RULE_TYPES}"),
        );
        return;
    }
    for key in obj.keys() {
        if key != "type" && key != "criterion" && !known.contains(&key.as_str()) {
            opts.problem(
                &format!("{pointer}/{}", skilleval_model::problem::escape_token(key)),
                format!(
                    "contains: unknown field `{key}` in a `{kind}` rule; it takes type, criterion, {}",
                    known.join(", ")
                ),
            );
        }
    }
    let criterion = match obj.get("criterion") {
        None | Some(Value::Null) => kind.to_string(),
        Some(Value::String(c)) if !c.trim().is_empty() => c.trim().to_string(),
        Some(other) => {
            opts.problem(
                &format!("{pointer}/criterion"),
                format!(
                    "contains: a rule's `criterion` must be a non-empty string naming what it checks, not {}",
                    if other.is_string() { "an empty string" } else { describe(other) }
                ),
            );
            return;
        }
    };
    let case_sensitive = match rule_bool(obj, "caseSensitive", default_cs, pointer, kind, opts) {
        Some(b) => b,
        None => return,
    };
    let value = obj.get("value");
    let value_pointer = format!("{pointer}/value");
    let mut push = |check: Check| rules.push(Rule::new(check, &criterion));
    match kind {
        "includes" | "excludes" | "regex" => {
            let Some(items) = string_items(value, &value_pointer, kind, opts) else {
                return;
            };
            for (s, p) in items {
                if let Some(check) = text_check(kind, s, case_sensitive, &p, opts) {
                    push(check);
                }
            }
        }
        "min_length" | "max_length" => match value.and_then(Value::as_u64) {
            Some(n) => push(if kind == "min_length" {
                Check::MinLength(n as usize)
            } else {
                Check::MaxLength(n as usize)
            }),
            None => opts.problem(
                &value_pointer,
                format!("contains: a `{kind}` rule needs a `value` that is a non-negative integer"),
            ),
        },
        "length" => {
            if let Some(check) = length_rule(obj, pointer, opts) {
                push(check);
            }
        }
        "keyword_count" => {
            if let Some(check) = keyword_count_rule(obj, pointer, case_sensitive, opts) {
                push(check);
            }
        }
        // "json_parse": `known_fields` admits no other type.
        _ => match value {
            None | Some(Value::Null) => push(Check::JsonParse(true)),
            Some(Value::Bool(b)) => push(Check::JsonParse(*b)),
            Some(other) => opts.problem(
                &value_pointer,
                format!(
                    "contains: a `json_parse` rule's value must be true or false, not {}",
                    describe(other)
                ),
            ),
        },
    }
}

/// A boolean field of a rule object, `default` when absent; `None` (a problem pushed) when
/// it is not a boolean.
fn rule_bool(
    obj: &Map<String, Value>,
    key: &str,
    default: bool,
    pointer: &str,
    kind: &str,
    opts: &mut OptionReader<'_, '_>,
) -> Option<bool> {
    match obj.get(key) {
        None | Some(Value::Null) => Some(default),
        Some(Value::Bool(b)) => Some(*b),
        Some(other) => {
            opts.problem(
                &format!("{pointer}/{key}"),
                format!(
                    "contains: a `{kind}` rule's `{key}` must be true or false, not {}",
                    describe(other)
                ),
            );
            None
        }
    }
}

/// A rule field holding a string or a non-empty array of strings, each with its pointer.
fn string_items<'v>(
    value: Option<&'v Value>,
    at: &str,
    kind: &str,
    opts: &mut OptionReader<'_, '_>,
) -> Option<Vec<(&'v str, String)>> {
    match value {
        Some(Value::String(s)) => Some(vec![(s.as_str(), at.to_string())]),
        Some(Value::Array(items)) if !items.is_empty() => {
            let mut out = Vec::new();
            for (i, v) in items.iter().enumerate() {
                match v.as_str() {
                    Some(s) => out.push((s, format!("{at}/{i}"))),
                    None => opts.problem(
                        &format!("{at}/{i}"),
                        format!(
                            "contains: `{kind}` values must be strings, not {}",
                            describe(v)
                        ),
                    ),
                }
            }
            Some(out)
        }
        _ => {
            let field = at.rsplit('/').next().unwrap_or("value");
            opts.problem(
                at,
                format!(
                    "contains: a `{kind}` rule needs `{field}`: a string or an array of strings"
                ),
            );
            None
        }
    }
}

/// A `length` rule: `unit`, `min`, `max`.
fn length_rule(
    obj: &Map<String, Value>,
    pointer: &str,
    opts: &mut OptionReader<'_, '_>,
) -> Option<Check> {
    let unit = match obj.get("unit") {
        None | Some(Value::Null) => Unit::Characters,
        Some(Value::String(u)) if u == "characters" || u == "chars" => Unit::Characters,
        Some(Value::String(u)) if u == "words" => Unit::Words,
        Some(other) => {
            let shown = match other {
                Value::String(u) => format!("`{u}`"),
                v => describe(v).to_string(),
            };
            opts.problem(
                &format!("{pointer}/unit"),
                format!(
                    "contains: a `length` rule's unit must be `characters` or `words`, not {shown}"
                ),
            );
            return None;
        }
    };
    let mut bound = |key: &str| -> Result<Option<usize>, ()> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) => Ok(Some(n as usize)),
                None => {
                    opts.problem(
                        &format!("{pointer}/{key}"),
                        format!(
                            "contains: a `length` rule's `{key}` must be a non-negative integer ({}), not {v}",
                            unit.as_str()
                        ),
                    );
                    Err(())
                }
            },
        }
    };
    let (min, max) = (bound("min"), bound("max"));
    let (Ok(min), Ok(max)) = (min, max) else {
        return None;
    };
    match (min, max) {
        (None, None) => {
            opts.problem(
                pointer,
                "contains: a `length` rule needs `min` and/or `max`",
            );
            None
        }
        (Some(lo), Some(hi)) if lo > hi => {
            opts.problem(
                &format!("{pointer}/min"),
                format!("contains: a `length` rule's min ({lo}) must not be above its max ({hi})"),
            );
            None
        }
        _ => Some(Check::Length { unit, min, max }),
    }
}

/// A `keyword_count` rule: `keywords` (or `value`), `min`, `matchWholeWord`.
fn keyword_count_rule(
    obj: &Map<String, Value>,
    pointer: &str,
    case_sensitive: bool,
    opts: &mut OptionReader<'_, '_>,
) -> Option<Check> {
    let key = if obj.contains_key("value") && !obj.contains_key("keywords") {
        "value"
    } else {
        "keywords"
    };
    let at = format!("{pointer}/{key}");
    if key == "keywords" && obj.contains_key("value") {
        opts.problem(
            &format!("{pointer}/value"),
            "contains: a `keyword_count` rule takes its keywords in `keywords` or `value`, not both",
        );
        return None;
    }
    let whole_word = rule_bool(obj, "matchWholeWord", true, pointer, "keyword_count", opts)?;
    let items = string_items(obj.get(key), &at, "keyword_count", opts)?;
    let min = match obj.get("min") {
        None | Some(Value::Null) => 1,
        Some(v) => match v.as_u64() {
            Some(n) => n as usize,
            None => {
                opts.problem(
                    &format!("{pointer}/min"),
                    format!("contains: a `keyword_count` rule's `min` must be a non-negative integer, not {v}"),
                );
                return None;
            }
        },
    };
    let mut keywords = Vec::with_capacity(items.len());
    for (k, p) in items {
        if k.trim().is_empty() {
            opts.problem(&p, "contains: a `keyword_count` keyword must not be empty");
            continue;
        }
        match user_regex(&term_pattern(k, whole_word), !case_sensitive) {
            Ok(re) => keywords.push((k.trim().to_string(), re)),
            Err(e) => opts.problem(&p, format!("contains: keyword cannot be compiled: {e}")),
        }
    }
    (!keywords.is_empty()).then_some(Check::KeywordCount { keywords, min })
}

/// An `includes`, `excludes` or `regex` check for one string.
fn text_check(
    kind: &str,
    text: &str,
    case_sensitive: bool,
    pointer: &str,
    opts: &mut OptionReader<'_, '_>,
) -> Option<Check> {
    if text.is_empty() {
        opts.problem(
            pointer,
            format!("contains: a `{kind}` value must not be empty"),
        );
        return None;
    }
    let needle = |t: &str| {
        if case_sensitive {
            t.to_string()
        } else {
            t.to_lowercase()
        }
    };
    Some(match kind {
        "includes" => Check::Includes {
            needle: needle(text),
            case_sensitive,
        },
        "excludes" => Check::Excludes {
            needle: needle(text),
            case_sensitive,
        },
        _ => match user_regex(text, !case_sensitive) {
            Ok(re) => Check::Regex(re),
            Err(e) => {
                opts.problem(pointer, format!("invalid regex: {e}"));
                return None;
            }
        },
    })
}

/// What a `length` rule counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    Characters,
    /// Runs of non-whitespace.
    Words,
}

impl Unit {
    fn as_str(self) -> &'static str {
        match self {
            Unit::Characters => "characters",
            Unit::Words => "words",
        }
    }
}

#[derive(Debug)]
enum Check {
    Includes {
        needle: String,
        case_sensitive: bool,
    },
    Excludes {
        needle: String,
        case_sensitive: bool,
    },
    MinLength(usize),
    MaxLength(usize),
    Length {
        unit: Unit,
        min: Option<usize>,
        max: Option<usize>,
    },
    /// The keywords' occurrences, added up, must reach `min`.
    KeywordCount {
        keywords: Vec<(String, Regex)>,
        min: usize,
    },
    /// `true`: the output must parse as JSON; `false`: it must not.
    JsonParse(bool),
    Regex(Regex),
}

#[derive(Debug)]
struct Rule {
    check: Check,
    /// How the rule is named in details, built once.
    label: Value,
    /// What the rule checks (its `criterion`, else its type).
    criterion: String,
}

impl Rule {
    fn new(check: Check, criterion: &str) -> Self {
        let label = match &check {
            Check::MinLength(n) => format!("min_length {n}"),
            Check::MaxLength(n) => format!("max_length {n}"),
            Check::Length { unit, min, max } => match (min, max) {
                (Some(lo), Some(hi)) => format!("length {lo}..{hi} {}", unit.as_str()),
                (Some(lo), None) => format!("length >= {lo} {}", unit.as_str()),
                (None, Some(hi)) => format!("length <= {hi} {}", unit.as_str()),
                (None, None) => format!("length {}", unit.as_str()),
            },
            Check::KeywordCount { keywords, min } => {
                let names: Vec<&str> = keywords.iter().map(|(k, _)| k.as_str()).collect();
                format!("keyword_count {names:?} >= {min}")
            }
            Check::JsonParse(true) => "json_parse".to_string(),
            Check::JsonParse(false) => "not json_parse".to_string(),
            Check::Includes { needle, .. } => format!("includes {needle:?}"),
            Check::Excludes { needle, .. } => format!("excludes {needle:?}"),
            Check::Regex(re) => format!("regex /{}/", re.as_str()),
        };
        Rule {
            check,
            label: Value::String(label),
            criterion: criterion.to_string(),
        }
    }
}

#[derive(Debug)]
struct ContainsGrader {
    rules: Vec<Rule>,
    /// Whether the lower-cased output is needed.
    any_insensitive: bool,
    /// Whether a rule named its criterion (then the grade has `rubric_scores`).
    named_criteria: bool,
}

#[async_trait]
impl Grader for ContainsGrader {
    async fn grade(&self, input: &GradeInput<'_>, _env: &GradeEnv) -> Result<Grade, Fault> {
        let output = input.output;
        // Lower-casing text with no upper-case letters gives the same text: skip the copy.
        let lowered: Cow<'_, str> = if self.any_insensitive && has_uppercase(output) {
            Cow::Owned(output.to_lowercase())
        } else {
            Cow::Borrowed(output)
        };
        let trimmed = output.trim();
        let mut chars: Option<usize> = None;
        let mut char_len = || *chars.get_or_insert_with(|| trimmed.chars().count());
        let mut words: Option<usize> = None;
        let mut word_len = || *words.get_or_insert_with(|| trimmed.split_whitespace().count());

        let mut passed_count = 0usize;
        let mut results = Vec::with_capacity(self.rules.len());
        // Per criterion: (rules passed, rules).
        let mut criteria: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
        for rule in &self.rules {
            let (passed, detail): (bool, Cow<'static, str>) = match &rule.check {
                Check::Includes {
                    needle,
                    case_sensitive,
                } => {
                    let hay = if *case_sensitive {
                        output
                    } else {
                        lowered.as_ref()
                    };
                    let found = hay.contains(needle.as_str());
                    (
                        found,
                        Cow::Borrowed(if found { "found" } else { "not found" }),
                    )
                }
                Check::Excludes {
                    needle,
                    case_sensitive,
                } => {
                    let hay = if *case_sensitive {
                        output
                    } else {
                        lowered.as_ref()
                    };
                    let found = hay.contains(needle.as_str());
                    (
                        !found,
                        Cow::Borrowed(if found { "present" } else { "absent" }),
                    )
                }
                Check::MinLength(n) => {
                    let len = char_len();
                    (len >= *n, Cow::Owned(format!("{len} characters")))
                }
                Check::MaxLength(n) => {
                    let len = char_len();
                    (len <= *n, Cow::Owned(format!("{len} characters")))
                }
                Check::Length { unit, min, max } => {
                    let len = match unit {
                        Unit::Characters => char_len(),
                        Unit::Words => word_len(),
                    };
                    let ok = min.is_none_or(|lo| len >= lo) && max.is_none_or(|hi| len <= hi);
                    (ok, Cow::Owned(format!("{len} {}", unit.as_str())))
                }
                Check::KeywordCount { keywords, min } => {
                    let mut total = 0usize;
                    let counts: Vec<String> = keywords
                        .iter()
                        .map(|(k, re)| {
                            let n = re.find_iter(output).count();
                            total += n;
                            format!("{k}: {n}")
                        })
                        .collect();
                    (
                        total >= *min,
                        Cow::Owned(format!(
                            "{total} occurrences ({}), at least {min} wanted",
                            counts.join(", ")
                        )),
                    )
                }
                Check::JsonParse(want) => match serde_json::from_str::<IgnoredAny>(trimmed) {
                    Ok(_) => (*want, Cow::Borrowed("parses as JSON")),
                    Err(e) => (!*want, Cow::Owned(format!("not JSON: {e}"))),
                },
                Check::Regex(re) => {
                    let m = re.is_match(output);
                    (m, Cow::Borrowed(if m { "matched" } else { "no match" }))
                }
            };
            if passed {
                passed_count += 1;
            }
            let entry = criteria.entry(rule.criterion.as_str()).or_default();
            entry.0 += usize::from(passed);
            entry.1 += 1;
            results.push(json!({
                "rule": rule.label.clone(),
                "criterion": rule.criterion,
                "passed": passed,
                "detail": detail,
            }));
        }
        let total = self.rules.len().max(1) as f64;
        let all = passed_count == self.rules.len();
        let mut grade = Grade::new(passed_count as f64 / total, all, json!({"rules": results}));
        if self.named_criteria {
            let scores: Map<String, Value> = criteria
                .into_iter()
                .map(|(name, (passed, rules))| {
                    let fraction = passed as f64 / rules as f64;
                    (
                        name.to_string(),
                        json!({
                            "score": fraction,
                            "normalized": fraction,
                            "scale": "numeric",
                            "weight": rules as f64 / total,
                            "reasoning": format!("{passed} of {rules} rules passed"),
                        }),
                    )
                })
                .collect();
            grade.rubric_scores = Some(Value::Object(scores));
        }
        Ok(grade)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::needless_pass_by_value)]
mod tests {
    use serde_json::json;

    use super::super::test_support::{assert_close, case, megabyte_text, pointers, Fixture};

    #[tokio::test]
    async fn short_forms_make_one_rule_per_item() {
        let f = Fixture::new();
        let c = case(json!({
            "expected": {"includes": ["refund", "order"], "excludes": ["sorry"], "minLength": 10, "maxLength": 100},
            "evaluation": {"strategy": "contains"}
        }));
        let g = f.ok(&c, "Your refund for order 42 is on its way.").await;
        assert!(g.passed, "{:?}", g.details);
        assert_eq!(g.details["rules"].as_array().unwrap().len(), 5);

        let g = f.ok(&c, "Sorry, no refund.").await;
        // includes order fails; excludes "sorry" passes (case-sensitive default), lengths pass.
        assert!(!g.passed);
        assert_close(g.score, 4.0 / 5.0);
        let rules = g.details["rules"].as_array().unwrap();
        assert_eq!(rules[1]["rule"], "includes \"order\"");
        assert_eq!(rules[1]["passed"], false);
        assert_eq!(rules[1]["detail"], "not found");
    }

    #[tokio::test]
    async fn rule_objects_with_case_and_regex() {
        let f = Fixture::new();
        let c = case(json!({
            "evaluation": {"strategy": "rule_based", "options": {"rules": [
                {"type": "includes", "value": "CAFÉ", "caseSensitive": false},
                {"type": "excludes", "value": ["lorem", "ipsum"]},
                {"type": "regex", "value": r"^\w+"},
                {"type": "json_parse"}
            ]}}
        }));
        let g = f.ok(&c, "naïve café 日本").await;
        let rules = g.details["rules"].as_array().unwrap();
        assert_eq!(rules.len(), 5);
        let passed: Vec<bool> = rules
            .iter()
            .map(|r| r["passed"].as_bool().unwrap())
            .collect();
        assert_eq!(passed, vec![true, true, true, true, false]);
        assert_eq!(g.score, 0.8);
        assert!(rules[4]["detail"].as_str().unwrap().starts_with("not JSON"));
        assert!(!g.passed);

        let g = f.ok(&c, r#"{"cafÉ": 1}"#).await;
        // Regex ^\w+ fails on "{"; JSON parses.
        assert_eq!(g.score, 0.8);
    }

    #[tokio::test]
    async fn json_parse_and_lengths_count_chars() {
        let f = Fixture::new();
        let c = case(
            json!({"expected": {"jsonParse": true, "maxLength": 4}, "evaluation": {"strategy": "contains"}}),
        );
        let g = f.ok(&c, " [1] ").await;
        assert!(g.passed);
        // 4 characters, 12 bytes.
        let c = case(
            json!({"expected": {"minLength": 4, "maxLength": 4}, "evaluation": {"strategy": "contains"}}),
        );
        assert!(f.ok(&c, "日本語字").await.passed);
        assert!(!f.ok(&c, "").await.passed);
        assert_eq!(f.ok(&c, "").await.score, 0.5);
    }

    #[tokio::test]
    async fn huge_output() {
        let f = Fixture::new();
        let c = case(
            json!({"expected": {"includes": ["日本"], "excludes": ["forbidden"], "maxLength": 1000}, "evaluation": {"strategy": "contains", "options": {"caseSensitive": false}}}),
        );
        let g = f.ok(&c, &megabyte_text()).await;
        assert_close(g.score, 2.0 / 3.0);
    }

    #[test]
    fn problems_name_the_broken_rule() {
        let f = Fixture::new();
        let c = case(
            json!({"evaluation": {"strategy": "contains", "options": {"rules": [
                {"type": "includes"},
                {"type": "shout", "value": "x"},
                {"type": "regex", "value": ["ok", "(bad"]},
                {"type": "min_length", "value": -3},
                "plain string"
            ]}}}),
        );
        let problems = f.problems(&c);
        assert_eq!(
            pointers(&problems),
            vec![
                "/testCases/0/evaluation/options/rules/0/value",
                "/testCases/0/evaluation/options/rules/1/type",
                "/testCases/0/evaluation/options/rules/2/value/1",
                "/testCases/0/evaluation/options/rules/3/value",
                "/testCases/0/evaluation/options/rules/4",
            ]
        );
        assert!(problems[1].message.contains("unknown rule type `shout`"));
        assert!(problems[2].message.starts_with("invalid regex"));
    }

    #[tokio::test]
    async fn length_keyword_count_and_criteria() {
        let f = Fixture::new();
        let c = |keyword_case: serde_json::Value| {
            let mut count = json!({"type": "keyword_count", "keywords": ["refund", "order"], "min": 3, "criterion": "coverage"});
            count
                .as_object_mut()
                .unwrap()
                .extend(keyword_case.as_object().unwrap().clone());
            case(
                json!({"evaluation": {"strategy": "rule_based", "options": {"rules": [
                    {"type": "length", "unit": "words", "min": 3, "max": 5, "criterion": "brevity"},
                    {"type": "length", "min": 10, "criterion": "brevity"},
                    count,
                    {"type": "includes", "value": "order", "criterion": "coverage"},
                    {"type": "json_parse", "value": false}
                ]}}}),
            )
        };
        // "Refund for order 42: refund sent": 6 words (over 5: fails); 32 characters (at
        // least 10: passes); case-sensitive "refund" once, "order" once: 2 < 3 (fails);
        // includes "order" (passes); not JSON (passes). 3 of 5.
        let out = "Refund for order 42: refund sent";
        let g = f.ok(&c(json!({})), out).await;
        assert_close(g.score, 0.6);
        assert!(!g.passed);
        let rules = g.details["rules"].as_array().unwrap();
        assert_eq!(rules[0]["rule"], "length 3..5 words");
        assert_eq!(rules[0]["detail"], "6 words");
        assert_eq!(rules[1]["detail"], "32 characters");
        assert_eq!(
            rules[2]["detail"],
            "2 occurrences (refund: 1, order: 1), at least 3 wanted"
        );
        assert_eq!(rules[4]["criterion"], "json_parse");
        // Per criterion: brevity 1 of 2 rules (weight 2/5), coverage 1 of 2 (2/5),
        // json_parse 1 of 1 (1/5); 0.4 x 0.5 + 0.4 x 0.5 + 0.2 x 1 = 0.6, the score.
        let rs = g.rubric_scores.as_ref().unwrap();
        assert_close(rs["brevity"]["normalized"].as_f64().unwrap(), 0.5);
        assert_close(rs["brevity"]["weight"].as_f64().unwrap(), 0.4);
        assert_close(rs["coverage"]["normalized"].as_f64().unwrap(), 0.5);
        assert_close(rs["json_parse"]["normalized"].as_f64().unwrap(), 1.0);
        assert_close(rs["json_parse"]["weight"].as_f64().unwrap(), 0.2);
        assert_eq!(rs["coverage"]["reasoning"], "1 of 2 rules passed");
        // Case folded for the count: "Refund" counts too, 3 occurrences: 4 of 5.
        let g = f.ok(&c(json!({"caseSensitive": false})), out).await;
        assert_close(g.score, 0.8);
        assert_close(
            g.rubric_scores.as_ref().unwrap()["coverage"]["normalized"]
                .as_f64()
                .unwrap(),
            1.0,
        );
        // Whole words: "orders" is no "order" unless matchWholeWord is false.
        let g = f.ok(&c(json!({"min": 1})), "orders orders").await;
        assert_eq!(g.details["rules"][2]["passed"], false);
        let g = f
            .ok(
                &c(json!({"min": 2, "matchWholeWord": false})),
                "orders orders",
            )
            .await;
        assert_eq!(g.details["rules"][2]["passed"], true);
    }

    #[tokio::test]
    async fn words_are_runs_of_non_whitespace_of_the_trimmed_output() {
        let f = Fixture::new();
        let c = case(
            json!({"evaluation": {"strategy": "contains", "options": {"rules": [
                {"type": "length", "unit": "words", "max": 3},
                {"type": "length", "unit": "characters", "min": 14, "max": 14}
            ]}}}),
        );
        // "one\ttwo\n three" after trimming: 3 words; 3 + 1 + 3 + 1 + 1 + 5 = 14 characters.
        let g = f.ok(&c, "  one\ttwo\n three  ").await;
        assert!(g.passed, "{:?}", g.details);
        // No rule names a criterion: no rubric scores.
        assert!(g.rubric_scores.is_none());
        assert!(!f.ok(&c, "one two three four").await.passed);
    }

    #[test]
    fn bad_rules_name_the_field_and_the_rule() {
        let f = Fixture::new();
        let c = case(
            json!({"evaluation": {"strategy": "contains", "options": {"rules": [
                {"type": "length"},
                {"type": "length", "unit": "lines", "min": 1},
                {"type": "length", "min": 5, "max": 2},
                {"type": "keyword_count", "min": 2},
                {"type": "keyword_count", "keywords": ["a"], "min": -1},
                {"type": "length", "max": 3, "minimum": 1},
                {"type": "includes", "value": "x", "criterion": ""}
            ]}}}),
        );
        let problems = f.problems(&c);
        assert_eq!(
            pointers(&problems),
            vec![
                "/testCases/0/evaluation/options/rules/0",
                "/testCases/0/evaluation/options/rules/1/unit",
                "/testCases/0/evaluation/options/rules/2/min",
                "/testCases/0/evaluation/options/rules/3/keywords",
                "/testCases/0/evaluation/options/rules/4/min",
                "/testCases/0/evaluation/options/rules/5/minimum",
                "/testCases/0/evaluation/options/rules/6/criterion",
            ]
        );
        let messages: Vec<&str> = problems.iter().map(|p| p.message.as_str()).collect();
        assert!(messages[0].contains("`length` rule needs `min` and/or `max`"));
        assert!(messages[1].contains("`characters` or `words`, not `lines`"));
        assert!(messages[2].contains("min (5) must not be above its max (2)"));
        assert!(messages[3].contains("`keyword_count` rule needs `keywords`"));
        assert!(messages[4].contains("`min` must be a non-negative integer"));
        assert!(messages[5].contains("unknown field `minimum` in a `length` rule"));
        assert!(messages[6].contains("criterion"));
    }

    #[test]
    fn no_rules_is_a_problem() {
        let f = Fixture::new();
        let problems = f.problems(&case(json!({"evaluation": {"strategy": "contains"}})));
        assert_eq!(pointers(&problems), vec!["/testCases/0/expected"]);
        assert!(problems[0].message.contains("at least one rule"));
        // jsonParse false is no rule.
        let problems = f.problems(&case(
            json!({"expected": {"jsonParse": false}, "evaluation": {"strategy": "contains"}}),
        ));
        assert_eq!(problems.len(), 1);
        // Short-form regexes are checked too, at their index.
        let problems = f.problems(&case(
            json!({"expected": {"regex": ["a", "("]}, "evaluation": {"strategy": "contains"}}),
        ));
        assert_eq!(pointers(&problems), vec!["/testCases/0/expected/regex/1"]);
    }
}
