//! Skill packages: open a folder or a ZIP (hardened against hostile archives), read `SKILL.md`,
//! find and convert the eval definition into the canonical [`model`](crate::definition), template
//! prompts, and validate everything at once.
//!
//! ```text
//! Package::open(path)        folder -> open_dir, anything else -> ZIP
//!   zip::extract             limits, zip slip, links, duplicates, bombs   (refusals)
//!   tree::scan + hash        file limits, links leaving the folder, SHA-256 content hash
//!   skill_md::parse          front matter rules                          (problems)
//!   formats::convert         v2 / v1 / eval_metadata / skill-creator -> EvalConfig
//!   template::resolve        {{var}} in v2 prompts
//! package.risk_report()     risk::scan: what the scripts and SKILL.md ask for (findings)
//! ```
//!
//! Hard limits are [`PackageError::Refused`] and stop loading at once: nothing past a refusal
//! is trusted. Everything else is a [`Problem`] with a file and a JSON pointer, collected so an
//! author sees every problem in one pass. Checking a package against the strategies and runners
//! that will execute it is `skilleval_execution::validate`'s.

use std::fs;
use std::path::{Path, PathBuf};

use tempfile::TempDir;

use crate::definition::EvalConfig;
use crate::problem::Problem;

pub mod dependencies;
mod error;
#[cfg(any(test, feature = "test-util"))]
pub mod fixtures;
pub mod formats;
mod limits;
pub mod paths;
pub mod risk;
pub mod skill_md;
pub mod template;
mod tree;
mod zip;

pub use dependencies::Dependencies;
pub use error::PackageError;
pub use formats::{EvalFormat, TriggerCase, EVAL_FILES, TRIGGER_FILES};
pub use limits::PackageLimits;
pub use risk::{RiskFinding, RiskReport};
pub use skill_md::SkillManifest;
pub use tree::PackageFile;

use formats::{source_suffix, Renames};
use skill_md::SKILL_MD;

/// An opened skill package.
#[derive(Debug)]
pub struct Package {
    root: PathBuf,
    /// Owns the extraction folder of a ZIP opened without a destination; removed on drop.
    _temp: Option<TempDir>,
    /// SHA-256 (hex) of the package's files: equal for a folder and the ZIP of that folder.
    pub content_hash: String,
    /// Every file, sorted by path (skipped folders and our own outputs excluded).
    pub files: Vec<PackageFile>,
    /// The parsed `SKILL.md`; empty (default) when it is missing or has no usable front matter,
    /// in which case an error problem says why (so a valid package always has a real one).
    pub manifest: SkillManifest,
    /// The eval definition's format; `None` when no eval file was found.
    pub format: Option<EvalFormat>,
    /// The eval file read (`eval/tests.json`, ...); empty when none was found.
    pub eval_file: String,
    /// The definition as converted, prompts templated: what is stored and runs. (The
    /// untemplated conversion is not kept: nothing read it, and for a large suite it was a
    /// second copy of every case.)
    pub config: EvalConfig,
    /// Per case of `config.test_cases`, its JSON pointer in `eval_file` (`/testCases/3`, `/0`).
    pub case_pointers: Vec<String>,
    pub triggers: Vec<TriggerCase>,
    /// The packages its code imports, from every place a package declares them
    /// ([`dependencies`]); malformed entries are among `problems`.
    pub dependencies: Dependencies,
    /// The trigger file read, when there was one.
    pub trigger_file: Option<String>,
    /// Problems found while loading (SKILL.md, JSON, conversion, templating); `skilleval_execution::validate`
    /// reports them with its own.
    pub problems: Vec<Problem>,
    case_renames: Vec<Renames>,
    list_pointer: String,
    /// A v2 definition opened without its cases ([`Package::from_zip_bytes_streamed`]), for
    /// `skilleval_execution::validate::check_in_chunks` to read them.
    streamed: Option<StreamedEval>,
}

/// A v2 eval file whose cases are still to read.
#[derive(Debug)]
struct StreamedEval {
    /// The file on disk (read again, as a stream, for its cases).
    path: PathBuf,
    /// Where the loading problems of the cases go in `problems` (before the trigger file's).
    problems_at: usize,
}

