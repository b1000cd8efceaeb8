//! Why a case failed, shown where it failed: the output beside what was expected with the
//! difference marked. An `exact_match` failure marks the first differing character in both
//! texts (the strategy's `first_difference`); a `regex_match` failure marks, for each
//! unmatched pattern, where in the output the longest matching start of the pattern stops; a
//! `json_schema` failure shows the output as parsed JSON with every failing path marked.
//!
//! Positions are said as line and column (1-based, in characters) so a reader finds them in
//! a long output; every text is escaped by `maud`.

use std::collections::BTreeSet;

use maud::{html, Markup};
use regex::Regex;
use serde_json::Value;

use skilleval_execution::result::JobResult;
use skilleval_model::problem::escape_token;

/// Longest pattern tried prefix by prefix (longer ones are only listed).
const MAX_PATTERN_CHARS: usize = 400;

/// Line and column (1-based, characters) of the character at `offset` (characters) of `text`.
pub fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut line = 1;
    let mut column = 1;
    for c in text.chars().take(offset) {
        if c == '\n' {
            line += 1;
            column = 1;
        } else {
            column += 1;
        }
    }
    (line, column)
}

/// The text with the character at `offset` marked (a visible end mark when the text ends
/// before it).
fn marked_at(text: &str, offset: usize, id: &str) -> Markup {
    let byte = text
        .char_indices()
        .nth(offset)
        .map_or(text.len(), |(i, _)| i);
    let (before, rest) = text.split_at(byte);
    let mut chars = rest.chars();
    let at = chars.next();
    let after = chars.as_str();
    html! {
        pre.text id=(id) {
            (before)
            @match at {
                Some('\n') => { mark.diff-at title="a line break" { "↵" } "\n" }
                Some(c) => mark.diff-at { (c) },
                None => mark.diff-at.diff-end title="the text ends here" { "∎" },
            }
            (after)
        }
    }
}

/// A character as a reader should see it in a sentence.
fn shown(c: Option<char>) -> String {
    match c {
        None => "the end of the text".to_string(),
        Some('\n') => "a line break".to_string(),
        Some(' ') => "a space".to_string(),
        Some('\t') => "a tab".to_string(),
        Some(c) => format!("`{c}`"),
    }
}

/// An `exact_match` failure: the compared output beside the expected text, the first
/// difference marked in both.
fn exact_match(r: &JobResult) -> Option<Markup> {
    let at = r.details.get("first_difference")?.as_u64()?;
    let at = usize::try_from(at).ok()?;
    let actual = r.details.get("actual")?.as_str()?;
    let expected = r.details.get("expected")?.as_str()?;
    let (line, column) = line_column(actual, at);
    Some(html! {
        p.diff-summary #case-diff {
            "First difference at line " (line) ", column " (column) ": expected "
            (shown(expected.chars().nth(at))) ", got " (shown(actual.chars().nth(at))) "."
        }
        div.side-by-side #case-compare {
            div { h3 { "Output (trimmed, as compared)" } (marked_at(actual, at, "case-output")) }
            div { h3 { "Expected" } (marked_at(expected, at, "case-expected")) }
        }
    })
}

/// Where in `output` the longest start of `pattern` that still matches ends, and the rest of
/// the pattern it does not get to; `None` when not even its first character matches.
fn regex_divergence(pattern: &str, output: &str) -> Option<(usize, String)> {
    if pattern.chars().count() > MAX_PATTERN_CHARS {
        return None;
    }
    let ends: Vec<usize> = pattern
        .char_indices()
        .map(|(i, _)| i)
        .skip(1)
        .chain(std::iter::once(pattern.len()))
        .collect();
    for end in ends.into_iter().rev() {
        let Ok(re) = Regex::new(&pattern[..end]) else {
            continue;
        };
        if let Some(m) = re.find(output) {
            if m.as_str().is_empty() && end < pattern.len() {
                continue;
            }
            let offset = output[..m.end()].chars().count();
            return Some((offset, pattern[end..].to_string()));
        }
    }
    None
}

