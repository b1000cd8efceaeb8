//! The packages a skill's code imports, as the package declares them: PEP 723 `# /// script`
//! blocks in its `.py` files, `setup.dependencies` of the eval definition, a
//! `requirements.txt` or a `pyproject.toml` (`[project].dependencies`) at the root for Python,
//! a `package.json` (`dependencies`) at the root for Node. They are read when the package is
//! opened; a malformed entry is a [`Problem`] naming its file, where in it, and the entry.
//!
//! Only the *shape* of a requirement is checked here (the name, extras, version specifiers
//! and markers of PEP 508; an npm name and range): whether it exists and resolves is the
//! resolver's answer, at build time (`skilleval_execution::environment`). That shape check is
//! a few regular expressions rather than a PEP 508 crate because it is all this layer needs:
//! nothing here evaluates versions or markers.
//!
//! Dependencies come from the configured index only: a direct reference (`name @ URL`), an
//! option line of `requirements.txt` (`-r`, `--index-url`, `-e`) and an npm spec that is a
//! path, a URL or a git repository are refused, naming the entry.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::problem::{escape_token, Problem};

use super::tree::PackageFile;

/// What a package declares its code needs. Sorted and without duplicates, so equal sets are
/// equal values (an environment is cached by them).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub struct Dependencies {
    /// PEP 508 requirements (`openpyxl>=3.1`, `requests[socks]`), as written, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub python: Vec<String>,
    /// `requires-python` specifiers (of every source that gives one, joined by `,`: all hold).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requires_python: Option<String>,
    /// npm package name to version range (`^4.17.0`, `latest`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node: BTreeMap<String, String>,
}

impl Dependencies {
    pub fn is_empty(&self) -> bool {
        self.python.is_empty() && self.node.is_empty()
    }
}

/// The prefix of a `setup.dependencies` entry that names an npm package (`npm:lodash@^4`).
pub const NPM_PREFIX: &str = "npm:";

/// Reads every declaration of the package: `files` are its files (sorted), `read` gives a
/// file's text, `setup` is `setup.dependencies` of `eval_file`.
pub(crate) fn collect(
    files: &[PackageFile],
    read: impl Fn(&str) -> Option<String>,
    setup: &[String],
    eval_file: &str,
) -> (Dependencies, Vec<Problem>) {
    let mut found = Found::default();
    for f in files.iter().filter(|f| f.path.ends_with(".py")) {
        if let Some(text) = read(&f.path) {
            found.pep723(&f.path, &text);
        }
    }
    for (i, entry) in setup.iter().enumerate() {
        let pointer = format!("/setup/dependencies/{i}");
        match entry.strip_prefix(NPM_PREFIX) {
            Some(spec) => found.npm_entry(eval_file, &pointer, spec),
            None => found.python(eval_file, &pointer, entry),
        }
    }
    if let Some(text) = read("requirements.txt") {
        found.requirements_txt(&text);
    }
    if let Some(text) = read("pyproject.toml") {
        found.pyproject(&text);
    }
    if let Some(text) = read("package.json") {
        found.package_json(&text);
    }
    found.finish()
}

/// [`collect`] over a package already on disk (a worker's extracted copy, which it runs without
/// reading the definition again): its `.py` files and root files, `setup` being the
/// definition's `setup.dependencies`. Problems are left out: the package was validated when
/// it was opened; what cannot be read counts as not declared.
pub fn read_from_dir(root: &std::path::Path, setup: &[String]) -> Dependencies {
    /// Larger `.py` files are not scanned for a `# /// script` block (generated data, say).
    const MAX_SCRIPT_BYTES: u64 = 1 << 20;
    // A package holds at most this many files (what it was opened with), at most this deep:
    // the walk stops there whatever the folder is.
    let limits = super::PackageLimits::default();
    let mut seen = 0usize;
    let mut files = Vec::new();
    let mut dirs = vec![(root.to_path_buf(), String::new(), 0usize)];
    while let Some((dir, rel, depth)) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > limits.max_files {
                break;
            }
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            if super::tree::is_skipped(&path) {
                continue;
            }
            if kind.is_dir() {
                if depth + 1 < limits.max_path_depth {
                    dirs.push((entry.path(), path, depth + 1));
                }
            } else if kind.is_file() {
                let size = entry.metadata().map_or(u64::MAX, |m| m.len());
                let wanted = path.ends_with(".py")
                    || ["requirements.txt", "pyproject.toml", "package.json"]
                        .contains(&path.as_str());
                if wanted && size <= MAX_SCRIPT_BYTES {
                    files.push(PackageFile { path, size });
                }
            }
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let read = |rel: &str| {
        files
            .iter()
            .any(|f| f.path == rel)
            .then(|| std::fs::read_to_string(root.join(rel)).ok())
            .flatten()
    };
    collect(&files, read, setup, "").0
}

