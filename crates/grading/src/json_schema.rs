//! `json_schema`: the output must be JSON valid against `expected.jsonSchema`, or against
//! the JSON Schema `expected.zodSchema`'s Zod source converts to (see `zod`; the converted
//! schema is then checked and graded exactly like a written one).
//!
//! The draft is read from the schema's `$schema` (draft 4, 6, 7, 2019-09, 2020-12; 2020-12 when
//! absent; any other `$schema` is a problem). At compile the schema is checked against its
//! draft's meta-schema (every violation reported at `/expected/jsonSchema`) and the validator is
//! built once. Internal `$ref`s (`#/$defs/..`, `#/definitions/..`, nested) resolve; nothing is
//! fetched: a remote or file `$ref` is a compile problem. Known `format`s (`email`, `date-time`,
//! `uri`...) are asserted in every draft, as authors expect (unknown formats are ignored).
//!
//! At grade the JSON is taken from the output as is (`raw`), else from a fenced code block
//! (```` ```json ```` blocks first, then any other), else from the first `{...}` or `[...]` span
//! of the text that parses (`embedded`). Output with no JSON scores 0 and fails. Each violation
//! is reported with the instance path, a message, the offending value and what the schema
//! wanted (`type: integer`, `required: name`). Score = max(0, 1 - 0.1 x errors) (the report
//! seed's compliance score); passed when there are no errors.

use std::borrow::Cow;
use std::sync::Arc;

use async_trait::async_trait;
use jsonschema::Validator;
use serde_json::{json, Value};

use super::zod::ZodError;
use super::{CompileContext, GradeEnv, GradeInput, Grader, Strategy};
use skilleval_model::definition::TestCase;
use skilleval_model::grade::{Fault, Grade, SchemaError};
use skilleval_model::problem::Problem;
use skilleval_schema::{compile_schema, schema_errors};

/// Most `{` / `[` positions tried when looking for JSON embedded in text (bounds the work on
/// hostile output).
const MAX_EMBEDDED_ATTEMPTS: usize = 32;

/// The name test cases use (results carry it; the run summary's schema compliance counts
/// the results graded by this strategy).
pub const NAME: &str = "json_schema";

pub struct JsonSchema;

impl Strategy for JsonSchema {
    fn name(&self) -> &'static str {
        NAME
    }

    fn compile(
        &self,
        case: &TestCase,
        ctx: &CompileContext<'_>,
    ) -> Result<Arc<dyn Grader>, Vec<Problem>> {
        let (schema, at) = match (&case.expected.json_schema, &case.expected.zod_schema) {
            (Some(_), Some(_)) => {
                return Err(vec![ctx.problem(
                    "/expected/zodSchema",
                    "json_schema: give expected.jsonSchema or expected.zodSchema, not both",
                )])
            }
            (Some(schema), None) => (Cow::Borrowed(schema), "/expected/jsonSchema"),
            (None, Some(Value::String(source))) => match convert_zod(source, ctx) {
                Ok(schema) => (Cow::Owned(schema), "/expected/zodSchema"),
                Err(problem) => return Err(vec![problem]),
            },
            (None, Some(other)) => {
                return Err(vec![ctx.problem(
                    "/expected/zodSchema",
                    format!(
                        "json_schema: expected.zodSchema must be a string holding a Zod schema's source, e.g. \"z.object({{ name: z.string() }})\", not {}",
                        super::options::describe(other)
                    ),
                )])
            }
            (None, None) => {
                return Err(vec![ctx.problem(
                    "/expected/jsonSchema",
                    "json_schema needs expected.jsonSchema (the JSON Schema the output must satisfy) or expected.zodSchema (a Zod schema's source)",
                )])
            }
        };
        match compile_schema(&schema) {
            Ok(validator) => Ok(Arc::new(JsonSchemaGrader { validator })),
            Err(messages) => Err(messages.into_iter().map(|m| ctx.problem(at, m)).collect()),
        }
    }
}

