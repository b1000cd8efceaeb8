//! Prompt templating: `{{name}}` (spaces inside the braces allowed, `{{ name }}`) in a v2
//! case's `input.prompt` is replaced by `input.variables[name]`.
//!
//! A placeholder is `{{`, optional spaces, a name of letters, digits, `_`, `-` or `.` starting
//! with a letter or `_`, optional spaces, `}}`; anything else between braces is left as text.
//! Substitution is a single pass, so a value is never re-expanded: to keep a literal `{{x}}`,
//! define `"x": "{{x}}"`. An unknown variable is an error naming it; a defined but unused
//! variable is a warning. Only v2 files are templated: the other formats had no variables, so
//! their prompts are taken verbatim.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

use crate::definition::{EvalConfig, TestCase};
use crate::problem::Problem;

/// One `{{name}}` in a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placeholder<'a> {
    pub name: &'a str,
    /// Byte range of the whole `{{ ... }}`.
    pub range: Range<usize>,
}

/// Every placeholder of `text`, in order.
pub fn placeholders(text: &str) -> Vec<Placeholder<'_>> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while let Some(rel) = text.get(i..).and_then(|rest| rest.find("{{")) {
        let start = i + rel;
        let mut j = start + 2;
        while j < bytes.len() && bytes[j] == b' ' {
            j += 1;
        }
        let name_start = j;
        while j < bytes.len() && is_name_byte(bytes[j], j == name_start) {
            j += 1;
        }
        let name_end = j;
        while j < bytes.len() && bytes[j] == b' ' {
            j += 1;
        }
        if name_end > name_start && bytes.get(j..j + 2) == Some(b"}}") {
            found.push(Placeholder {
                name: &text[name_start..name_end],
                range: start..j + 2,
            });
            i = j + 2;
        } else {
            i = start + 1;
        }
    }
    found
}

fn is_name_byte(b: u8, first: bool) -> bool {
    if first {
        b.is_ascii_alphabetic() || b == b'_'
    } else {
        b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')
    }
}

/// Replaces every placeholder; `Err` lists the unknown names (each once, in order).
pub fn render(text: &str, variables: &BTreeMap<String, String>) -> Result<String, Vec<String>> {
    let mut out = String::with_capacity(text.len());
    let mut unknown: Vec<String> = Vec::new();
    let mut last = 0;
    for p in placeholders(text) {
        out.push_str(&text[last..p.range.start]);
        match variables.get(p.name) {
            Some(value) => out.push_str(value),
            None => {
                if !unknown.iter().any(|u| u == p.name) {
                    unknown.push(p.name.to_string());
                }
            }
        }
        last = p.range.end;
    }
    out.push_str(&text[last..]);
    if unknown.is_empty() {
        Ok(out)
    } else {
        Err(unknown)
    }
}

/// Templates every case's prompt. `case_pointers[i]` is case `i`'s pointer in `file`. Cases
/// with unknown variables keep their raw prompt; each unknown variable is an error at
/// `<case>/input/prompt`, each unused one a warning at `<case>/input/variables/<name>`.
pub fn resolve(
    config: EvalConfig,
    file: &str,
    case_pointers: &[String],
) -> (EvalConfig, Vec<Problem>) {
    // In place: copying the whole definition to template it held a large suite twice.
    let mut resolved = config;
    let problems = resolve_cases(&mut resolved.test_cases, file, case_pointers);
    (resolved, problems)
}

/// [`resolve`] for some of a definition's cases (`case_pointers[i]` is `cases[i]`'s pointer).
pub fn resolve_cases(cases: &mut [TestCase], file: &str, case_pointers: &[String]) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (i, case) in cases.iter_mut().enumerate() {
        let at = case_pointers.get(i).map_or("", String::as_str);
        let vars = &case.input.variables;
        // The placeholders of the prompt as written (it is replaced by its rendering below).
        let used: BTreeSet<String> = placeholders(&case.input.prompt)
            .into_iter()
            .map(|p| p.name.to_string())
            .collect();
        match render(&case.input.prompt, vars) {
            Ok(prompt) => case.input.prompt = prompt,
            Err(unknown) => {
                for name in unknown {
                    let defined = if vars.is_empty() {
                        "no variables are defined".to_string()
                    } else {
                        format!(
                            "defined: {}",
                            vars.keys()
                                .map(String::as_str)
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    };
                    problems.push(Problem::error(
                        file,
                        format!("{at}/input/prompt"),
                        format!("unknown template variable `{name}` in `{{{{{name}}}}}`: add it to input.variables ({defined})"),
                    ));
                }
            }
        }
        for name in vars.keys().filter(|k| !used.contains(k.as_str())) {
            problems.push(Problem::warning(
                file,
                format!(
                    "{at}/input/variables/{}",
                    crate::problem::escape_token(name)
                ),
                format!("variable `{name}` is not used in the prompt"),
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::definition::Input;

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn finds_placeholders_with_spaces() {
        let names: Vec<&str> = placeholders("Hi {{name}}, {{ city }} {{ bad name }} {{}} {{{x}}}")
            .into_iter()
            .map(|p| p.name)
            .collect();
        assert_eq!(names, ["name", "city", "x"]);
    }

    #[test]
    fn renders_known_variables_once() {
        let v = vars(&[("name", "Ann"), ("x", "{{name}}")]);
        assert_eq!(
            render("Hi {{ name }}! {{x}}", &v).as_deref(),
            Ok("Hi Ann! {{name}}")
        );
        assert_eq!(render("no braces", &v).as_deref(), Ok("no braces"));
        assert_eq!(render("{ {name} }", &v).as_deref(), Ok("{ {name} }"));
    }

    #[test]
    fn unknown_variables_are_listed_once() {
        let v = vars(&[("a", "1")]);
        assert_eq!(
            render("{{b}} {{a}} {{c}} {{b}}", &v),
            Err(vec!["b".to_string(), "c".to_string()])
        );
    }

    #[test]
    fn resolve_reports_unknown_and_unused() {
        let mut config: EvalConfig = serde_json::from_str(r#"{"testCases": []}"#).expect("config");
        config.test_cases = vec![
            TestCase {
                id: "a".into(),
                input: Input {
                    prompt: "Sum {{x}} and {{ y }}".into(),
                    variables: vars(&[("x", "1"), ("y", "2")]),
                    ..Input::default()
                },
                ..TestCase::default()
            },
            TestCase {
                id: "b".into(),
                input: Input {
                    prompt: "Hello {{who}}".into(),
                    variables: vars(&[("whom", "Bob")]),
                    ..Input::default()
                },
                ..TestCase::default()
            },
        ];
        let pointers = vec!["/testCases/0".to_string(), "/testCases/1".to_string()];
        let (resolved, problems) = resolve(config, "eval/tests.json", &pointers);
        assert_eq!(resolved.test_cases[0].input.prompt, "Sum 1 and 2");
        assert_eq!(resolved.test_cases[1].input.prompt, "Hello {{who}}");
        assert_eq!(problems.len(), 2);
        assert!(problems[0].is_error());
        assert_eq!(problems[0].pointer, "/testCases/1/input/prompt");
        assert_eq!(
            problems[0].message,
            "unknown template variable `who` in `{{who}}`: add it to input.variables (defined: whom)"
        );
        assert!(!problems[1].is_error());
        assert_eq!(problems[1].pointer, "/testCases/1/input/variables/whom");
    }
}