#[derive(Default)]
struct Found {
    python: Vec<String>,
    requires_python: Vec<String>,
    node: BTreeMap<String, String>,
    problems: Vec<Problem>,
}

impl Found {
    fn finish(mut self) -> (Dependencies, Vec<Problem>) {
        self.python.sort();
        self.python.dedup();
        self.requires_python.sort();
        self.requires_python.dedup();
        let requires_python =
            (!self.requires_python.is_empty()).then(|| self.requires_python.join(","));
        (
            Dependencies {
                python: self.python,
                requires_python,
                node: self.node,
            },
            self.problems,
        )
    }

    fn python(&mut self, file: &str, pointer: &str, spec: &str) {
        match check_pep508(spec) {
            Ok(clean) => self.python.push(clean),
            Err(why) => self.problems.push(Problem::error(
                file,
                pointer,
                format!("dependency `{spec}`: {why}"),
            )),
        }
    }

    fn requires(&mut self, file: &str, pointer: &str, spec: &str) {
        let spec = spec.trim();
        if specifiers_re().is_match(spec) {
            self.requires_python.push(spec.replace(' ', ""));
        } else {
            self.problems.push(Problem::error(
                file,
                pointer,
                format!("requires-python `{spec}`: not a list of version specifiers such as `>=3.10` or `>=3.9,<4`"),
            ));
        }
    }

