//! `SKILL.md`: YAML front matter between `---` lines, then the Markdown body, checked against
//! the Agent Skills rules.
//!
//! `name` (kebab-case, at most 64 characters) and `description` (at most 1024 characters, no
//! `<` or `>`) are required; `license`, `allowed-tools`, `metadata` and `compatibility` (at most
//! 500 characters) are allowed; any other key is a warning. Problems point into the front
//! matter (`SKILL.md#/name`). The folder name of the skill is not compared with `name`:
//! uploaded ZIPs have arbitrary names.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::problem::{pointer, Problem};

/// The file name, as problems report it.
pub const SKILL_MD: &str = "SKILL.md";

pub const MAX_NAME_CHARS: usize = 64;
pub const MAX_DESCRIPTION_CHARS: usize = 1024;
pub const MAX_COMPATIBILITY_CHARS: usize = 500;

const KNOWN_KEYS: &[&str] = &[
    "name",
    "description",
    "license",
    "allowed-tools",
    "metadata",
    "compatibility",
];

/// A parsed `SKILL.md`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SkillManifest {
    pub name: String,
    pub description: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub license: Option<String>,
    /// As written: a string (space- or comma-separated) or a list of strings.
    #[serde(
        default,
        rename = "allowed-tools",
        skip_serializing_if = "Option::is_none"
    )]
    pub allowed_tools: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compatibility: Option<String>,
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
    /// Keys the Agent Skills format does not define (each reported as a warning).
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub extra: Map<String, Value>,
    /// The Markdown after the front matter: the skill's instructions.
    #[serde(default)]
    pub body: String,
}

impl SkillManifest {
    /// SHA-256 (hex) of the description: what benchmarks track across description changes.
    pub fn description_hash(&self) -> String {
        hex::encode(Sha256::digest(self.description.as_bytes()))
    }
}

/// Parses `SKILL.md`. The manifest is `None` only when there is no usable front matter; any
/// rule broken inside it is a problem next to a manifest holding what could be read.
pub fn parse(text: &str) -> (Option<SkillManifest>, Vec<Problem>) {
    let mut problems = Vec::new();
    let Some((yaml, body, yaml_first_line)) = split_front_matter(text, &mut problems) else {
        return (None, problems);
    };
    let front: Value = if yaml.trim().is_empty() {
        Value::Object(Map::new())
    } else {
        match serde_yaml_ng::from_str(yaml) {
            Ok(v) => v,
            Err(e) => {
                let at = e
                    .location()
                    .map(|l| {
                        format!(
                            " at line {}, column {}",
                            l.line() + yaml_first_line - 1,
                            l.column()
                        )
                    })
                    .unwrap_or_default();
                let mut message = e.to_string();
                // serde_yaml appends its own (front-matter relative) position; ours is the file's.
                if let Some(idx) = message.find(" at line ") {
                    message.truncate(idx);
                }
                problems.push(Problem::error(
                    SKILL_MD,
                    "",
                    format!("invalid YAML front matter{at}: {message}"),
                ));
                return (None, problems);
            }
        }
    };
    // YAML refuses a raw NUL but not the escape `"\0"` in a double-quoted string.
    if let Some(pointer) = crate::text::first_nul(&front) {
        problems.push(Problem::error(SKILL_MD, pointer, crate::text::NUL_RULE));
    }
    let Value::Object(front) = front else {
        problems.push(Problem::error(
            SKILL_MD,
            "",
            "the front matter must be a YAML mapping (`name: ...`, `description: ...`)",
        ));
        return (None, problems);
    };

    let mut manifest = SkillManifest {
        body: body.to_string(),
        ..SkillManifest::default()
    };
    manifest.name = required_string(&front, "name", &mut problems).unwrap_or_default();
    if front.contains_key("name") {
        check_name(&manifest.name, &mut problems);
    }
    manifest.description =
        required_string(&front, "description", &mut problems).unwrap_or_default();
    if front.contains_key("description") {
        check_description(&manifest.description, &mut problems);
    }
    manifest.license = optional_string(&front, "license", &mut problems);
    manifest.compatibility = optional_string(&front, "compatibility", &mut problems);
    if let Some(c) = &manifest.compatibility {
        let n = c.chars().count();
        if n > MAX_COMPATIBILITY_CHARS {
            problems.push(Problem::error(
                SKILL_MD,
                "/compatibility",
                format!("`compatibility` is {n} characters; at most {MAX_COMPATIBILITY_CHARS} are allowed"),
            ));
        }
    }
    if let Some(tools) = front.get("allowed-tools") {
        let ok = match tools {
            Value::String(_) | Value::Null => true,
            Value::Array(items) => items.iter().all(Value::is_string),
            _ => false,
        };
        if ok {
            manifest.allowed_tools = (!tools.is_null()).then(|| tools.clone());
        } else {
            problems.push(Problem::error(
                SKILL_MD,
                "/allowed-tools",
                "`allowed-tools` must be a string or a list of strings",
            ));
        }
    }
    match front.get("metadata") {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => manifest.metadata = map.clone(),
        Some(_) => problems.push(Problem::error(
            SKILL_MD,
            "/metadata",
            "`metadata` must be a mapping of keys to values",
        )),
    }
    for (key, value) in &front {
        if !KNOWN_KEYS.contains(&key.as_str()) {
            problems.push(Problem::warning(
                SKILL_MD,
                pointer([key]),
                format!(
                    "unknown front-matter key `{key}`; the Agent Skills format defines {}",
                    KNOWN_KEYS.join(", ")
                ),
            ));
            manifest.extra.insert(key.clone(), value.clone());
        }
    }
    (Some(manifest), problems)
}

