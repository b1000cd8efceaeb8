//! Text of produced files, for graders that read files (`evaluation.target: "file:NAME"`).
//!
//! Plain formats (`.md`, `.txt`, `.json`, `.csv`, anything else that is UTF-8) are their own
//! text; `.html` loses its tags, scripts and styles. A file that cannot be read as text is an
//! error naming the file and the reason, never silently empty.

use crate::model::{ExpectedFile, TestCase};
use crate::runner::ProducedFile;

/// What the grader reads: `Ok(None)` grades the answer, `Ok(Some(text))` a file's text.
/// `Err` says why the target cannot be read (the case then fails on it).
pub fn target_text(case: &TestCase, files: &[ProducedFile]) -> Result<Option<String>, String> {
    let Some(target) = case.evaluation.target.as_deref() else {
        return Ok(None);
    };
    if target == "output" {
        return Ok(None);
    }
    let Some(name) = target.strip_prefix("file:") else {
        return Err(format!(
            "evaluation.target `{target}` must be `output` or `file:NAME`"
        ));
    };
    let name = name
        .trim()
        .trim_start_matches("./")
        .trim_start_matches("/workspace/");
    let file = files
        .iter()
        .find(|f| f.path == name)
        .ok_or_else(|| format!("the runner left no file `{name}` to grade"))?;
    let bytes = file.content.as_deref().ok_or_else(|| {
        format!(
            "`{name}` ({} bytes) is over the kept-content budget and cannot be graded",
            file.size
        )
    })?;
    extract_text(name, bytes).map(Some)
}

/// The text of a file by its extension.
pub fn extract_text(name: &str, bytes: &[u8]) -> Result<String, String> {
    let ext = name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "html" | "htm" => Ok(html_text(&utf8(name, bytes)?)),
        _ => utf8(name, bytes),
    }
}

fn utf8(name: &str, bytes: &[u8]) -> Result<String, String> {
    String::from_utf8(bytes.to_vec())
        .map_err(|_| format!("`{name}` is not UTF-8 text and its format has no text extractor"))
}

/// Visible text of an HTML document: tags dropped, `<script>`/`<style>` content dropped,
/// the five common entities decoded. Hand-written because graders need words, not a DOM,
/// and a browser-grade parser is far more than that asks.
fn html_text(html: &str) -> String {
    let mut out = String::with_capacity(html.len() / 2);
    let lower = html.to_ascii_lowercase();
    let mut i = 0;
    while i < html.len() {
        if html[i..].starts_with('<') {
            let skip_to = ["script", "style"].iter().find_map(|t| {
                lower[i + 1..]
                    .starts_with(t)
                    .then(|| lower[i..].find(&format!("</{t}")).map(|e| i + e))
                    .flatten()
            });
            let from = skip_to.unwrap_or(i);
            match html[from..].find('>') {
                Some(end) => {
                    i = from + end + 1;
                    out.push(' ');
                }
                None => break,
            }
        } else {
            let next = html[i..].find('<').map_or(html.len(), |n| i + n);
            out.push_str(&html[i..next]);
            i = next;
        }
    }
    let decoded = out
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&nbsp;", " ")
        .replace("&amp;", "&");
    decoded.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Checks `expected.files` against what the runner left: one `(path, passed, detail)` each.
pub fn check_files(
    expected: &[ExpectedFile],
    files: &[ProducedFile],
) -> Vec<(String, bool, String)> {
    expected
        .iter()
        .map(|e| {
            let path = e.path.trim_start_matches("./");
            let Some(f) = files.iter().find(|f| f.path == path) else {
                return (path.to_string(), false, "missing".to_string());
            };
            if e.min_size.is_some_and(|m| f.size < m) {
                return (
                    path.to_string(),
                    false,
                    format!(
                        "{} bytes, under the minimum {}",
                        f.size,
                        e.min_size.unwrap_or(0)
                    ),
                );
            }
            if e.max_size.is_some_and(|m| f.size > m) {
                return (
                    path.to_string(),
                    false,
                    format!(
                        "{} bytes, over the maximum {}",
                        f.size,
                        e.max_size.unwrap_or(0)
                    ),
                );
            }
            if let Some(h) = &e.sha256 {
                if !h.eq_ignore_ascii_case(&f.sha256) {
                    return (
                        path.to_string(),
                        false,
                        format!("sha256 {} is not {h}", f.sha256),
                    );
                }
            }
            (
                path.to_string(),
                true,
                format!("{} bytes, sha256 {}", f.size, f.sha256),
            )
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn html_loses_tags_scripts_and_entities() {
        let t = extract_text(
            "r.html",
            b"<html><head><style>p{}</style><script>var x=1;</script></head><body><h1>Total</h1><p>42 &amp; more</p></body></html>",
        )
        .unwrap();
        assert_eq!(t, "Total 42 & more");
    }

    #[test]
    fn file_checks_report_missing_size_and_hash() {
        let files = vec![ProducedFile {
            path: "a.json".into(),
            size: 10,
            sha256: "ab".into(),
            content: None,
        }];
        let exp = vec![
            ExpectedFile {
                path: "a.json".into(),
                min_size: Some(5),
                sha256: Some("AB".into()),
                ..Default::default()
            },
            ExpectedFile {
                path: "b.json".into(),
                ..Default::default()
            },
            ExpectedFile {
                path: "a.json".into(),
                max_size: Some(3),
                ..Default::default()
            },
        ];
        let r = check_files(&exp, &files);
        assert!(r[0].1, "{r:?}");
        assert_eq!((r[1].1, r[1].2.as_str()), (false, "missing"));
        assert!(!r[2].1);
    }
}