    /// `# /// script` blocks (PEP 723): comment lines between `# /// script` and `# ///`,
    /// with `# ` (or `#`) taken off, are TOML with `dependencies` and `requires-python`.
    fn pep723(&mut self, file: &str, text: &str) {
        let lines: Vec<&str> = text.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            if lines[i].trim_end() != "# /// script" {
                i += 1;
                continue;
            }
            let start = i + 1;
            let mut end = None;
            let mut j = start;
            while j < lines.len() && lines[j].starts_with('#') {
                if lines[j].trim_end() == "# ///" {
                    end = Some(j);
                }
                j += 1;
            }
            let Some(end) = end else {
                self.problems.push(Problem::error(
                    file,
                    "",
                    format!(
                        "line {}: a `# /// script` block must end with a `# ///` line",
                        i + 1
                    ),
                ));
                return;
            };
            let toml_text: String = lines[start..end]
                .iter()
                .map(|l| {
                    let body = l.strip_prefix("# ").unwrap_or_else(|| &l[1..]);
                    format!("{body}\n")
                })
                .collect();
            let at = |line: usize| format!("line {line} (the `# /// script` block)");
            match toml::from_str::<toml::Table>(&toml_text) {
                Err(e) => {
                    let line = e
                        .span()
                        .map(|s| toml_text[..s.start].lines().count().max(1))
                        .unwrap_or(1);
                    self.problems.push(Problem::error(
                        file,
                        "",
                        format!("{}: not TOML: {}", at(start + line), e.message().trim()),
                    ));
                }
                Ok(table) => self.toml_deps(file, &table, "", &at(i + 1)),
            }
            i = end + 1;
        }
    }

    /// `dependencies` and `requires-python` of a TOML table (a PEP 723 block or
    /// `[project]`), reported under `base` (`/project`).
    fn toml_deps(&mut self, file: &str, table: &toml::Table, base: &str, place: &str) {
        let located = |msg: String| {
            if place.is_empty() {
                msg
            } else {
                format!("{place}: {msg}")
            }
        };
        match table.get("dependencies") {
            None => {}
            Some(toml::Value::Array(items)) => {
                for (n, item) in items.iter().enumerate() {
                    let pointer = format!("{base}/dependencies/{n}");
                    match item.as_str() {
                        Some(spec) => {
                            let before = self.problems.len();
                            self.python(file, &pointer, spec);
                            for p in &mut self.problems[before..] {
                                p.message = located(std::mem::take(&mut p.message));
                            }
                        }
                        None => self.problems.push(Problem::error(
                            file,
                            pointer,
                            located("a dependency must be a string".into()),
                        )),
                    }
                }
            }
            Some(_) => self.problems.push(Problem::error(
                file,
                format!("{base}/dependencies"),
                located("`dependencies` must be an array of strings".into()),
            )),
        }
        match table.get("requires-python") {
            None => {}
            Some(toml::Value::String(spec)) => {
                self.requires(file, &format!("{base}/requires-python"), spec);
            }
            Some(_) => self.problems.push(Problem::error(
                file,
                format!("{base}/requires-python"),
                located("`requires-python` must be a string".into()),
            )),
        }
    }

    fn requirements_txt(&mut self, text: &str) {
        const FILE: &str = "requirements.txt";
        for (n, raw) in text.lines().enumerate() {
            let line = match raw.find(" #") {
                Some(at) => &raw[..at],
                None => raw,
            }
            .trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let before = self.problems.len();
            if line.starts_with('-') {
                self.problems.push(Problem::error(
                    FILE,
                    "",
                    format!("`{line}`: options are not accepted (list requirements only; the index is the operator's)"),
                ));
            } else {
                self.python(FILE, "", line);
            }
            for p in &mut self.problems[before..] {
                p.message = format!("line {}: {}", n + 1, p.message);
            }
        }
    }

    fn pyproject(&mut self, text: &str) {
        const FILE: &str = "pyproject.toml";
        match toml::from_str::<toml::Table>(text) {
            Err(e) => self.problems.push(Problem::error(
                FILE,
                "",
                format!("not TOML: {}", e.message().trim()),
            )),
            Ok(doc) => match doc.get("project") {
                Some(toml::Value::Table(project)) => self.toml_deps(FILE, project, "/project", ""),
                Some(_) => self.problems.push(Problem::error(
                    FILE,
                    "/project",
                    "`[project]` must be a table",
                )),
                None => {}
            },
        }
    }

    fn package_json(&mut self, text: &str) {
        const FILE: &str = "package.json";
        let doc: serde_json::Value = match serde_json::from_str(text) {
            Ok(v) => v,
            Err(e) => {
                self.problems
                    .push(Problem::error(FILE, "", format!("not JSON: {e}")));
                return;
            }
        };
        match doc.get("dependencies") {
            None => {}
            Some(serde_json::Value::Object(deps)) => {
                for (name, range) in deps {
                    let pointer = format!("/dependencies/{}", escape_token(name));
                    match range.as_str() {
                        Some(range) => self.npm(FILE, &pointer, name, range),
                        None => self.problems.push(Problem::error(
                            FILE,
                            pointer,
                            format!("dependency `{name}`: the version range must be a string"),
                        )),
                    }
                }
            }
            Some(_) => self.problems.push(Problem::error(
                FILE,
                "/dependencies",
                "`dependencies` must be an object of package names to version ranges",
            )),
        }
    }

    /// A `setup.dependencies` entry `npm:NAME@RANGE` (`@RANGE` optional: `latest`).
    fn npm_entry(&mut self, file: &str, pointer: &str, spec: &str) {
        // A scoped name starts with `@`: the version's `@` is the one after the first char.
        let (name, range) = match spec.get(1..).and_then(|rest| rest.find('@')) {
            Some(at) => (&spec[..=at], &spec[at + 2..]),
            None => (spec, "latest"),
        };
        self.npm(file, pointer, name, range);
    }

    fn npm(&mut self, file: &str, pointer: &str, name: &str, range: &str) {
        let bad = |why: &str| format!("dependency `{name}`: {why}");
        if !npm_name_re().is_match(name) || name.len() > 214 {
            self.problems.push(Problem::error(
                file,
                pointer,
                bad("not an npm package name (lower-case letters, digits, `-`, `.`, `_`, `~`; `@scope/name` for a scoped one)"),
            ));
            return;
        }
        let range = range.trim();
        let refused = [
            "file:", "link:", "git", "http:", "https:", "github:", "npm:",
        ];
        if range.is_empty() {
            self.problems.push(Problem::error(
                file,
                pointer,
                bad("the version range is empty"),
            ));
        } else if refused.iter().any(|p| range.starts_with(p)) || range.contains('/') {
            self.problems.push(Problem::error(
                file,
                pointer,
                bad(&format!("`{range}` is a path, URL or repository: only version ranges from the configured registry are accepted")),
            ));
        } else if !npm_range_re().is_match(range) {
            self.problems.push(Problem::error(
                file,
                pointer,
                bad(&format!("`{range}` is not a version range (`^1.2.0`, `~1.2`, `>=1 <2`, `1.x`, `latest`)")),
            ));
        } else {
            self.node.insert(name.to_string(), range.to_string());
        }
    }
}

