//! `tool_usage`: did the agent call the right tools, with valid arguments, in the right order?
//! (the evaluator seed's tool usage evaluator).
//!
//! Tool calls come from the runner (read from its JSON transcript); when it gave none, the
//! output itself is read as a transcript ([`skilleval_model::output::transcript::parse`]); with no
//! transcript at all there were no calls.
//!
//! Options:
//! - `tools`: `[{"name", "required" (default true), "arguments" (a JSON Schema every call's
//!   arguments must satisfy, compiled once), "minCalls", "maxCalls"}]`; a bare string is a
//!   required tool;
//! - `order`: tool names that must appear in this relative order (as a subsequence of the
//!   calls; other calls may come between);
//! - `forbidden`: tool names that must not be called.
//!
//! Each of these yields checks: `required` (or `min_calls`), `max_calls`, `arguments` (when the
//! tool was called), `forbidden`, `order`. Score = checks passed / checks; passed when all pass.
//! Details: `checks: [{check, tool, passed, detail}]`, `calls`, `source`.

use std::borrow::Cow;
use std::sync::Arc;

use async_trait::async_trait;
use jsonschema::Validator;
use serde_json::{json, Value};

use super::options::{describe, option_pointer, OptionReader};
use super::{CompileContext, GradeEnv, GradeInput, Grader, Strategy};
use skilleval_model::definition::TestCase;
use skilleval_model::grade::{Fault, Grade, ToolCall};
use skilleval_model::problem::Problem;
use skilleval_model::text::abbreviate;
use skilleval_schema::{compile_schema, schema_errors};

/// Most calls listed in details.
const MAX_LISTED_CALLS: usize = 100;

pub struct ToolUsage;

#[derive(Debug)]
struct ToolSpec {
    name: String,
    required: bool,
    min_calls: Option<u64>,
    max_calls: Option<u64>,
    /// Compiled schema for the call arguments.
    arguments: Option<Validator>,
}

impl Strategy for ToolUsage {
    fn name(&self) -> &'static str {
        "tool_usage"
    }

    fn compile(
        &self,
        case: &TestCase,
        ctx: &CompileContext<'_>,
    ) -> Result<Arc<dyn Grader>, Vec<Problem>> {
        let mut opts = OptionReader::new(case, ctx, "tool_usage");
        let mut tools = Vec::new();
        if let Some(value) = opts.raw("tools") {
            let base = option_pointer(case, "tools");
            match value {
                Value::Array(items) => {
                    for (i, item) in items.iter().enumerate() {
                        if let Some(spec) = tool_spec(item, &format!("{base}/{i}"), &mut opts) {
                            tools.push(spec);
                        }
                    }
                }
                other => opts.problem(
                    &base,
                    format!(
                        "tool_usage: option `tools` must be an array of tool objects, not {}",
                        describe(other)
                    ),
                ),
            }
        }
        let order = opts.string_list("order").unwrap_or_default();
        let forbidden = opts.string_list("forbidden").unwrap_or_default();
        let forbidden_base = option_pointer(case, "forbidden");
        for (i, name) in forbidden.iter().enumerate() {
            if tools
                .iter()
                .any(|t| &t.name == name && (t.required || t.min_calls.unwrap_or(0) > 0))
            {
                opts.problem(
                    &format!("{forbidden_base}/{i}"),
                    format!("tool_usage: tool `{name}` is both required and forbidden"),
                );
            }
            if order.contains(name) {
                opts.problem(
                    &format!("{forbidden_base}/{i}"),
                    format!("tool_usage: tool `{name}` is both in `order` and forbidden"),
                );
            }
        }
        if tools.is_empty() && order.is_empty() && forbidden.is_empty() && opts.problems.is_empty()
        {
            opts.problem(
                "/evaluation/options/tools",
                "tool_usage needs at least one of the options `tools`, `order` or `forbidden`",
            );
        }
        opts.finish(Arc::new(ToolUsageGrader {
            tools,
            order: order.into_iter().map(Value::String).collect(),
            forbidden,
        }) as Arc<dyn Grader>)
    }
}