/// Splits `---\n<yaml>\n---\n<body>`; returns (yaml, body, 1-based line of the yaml's first line).
fn split_front_matter<'a>(
    text: &'a str,
    problems: &mut Vec<Problem>,
) -> Option<(&'a str, &'a str, usize)> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    let first = lines.next().unwrap_or("");
    if first.trim_end() != "---" {
        problems.push(Problem::error(
            SKILL_MD,
            "",
            "SKILL.md has no YAML front matter: it must start with a `---` line, then `name:` and \
             `description:`, then a closing `---` line",
        ));
        return None;
    }
    let yaml_start = first.len();
    let mut offset = yaml_start;
    for line in lines {
        let trimmed = line.trim_end();
        if trimmed == "---" || trimmed == "..." {
            let yaml = &text[yaml_start..offset];
            let body = &text[offset + line.len()..];
            return Some((yaml, body, 2));
        }
        offset += line.len();
    }
    problems.push(Problem::error(
        SKILL_MD,
        "",
        "the YAML front matter is not closed: add a `---` line after it",
    ));
    None
}

fn required_string(
    front: &Map<String, Value>,
    key: &str,
    problems: &mut Vec<Problem>,
) -> Option<String> {
    match front.get(key) {
        None | Some(Value::Null) => {
            problems.push(Problem::error(
                SKILL_MD,
                pointer([key]),
                format!("`{key}` is required"),
            ));
            None
        }
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            problems.push(Problem::error(
                SKILL_MD,
                pointer([key]),
                format!("`{key}` must be a string, not {}", kind(other)),
            ));
            None
        }
    }
}

fn optional_string(
    front: &Map<String, Value>,
    key: &str,
    problems: &mut Vec<Problem>,
) -> Option<String> {
    match front.get(key) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            problems.push(Problem::error(
                SKILL_MD,
                pointer([key]),
                format!("`{key}` must be a string, not {}", kind(other)),
            ));
            None
        }
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// Agent Skills name: lowercase letters, digits and single hyphens, no hyphen at either end.
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().count() <= MAX_NAME_CHARS
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
}

fn check_name(name: &str, problems: &mut Vec<Problem>) {
    let n = name.chars().count();
    if name.is_empty() {
        problems.push(Problem::error(
            SKILL_MD,
            "/name",
            "`name` must not be empty",
        ));
    } else if n > MAX_NAME_CHARS {
        problems.push(Problem::error(
            SKILL_MD,
            "/name",
            format!("`name` is {n} characters; at most {MAX_NAME_CHARS} are allowed"),
        ));
    } else if !is_valid_name(name) {
        problems.push(Problem::error(
            SKILL_MD,
            "/name",
            format!(
                "`{name}` is not a valid skill name: use kebab-case (lowercase letters, digits and \
                 single hyphens, not starting or ending with a hyphen), e.g. `pdf-report`"
            ),
        ));
    }
}