/// A `regex_match` failure: the output with, for its first unmatched pattern, the place the
/// pattern stops matching marked; every pattern listed, matched or not.
fn regex_match(r: &JobResult, output: &str) -> Option<Markup> {
    let list = |k: &str| -> Vec<String> {
        r.details
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
    let unmatched = list("unmatched");
    let matched = list("matched");
    let first = unmatched.first()?;
    let divergence = regex_divergence(first, output);
    Some(html! {
        @match &divergence {
            Some((offset, rest)) => {
                @let (line, column) = line_column(output, *offset);
                p.diff-summary #case-diff {
                    "Pattern " code { (first) } " matches up to line " (line) ", column " (column)
                    " and then wants " code { (rest) } "."
                }
            }
            None => p.diff-summary #case-diff { "Pattern " code { (first) } " matches nothing in the output." }
        }
        div.side-by-side #case-compare {
            div { h3 { "Output" }
                @match &divergence {
                    Some((offset, _)) => (marked_at(output, *offset, "case-output")),
                    None => pre.text #case-output { (output) },
                }
            }
            div { h3 { "Patterns" }
                ul.patterns #case-patterns {
                    @for p in &unmatched { li.fail { "✗ " code { (p) } } }
                    @for p in &matched { li.pass { "✓ " code { (p) } } }
                }
            }
        }
    })
}

/// The JSON in an output as the `json_schema` strategy finds it: the whole text, else a
/// fenced block, else the outermost braces.
fn json_in(output: &str) -> Option<Value> {
    let parse = |s: &str| serde_json::from_str::<Value>(s.trim()).ok();
    if let Some(v) = parse(output) {
        return Some(v);
    }
    if let Some(start) = output.find("```") {
        let body = &output[start + 3..];
        let body = body.split_once('\n').map_or(body, |(_, rest)| rest);
        if let Some(end) = body.find("```") {
            if let Some(v) = parse(&body[..end]) {
                return Some(v);
            }
        }
    }
    let (start, end) = (output.find(['{', '['])?, output.rfind(['}', ']'])?);
    (start < end).then(|| parse(&output[start..=end])).flatten()
}

/// Pretty JSON in pieces, each marked when it is (inside) the value at a failing pointer.
fn json_pieces(
    v: &Value,
    pointer: &str,
    failing: &BTreeSet<String>,
    indent: usize,
    marked: bool,
    out: &mut Vec<(String, bool)>,
) {
    let marked = marked || failing.contains(pointer);
    let pad = |n: usize| " ".repeat(n);
    match v {
        Value::Object(map) if !map.is_empty() => {
            out.push(("{\n".into(), marked));
            let n = map.len();
            for (i, (k, child)) in map.iter().enumerate() {
                out.push((
                    format!("{}{}: ", pad(indent + 2), Value::String(k.clone())),
                    marked,
                ));
                let p = format!("{pointer}/{}", escape_token(k));
                json_pieces(child, &p, failing, indent + 2, marked, out);
                out.push((if i + 1 < n { ",\n" } else { "\n" }.into(), marked));
            }
            out.push((format!("{}}}", pad(indent)), marked));
        }
        Value::Array(items) if !items.is_empty() => {
            out.push(("[\n".into(), marked));
            let n = items.len();
            for (i, child) in items.iter().enumerate() {
                out.push((pad(indent + 2), marked));
                json_pieces(
                    child,
                    &format!("{pointer}/{i}"),
                    failing,
                    indent + 2,
                    marked,
                    out,
                );
                out.push((if i + 1 < n { ",\n" } else { "\n" }.into(), marked));
            }
            out.push((format!("{}]", pad(indent)), marked));
        }
        other => out.push((other.to_string(), marked)),
    }
}

/// A `json_schema` failure: the output as parsed JSON with every failing path marked, beside
/// the errors.
fn json_schema(r: &JobResult, output: &str) -> Option<Markup> {
    let errors = r.schema_errors.as_ref().filter(|e| !e.is_empty())?;
    let doc = json_in(output)?;
    let failing: BTreeSet<String> = errors.iter().map(|e| e.path.clone()).collect();
    let mut pieces = Vec::new();
    json_pieces(&doc, "", &failing, 0, false, &mut pieces);
    // One element per run of marked or unmarked text.
    let mut merged: Vec<(String, bool)> = Vec::new();
    for (text, marked) in pieces {
        match merged.last_mut() {
            Some((t, m)) if *m == marked => t.push_str(&text),
            _ => merged.push((text, marked)),
        }
    }
    Some(html! {
        p.diff-summary #case-diff { (errors.len()) " schema error(s); the failing paths are marked in the output." }
        div.side-by-side #case-compare {
            div { h3 { "Output (as parsed JSON)" }
                pre.text #case-output-json {
                    @for (text, marked) in &merged {
                        @if *marked { mark.schema-error { (text) } } @else { (text) }
                    }
                }
            }
            div { h3 { "Schema errors" }
                ul.schema-errors #case-schema-errors {
                    @for e in errors {
                        li { code { (if e.path.is_empty() { "(the document)" } else { e.path.as_str() }) } " " (e.message) }
                    }
                }
            }
        }
    })
}