fn tool_spec(item: &Value, pointer: &str, opts: &mut OptionReader<'_, '_>) -> Option<ToolSpec> {
    let obj = match item {
        Value::String(name) if !name.trim().is_empty() => {
            return Some(ToolSpec {
                name: name.clone(),
                required: true,
                min_calls: None,
                max_calls: None,
                arguments: None,
            })
        }
        Value::Object(obj) => obj,
        other => {
            opts.problem(
                pointer,
                format!(
                    "tool_usage: a tool must be a name or an object {{\"name\", ...}}, not {}",
                    describe(other)
                ),
            );
            return None;
        }
    };
    let mut ok = true;
    let name = match obj.get("name") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
        _ => {
            opts.problem(
                &format!("{pointer}/name"),
                "tool_usage: a tool needs a non-empty `name`",
            );
            ok = false;
            String::new()
        }
    };
    let required = match obj.get("required") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            opts.problem(
                &format!("{pointer}/required"),
                format!(
                    "tool_usage: `required` must be true or false, not {}",
                    describe(other)
                ),
            );
            ok = false;
            true
        }
    };
    let mut count = |key: &str, opts: &mut OptionReader<'_, '_>| match obj.get(key) {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(n) => Some(n),
            None => {
                opts.problem(
                    &format!("{pointer}/{key}"),
                    format!(
                        "tool_usage: `{key}` must be a non-negative integer, not {}",
                        describe(v)
                    ),
                );
                ok = false;
                None
            }
        },
    };
    let min_calls = count("minCalls", opts);
    let max_calls = count("maxCalls", opts);
    if let (Some(lo), Some(hi)) = (min_calls, max_calls) {
        if lo > hi {
            opts.problem(
                &format!("{pointer}/minCalls"),
                format!("tool_usage: minCalls ({lo}) must not be above maxCalls ({hi})"),
            );
            ok = false;
        }
    }
    let arguments = match obj.get("arguments") {
        None | Some(Value::Null) => None,
        Some(schema) => match compile_schema(schema) {
            Ok(v) => Some(v),
            Err(messages) => {
                for m in messages {
                    opts.problem(&format!("{pointer}/arguments"), m);
                }
                ok = false;
                None
            }
        },
    };
    ok.then_some(ToolSpec {
        name,
        required,
        min_calls,
        max_calls,
        arguments,
    })
}

#[derive(Debug)]
struct ToolUsageGrader {
    tools: Vec<ToolSpec>,
    order: Vec<Value>,
    forbidden: Vec<String>,
}

/// Where the grader found the calls.
fn calls_of<'a>(input: &GradeInput<'a>) -> (Cow<'a, [ToolCall]>, &'static str) {
    if let Some(calls) = input.tool_calls {
        return (Cow::Borrowed(calls), "runner");
    }
    match skilleval_model::output::transcript::parse(input.output).tool_calls {
        Some(calls) => (Cow::Owned(calls), "output_transcript"),
        None => (Cow::Owned(Vec::new()), "none"),
    }
}

fn times(n: u64) -> String {
    match n {
        0 => "not called".to_string(),
        1 => "called once".to_string(),
        n => format!("called {n} times"),
    }
}

fn check(kind: &str, tool: &Value, passed: bool, detail: &str) -> Value {
    json!({"check": kind, "tool": tool, "passed": passed, "detail": detail})
}

