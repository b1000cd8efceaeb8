//! `contains` (alias `rule_based`): fast deterministic checks on the output, the evaluator
//! seed's rule-based evaluator.
//!
//! Rules come from option `rules`, an array of `{"type", "value", "caseSensitive"}` with type
//! `includes`, `excludes`, `min_length`, `max_length`, `json_parse` or `regex`, and/or from the
//! short forms `includes: [..]`, `excludes: [..]`, `minLength`, `maxLength`, `jsonParse: true`,
//! `regex: [..]` (in `evaluation.options` or `expected`). An array value is one rule per item.
//! Option `caseSensitive` (default true) applies to `includes`, `excludes` and `regex` rules
//! that do not set their own. Lengths count characters of the trimmed output. A `json_parse`
//! rule object with `"value": false` requires the output *not* to be JSON.
//!
//! Score = rules passed / rules; passed when every rule passes. Details: `rules: [{rule,
//! passed, detail}]`. Regexes are compiled once; no rules at all is a problem.

use std::borrow::Cow;
use std::sync::Arc;

use async_trait::async_trait;
use regex::Regex;
use serde::de::IgnoredAny;
use serde_json::{json, Value};

use super::options::{describe, option_pointer, OptionReader};
use super::text::{has_uppercase, user_regex};
use super::{CompileContext, GradeEnv, GradeInput, Grader, Strategy};
use skilleval_model::definition::TestCase;
use skilleval_model::grade::{Fault, Grade};
use skilleval_model::problem::Problem;

const RULE_TYPES: &str = "includes, excludes, min_length, max_length, json_parse, regex";

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

        if let Some(value) = opts.raw("rules") {
            let base = option_pointer(case, "rules");
            match value {
                Value::Array(items) => {
                    for (i, item) in items.iter().enumerate() {
                        rule_object(
                            item,
                            &format!("{base}/{i}"),
                            case_sensitive,
                            &mut opts,
                            &mut rules,
                        );
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
                    if let Some(rule) = text_rule(kind, item, case_sensitive, &pointer, &mut opts) {
                        rules.push(rule);
                    }
                }
            }
        }
        if let Some(n) = opts.u64("minLength") {
            rules.push(Rule::new(Check::MinLength(n as usize)));
        }
        if let Some(n) = opts.u64("maxLength") {
            rules.push(Rule::new(Check::MaxLength(n as usize)));
        }
        if opts.bool("jsonParse", false) {
            rules.push(Rule::new(Check::JsonParse(true)));
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
    let case_sensitive = match obj.get("caseSensitive") {
        None | Some(Value::Null) => default_cs,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            opts.problem(
                &format!("{pointer}/caseSensitive"),
                format!(
                    "contains: caseSensitive must be true or false, not {}",
                    describe(other)
                ),
            );
            default_cs
        }
    };
    let value = obj.get("value");
    let value_pointer = format!("{pointer}/value");
    match kind {
        "includes" | "excludes" | "regex" => {
            let items: Vec<(&str, String)> = match value {
                Some(Value::String(s)) => vec![(s.as_str(), value_pointer.clone())],
                Some(Value::Array(items)) if !items.is_empty() => {
                    let mut out = Vec::new();
                    for (i, v) in items.iter().enumerate() {
                        match v.as_str() {
                            Some(s) => out.push((s, format!("{value_pointer}/{i}"))),
                            None => opts.problem(
                                &format!("{value_pointer}/{i}"),
                                format!(
                                    "contains: `{kind}` values must be strings, not {}",
                                    describe(v)
                                ),
                            ),
                        }
                    }
                    out
                }
                _ => {
                    opts.problem(
                        &value_pointer,
                        format!("contains: a `{kind}` rule needs a `value`: a string or an array of strings"),
                    );
                    return;
                }
            };
            for (s, p) in items {
                if let Some(rule) = text_rule(kind, s, case_sensitive, &p, opts) {
                    rules.push(rule);
                }
            }
        }
        "min_length" | "max_length" => match value.and_then(Value::as_u64) {
            Some(n) => rules.push(Rule::new(if kind == "min_length" {
                Check::MinLength(n as usize)
            } else {
                Check::MaxLength(n as usize)
            })),
            None => opts.problem(
                &value_pointer,
                format!("contains: a `{kind}` rule needs a `value` that is a non-negative integer"),
            ),
        },
        "json_parse" => match value {
            None | Some(Value::Null) => rules.push(Rule::new(Check::JsonParse(true))),
            Some(Value::Bool(b)) => rules.push(Rule::new(Check::JsonParse(*b))),
            Some(other) => opts.problem(
                &value_pointer,
                format!(
                    "contains: a `json_parse` rule's value must be true or false, not {}",
                    describe(other)
                ),
            ),
        },
        other => opts.problem(
            &format!("{pointer}/type"),
            format!("contains: unknown rule type `{other}`; use one of {RULE_TYPES}"),
        ),
    }
}

/// An `includes`, `excludes` or `regex` rule for one string.
fn text_rule(
    kind: &str,
    text: &str,
    case_sensitive: bool,
    pointer: &str,
    opts: &mut OptionReader<'_, '_>,
) -> Option<Rule> {
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
    let check = match kind {
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
    };
    let label = match kind {
        "regex" => format!("regex /{text}/"),
        _ => format!("{kind} {text:?}"),
    };
    Some(Rule {
        check,
        label: Value::String(label),
    })
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
    /// `true`: the output must parse as JSON; `false`: it must not.
    JsonParse(bool),
    Regex(Regex),
}

#[derive(Debug)]
struct Rule {
    check: Check,
    /// How the rule is named in details, built once.
    label: Value,
}

impl Rule {
    fn new(check: Check) -> Self {
        let label = match &check {
            Check::MinLength(n) => format!("min_length {n}"),
            Check::MaxLength(n) => format!("max_length {n}"),
            Check::JsonParse(true) => "json_parse".to_string(),
            Check::JsonParse(false) => "not json_parse".to_string(),
            Check::Includes { needle, .. } => format!("includes {needle:?}"),
            Check::Excludes { needle, .. } => format!("excludes {needle:?}"),
            Check::Regex(re) => format!("regex /{}/", re.as_str()),
        };
        Rule {
            check,
            label: Value::String(label),
        }
    }
}

#[derive(Debug)]
struct ContainsGrader {
    rules: Vec<Rule>,
    /// Whether the lower-cased output is needed.
    any_insensitive: bool,
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
        let mut length: Option<usize> = None;
        let mut char_len = || *length.get_or_insert_with(|| trimmed.chars().count());

        let mut passed_count = 0usize;
        let mut results = Vec::with_capacity(self.rules.len());
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
            results.push(json!({"rule": rule.label.clone(), "passed": passed, "detail": detail}));
        }
        let total = self.rules.len().max(1) as f64;
        let all = passed_count == self.rules.len();
        Ok(Grade::new(
            passed_count as f64 / total,
            all,
            json!({"rules": results}),
        ))
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
