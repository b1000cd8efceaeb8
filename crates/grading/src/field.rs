//! Which text a lexical strategy reads (the evaluator seed's `sourceField`, `referenceField`
//! and keyword source): the produced output, the case's expected output, its prompt, or a
//! value inside the case's `input.context`.
//!
//! A field is named by a string option: `output` (alias `response`), `expected.output`
//! (aliases `expected`, `groundTruth`), `prompt` (alias `input.prompt`) or
//! `input.context.<path>` (alias `context.<path>`), where `<path>` is dot-separated keys, a
//! number indexing an array. The name is checked at compile time; a context value is looked
//! up at grade time, because the context is the case's input, which compiling never reads
//! (cases that differ only in their input share one grader, see `DefinitionKey`).

use std::borrow::Cow;

use serde_json::Value;

use super::GradeInput;

/// What the field names accept, for problem messages.
pub(crate) const FIELD_NAMES: &str =
    "`output`, `expected.output`, `prompt` or `input.context.<path>`";

/// A text a strategy reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Field {
    /// What the skill produced.
    Output,
    /// The case's `expected.output`.
    Expected,
    /// The case's templated prompt.
    Prompt,
    /// A value inside the case's `input.context`, by path.
    Context(Vec<String>),
}

impl Field {
    /// Parses a field name; `Err` says why it is not one.
    pub fn parse(name: &str) -> Result<Field, String> {
        match name.trim() {
            "output" | "response" => Ok(Field::Output),
            "expected.output" | "expected" | "groundTruth" => Ok(Field::Expected),
            "prompt" | "input.prompt" => Ok(Field::Prompt),
            other => {
                let path = other
                    .strip_prefix("input.context.")
                    .or_else(|| other.strip_prefix("context."));
                match path {
                    Some(path) => {
                        let segments: Vec<String> = path.split('.').map(str::to_string).collect();
                        if segments.iter().any(|s| s.trim().is_empty()) {
                            Err(format!("`{other}` has an empty segment in its path"))
                        } else {
                            Ok(Field::Context(segments))
                        }
                    }
                    None => Err(format!("unknown field `{other}`; use {FIELD_NAMES}")),
                }
            }
        }
    }

    /// The canonical name, as details show it.
    pub fn name(&self) -> String {
        match self {
            Field::Output => "output".to_string(),
            Field::Expected => "expected.output".to_string(),
            Field::Prompt => "prompt".to_string(),
            Field::Context(path) => format!("input.context.{}", path.join(".")),
        }
    }

    /// The value at this context path, if the field is one and the value is there.
    pub fn context_value<'a>(path: &[String], context: Option<&'a Value>) -> Option<&'a Value> {
        let mut at = context?;
        for segment in path {
            at = match at {
                Value::Object(map) => map.get(segment)?,
                Value::Array(items) => items.get(segment.parse::<usize>().ok()?)?,
                _ => return None,
            };
        }
        (!at.is_null()).then_some(at)
    }

    /// The text this field holds for one output. A string is itself; a number or boolean its
    /// JSON text; an array or object its compact JSON. `Err` names what is missing.
    pub fn text<'a>(&self, input: &GradeInput<'a>) -> Result<Cow<'a, str>, String> {
        match self {
            Field::Output => Ok(Cow::Borrowed(input.output)),
            Field::Prompt => Ok(Cow::Borrowed(input.prompt)),
            Field::Expected => input
                .case
                .expected
                .output
                .as_deref()
                .map(Cow::Borrowed)
                .ok_or_else(|| "expected.output is not set".to_string()),
            Field::Context(path) => match Field::context_value(path, input.context) {
                Some(Value::String(s)) => Ok(Cow::Borrowed(s.as_str())),
                Some(other) => Ok(Cow::Owned(other.to_string())),
                None => Err(format!(
                    "`{}` names nothing in this case's input.context",
                    self.name()
                )),
            },
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::needless_pass_by_value)]
mod tests {
    use serde_json::json;

    use super::super::test_support::case;
    use super::*;

    #[test]
    fn names_parse_to_fields() {
        assert_eq!(Field::parse("output"), Ok(Field::Output));
        assert_eq!(Field::parse("response"), Ok(Field::Output));
        assert_eq!(Field::parse("groundTruth"), Ok(Field::Expected));
        assert_eq!(Field::parse("expected.output"), Ok(Field::Expected));
        assert_eq!(Field::parse("prompt"), Ok(Field::Prompt));
        let f = Field::parse("context.ticket.lines.1").unwrap();
        assert_eq!(
            f,
            Field::Context(vec!["ticket".into(), "lines".into(), "1".into()])
        );
        assert_eq!(f.name(), "input.context.ticket.lines.1");
        assert!(Field::parse("input.context.")
            .unwrap_err()
            .contains("empty segment"));
        assert!(Field::parse("answer")
            .unwrap_err()
            .contains("unknown field"));
    }

    #[test]
    fn context_paths_walk_objects_and_arrays() {
        let c = case(json!({
            "input": {"prompt": "p", "context": {"ticket": {"lines": ["a", "b"], "n": 3, "nothing": null}}}
        }));
        let input = GradeInput {
            output: "out",
            prompt: &c.input.prompt,
            context: c.input.context.as_ref(),
            tool_calls: None,
            case: &c,
            files: &[],
        };
        let text = |name: &str| Field::parse(name).unwrap().text(&input);
        assert_eq!(text("input.context.ticket.lines.1").unwrap(), "b");
        assert_eq!(text("context.ticket.n").unwrap(), "3");
        assert_eq!(text("context.ticket.lines").unwrap(), r#"["a","b"]"#);
        assert_eq!(text("output").unwrap(), "out");
        assert_eq!(text("prompt").unwrap(), "p");
        assert!(text("context.ticket.nothing")
            .unwrap_err()
            .contains("names nothing"));
        assert!(text("context.ticket.lines.7").is_err());
        assert!(text("context.ticket.n.x").is_err());
        assert_eq!(text("expected").unwrap_err(), "expected.output is not set");
    }
}
