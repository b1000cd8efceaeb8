//! Text helpers every layer shares: cutting a string at a character boundary, shortening a
//! JSON value for a message or a grade's details, and finding the NUL character that
//! PostgreSQL's `text` and `jsonb` cannot hold.

use serde_json::Value;

use crate::problem::escape_token;

/// The rule a string with a NUL character breaks, as a 4xx names it.
pub const NUL_RULE: &str =
    "must not contain the NUL character (U+0000): stored text cannot hold it";

/// What stands for the NUL character in text a skill produced, when it is stored: U+2400
/// SYMBOL FOR NULL (`␀`), visible where the output is shown.
pub const NUL_STAND_IN: char = '\u{2400}';

/// `s` with every NUL character replaced by [`NUL_STAND_IN`] (borrowed when there is none).
/// For what a skill produced (its output, a grader's feedback quoting it): input a caller
/// sends is refused instead ([`NUL_RULE`]), output is kept, as close as it can be stored.
pub fn replace_nul(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains('\0') {
        std::borrow::Cow::Owned(s.replace('\0', &NUL_STAND_IN.to_string()))
    } else {
        std::borrow::Cow::Borrowed(s)
    }
}

/// Serialized JSON with every NUL character in its strings and keys replaced by
/// [`NUL_STAND_IN`]. JSON carries NUL only as the escape `\u0000`, so text without it is
/// returned as it is, unparsed.
pub fn replace_nul_in_json(text: String) -> String {
    if !holds_nul_escape(text.as_bytes()) {
        return text;
    }
    let Ok(mut value) = serde_json::from_str::<Value>(&text) else {
        return text;
    };
    replace_nul_in_value(&mut value);
    value.to_string()
}

fn replace_nul_in_value(value: &mut Value) {
    match value {
        Value::String(s) => {
            if let std::borrow::Cow::Owned(replaced) = replace_nul(s) {
                *s = replaced;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(replace_nul_in_value),
        Value::Object(members) => {
            let entries = std::mem::take(members);
            for (key, mut member) in entries {
                replace_nul_in_value(&mut member);
                members.insert(replace_nul(&key).into_owned(), member);
            }
        }
        _ => {}
    }
}

/// Whether JSON text holds the escape `\u0000`, the only way JSON carries NUL (it also
/// matches the text after an escaped backslash, which a parse tells apart): what lets every
/// check below skip parsing text that cannot hold NUL.
pub fn holds_nul_escape(json: &[u8]) -> bool {
    json.windows(6).any(|w| w == b"\\u0000")
}

/// [`first_nul`] of JSON text: `None` when it holds no NUL or is not JSON (whoever parses it
/// reports that). Parses only text that holds the escape.
pub fn nul_in_json(json: &[u8]) -> Option<String> {
    if !holds_nul_escape(json) {
        return None;
    }
    first_nul(&serde_json::from_slice::<Value>(json).ok()?)
}

/// The JSON pointer of the first string (or object key) in `value` that holds the NUL
/// character (U+0000), depth first in document order; `None` when there is none. A request
/// whose text reaches PostgreSQL is refused with it naming the field, since `text` and
/// `jsonb` refuse NUL and the database's error would otherwise surface as a server error.
pub fn first_nul(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => s.contains('\0').then(String::new),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| first_nul(item).map(|rest| format!("/{i}{rest}"))),
        // The pointer is built only on the way back from a find: no allocation per member.
        Value::Object(members) => members.iter().find_map(|(key, member)| {
            let rest = if key.contains('\0') {
                String::new()
            } else {
                first_nul(member)?
            };
            Some(format!("/{}{rest}", escape_token(key)))
        }),
        _ => None,
    }
}

/// At most `max` bytes of `s`, cut at a character boundary, and whether it was cut.
pub fn truncate(s: &str, max: usize) -> (&str, bool) {
    if s.len() <= max {
        return (s, false);
    }
    let mut end = max;
    while end > 0 && !s.is_char_boundary(end) {
        end -= 1;
    }
    (&s[..end], true)
}