impl Package {
    /// Opens a folder in place, or a ZIP file (any path that is not a folder) into a
    /// temporary folder owned by the package.
    pub fn open(path: &Path, limits: &PackageLimits) -> Result<Package, PackageError> {
        let meta = fs::metadata(path).map_err(|e| PackageError::io(path, e))?;
        if meta.is_dir() {
            return Package::open_dir(path, limits);
        }
        if meta.len() > limits.max_compressed_bytes {
            return Err(PackageError::refused(
                "max_compressed_bytes",
                None,
                format!(
                    "the archive is {} (limit max_compressed_bytes = {})",
                    limits::human_bytes(meta.len()),
                    limits::human_bytes(limits.max_compressed_bytes)
                ),
            ));
        }
        let bytes = fs::read(path).map_err(|e| PackageError::io(path, e))?;
        Package::from_zip_bytes(&bytes, limits, None)
    }

    /// Opens a skill folder in place. When the folder has no `SKILL.md` and holds a single
    /// sub-folder that has one, that sub-folder is the package.
    pub fn open_dir(path: &Path, limits: &PackageLimits) -> Result<Package, PackageError> {
        let root = tree::effective_root(path)?;
        Package::load(root, None, limits)
    }

    /// Extracts a ZIP into `dest` (created if missing, must be empty) or, when `None`, into a
    /// temporary folder removed when the package is dropped.
    pub fn from_zip_bytes(
        bytes: &[u8],
        limits: &PackageLimits,
        dest: Option<&Path>,
    ) -> Result<Package, PackageError> {
        match dest {
            Some(dest) => {
                extract_into(bytes, limits, dest)?;
                Package::load(dest.to_path_buf(), None, limits)
            }
            None => {
                let temp = extract_to_temp(bytes, limits)?;
                Package::load(temp.path().to_path_buf(), Some(temp), limits)
            }
        }
    }

    /// [`Package::from_zip_bytes`] into a temporary folder, but a v2 definition whose
    /// `testCases` is a list is opened without its cases: only the rest of it is read, and
    /// `skilleval_execution::validate::check_in_chunks` reads, checks and hands over the cases a chunk at a time.
    /// For a service, whose memory must not grow with the size of a definition (the model of
    /// a 100,000-case definition is ~250 MB). Any other definition is read whole.
    pub fn from_zip_bytes_streamed(
        bytes: &[u8],
        limits: &PackageLimits,
    ) -> Result<Package, PackageError> {
        let temp = extract_to_temp(bytes, limits)?;
        Package::load_with(temp.path().to_path_buf(), Some(temp), limits, true)
    }

    /// Extracts a ZIP into `dest` with the same hardening as [`Package::from_zip_bytes`], but
    /// without reading the eval definition: for a worker, which needs the files on disk (its
    /// jobs carry their cases) and must not parse a definition of 100,000 cases to get them.
    /// Returns the package's root inside `dest`.
    pub fn extract_files(
        bytes: &[u8],
        limits: &PackageLimits,
        dest: &Path,
    ) -> Result<PathBuf, PackageError> {
        extract_into(bytes, limits, dest)?;
        tree::effective_root(dest)
    }

    /// The package root of a folder [`Package::extract_files`] filled (the folder, or its
    /// single sub-folder holding `SKILL.md`), without reading the package.
    pub fn root_of(dir: &Path) -> Result<PathBuf, PackageError> {
        tree::effective_root(dir)
    }

    /// The package's folder on disk (the stripped top-level folder of a ZIP, if any).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The static risk report of the package's scripts and `SKILL.md` ([`risk`]).
    pub fn risk_report(&self) -> RiskReport {
        risk::scan(&self.root, &self.files)
    }

    /// The skill's name from `SKILL.md`, when it could be read.
    pub fn name(&self) -> Option<&str> {
        Some(self.manifest.name.as_str()).filter(|n| !n.is_empty())
    }

    /// Whether the package has a file at this package-relative path.
    pub fn has_file(&self, path: &str) -> bool {
        self.files
            .binary_search_by(|f| f.path.as_str().cmp(path))
            .is_ok()
    }

    /// The index of the case with this id in `config.test_cases`.
    pub fn case_index(&self, id: &str) -> Option<usize> {
        self.config.test_cases.iter().position(|c| c.id == id)
    }

    /// Pointer of the case list in `eval_file` (`/testCases`, `` for a v1 list, `/evals`).
    pub fn list_pointer(&self) -> &str {
        &self.list_pointer
    }

