//! Getting a JSON object out of what a model wrote.
//!
//! Models asked for JSON still wrap it in a Markdown fence, add a sentence after it, or stop
//! mid-object at `max_tokens`. [`extract_json`] tries, in order: the whole text; a fenced block
//! (```` ```json ```` first); the first balanced `{…}` span; and, when the text ends inside an
//! object, a repair that closes the open string, drops a dangling key or comma and closes the
//! open brackets ([`repair_truncated`]). It reports which of these worked ([`Recovery`]) so a
//! grade can say its judge's answer needed help.

use serde::Serialize;
use serde_json::Value;

/// How the JSON was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Recovery {
    /// The text was the JSON (or the provider returned structured JSON).
    Clean,
    /// Inside a Markdown code fence.
    Fenced,
    /// A `{…}` span inside prose.
    Embedded,
    /// The text was cut off; brackets and strings were closed.
    Repaired,
}

/// The JSON object (or array) in a model's answer, and how it was found.
pub fn extract_json(text: &str) -> Option<(Value, Recovery)> {
    let trimmed = text.trim().trim_start_matches('\u{feff}');
    if let Ok(v) = serde_json::from_str::<Value>(trimmed) {
        if v.is_object() || v.is_array() {
            return Some((v, Recovery::Clean));
        }
    }
    for block in fenced_blocks(trimmed) {
        if let Ok(v) = serde_json::from_str::<Value>(block.trim()) {
            if v.is_object() || v.is_array() {
                return Some((v, Recovery::Fenced));
            }
        }
    }
    if let Some(v) = first_balanced_object(trimmed) {
        return Some((v, Recovery::Embedded));
    }
    // An unclosed fence is a truncated answer too: repair what follows it.
    let start = trimmed.find('{')?;
    let tail = &trimmed[start..];
    let tail = tail.split("```").next().unwrap_or(tail);
    let repaired = repair_truncated(tail)?;
    serde_json::from_str::<Value>(&repaired)
        .ok()
        .filter(Value::is_object)
        .map(|v| (v, Recovery::Repaired))
}

/// Contents of ```` ``` ```` fences, ```` ```json ```` ones first.
fn fenced_blocks(text: &str) -> Vec<&str> {
    let mut json_first = Vec::new();
    let mut others = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("```") {
        let after = &rest[open + 3..];
        let line_end = after.find('\n').unwrap_or(after.len());
        let lang = after[..line_end].trim().to_ascii_lowercase();
        let body = &after[line_end..];
        let Some(close) = body.find("```") else {
            break;
        };
        if lang == "json" || lang == "json5" {
            json_first.push(&body[..close]);
        } else {
            others.push(&body[..close]);
        }
        rest = &body[close + 3..];
    }
    json_first.extend(others);
    json_first
}

/// The first `{…}` span that parses, scanning with string awareness; `None` as soon as an
/// object is left open at the end of the text.
fn first_balanced_object(text: &str) -> Option<Value> {
    let mut search_from = 0;
    while let Some(offset) = text[search_from..].find('{') {
        let start = search_from + offset;
        let mut depth = 0usize;
        let mut strings = Strings::default();
        let mut closed = false;
        for (i, c) in text[start..].char_indices().map(|(i, c)| (start + i, c)) {
            if !strings.outside(c) {
                continue;
            }
            match c {
                '{' | '[' => depth += 1,
                '}' | ']' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        closed = true;
                        if let Ok(v) = serde_json::from_str::<Value>(&text[start..=i]) {
                            if v.is_object() {
                                return Some(v);
                            }
                        }
                        break;
                    }
                }
                _ => {}
            }
        }
        // An object still open at the end of the text was cut off: its inner objects are
        // fragments, not the answer (the repair handles it).
        if !closed {
            return None;
        }
        search_from = start + 1;
    }
    None
}

/// Closes a JSON text that was cut off: an open string is closed, a trailing `,`, `:` or
/// dangling key is dropped (or given `null`), open arrays and objects are closed. Returns
/// `None` when the text does not start an object or array, or has a stray closing bracket.
/// When the result still does not parse, the text is cut back to its last complete value
/// and tried again.
pub fn repair_truncated(text: &str) -> Option<String> {
    let text = text.trim_end();
    if !(text.starts_with('{') || text.starts_with('[')) {
        return None;
    }
    let mut candidate = text.to_string();
    for _ in 0..64 {
        if let Some(closed) = close_all(&candidate) {
            if serde_json::from_str::<Value>(&closed).is_ok() {
                return Some(closed);
            }
        }
        // Cut back to before the last separator at any depth and try again.
        let cut = last_separator(&candidate)?;
        candidate.truncate(cut);
        if candidate.trim().is_empty() {
            return None;
        }
    }
    None
}

/// Follows JSON strings through a text one character at a time, so the scanners of this
/// module see only the characters outside strings.
#[derive(Debug, Default)]
struct Strings {
    in_string: bool,
    escaped: bool,
}

impl Strings {
    /// Whether `c` (the next character) stands outside a string; quotes themselves do not.
    fn outside(&mut self, c: char) -> bool {
        if self.in_string {
            match c {
                _ if self.escaped => self.escaped = false,
                '\\' => self.escaped = true,
                '"' => self.in_string = false,
                _ => {}
            }
            return false;
        }
        if c == '"' {
            self.in_string = true;
            return false;
        }
        true
    }
}

