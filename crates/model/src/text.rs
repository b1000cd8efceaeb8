//! Text helpers every layer shares: cutting a string at a character boundary, and shortening a
//! JSON value for a message or a grade's details.

use serde_json::Value;

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
    fn abbreviate_caps_size() {
        let big: Vec<Value> = (0..100).map(|i| json!(i)).collect();
        let v = abbreviate(&json!({"a": big, "s": "x".repeat(1000)}));
        assert_eq!(v["a"].as_array().unwrap().len(), 21);
        assert!(v["s"].as_str().unwrap().len() < 300);
    }
}