    /// The pointer in `eval_file` of a v2 field below case `index` (`/expected/patterns/0`),
    /// following the conversion back to what the author wrote. `None` when the converter
    /// generated that field (it has no place in the source).
    pub fn source_pointer(&self, index: usize, v2_suffix: &str) -> Option<String> {
        let base = self.case_pointers.get(index)?;
        let renames = self.case_renames.get(index).copied().unwrap_or(&[]);
        let is_v2 = self.format == Some(EvalFormat::V2);
        source_suffix(renames, is_v2, v2_suffix).map(|s| format!("{base}{s}"))
    }

    /// Rewrites a problem reported against case `index` of the converted model so it points
    /// into the source file; a generated field points at the case and says which field.
    pub fn remap_problem(&self, index: usize, mut problem: Problem) -> Problem {
        let Some(base) = self.case_pointers.get(index) else {
            return problem;
        };
        if problem.file != self.eval_file {
            return problem;
        }
        let Some(suffix) = problem.pointer.strip_prefix(base.as_str()) else {
            return problem;
        };
        if !(suffix.is_empty() || suffix.starts_with('/')) {
            return problem;
        }
        let suffix = suffix.to_string();
        match self.source_pointer(index, &suffix) {
            Some(pointer) => problem.pointer = pointer,
            None => {
                problem.pointer.clone_from(base);
                problem.message =
                    format!("{} (converted field `{}`)", problem.message, &suffix[1..]);
            }
        }
        problem
    }

    fn load(
        root: PathBuf,
        temp: Option<TempDir>,
        limits: &PackageLimits,
    ) -> Result<Package, PackageError> {
        Package::load_with(root, temp, limits, false)
    }

    /// `streamed`: a v2 definition's cases are left in the file (see
    /// [`Package::from_zip_bytes_streamed`]).
    fn load_with(
        root: PathBuf,
        temp: Option<TempDir>,
        limits: &PackageLimits,
        streamed: bool,
    ) -> Result<Package, PackageError> {
        let files = tree::scan(&root, limits)?;
        let content_hash = tree::content_hash(&root, &files, limits)?;
        let mut package = Package {
            root,
            _temp: temp,
            content_hash,
            files,
            manifest: SkillManifest::default(),
            format: None,
            eval_file: String::new(),
            config: formats::Converted::empty(EvalFormat::V2, "").config,
            case_pointers: Vec::new(),
            triggers: Vec::new(),
            dependencies: Dependencies::default(),
            trigger_file: None,
            problems: Vec::new(),
            case_renames: Vec::new(),
            list_pointer: String::new(),
            streamed: None,
        };
        package.load_skill_md()?;
        package.load_eval(streamed)?;
        package.load_dependencies();
        package.load_triggers()?;
        Ok(package)
    }

    fn read(&self, rel: &str) -> Result<Vec<u8>, PackageError> {
        let path = paths::join(&self.root, rel);
        fs::read(&path).map_err(|e| PackageError::io(path, e))
    }

    fn load_dependencies(&mut self) {
        let setup = self
            .config
            .setup
            .as_ref()
            .map(|s| s.dependencies.clone())
            .unwrap_or_default();
        let read = |rel: &str| {
            self.has_file(rel)
                .then(|| self.read(rel).ok())
                .flatten()
                .and_then(|b| String::from_utf8(b).ok())
        };
        let (deps, problems) = dependencies::collect(&self.files, read, &setup, &self.eval_file);
        self.dependencies = deps;
        self.problems.extend(problems);
    }

    fn load_skill_md(&mut self) -> Result<(), PackageError> {
        if !self.has_file(SKILL_MD) {
            let other = self
                .files
                .iter()
                .find(|f| !f.path.contains('/') && f.path.eq_ignore_ascii_case(SKILL_MD));
            let message = match other {
                Some(f) => format!("SKILL.md is missing (found `{}`: the name must be exactly `SKILL.md`)", f.path),
                None => "SKILL.md is missing: a skill package needs a SKILL.md at its root (or inside a \
                         single top-level folder)"
                    .to_string(),
            };
            self.problems.push(Problem::error(SKILL_MD, "", message));
            return Ok(());
        }
        let bytes = self.read(SKILL_MD)?;
        let Ok(text) = String::from_utf8(bytes) else {
            self.problems
                .push(Problem::error(SKILL_MD, "", "SKILL.md is not UTF-8 text"));
            return Ok(());
        };
        let (manifest, problems) = skill_md::parse(&text);
        self.manifest = manifest.unwrap_or_default();
        self.problems.extend(problems);
        Ok(())
    }