/// Checks the shape of a PEP 508 requirement from an index: `name[extras] specifiers ;
/// marker`. Returns it trimmed, or why it is refused.
fn check_pep508(spec: &str) -> Result<String, String> {
    let spec = spec.trim();
    if spec.is_empty() {
        return Err("empty requirement".into());
    }
    let (req, marker) = match spec.split_once(';') {
        Some((r, m)) => (r.trim(), Some(m.trim())),
        None => (spec, None),
    };
    if let Some(marker) = marker {
        if marker.is_empty() {
            return Err("an empty marker after `;`".into());
        }
    }
    if req.contains('@') {
        return Err(
            "a direct reference (`name @ URL`) is not accepted: dependencies come from the configured index"
                .into(),
        );
    }
    let caps = requirement_re()
        .captures(req)
        .ok_or_else(|| "not a PEP 508 requirement: a name (letters, digits, `.`, `_`, `-`), optional `[extras]`, then version specifiers such as `>=1.2,<2`".to_string())?;
    let specs = caps.name("specs").map_or("", |m| m.as_str()).trim();
    let specs = specs
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .unwrap_or(specs)
        .trim();
    if !specs.is_empty() && !specifiers_re().is_match(specs) {
        return Err(format!(
            "`{specs}` is not a list of version specifiers (`==1.2.3`, `>=1.2,<2`, `~=1.4`)"
        ));
    }
    Ok(spec.to_string())
}

fn requirement_re() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        #[allow(clippy::expect_used)] // A constant pattern, tested.
        Regex::new(
            r"^(?i)(?P<name>[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?)\s*(?:\[\s*[a-z0-9][a-z0-9._-]*(?:\s*,\s*[a-z0-9][a-z0-9._-]*)*\s*\])?\s*(?P<specs>[(<>=!~].*)?$",
        )
        .expect("requirement pattern")
    })
}

fn specifiers_re() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        let one = r"(?:===|~=|==|!=|<=|>=|<|>)\s*[A-Za-z0-9][A-Za-z0-9.*+!_-]*";
        #[allow(clippy::expect_used)] // A constant pattern, tested.
        Regex::new(&format!(r"^\s*{one}(?:\s*,\s*{one})*\s*$")).expect("specifier pattern")
    })
}

fn npm_name_re() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        #[allow(clippy::expect_used)] // A constant pattern, tested.
        Regex::new(r"^(?:@[a-z0-9][a-z0-9._~-]*/)?[a-z0-9][a-z0-9._~-]*$").expect("npm name")
    })
}