#[async_trait]
impl Grader for ToolUsageGrader {
    async fn grade(&self, input: &GradeInput<'_>, _env: &GradeEnv) -> Result<Grade, Fault> {
        let (calls, source) = calls_of(input);
        let mut checks = Vec::new();

        for spec in &self.tools {
            let of_tool: Vec<&ToolCall> = calls.iter().filter(|c| c.name == spec.name).collect();
            let n = of_tool.len() as u64;
            let tool = Value::String(spec.name.clone());
            if let Some(min) = spec.min_calls {
                checks.push(check(
                    "min_calls",
                    &tool,
                    n >= min,
                    &format!("{}; at least {min} wanted", times(n)),
                ));
            } else if spec.required {
                checks.push(check("required", &tool, n > 0, &times(n)));
            }
            if let Some(max) = spec.max_calls {
                checks.push(check(
                    "max_calls",
                    &tool,
                    n <= max,
                    &format!("{}; at most {max} allowed", times(n)),
                ));
            }
            if let (Some(validator), true) = (&spec.arguments, n > 0) {
                let mut problems = Vec::new();
                for (k, call) in of_tool.iter().enumerate() {
                    for e in schema_errors(validator, &call.arguments) {
                        let at = if e.path.is_empty() {
                            "/".to_string()
                        } else {
                            e.path
                        };
                        problems.push(format!("call {}: {at}: {}", k + 1, e.message));
                    }
                }
                let passed = problems.is_empty();
                let detail = if passed {
                    format!("arguments of {n} calls valid")
                } else {
                    let shown: Vec<&str> = problems.iter().take(5).map(String::as_str).collect();
                    let more = problems.len().saturating_sub(5);
                    if more > 0 {
                        format!("{} (and {more} more)", shown.join("; "))
                    } else {
                        shown.join("; ")
                    }
                };
                checks.push(check("arguments", &tool, passed, &detail));
            }
        }

        for name in &self.forbidden {
            let n = calls.iter().filter(|c| &c.name == name).count();
            checks.push(check(
                "forbidden",
                &Value::String(name.clone()),
                n == 0,
                &times(n as u64),
            ));
        }

        if !self.order.is_empty() {
            // Greedy subsequence match: each listed tool after the previous one.
            let mut next = 0;
            for call in calls.iter() {
                if self.order.get(next).and_then(Value::as_str) == Some(call.name.as_str()) {
                    next += 1;
                    if next == self.order.len() {
                        break;
                    }
                }
            }
            let passed = next == self.order.len();
            let wanted: Vec<&str> = self.order.iter().filter_map(Value::as_str).collect();
            let detail = if passed {
                format!("called in order: {}", wanted.join(" -> "))
            } else if next == 0 {
                format!(
                    "`{}` never called",
                    wanted.first().copied().unwrap_or_default()
                )
            } else {
                format!(
                    "`{}` not called after `{}`",
                    wanted.get(next).copied().unwrap_or_default(),
                    wanted[..next].join(" -> ")
                )
            };
            checks.push(check(
                "order",
                &Value::Array(self.order.clone()),
                passed,
                &detail,
            ));
        }

        let total = checks.len();
        let passed_count = checks.iter().filter(|c| c["passed"] == true).count();
        let score = if total == 0 {
            1.0
        } else {
            passed_count as f64 / total as f64
        };
        let listed: Vec<Value> = calls
            .iter()
            .take(MAX_LISTED_CALLS)
            .map(|c| json!({"name": c.name, "arguments": abbreviate(&c.arguments)}))
            .collect();
        let details = json!({
            "checks": checks,
            "calls": listed,
            "call_count": calls.len(),
            "source": source,
        });
        Ok(Grade::new(score, passed_count == total, details))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::needless_pass_by_value)]
mod tests {
    use serde_json::json;

    use super::super::test_support::{assert_close, case, megabyte_text, pointers, Fixture};
    use super::*;

    fn calls(spec: &[(&str, Value)]) -> Vec<ToolCall> {
        spec.iter()
            .map(|(n, a)| ToolCall {
                name: n.to_string(),
                arguments: a.clone(),
            })
            .collect()
    }

    fn tu(options: Value) -> TestCase {
        case(json!({"evaluation": {"strategy": "tool_usage", "options": options}}))
    }