/// A JSON value shortened for details: long strings cut, at most 20 array items or object
/// members, at most 4 levels deep. Keeps a 1 MB instance out of every error message.
pub fn abbreviate(value: &Value) -> Value {
    abbreviate_at(value, 0)
}

fn abbreviate_at(value: &Value, depth: usize) -> Value {
    const ITEMS: usize = 20;
    const STRING: usize = 256;
    match value {
        Value::String(s) => {
            let (head, cut) = truncate(s, STRING);
            if cut {
                Value::String(format!("{head}…"))
            } else {
                value.clone()
            }
        }
        Value::Array(items) => {
            if depth >= 4 {
                return Value::String(format!("[… {} items]", items.len()));
            }
            let mut out: Vec<Value> = items
                .iter()
                .take(ITEMS)
                .map(|v| abbreviate_at(v, depth + 1))
                .collect();
            if items.len() > ITEMS {
                out.push(Value::String(format!("… {} more", items.len() - ITEMS)));
            }
            Value::Array(out)
        }
        Value::Object(map) => {
            if depth >= 4 {
                return Value::String(format!("{{… {} members}}", map.len()));
            }
            let mut out = serde_json::Map::new();
            for (k, v) in map.iter().take(ITEMS) {
                out.insert(k.clone(), abbreviate_at(v, depth + 1));
            }
            if map.len() > ITEMS {
                out.insert(
                    "…".to_string(),
                    Value::String(format!("{} more", map.len() - ITEMS)),
                );
            }
            Value::Object(out)
        }
        _ => value.clone(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn truncate_respects_char_boundaries() {
        let s = "日本語";
        assert_eq!(truncate(s, 4), ("日", true));
        assert_eq!(truncate(s, 9), ("日本語", false));
        assert_eq!(truncate("", 0), ("", false));
    }

    #[test]
    fn first_nul_names_the_string_or_key_that_holds_it() {
        assert_eq!(first_nul(&json!({"a": ["x", {"b": "ok"}], "c": 1})), None);
        assert_eq!(first_nul(&json!("a\0b")), Some(String::new()));
        assert_eq!(
            first_nul(&json!({"a": ["x", {"b/c": "bad\0"}]})),
            Some("/a/1/b~1c".to_string())
        );
        assert_eq!(
            first_nul(&json!({"ok": "fine", "k\0": "v"})),
            Some("/k\0".to_string())
        );
        // A backslash followed by `u0000` is text, not NUL.
        assert_eq!(first_nul(&json!({"a": "\\u0000"})), None);
    }

    #[test]
    fn nul_is_replaced_in_text_and_in_json_strings_and_keys_only() {
        assert_eq!(replace_nul("a\0b"), "a\u{2400}b");
        assert!(matches!(
            replace_nul("ab"),
            std::borrow::Cow::Borrowed("ab")
        ));
        let text = json!({"out": "x\0y", "k\0": ["\0", 1], "kept": "\\u0000"}).to_string();
        let replaced: Value = serde_json::from_str(&replace_nul_in_json(text)).unwrap();
        assert_eq!(
            replaced,
            json!({"out": "x\u{2400}y", "k\u{2400}": ["\u{2400}", 1], "kept": "\\u0000"})
        );
        assert_eq!(
            nul_in_json(br#"{"a": [1, "x\u0000"]}"#),
            Some("/a/1".to_string())
        );
        assert_eq!(nul_in_json(br#"{"a": "\\u0000"}"#), None);
        assert_eq!(nul_in_json(br#"{"a": "\u0000"#), None, "not JSON");
        let plain = json!({"a": "\\u0000 is text"}).to_string();
        assert_eq!(replace_nul_in_json(plain.clone()), plain);
    }

    #[test]
    fn abbreviate_caps_size() {
        let big: Vec<Value> = (0..100).map(|i| json!(i)).collect();
        let v = abbreviate(&json!({"a": big, "s": "x".repeat(1000)}));
        assert_eq!(v["a"].as_array().unwrap().len(), 21);
        assert!(v["s"].as_str().unwrap().len() < 300);
    }
}