/// The JSON Schema a Zod source converts to, or the problem at `/expected/zodSchema`.
fn convert_zod(source: &str, ctx: &CompileContext<'_>) -> Result<Value, Problem> {
    let Some(converter) = ctx.registry.zod() else {
        return Err(ctx.host_problem(
            "/expected/zodSchema",
            "json_schema: expected.zodSchema needs the Zod converter, and this validator runs without one (docs/strategies.md, json_schema)",
        ));
    };
    converter.convert(source).map_err(|e| match e {
        ZodError::Source(message) => ctx.problem(
            "/expected/zodSchema",
            format!("json_schema: expected.zodSchema is not a Zod schema that converts to JSON Schema: {message}"),
        ),
        ZodError::Host(message) => ctx.host_problem(
            "/expected/zodSchema",
            format!("json_schema: expected.zodSchema could not be converted on this host, a problem of the host's configuration, not of the package: {message}"),
        ),
    })
}

/// Where [`extract_json`] found the JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extraction {
    /// The whole output is JSON.
    Raw,
    /// Inside a fenced code block.
    Fenced,
    /// A `{...}` or `[...]` span inside other text.
    Embedded,
}

impl Extraction {
    pub fn as_str(self) -> &'static str {
        match self {
            Extraction::Raw => "raw",
            Extraction::Fenced => "fenced",
            Extraction::Embedded => "embedded",
        }
    }
}

/// Finds the JSON in a model's output: the whole output, else a fenced block (```` ```json ````
/// first), else the first `{...}` / `[...]` span that parses. `Err` says why none was found.
pub fn extract_json(output: &str) -> Result<(Value, Extraction), String> {
    let trimmed = output.trim();
    let raw_error = match serde_json::from_str::<Value>(trimmed) {
        Ok(v) => return Ok((v, Extraction::Raw)),
        Err(e) => e,
    };
    let blocks = fenced_blocks(trimmed);
    for json_only in [true, false] {
        for (info, body) in &blocks {
            let is_json = info.to_ascii_lowercase().starts_with("json");
            if is_json != json_only {
                continue;
            }
            if let Ok(v) = serde_json::from_str::<Value>(body.trim()) {
                return Ok((v, Extraction::Fenced));
            }
        }
    }
    let mut attempts = 0;
    for (pos, c) in trimmed.char_indices() {
        if c != '{' && c != '[' {
            continue;
        }
        attempts += 1;
        if attempts > MAX_EMBEDDED_ATTEMPTS {
            break;
        }
        let mut stream = serde_json::Deserializer::from_str(&trimmed[pos..]).into_iter::<Value>();
        if let Some(Ok(v)) = stream.next() {
            return Ok((v, Extraction::Embedded));
        }
    }
    if trimmed.is_empty() {
        return Err("output is empty".to_string());
    }
    Err(format!(
        "output is not JSON ({raw_error}) and holds no fenced or embedded JSON that parses"
    ))
}

/// `(info string, body)` of each fenced (```` ``` ````) block.
fn fenced_blocks(text: &str) -> Vec<(&str, &str)> {
    let mut blocks = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("```") {
        let after = &rest[open + 3..];
        let (info, body_start) = match after.find('\n') {
            Some(nl) => (after[..nl].trim(), &after[nl + 1..]),
            None => break,
        };
        let Some(close) = body_start.find("```") else {
            break;
        };
        blocks.push((info, &body_start[..close]));
        rest = &body_start[close + 3..];
    }
    blocks
}

/// The compliance score of an output with `errors` violations: max(0, 1 - 0.1 x errors).
pub fn compliance_score(errors: usize) -> f64 {
    (1.0 - 0.1 * errors as f64).max(0.0)
}

#[derive(Debug)]
struct JsonSchemaGrader {
    validator: Validator,
}

#[async_trait]
impl Grader for JsonSchemaGrader {
    async fn grade(&self, input: &GradeInput<'_>, _env: &GradeEnv) -> Result<Grade, Fault> {
        let (instance, from) = match extract_json(input.output) {
            Ok(found) => found,
            Err(why) => {
                let details = json!({
                    "valid": false,
                    "errors": [],
                    "compliance_score": 0.0,
                    "extracted_from": null,
                    "parse_error": why,
                });
                let mut grade = Grade::new(0.0, false, details);
                grade.schema_errors = Some(vec![SchemaError {
                    path: String::new(),
                    message: why,
                    value: None,
                    expected: Some("valid JSON".to_string()),
                }]);
                return Ok(grade);
            }
        };
        let errors = schema_errors(&self.validator, &instance);
        let score = compliance_score(errors.len());
        let valid = errors.is_empty();
        let details = json!({
            "valid": valid,
            "errors": errors,
            "compliance_score": score,
            "extracted_from": from.as_str(),
        });
        let mut grade = Grade::new(score, valid, details);
        grade.schema_errors = Some(errors);
        Ok(grade)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::needless_pass_by_value)]