    fn checks(g: &Grade) -> Vec<(String, bool)> {
        g.details["checks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["check"].as_str().unwrap().to_string(),
                    c["passed"].as_bool().unwrap(),
                )
            })
            .collect()
    }

    fn search_case() -> TestCase {
        tu(json!({
            "tools": [
                {"name": "search", "arguments": {
                    "type": "object", "required": ["query"],
                    "properties": {"query": {"type": "string", "minLength": 1}, "limit": {"type": "integer"}}
                }, "maxCalls": 2},
                {"name": "summarize"},
                {"name": "translate", "required": false}
            ],
            "order": ["search", "summarize"],
            "forbidden": ["delete_all"]
        }))
    }

    #[tokio::test]
    async fn all_checks_pass() {
        let f = Fixture::new();
        let c = search_case();
        let cs = calls(&[
            ("search", json!({"query": "rust"})),
            ("fetch", json!({})),
            ("summarize", json!({"text": "…"})),
        ]);
        let g = f.grade_with_calls(&c, "", Some(&cs)).await.unwrap();
        assert!(g.passed, "{:#?}", g.details);
        assert_eq!(g.score, 1.0);
        assert_eq!(
            checks(&g),
            vec![
                ("required".into(), true),
                ("max_calls".into(), true),
                ("arguments".into(), true),
                ("required".into(), true),
                ("forbidden".into(), true),
                ("order".into(), true),
            ]
        );
        assert_eq!(g.details["source"], "runner");
        assert_eq!(g.details["call_count"], 3);
    }

    #[tokio::test]
    async fn wrong_order_bad_arguments_and_forbidden_call() {
        let f = Fixture::new();
        let c = search_case();
        let cs = calls(&[
            ("summarize", json!({})),
            ("search", json!({"query": ""})),
            ("delete_all", json!({})),
        ]);
        let g = f.grade_with_calls(&c, "", Some(&cs)).await.unwrap();
        assert!(!g.passed);
        assert_eq!(
            checks(&g),
            vec![
                ("required".into(), true),
                ("max_calls".into(), true),
                ("arguments".into(), false),
                ("required".into(), true),
                ("forbidden".into(), false),
                ("order".into(), false),
            ]
        );
        assert_close(g.score, 3.0 / 6.0);
        let c = &g.details["checks"];
        assert!(
            c[2]["detail"]
                .as_str()
                .unwrap()
                .starts_with("call 1: /query:"),
            "{}",
            c[2]["detail"]
        );
        assert_eq!(c[5]["detail"], "`summarize` not called after `search`");
    }

    #[tokio::test]
    async fn order_is_a_subsequence() {
        let f = Fixture::new();
        let c = tu(json!({"order": ["a", "b", "c"]}));
        let ok = calls(&[
            ("a", json!({})),
            ("x", json!({})),
            ("b", json!({})),
            ("a", json!({})),
            ("c", json!({})),
        ]);
        assert!(f.grade_with_calls(&c, "", Some(&ok)).await.unwrap().passed);
        let bad = calls(&[("b", json!({})), ("a", json!({})), ("c", json!({}))]);
        let g = f.grade_with_calls(&c, "", Some(&bad)).await.unwrap();
        assert!(!g.passed);
        assert_eq!(g.details["checks"][0]["detail"], "`b` not called after `a`");
        let g = f.grade_with_calls(&c, "", Some(&[])).await.unwrap();
        assert_eq!(g.details["checks"][0]["detail"], "`a` never called");
    }

    #[tokio::test]
    async fn min_and_max_calls() {
        let f = Fixture::new();
        let c = tu(json!({"tools": [{"name": "ping", "minCalls": 2, "maxCalls": 3}]}));
        let two = calls(&[("ping", json!({})), ("ping", json!({}))]);
        assert!(f.grade_with_calls(&c, "", Some(&two)).await.unwrap().passed);
        let one = calls(&[("ping", json!({}))]);
        let g = f.grade_with_calls(&c, "", Some(&one)).await.unwrap();
        assert_eq!(
            checks(&g),
            vec![("min_calls".into(), false), ("max_calls".into(), true)]
        );
        assert_eq!(g.score, 0.5);
        let four: Vec<ToolCall> = (0..4).flat_map(|_| one.clone()).collect();
        assert_eq!(
            f.grade_with_calls(&c, "", Some(&four)).await.unwrap().score,
            0.5
        );
    }

    #[tokio::test]
    async fn calls_are_read_from_an_output_transcript() {
        let f = Fixture::new();
        let c = tu(json!({"tools": ["get_weather"]}));
        let transcript = json!({"messages": [
            {"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "content": [{"type": "tool_use", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "assistant", "content": "Sunny, 21°C — très agréable."}
        ]});
        let g = f.ok(&c, &transcript.to_string()).await;
        assert!(g.passed, "{:#?}", g.details);
        assert_eq!(g.details["source"], "output_transcript");
        assert_eq!(g.details["calls"][0]["arguments"]["city"], "Paris");
    }

    #[tokio::test]
    async fn no_transcript_means_no_calls() {
        let f = Fixture::new();
        let c = tu(json!({"tools": ["search"], "forbidden": ["rm"]}));
        for out in ["", "naïve café 日本"] {
            let g = f.ok(&c, out).await;
            assert_eq!(g.score, 0.5);
            assert_eq!(g.details["source"], "none");
        }
        let g = f.ok(&c, &megabyte_text()).await;
        assert_eq!(g.score, 0.5);
    }

    #[test]
    fn problems() {
        let f = Fixture::new();
        let problems = f.problems(&tu(json!({})));
        assert_eq!(
            pointers(&problems),
            vec!["/testCases/0/evaluation/options/tools"]
        );
        let problems = f.problems(&tu(json!({
            "tools": [{"required": "yes"}, {"name": "a", "arguments": {"type": 5}}, {"name": "b", "minCalls": 3, "maxCalls": 1}, 7],
            "forbidden": ["b"]
        })));
        assert_eq!(
            pointers(&problems),
            vec![
                "/testCases/0/evaluation/options/tools/0/name",
                "/testCases/0/evaluation/options/tools/0/required",
                "/testCases/0/evaluation/options/tools/1/arguments",
                "/testCases/0/evaluation/options/tools/2/minCalls",
                "/testCases/0/evaluation/options/tools/3",
            ]
        );
        assert!(
            problems[2].message.starts_with("invalid JSON Schema"),
            "{}",
            problems[2].message
        );
        let problems = f.problems(&tu(json!({"tools": ["a"], "forbidden": ["a"]})));
        assert_eq!(
            pointers(&problems),
            vec!["/testCases/0/evaluation/options/forbidden/0"]
        );
        assert!(problems[0].message.contains("both required and forbidden"));
    }
}