    fn load_eval(&mut self, streamed: bool) -> Result<(), PackageError> {
        let found: Vec<&'static str> = EVAL_FILES
            .iter()
            .copied()
            .filter(|f| self.has_file(f))
            .collect();
        let Some(&file) = found.first() else {
            self.problems.push(Problem::error(
                EVAL_FILES[0],
                "",
                format!(
                    "no eval definition found: add one of {}",
                    EVAL_FILES.join(", ")
                ),
            ));
            return Ok(());
        };
        for ignored in &found[1..] {
            self.problems.push(Problem::warning(
                *ignored,
                "",
                format!("ignored: `{file}` is the eval definition (first found wins)"),
            ));
        }
        if streamed {
            let path = paths::join(&self.root, file);
            // A NUL character is rare enough that its file is read whole to name where it is.
            if holds_nul_escape_in(&path)? {
                self.problems
                    .extend(formats::nul_problem(file, &self.read(file)?));
            }
            let opened = fs::File::open(&path).map_err(|e| PackageError::io(&path, e))?;
            if let Some(header) = formats::v2_header(file, opened) {
                self.eval_file = file.to_string();
                self.format = Some(header.format);
                self.list_pointer = header.list_pointer;
                self.problems.extend(header.problems);
                self.config = header.config;
                self.streamed = Some(StreamedEval {
                    path,
                    problems_at: self.problems.len(),
                });
                // The runner is inferred once the cases are read (it depends on them).
                return Ok(());
            }
        }
        let bytes = self.read(file)?;
        self.problems.extend(formats::nul_problem(file, &bytes));
        let converted = formats::convert(file, &bytes)?;
        self.eval_file = file.to_string();
        self.format = Some(converted.format);
        self.list_pointer = converted.list_pointer;
        self.problems.extend(converted.problems);
        self.case_pointers = converted
            .sources
            .iter()
            .map(|s| s.pointer.clone())
            .collect();
        self.case_renames = converted.sources.iter().map(|s| s.renames).collect();
        if let Some((declared, pointer)) = &converted.skill_name {
            let name = &self.manifest.name;
            if !name.is_empty() && declared != name {
                self.problems.push(Problem::warning(
                    file,
                    pointer,
                    format!("skill_name `{declared}` differs from SKILL.md's name `{name}`"),
                ));
            }
        }
        if converted.format == EvalFormat::V2 {
            let (resolved, problems) =
                template::resolve(converted.config, file, &self.case_pointers);
            self.problems.extend(problems);
            self.config = resolved;
        } else {
            self.config = converted.config;
        }
        let all_given = self.config.test_cases.iter().all(|c| c.given.is_some());
        self.infer_runner(all_given);
        Ok(())
    }

    /// A definition that names no runner gets `command` with the package's conventional entry
    /// script (`scripts/run.py`, `.js`, `.sh`, or `run.*` at the root) when there is one: a
    /// v1 or skill-creator package has no field to name it, and running the skill's own script
    /// is what its author means. Cases with a recorded `given` output keep the `given` runner.
    /// `all_given`: every case has a recorded output.
    fn infer_runner(&mut self, all_given: bool) {
        if self.config.settings.runner.is_some() || all_given {
            return;
        }
        let Some(script) = RUN_SCRIPTS.iter().copied().find(|f| self.has_file(f)) else {
            return;
        };
        let runner = crate::definition::RunnerSpec::Detailed(crate::definition::RunnerConfig {
            kind: "command".into(),
            script: Some(script.to_string()),
            ..crate::definition::RunnerConfig::default()
        });
        self.config.settings.runner = Some(runner);
    }