fn npm_range_re() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        #[allow(clippy::expect_used)] // A constant pattern, tested.
        Regex::new(r"^(?:[a-z][a-z0-9._-]*|[\^~<>=v0-9xX*.| +-][0-9A-Za-z\^~<>=*.| +-]*)$")
            .expect("npm range")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(paths: &[&str]) -> Vec<PackageFile> {
        paths
            .iter()
            .map(|p| PackageFile {
                path: (*p).to_string(),
                size: 0,
            })
            .collect()
    }

    fn collect_from(sources: &[(&str, &str)], setup: &[&str]) -> (Dependencies, Vec<Problem>) {
        let mut paths: Vec<&str> = sources.iter().map(|(p, _)| *p).collect();
        paths.sort_unstable();
        let setup: Vec<String> = setup.iter().map(|s| (*s).to_string()).collect();
        collect(
            &files(&paths),
            |p| {
                sources
                    .iter()
                    .find(|(q, _)| *q == p)
                    .map(|(_, t)| (*t).to_string())
            },
            &setup,
            "eval/tests.json",
        )
    }

    #[test]
    fn every_source_is_read_and_the_set_is_sorted() {
        let script = "#!/usr/bin/env python3\n# /// script\n# requires-python = \">=3.9\"\n# dependencies = [\n#   \"openpyxl>=3.1\",\n#   \"requests[socks] ==2.*\",\n# ]\n# ///\nimport openpyxl\n";
        let (deps, problems) = collect_from(
            &[
                ("scripts/run.py", script),
                ("requirements.txt", "# pins\npandas==2.2.0  # data\n\nnumpy\n"),
                (
                    "pyproject.toml",
                    "[project]\nname = \"x\"\ndependencies = [\"pypdf<5\"]\nrequires-python = \">=3.8\"\n",
                ),
                ("package.json", r#"{"dependencies": {"lodash": "^4.17.0", "@scope/pkg": "1.x"}}"#),
            ],
            &["python-pptx", "npm:left-pad@1.3.0", "npm:@types/node"],
        );
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            deps.python,
            [
                "numpy",
                "openpyxl>=3.1",
                "pandas==2.2.0",
                "pypdf<5",
                "python-pptx",
                "requests[socks] ==2.*"
            ]
        );
        assert_eq!(deps.requires_python.as_deref(), Some(">=3.8,>=3.9"));
        assert_eq!(
            deps.node
                .iter()
                .map(|(k, v)| format!("{k}@{v}"))
                .collect::<Vec<_>>(),
            [
                "@scope/pkg@1.x",
                "@types/node@latest",
                "left-pad@1.3.0",
                "lodash@^4.17.0"
            ]
        );
    }

    #[test]
    fn malformed_entries_are_problems_naming_file_place_and_dependency() {
        let script = "# /// script\n# dependencies = [\"ok\", \"bad name!\", 3]\n# ///\n";
        let (deps, problems) = collect_from(
            &[
                ("a.py", script),
                ("b.py", "# /// script\n# dependencies = [\n"),
                (
                    "requirements.txt",
                    "ok2\n-r other.txt\nx @ https://h/x.whl\n",
                ),
                ("pyproject.toml", "[project]\ndependencies = [\"y >= \"]\n"),
                (
                    "package.json",
                    r#"{"dependencies": {"Bad": "1", "z": "file:../z", "w": 2}}"#,
                ),
            ],
            &["pkg>>1", "npm:q@"],
        );
        assert_eq!(deps.python, ["ok", "ok2"]);
        let got: Vec<(String, String, String)> = problems
            .iter()
            .map(|p| (p.file.clone(), p.pointer.clone(), p.message.clone()))
            .collect();
        let has = |file: &str, pointer: &str, words: &[&str]| {
            assert!(
                got.iter().any(|(f, p, m)| f == file
                    && p == pointer
                    && words.iter().all(|w| m.contains(w))),
                "no problem {file}#{pointer} {words:?} in {got:#?}"
            );
        };
        has("a.py", "/dependencies/1", &["line 1", "`bad name!`"]);
        has("a.py", "/dependencies/2", &["must be a string"]);
        has("b.py", "", &["line 1", "`# ///`"]);
        has(
            "requirements.txt",
            "",
            &["line 2", "`-r other.txt`", "options"],
        );
        has("requirements.txt", "", &["line 3", "direct reference"]);
        has("pyproject.toml", "/project/dependencies/0", &["`y >= `"]);
        has(
            "package.json",
            "/dependencies/Bad",
            &["`Bad`", "npm package name"],
        );
        has("package.json", "/dependencies/z", &["`z`", "file:../z"]);
        has(
            "package.json",
            "/dependencies/w",
            &["`w`", "must be a string"],
        );
        has("eval/tests.json", "/setup/dependencies/0", &["`pkg>>1`"]);
        has(
            "eval/tests.json",
            "/setup/dependencies/1",
            &["`q`", "empty"],
        );
        assert_eq!(problems.len(), 11, "{got:#?}");
    }

    #[test]
    fn requirement_shapes() {
        for ok in [
            "a",
            "A.b_c-d",
            "x>=1",
            "x (>=1, <2)",
            "x[a,b]>=1.0.post1",
            "x~=1.4.2",
            "x===1.0",
            "x==1.*; python_version < \"3.12\"",
        ] {
            assert!(check_pep508(ok).is_ok(), "{ok}: {:?}", check_pep508(ok));
        }
        for bad in [
            "",
            "-x",
            "x>>1",
            "x[",
            "x==",
            "x; ",
            "x @ https://a/b",
            "x y",
        ] {
            assert!(check_pep508(bad).is_err(), "{bad}");
        }
    }
}