fn check_description(description: &str, problems: &mut Vec<Problem>) {
    let n = description.chars().count();
    if description.trim().is_empty() {
        problems.push(Problem::error(
            SKILL_MD,
            "/description",
            "`description` must not be empty",
        ));
    }
    if n > MAX_DESCRIPTION_CHARS {
        problems.push(Problem::error(
            SKILL_MD,
            "/description",
            format!("`description` is {n} characters; at most {MAX_DESCRIPTION_CHARS} are allowed"),
        ));
    }
    if description.contains(['<', '>']) {
        problems.push(Problem::error(
            SKILL_MD,
            "/description",
            "`description` must not contain `<` or `>`",
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::Severity;

    fn errors(problems: &[Problem]) -> Vec<(String, String)> {
        problems
            .iter()
            .filter(|p| p.is_error())
            .map(|p| (p.pointer.clone(), p.message.clone()))
            .collect()
    }

    #[test]
    fn good_manifest_keeps_body_and_fields() {
        let text = "---\nname: pdf-report\ndescription: Builds PDF reports.\nlicense: MIT\n\
                    allowed-tools: Read Write\nmetadata:\n  author: ann\ncompatibility: needs python3\n---\n# Use\nDo it.\n";
        let (manifest, problems) = parse(text);
        assert!(problems.is_empty(), "{problems:?}");
        let m = manifest.expect("manifest");
        assert_eq!(m.name, "pdf-report");
        assert_eq!(m.description, "Builds PDF reports.");
        assert_eq!(m.license.as_deref(), Some("MIT"));
        assert_eq!(m.allowed_tools, Some(Value::String("Read Write".into())));
        assert_eq!(m.metadata.get("author"), Some(&Value::String("ann".into())));
        assert_eq!(m.compatibility.as_deref(), Some("needs python3"));
        assert_eq!(m.body, "# Use\nDo it.\n");
        assert_eq!(m.description_hash().len(), 64);
    }

    #[test]
    fn crlf_and_bom_are_accepted() {
        let (m, problems) = parse("\u{feff}---\r\nname: a\r\ndescription: b\r\n---\r\nbody");
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(m.expect("manifest").body, "body");
    }

    #[test]
    fn name_rules() {
        for bad in [
            "Pdf",
            "pdf_report",
            "-pdf",
            "pdf-",
            "pdf--report",
            "pdf report",
        ] {
            let (_, problems) = parse(&format!("---\nname: \"{bad}\"\ndescription: d\n---\n"));
            let errs = errors(&problems);
            assert_eq!(errs.len(), 1, "{bad}: {errs:?}");
            assert_eq!(errs[0].0, "/name");
            assert!(errs[0].1.contains("kebab-case"), "{}", errs[0].1);
        }
        let long = "a".repeat(65);
        let (_, problems) = parse(&format!("---\nname: {long}\ndescription: d\n---\n"));
        assert_eq!(
            errors(&problems),
            vec![(
                "/name".to_string(),
                "`name` is 65 characters; at most 64 are allowed".to_string()
            )]
        );
        let ok = "a".repeat(64);
        let (_, problems) = parse(&format!("---\nname: {ok}\ndescription: d\n---\n"));
        assert!(problems.is_empty());
        assert!(is_valid_name("pdf-report-2"));
    }

    #[test]
    fn description_rules() {
        let long = "x".repeat(1025);
        let (_, problems) = parse(&format!("---\nname: a\ndescription: {long}\n---\n"));
        assert_eq!(
            errors(&problems),
            vec![(
                "/description".to_string(),
                "`description` is 1025 characters; at most 1024 are allowed".to_string()
            )]
        );
        let (_, problems) = parse("---\nname: a\ndescription: \"Use for <html> pages\"\n---\n");
        assert_eq!(
            errors(&problems),
            vec![(
                "/description".to_string(),
                "`description` must not contain `<` or `>`".to_string()
            )]
        );
    }

    #[test]
    fn missing_fields_and_wrong_types() {
        let (m, problems) = parse("---\nlicense: 3\n---\n");
        assert!(m.is_some());
        assert_eq!(
            errors(&problems),
            vec![
                ("/name".to_string(), "`name` is required".to_string()),
                (
                    "/description".to_string(),
                    "`description` is required".to_string()
                ),
                (
                    "/license".to_string(),
                    "`license` must be a string, not a number".to_string()
                ),
            ]
        );
    }

    #[test]
    fn unknown_key_is_a_warning_only() {
        let (m, problems) = parse("---\nname: a\ndescription: b\ncolor: blue\n---\n");
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].severity, Severity::Warning);
        assert_eq!(problems[0].pointer, "/color");
        assert_eq!(problems[0].file, "SKILL.md");
        assert_eq!(
            m.expect("manifest").extra.get("color"),
            Some(&Value::String("blue".into()))
        );
    }

    #[test]
    fn long_compatibility_is_an_error() {
        let long = "c".repeat(501);
        let (_, problems) = parse(&format!(
            "---\nname: a\ndescription: b\ncompatibility: {long}\n---\n"
        ));
        assert_eq!(errors(&problems)[0].0, "/compatibility");
    }

    #[test]
    fn missing_or_unclosed_front_matter() {
        let (m, problems) = parse("# Just markdown\n");
        assert!(m.is_none());
        assert!(problems[0].message.contains("no YAML front matter"));
        let (m, problems) = parse("---\nname: a\n");
        assert!(m.is_none());
        assert!(problems[0].message.contains("not closed"));
        let (m, problems) = parse("---\nname: [a\n---\n");
        assert!(m.is_none());
        assert!(
            problems[0]
                .message
                .starts_with("invalid YAML front matter at line"),
            "{}",
            problems[0].message
        );
    }
}