    /// For a package opened with [`Package::from_zip_bytes_streamed`]: reads its v2 cases
    /// again from the eval file, `chunk` at a time, converted and templated, and calls `each`
    /// with the package holding that chunk (in `config.test_cases` and `case_pointers`);
    /// `each` takes what it keeps. Then puts the loading problems where loading the whole file
    /// puts them (after the definition's own, before the trigger file's) and infers the runner,
    /// leaving the package as [`Package::from_zip_bytes`] would have, without its cases.
    /// Returns how many cases were read, or `None` (and calls nothing) when the package was
    /// read whole.
    pub fn stream_cases(
        &mut self,
        chunk: usize,
        mut each: impl FnMut(&mut Package),
    ) -> Result<Option<usize>, PackageError> {
        let Some(streamed) = self.streamed.take() else {
            return Ok(None);
        };
        let file = self.eval_file.clone();
        let mut converting = Vec::new();
        let mut templating = Vec::new();
        let mut converted = 0;
        let mut all_given = true;
        let opened =
            fs::File::open(&streamed.path).map_err(|e| PackageError::io(&streamed.path, e))?;
        formats::v2_case_chunks(&file, opened, chunk, |list| {
            let (mut cases, sources, problems) = list.into_parts();
            converting.extend(problems);
            let pointers: Vec<String> = sources.into_iter().map(|s| s.pointer).collect();
            templating.extend(template::resolve_cases(&mut cases, &file, &pointers));
            converted += cases.len();
            all_given &= cases.iter().all(|c| c.given.is_some());
            self.config.test_cases = cases;
            self.case_pointers = pointers;
            each(self);
        })?;
        self.config.test_cases = Vec::new();
        self.case_pointers = Vec::new();
        self.infer_runner(all_given);
        let triggers = self
            .problems
            .split_off(streamed.problems_at.min(self.problems.len()));
        self.problems.extend(converting);
        self.problems.extend(templating);
        self.problems.extend(triggers);
        Ok(Some(converted))
    }

    fn load_triggers(&mut self) -> Result<(), PackageError> {
        let Some(file) = TRIGGER_FILES.iter().copied().find(|f| self.has_file(f)) else {
            return Ok(());
        };
        let bytes = self.read(file)?;
        let (triggers, problems) = formats::convert_triggers(file, &bytes)?;
        self.triggers = triggers;
        self.trigger_file = Some(file.to_string());
        self.problems.extend(problems);
        Ok(())
    }
}

/// [`crate::text::holds_nul_escape`] over a file read a block at a time (a streamed definition is
/// never held whole unless it holds the escape).
fn holds_nul_escape_in(path: &Path) -> Result<bool, PackageError> {
    use std::io::Read as _;
    const ESCAPE: usize = 6;
    let mut file = fs::File::open(path).map_err(|e| PackageError::io(path, e))?;
    let mut buf = vec![0u8; 64 * 1024];
    // The last ESCAPE - 1 bytes of a block are kept before the next one, so an escape split
    // across two reads is seen.
    let mut kept = 0;
    loop {
        let n = file
            .read(&mut buf[kept..])
            .map_err(|e| PackageError::io(path, e))?;
        if n == 0 {
            return Ok(false);
        }
        let filled = kept + n;
        if crate::text::holds_nul_escape(&buf[..filled]) {
            return Ok(true);
        }
        kept = filled.min(ESCAPE - 1);
        buf.copy_within(filled - kept..filled, 0);
    }
}

/// Conventional entry scripts of a skill, in the order they are looked for.
const RUN_SCRIPTS: &[&str] = &[
    "scripts/run.py",
    "scripts/run.js",
    "scripts/run.sh",
    "run.py",
    "run.js",
    "run.sh",
];

/// Extracts a ZIP into a new temporary folder (removed when dropped).
fn extract_to_temp(bytes: &[u8], limits: &PackageLimits) -> Result<TempDir, PackageError> {
    let temp = tempfile::Builder::new()
        .prefix("skilleval-pkg-")
        .tempdir()
        .map_err(|e| PackageError::io(std::env::temp_dir(), e))?;
    // Readable by a sandbox running as another user.
    zip::set_mode(temp.path(), 0o755)?;
    zip::extract(bytes, limits, temp.path())?;
    Ok(temp)
}

/// Removes everything inside `dir`, best effort (used after a failed extraction).
/// Extracts into `dest`, created if missing and required empty; on failure leaves nothing
/// half-extracted behind (a cache keyed by hash would trust it).
fn extract_into(bytes: &[u8], limits: &PackageLimits, dest: &Path) -> Result<(), PackageError> {
    if dest.exists() {
        let mut entries = fs::read_dir(dest).map_err(|e| PackageError::io(dest, e))?;
        if entries.next().is_some() {
            return Err(PackageError::io(
                dest,
                std::io::Error::other("the extraction folder is not empty"),
            ));
        }
    } else {
        fs::create_dir_all(dest).map_err(|e| PackageError::io(dest, e))?;
        zip::set_mode(dest, 0o755)?;
    }
    if let Err(e) = zip::extract(bytes, limits, dest) {
        clear_dir(dest);
        return Err(e);
    }
    Ok(())
}

fn clear_dir(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            let _ = if path.is_dir() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
        }
    }
}

#[cfg(test)]
mod tests;
