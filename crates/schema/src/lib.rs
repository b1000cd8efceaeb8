//! JSON Schema as skilleval uses it, wherever an author's schema is checked: the draft a schema
//! declares, its compile (checked against its draft's meta-schema, offline, with limits on its
//! own `pattern`s) and an instance's violations, each with what the schema wanted.
//!
//! The `json_schema` and `tool_usage` strategies grade with it, the coordinator's editor checks a
//! schema being written with it, and the fuzz crate fuzzes it; it sits below `grading` so that
//! those need neither the providers nor the sandbox.

use jsonschema::error::{TypeKind, ValidationErrorKind};
use jsonschema::{Draft, PatternOptions, Validator};
use serde_json::Value;

use skilleval_model::grade::SchemaError;
use skilleval_model::text::{abbreviate, truncate};

/// Compiled-size limit for an author-supplied regex (a strategy's pattern or a schema's
/// `pattern`): generous for real patterns, small enough that a pathological one
/// (`(a{1000}){1000}`) fails at validation instead of eating memory.
pub const REGEX_SIZE_LIMIT: usize = 1 << 20;
/// Lazy-DFA cache limit per author-supplied regex.
pub const REGEX_DFA_SIZE_LIMIT: usize = 2 << 20;

/// Most violations listed in a grade; the score is 0 long before this many.
pub const MAX_REPORTED_ERRORS: usize = 100;

/// The draft a schema declares with `$schema`; `Ok(None)` when it declares none.
pub fn declared_draft(schema: &Value) -> Result<Option<Draft>, String> {
    let Some(declared) = schema.as_object().and_then(|o| o.get("$schema")) else {
        return Ok(None);
    };
    let Some(uri) = declared.as_str() else {
        return Err("$schema must be a string (the URI of a JSON Schema draft)".to_string());
    };
    let bare = uri.trim().trim_end_matches('#');
    let bare = bare
        .strip_prefix("https://")
        .or_else(|| bare.strip_prefix("http://"))
        .unwrap_or(bare);
    match bare {
        "json-schema.org/draft-04/schema" => Ok(Some(Draft::Draft4)),
        "json-schema.org/draft-06/schema" => Ok(Some(Draft::Draft6)),
        "json-schema.org/draft-07/schema" => Ok(Some(Draft::Draft7)),
        "json-schema.org/draft/2019-09/schema" => Ok(Some(Draft::Draft201909)),
        "json-schema.org/draft/2020-12/schema" | "json-schema.org/schema" => Ok(Some(Draft::Draft202012)),
        _ => Err(format!(
            "unsupported $schema `{uri}`: use the URI of JSON Schema draft 4, 6, 7, 2019-09 or 2020-12"
        )),
    }
}

fn draft_name(draft: Draft) -> &'static str {
    match draft {
        Draft::Draft4 => "draft 4",
        Draft::Draft6 => "draft 6",
        Draft::Draft7 => "draft 7",
        Draft::Draft201909 => "draft 2019-09",
        _ => "draft 2020-12",
    }
}

/// Checks `schema` against its draft's meta-schema and builds its validator, offline (no remote
/// or file `$ref`) and with limits on the schema's own `pattern`s. On failure, one message per
/// problem found, each naming the rule broken.
pub fn compile_schema(schema: &Value) -> Result<Validator, Vec<String>> {
    let draft = declared_draft(schema)
        .map_err(|e| vec![e])?
        .unwrap_or(Draft::Draft202012);
    let meta = match draft {
        Draft::Draft4 => jsonschema::draft4::meta::validator(),
        Draft::Draft6 => jsonschema::draft6::meta::validator(),
        Draft::Draft7 => jsonschema::draft7::meta::validator(),
        Draft::Draft201909 => jsonschema::draft201909::meta::validator(),
        _ => jsonschema::draft202012::meta::validator(),
    };
    let violations: Vec<String> = meta
        .iter_errors(schema)
        .take(MAX_REPORTED_ERRORS)
        .map(|e| {
            let at = e.instance_path().as_str();
            let at = if at.is_empty() { "/" } else { at };
            let (msg, _) = truncate_owned(e.to_string(), 300);
            format!(
                "invalid JSON Schema ({}): at {at}: {msg}",
                draft_name(draft)
            )
        })
        .collect();
    if !violations.is_empty() {
        return Err(violations);
    }
    jsonschema::options()
        .with_draft(draft)
        .offline()
        .should_validate_formats(true)
        .with_pattern_options(
            PatternOptions::fancy_regex()
                .backtrack_limit(1_000_000)
                .size_limit(REGEX_SIZE_LIMIT)
                .dfa_size_limit(REGEX_DFA_SIZE_LIMIT),
        )
        .build(schema)
        .map_err(|e| {
            vec![format!(
                "JSON Schema cannot be compiled ({}; only internal `$ref`s such as `#/$defs/name` are resolved, nothing is fetched): {e}",
                draft_name(draft)
            )]
        })
}

fn truncate_owned(s: String, max: usize) -> (String, bool) {
    let (head, cut) = truncate(&s, max);
    if cut {
        (format!("{head}…"), true)
    } else {
        (s, false)
    }
}

/// Validates `instance`, listing at most [`MAX_REPORTED_ERRORS`] violations.
pub fn schema_errors(validator: &Validator, instance: &Value) -> Vec<SchemaError> {
    if validator.is_valid(instance) {
        return Vec::new();
    }
    validator
        .iter_errors(instance)
        .take(MAX_REPORTED_ERRORS)
        .map(|e| SchemaError {
            path: e.instance_path().as_str().to_string(),
            message: truncate_owned(e.masked().to_string(), 500).0,
            value: Some(abbreviate(e.instance())),
            expected: Some(expected_of(e.kind())),
        })
        .collect()
}

/// What the schema keyword wanted, as `keyword: value`.
fn expected_of(kind: &ValidationErrorKind) -> String {
    use ValidationErrorKind as K;
    let keyword = kind.keyword();
    let wanted = match kind {
        K::Type { kind } => match kind {
            TypeKind::Single(t) => t.to_string(),
            TypeKind::Multiple(set) => set
                .iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>()
                .join(" | "),
        },
        K::Required { property } => match property {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        },
        K::Enum { options } => short(options),
        K::Constant { expected_value } => short(expected_value),
        K::Minimum { limit }
        | K::Maximum { limit }
        | K::ExclusiveMinimum { limit }
        | K::ExclusiveMaximum { limit } => limit.to_string(),
        K::MinLength { limit }
        | K::MaxLength { limit }
        | K::MinItems { limit }
        | K::MaxItems { limit }
        | K::MinProperties { limit }
        | K::MaxProperties { limit } => limit.to_string(),
        K::AdditionalItems { limit } => format!("at most {limit} items"),
        K::Pattern { pattern } => pattern.clone(),
        K::Format { format } => format.clone(),
        K::AdditionalProperties { unexpected } => {
            format!("false (unexpected: {})", unexpected.join(", "))
        }
        K::UnevaluatedProperties { unexpected } | K::UnevaluatedItems { unexpected } => {
            format!("false (unexpected: {})", unexpected.join(", "))
        }
        K::MultipleOf { multiple_of } => multiple_of.to_string(),
        K::UniqueItems => "true".to_string(),
        K::FalseSchema => return "nothing (false schema)".to_string(),
        _ => return keyword.to_string(),
    };
    format!("{keyword}: {wanted}")
}

fn short(v: &Value) -> String {
    truncate_owned(v.to_string(), 200).0
}