/// Index of the last `,` outside strings (`None` when there is none).
fn last_separator(text: &str) -> Option<usize> {
    let mut strings = Strings::default();
    text.char_indices()
        .filter(|&(_, c)| strings.outside(c) && c == ',')
        .map(|(i, _)| i)
        .last()
}

/// Closes the open string and brackets of `text`, fixing what dangles at its end.
fn close_all(text: &str) -> Option<String> {
    let mut stack: Vec<char> = Vec::new();
    let mut strings = Strings::default();
    for c in text.chars() {
        if !strings.outside(c) {
            continue;
        }
        match c {
            '{' => stack.push('}'),
            '[' => stack.push(']'),
            '}' | ']' if stack.pop() != Some(c) => return None,
            _ => {}
        }
    }
    let mut out = text.to_string();
    if strings.in_string {
        if strings.escaped {
            out.pop();
        }
        out.push('"');
    }
    let trimmed_len = out.trim_end().len();
    out.truncate(trimmed_len);
    // A literal cut short (`tru`, `nul`, `3.`) cannot be completed reliably: drop it.
    if let Some(last) = out.chars().last() {
        if last.is_ascii_alphanumeric() || last == '.' || last == '-' {
            let start = out
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '+'))
                .map_or(0, |i| i + 1);
            let word = &out[start..];
            let complete = matches!(word, "true" | "false" | "null")
                || (word.parse::<f64>().is_ok() && !word.ends_with('.'));
            if !complete {
                out.truncate(start);
            }
        }
    }
    loop {
        let t = out.trim_end();
        if let Some(stripped) = t.strip_suffix(',') {
            out = stripped.to_string();
        } else if t.ends_with(':') {
            out = format!("{t} null");
        } else {
            out.truncate(t.len());
            break;
        }
    }
    // A key with no colon inside an object (`{"a": 1, "b"`) is dropped with its comma.
    if stack.last() == Some(&'}') && out.ends_with('"') {
        if let Some(key_start) = dangling_key_start(&out) {
            out.truncate(key_start);
            let t = out.trim_end();
            out = t.strip_suffix(',').unwrap_or(t).to_string();
        }
    }
    while let Some(close) = stack.pop() {
        out.push(close);
    }
    Some(out)
}

/// When `text` ends with a string that is an object key without its value (preceded by `{`
/// or `,`), where that key starts.
fn dangling_key_start(text: &str) -> Option<usize> {
    let body = &text[..text.len() - 1];
    let mut i = body.len();
    // Find the opening quote of the last string, skipping escaped quotes.
    loop {
        let q = body[..i].rfind('"')?;
        let backslashes = body[..q].chars().rev().take_while(|c| *c == '\\').count();
        if backslashes % 2 == 0 {
            i = q;
            break;
        }
        i = q;
    }
    let before = body[..i].trim_end();
    (before.ends_with('{') || before.ends_with(',')).then_some(i)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn clean_fenced_and_embedded() {
        let (v, r) = extract_json(r#" {"a": 1} "#).unwrap();
        assert_eq!((v, r), (json!({"a": 1}), Recovery::Clean));
        let text = "Here is my verdict:\n```json\n{\"a\": 2}\n```\nHope that helps.";
        assert_eq!(
            extract_json(text).unwrap(),
            (json!({"a": 2}), Recovery::Fenced)
        );
        let text = "```\n{\"a\": 3}\n```";
        assert_eq!(
            extract_json(text).unwrap(),
            (json!({"a": 3}), Recovery::Fenced)
        );
        let text = "Sure! {\"a\": {\"b\": \"}\"}} — and that is {not json}.";
        assert_eq!(
            extract_json(text).unwrap(),
            (json!({"a": {"b": "}"}}), Recovery::Embedded)
        );
    }

    #[test]
    fn truncated_objects_are_repaired() {
        let cases = [
            (
                r#"{"criteria": [{"name": "a", "score": 4, "reasoning": "clear and"#,
                json!({"criteria": [{"name": "a", "score": 4, "reasoning": "clear and"}]}),
            ),
            (r#"{"a": 1, "b": "#, json!({"a": 1, "b": null})),
            (r#"{"a": 1, "b""#, json!({"a": 1})),
            (r#"{"a": [1, 2,"#, json!({"a": [1, 2]})),
            (r#"{"a": tru"#, json!({"a": null})),
            (r#"{"a": 1, "b": 2."#, json!({"a": 1, "b": null})),
            (r#"{"a": "x\"#, json!({"a": "x"})),
        ];
        for (text, want) in cases {
            let (v, r) = extract_json(text).unwrap_or_else(|| panic!("no JSON from {text}"));
            assert_eq!(v, want, "{text}");
            assert_eq!(r, Recovery::Repaired, "{text}");
        }
        let text = "```json\n{\"score\": 3, \"reasoning\": \"cut";
        assert_eq!(
            extract_json(text).unwrap().0,
            json!({"score": 3, "reasoning": "cut"})
        );
    }

    #[test]
    fn hopeless_text_gives_nothing() {
        assert_eq!(extract_json("I cannot grade this."), None);
        assert_eq!(extract_json(""), None);
        assert_eq!(extract_json("42"), None);
        assert_eq!(repair_truncated("{\"a\": 1}}"), None);
    }
}