mod tests {
    use serde_json::{json, Value};

    use super::super::test_support::{assert_close, case, megabyte_text, pointers, Fixture};
    use super::*;

    fn schema_case(schema: Value) -> TestCase {
        case(json!({"expected": {"jsonSchema": schema}, "evaluation": {"strategy": "json_schema"}}))
    }

    fn person() -> Value {
        json!({
            "type": "object",
            "required": ["name", "age"],
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "age": {"type": "integer", "minimum": 0},
                "email": {"type": "string"}
            }
        })
    }

    #[tokio::test]
    async fn valid_raw_json_passes() {
        let f = Fixture::new();
        let g = f
            .ok(&schema_case(person()), r#" {"name": "Ada", "age": 36} "#)
            .await;
        assert!(g.passed);
        assert_eq!(g.score, 1.0);
        assert_eq!(g.details["valid"], true);
        assert_eq!(g.details["extracted_from"], "raw");
        assert_eq!(g.schema_errors, Some(vec![]));
    }

    #[tokio::test]
    async fn violations_are_reported_with_path_value_and_expected() {
        let f = Fixture::new();
        let g = f
            .ok(&schema_case(person()), r#"{"age": "thirty", "email": 5}"#)
            .await;
        assert!(!g.passed);
        let errors = g.schema_errors.clone().unwrap();
        assert_eq!(errors.len(), 3, "{errors:#?}");
        assert_close(g.score, 0.7);
        assert_eq!(g.details["compliance_score"], 0.7);
        let by_path = |p: &str| errors.iter().find(|e| e.path == p).cloned().unwrap();
        let root = by_path("");
        assert_eq!(root.expected.as_deref(), Some("required: name"));
        let age = by_path("/age");
        assert_eq!(age.expected.as_deref(), Some("type: integer"));
        assert_eq!(age.value, Some(json!("thirty")));
        assert!(age.message.contains("integer"), "{}", age.message);
        let email = by_path("/email");
        assert_eq!(email.expected.as_deref(), Some("type: string"));
        assert_eq!(email.value, Some(json!(5)));
        assert_eq!(g.details["errors"].as_array().unwrap().len(), 3);
    }

    #[tokio::test]
    async fn score_floors_at_zero() {
        let f = Fixture::new();
        let schema = json!({"type": "array", "items": {"type": "integer"}});
        let out =
            serde_json::to_string(&(0..15).map(|i| format!("s{i}")).collect::<Vec<_>>()).unwrap();
        let g = f.ok(&schema_case(schema), &out).await;
        assert_eq!(g.score, 0.0);
        assert_eq!(g.schema_errors.unwrap().len(), 15);
    }

    #[tokio::test]
    async fn fenced_json_is_extracted() {
        let f = Fixture::new();
        let out = "Here you go:\n```python\nprint(1)\n```\nand\n```json\n{\"name\": \"Zoë 日本\", \"age\": 3}\n```\nDone.";
        let g = f.ok(&schema_case(person()), out).await;
        assert!(g.passed, "{:?}", g.details);
        assert_eq!(g.details["extracted_from"], "fenced");
        // A bare fence works too.
        let g = f
            .ok(
                &schema_case(person()),
                "```\n{\"name\": \"x\", \"age\": 1}\n```",
            )
            .await;
        assert_eq!(g.details["extracted_from"], "fenced");
        assert!(g.passed);
    }

    #[tokio::test]
    async fn embedded_json_is_extracted() {
        let f = Fixture::new();
        let out =
            "Sure! {not json} The answer is {\"name\": \"Ada\", \"age\": 36} — hope it helps.";
        let g = f.ok(&schema_case(person()), out).await;
        assert!(g.passed, "{:?}", g.details);
        assert_eq!(g.details["extracted_from"], "embedded");
    }

    #[tokio::test]
    async fn unparseable_output_scores_zero() {
        let f = Fixture::new();
        for out in ["", "no json here at all", "naïve café 日本 {broken"] {
            let g = f.ok(&schema_case(person()), out).await;
            assert!(!g.passed);
            assert_eq!(g.score, 0.0);
            assert_eq!(g.details["valid"], false);
            assert!(g.details["parse_error"].as_str().unwrap().len() > 5);
            assert_eq!(
                g.schema_errors.as_ref().unwrap()[0].expected.as_deref(),
                Some("valid JSON")
            );
        }
    }

    #[tokio::test]
    async fn megabyte_outputs_do_not_hang_or_panic() {
        let f = Fixture::new();
        let g = f.ok(&schema_case(person()), &megabyte_text()).await;
        assert!(!g.passed);
        // Many unclosed brackets: bounded attempts.
        let hostile = "[1, ".repeat(250_000);
        let g = f.ok(&schema_case(person()), &hostile).await;
        assert!(!g.passed);
        // A 1 MB valid instance.
        let big = json!({"name": "x".repeat(1 << 20), "age": 1});
        let g = f.ok(&schema_case(person()), &big.to_string()).await;
        assert!(g.passed);
        // A 1 MB invalid instance: the value in the error is abbreviated.
        let big = json!({"name": 1, "age": 1, "pad": "y".repeat(1 << 20)});
        let g = f
            .ok(&schema_case(json!({"type": "array"})), &big.to_string())
            .await;
        let err = &g.schema_errors.unwrap()[0];
        assert!(err.value.as_ref().unwrap().to_string().len() < 1000);
    }

    #[tokio::test]
    async fn nested_refs_with_defs_resolve() {
        let f = Fixture::new();
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "required": ["order"],
            "properties": {"order": {"$ref": "#/$defs/order"}},
            "$defs": {
                "order": {
                    "type": "object",
                    "required": ["id", "items"],
                    "properties": {
                        "id": {"type": "integer"},
                        "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1}
                    }
                },
                "item": {
                    "type": "object",
                    "required": ["sku", "price"],
                    "properties": {"sku": {"type": "string"}, "price": {"$ref": "#/$defs/money"}}
                },
                "money": {"type": "number", "minimum": 0}
            }
        });
        let c = schema_case(schema);
        let ok = r#"{"order": {"id": 1, "items": [{"sku": "a", "price": 2.5}]}}"#;
        assert!(f.ok(&c, ok).await.passed);
        let bad = r#"{"order": {"id": 1, "items": [{"sku": "a", "price": -1}, {"price": 3}]}}"#;
        let g = f.ok(&c, bad).await;
        let errors = g.schema_errors.unwrap();
        let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
        assert!(paths.contains(&"/order/items/0/price"), "{paths:?}");
        assert!(paths.contains(&"/order/items/1"), "{paths:?}");
        assert_eq!(errors.len(), 2);
        let price = errors
            .iter()
            .find(|e| e.path == "/order/items/0/price")
            .unwrap();
        assert_eq!(price.expected.as_deref(), Some("minimum: 0"));
        assert_eq!(price.value, Some(json!(-1)));
    }

    #[tokio::test]
    async fn draft7_definitions_refs_resolve() {
        let f = Fixture::new();
        let schema = json!({
            "$schema": "http://json-schema.org/draft-07/schema#",
            "definitions": {
                "tag": {"type": "string", "enum": ["a", "b"]},
                "tags": {"type": "array", "items": {"$ref": "#/definitions/tag"}}
            },
            "type": "object",
            "properties": {"tags": {"$ref": "#/definitions/tags"}}
        });
        let c = schema_case(schema);
        assert!(f.ok(&c, r#"{"tags": ["a", "b"]}"#).await.passed);
        let g = f.ok(&c, r#"{"tags": ["a", "c"]}"#).await;
        let errors = g.schema_errors.unwrap();
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].path, "/tags/1");
        assert_eq!(errors[0].expected.as_deref(), Some(r#"enum: ["a","b"]"#));
    }

    #[tokio::test]
    async fn formats_are_asserted() {
        let f = Fixture::new();
        let c = schema_case(json!({
            "type": "object",
            "properties": {"email": {"type": "string", "format": "email"}, "at": {"format": "date-time"}}
        }));
        assert!(
            f.ok(
                &c,
                r#"{"email": "ada@example.com", "at": "2024-05-03T10:00:00Z"}"#
            )
            .await
            .passed
        );
        let g = f
            .ok(&c, r#"{"email": "not an email", "at": "yesterday"}"#)
            .await;
        let mut expected: Vec<String> = g
            .schema_errors
            .unwrap()
            .into_iter()
            .filter_map(|e| e.expected)
            .collect();
        expected.sort();
        assert_eq!(expected, vec!["format: date-time", "format: email"]);
    }

    #[tokio::test]
    async fn draft4_semantics_apply() {
        let f = Fixture::new();
        // In draft 4 exclusiveMaximum is a boolean modifier.
        let schema = json!({
            "$schema": "http://json-schema.org/draft-04/schema#",
            "type": "number", "maximum": 10, "exclusiveMaximum": true
        });
        let c = schema_case(schema);
        assert!(f.ok(&c, "9").await.passed);
        assert!(!f.ok(&c, "10").await.passed);
    }

    #[test]
    fn invalid_schemas_are_problems_at_json_schema() {
        let f = Fixture::new();
        let problems = f.problems(&schema_case(json!({"type": "strin", "minLength": -1})));
        assert!(!problems.is_empty());
        assert!(problems
            .iter()
            .all(|p| p.pointer == "/testCases/0/expected/jsonSchema"));
        assert!(
            problems[0]
                .message
                .starts_with("invalid JSON Schema (draft 2020-12)"),
            "{}",
            problems[0].message
        );
        // Both violations are listed.
        assert_eq!(problems.len(), 2, "{problems:#?}");
    }

    #[test]
    fn missing_schema_unknown_draft_and_remote_refs_are_problems() {
        let f = Fixture::new();
        let problems = f.problems(&case(json!({"evaluation": {"strategy": "json_schema"}})));
        assert_eq!(
            pointers(&problems),
            vec!["/testCases/0/expected/jsonSchema"]
        );
        assert!(problems[0].message.contains("needs expected.jsonSchema"));

        let problems = f.problems(&schema_case(
            json!({"$schema": "https://example.com/my-meta", "type": "object"}),
        ));
        assert!(
            problems[0].message.contains("unsupported $schema"),
            "{}",
            problems[0].message
        );

        let problems = f.problems(&schema_case(
            json!({"$ref": "https://example.com/schema.json"}),
        ));
        assert_eq!(
            pointers(&problems),
            vec!["/testCases/0/expected/jsonSchema"]
        );
        assert!(
            problems[0].message.contains("cannot be compiled"),
            "{}",
            problems[0].message
        );

        let problems = f.problems(&schema_case(json!({"$ref": "#/$defs/missing"})));
        assert!(
            problems[0].message.contains("cannot be compiled"),
            "{}",
            problems[0].message
        );
    }

    #[test]
    fn extraction_prefers_raw_then_fenced_then_embedded() {
        assert_eq!(
            extract_json("[1,2]").unwrap(),
            (json!([1, 2]), Extraction::Raw)
        );
        assert_eq!(extract_json("\"s\"").unwrap().1, Extraction::Raw);
        let (v, how) = extract_json("x ```\n{\"a\":1}\n``` y {\"b\":2}").unwrap();
        assert_eq!((v, how), (json!({"a": 1}), Extraction::Fenced));
        let (v, how) = extract_json("```text\nnot json\n```\n```json\n[true]\n```").unwrap();
        assert_eq!((v, how), (json!([true]), Extraction::Fenced));
        let (v, how) = extract_json("result: [1, {\"a\": 2}] trailing").unwrap();
        assert_eq!((v, how), (json!([1, {"a": 2}]), Extraction::Embedded));
        assert!(extract_json("```json\n{broken\n```").is_err());
    }

    #[test]
    fn compliance_score_matches_seed() {
        assert_eq!(compliance_score(0), 1.0);
        assert_close(compliance_score(3), 0.7);
        assert_eq!(compliance_score(10), 0.0);
        assert_eq!(compliance_score(12), 0.0);
    }
}