/// The output beside what was expected, the difference marked when the strategy says where;
/// `None` for a case with no output to show.
pub fn output_and_expected(r: &JobResult) -> Option<Markup> {
    let output = r.output.as_deref()?;
    let failed = r.status == skilleval_execution::result::CaseStatus::Failed;
    if failed {
        let explained = match r.strategy.as_str() {
            "exact_match" => exact_match(r),
            "regex_match" => regex_match(r, output),
            "json_schema" => json_schema(r, output),
            _ => None,
        };
        if let Some(markup) = explained {
            return Some(markup);
        }
    }
    Some(html! {
        @match &r.expected_output {
            Some(expected) => div.side-by-side #case-compare {
                div { h3 { "Output" @if r.output_truncated { " (truncated)" } } pre.text #case-output { (output) } }
                div { h3 { "Expected" } pre.text #case-expected { (expected) } }
            },
            None => {
                h3 { "Output" @if r.output_truncated { " (truncated)" } }
                pre.text #case-output { (output) }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use skilleval_execution::result::{test_result, CaseStatus};
    use skilleval_model::grade::SchemaError;

    #[test]
    fn positions_are_lines_and_columns_of_characters() {
        assert_eq!(line_column("ab\ncdé f", 6), (2, 4));
        assert_eq!(line_column("", 0), (1, 1));
    }

    #[test]
    fn an_exact_match_failure_marks_the_first_difference_in_both_texts() {
        let mut r = test_result("a", CaseStatus::Failed, Some(0.0));
        r.output = Some("Hello, world".into());
        r.details =
            json!({"expected": "Hello, World", "actual": "Hello, world", "first_difference": 7});
        let html = output_and_expected(&r).unwrap().into_string();
        assert!(
            html.contains("First difference at line 1, column 8: expected `W`, got `w`."),
            "{html}"
        );
        assert!(
            html.contains("Hello, <mark class=\"diff-at\">w</mark>orld"),
            "{html}"
        );
        assert!(
            html.contains("Hello, <mark class=\"diff-at\">W</mark>orld"),
            "{html}"
        );
        // A shorter output: its end is marked.
        r.details = json!({"expected": "abc", "actual": "ab", "first_difference": 2});
        let html = output_and_expected(&r).unwrap().into_string();
        assert!(html.contains("got the end of the text"), "{html}");
    }

    #[test]
    fn a_regex_failure_marks_where_the_pattern_stops_matching() {
        assert_eq!(
            regex_divergence(r"Total: \$\d+\.\d{2}", "Total: $45 due"),
            Some((10, r"\.\d{2}".to_string()))
        );
        assert_eq!(regex_divergence("zzz", "abc"), None);
        let mut r = test_result("a", CaseStatus::Failed, Some(0.5));
        r.strategy = "regex_match".into();
        r.output = Some("Order #12\nTotal: $45 due".into());
        r.details = json!({"matched": ["Order"], "unmatched": [r"Total: \$\d+\.\d{2}"]});
        let html = output_and_expected(&r).unwrap().into_string();
        assert!(html.contains("matches up to line 2, column 11"), "{html}");
        assert!(
            html.contains("$45<mark class=\"diff-at\"> </mark>due"),
            "{html}"
        );
    }

    #[test]
    fn a_schema_failure_marks_the_failing_paths_of_the_parsed_output() {
        let mut r = test_result("a", CaseStatus::Failed, Some(0.8));
        r.strategy = "json_schema".into();
        r.output = Some(
            "Here:\n```json\n{\"name\": \"Ada\", \"age\": \"x\", \"tags\": [1, \"<b>\"]}\n```"
                .into(),
        );
        r.schema_errors = Some(vec![
            SchemaError {
                path: "/age".into(),
                message: "\"x\" is not of type \"integer\"".into(),
                value: None,
                expected: None,
            },
            SchemaError {
                path: "/tags/1".into(),
                message: "not a number".into(),
                value: None,
                expected: None,
            },
        ]);
        let html = output_and_expected(&r).unwrap().into_string();
        assert!(
            html.contains("&quot;age&quot;: <mark class=\"schema-error\">&quot;x&quot;</mark>"),
            "{html}"
        );
        assert!(
            html.contains("<mark class=\"schema-error\">&quot;&lt;b&gt;&quot;</mark>"),
            "{html}"
        );
        assert!(
            html.contains("&quot;name&quot;: &quot;Ada&quot;,"),
            "{html}"
        );
        assert!(!html.contains("<b>"), "escaped: {html}");
    }
}
