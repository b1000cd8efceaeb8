//! The files of a package on disk: a limited walk of the folder and the content hash.
//!
//! The same walk runs over a folder opened in place and over a freshly extracted ZIP, so a
//! folder and the ZIP of that folder list the same files and hash the same. Skipped, and so
//! neither counted nor hashed: `.git`, `target`, `node_modules`, `__pycache__` and `__MACOSX`
//! folders at any depth, `.DS_Store` files, and our own outputs `eval/runs/`,
//! `eval/version-history.json` and (from before that name) `eval/benchmark.json`. Symbolic links are followed only when they stay inside the package.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::error::PackageError;
use super::limits::{human_bytes, PackageLimits};

/// Folder names skipped at any depth.
const SKIPPED_DIRS: &[&str] = &[".git", "target", "node_modules", "__pycache__", "__MACOSX"];
/// File names skipped at any depth.
const SKIPPED_FILES: &[&str] = &[".DS_Store"];
/// Package-relative paths skipped (the CLI's own outputs).
const SKIPPED_PATHS: &[&str] = &[
    "eval/runs",
    "eval/benchmark.json",
    "eval/version-history.json",
];

/// One regular file of the package.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageFile {
    /// Package-relative, `/`-separated.
    pub path: String,
    pub size: u64,
}

/// Whether a package-relative path is left out of listings and the hash.
pub(crate) fn is_skipped(rel: &str) -> bool {
    SKIPPED_PATHS.iter().any(|p| {
        rel == *p
            || rel
                .strip_prefix(p)
                .is_some_and(|rest| rest.starts_with('/'))
    }) || rel
        .rsplit('/')
        .next()
        .is_some_and(|name| SKIPPED_FILES.contains(&name))
        || rel
            .split('/')
            .rev()
            .skip(1)
            .any(|segment| SKIPPED_DIRS.contains(&segment))
}

/// The effective package root below `path`: `path` itself, or its single sub-folder when
/// `path` has no `SKILL.md` and nothing but that folder (ignoring skipped names).
pub(crate) fn effective_root(path: &Path) -> Result<PathBuf, PackageError> {
    if path.join("SKILL.md").exists() {
        return Ok(path.to_path_buf());
    }
    let mut only: Option<PathBuf> = None;
    let entries = fs::read_dir(path).map_err(|e| PackageError::io(path, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| PackageError::io(path, e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if SKIPPED_DIRS.contains(&name.as_ref()) || SKIPPED_FILES.contains(&name.as_ref()) {
            continue;
        }
        if only.is_some() || !entry.path().is_dir() {
            return Ok(path.to_path_buf());
        }
        only = Some(entry.path());
    }
    Ok(only
        .filter(|dir| dir.join("SKILL.md").is_file())
        .unwrap_or_else(|| path.to_path_buf()))
}

/// Lists the package's files (sorted by path), enforcing file count, size, depth and link rules.
pub(crate) fn scan(root: &Path, limits: &PackageLimits) -> Result<Vec<PackageFile>, PackageError> {
    let canonical_root = root.canonicalize().map_err(|e| PackageError::io(root, e))?;
    let mut walk = Walk {
        canonical_root,
        limits,
        files: Vec::new(),
        total: 0,
    };
    walk.dir(root, "", 0)?;
    let mut files = walk.files;
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

struct Walk<'a> {
    canonical_root: PathBuf,
    limits: &'a PackageLimits,
    files: Vec<PackageFile>,
    total: u64,
}

impl Walk<'_> {
    fn dir(&mut self, dir: &Path, rel: &str, depth: usize) -> Result<(), PackageError> {
        let mut entries = fs::read_dir(dir)
            .map_err(|e| PackageError::io(dir, e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| PackageError::io(dir, e))?;
        entries.sort_by_key(fs::DirEntry::file_name);
        for entry in entries {
            let os_name = entry.file_name();
            let path = entry.path();
            let Some(name) = os_name.to_str() else {
                let lossy = format!("{rel}{}", os_name.to_string_lossy());
                return Err(PackageError::refused(
                    "non_utf8_name",
                    Some(&lossy),
                    "the file name is not UTF-8",
                ));
            };
            let child_rel = if rel.is_empty() {
                name.to_string()
            } else {
                format!("{rel}/{name}")
            };
            let meta = fs::symlink_metadata(&path).map_err(|e| PackageError::io(&path, e))?;
            let (is_dir, is_file) = if meta.file_type().is_symlink() {
                let target = self.link_target(&path, &child_rel)?;
                (target.is_dir(), target.is_file())
            } else {
                (meta.is_dir(), meta.is_file())
            };
            if is_dir {
                if SKIPPED_DIRS.contains(&name) || is_skipped(&child_rel) {
                    continue;
                }
                if depth + 1 > self.limits.max_path_depth {
                    return Err(PackageError::refused(
                        "max_path_depth",
                        Some(&child_rel),
                        format!(
                            "the folder is more than {} levels deep (limit max_path_depth; a link loop?)",
                            self.limits.max_path_depth
                        ),
                    ));
                }
                self.dir(&path, &child_rel, depth + 1)?;
            } else if is_file {
                if is_skipped(&child_rel) {
                    continue;
                }
                self.file(&path, child_rel, depth + 1)?;
            }
            // Sockets, FIFOs and devices are never read (a FIFO would block).
        }
        Ok(())
    }

    /// Resolves a link, refusing one that leaves the package or points nowhere.
    fn link_target(&self, path: &Path, rel: &str) -> Result<PathBuf, PackageError> {
        let target = path.canonicalize().map_err(|_| {
            PackageError::refused("symlink", Some(rel), "the symbolic link points to nothing")
        })?;
        if !target.starts_with(&self.canonical_root) {
            return Err(PackageError::refused(
                "symlink",
                Some(rel),
                "the symbolic link points outside the package",
            ));
        }
        Ok(target)
    }

    fn file(&mut self, path: &Path, rel: String, depth: usize) -> Result<(), PackageError> {
        if depth > self.limits.max_path_depth {
            return Err(PackageError::refused(
                "max_path_depth",
                Some(&rel),
                format!(
                    "the path is more than {} folders deep (limit max_path_depth)",
                    self.limits.max_path_depth
                ),
            ));
        }
        if self.files.len() >= self.limits.max_files {
            return Err(PackageError::refused(
                "max_files",
                Some(&rel),
                format!(
                    "the package has more than {} files (limit max_files)",
                    self.limits.max_files
                ),
            ));
        }
        let size = fs::metadata(path)
            .map_err(|e| PackageError::io(path, e))?
            .len();
        if size > self.limits.max_file_bytes {
            return Err(PackageError::refused(
                "max_file_bytes",
                Some(&rel),
                format!(
                    "the file is {} (limit max_file_bytes = {})",
                    human_bytes(size),
                    human_bytes(self.limits.max_file_bytes)
                ),
            ));
        }
        self.total = self.total.saturating_add(size);
        if self.total > self.limits.max_uncompressed_bytes {
            return Err(PackageError::refused(
                "max_uncompressed_bytes",
                Some(&rel),
                format!(
                    "the package is larger than {} (limit max_uncompressed_bytes)",
                    human_bytes(self.limits.max_uncompressed_bytes)
                ),
            ));
        }
        self.files.push(PackageFile { path: rel, size });
        Ok(())
    }
}

/// SHA-256 (hex) over the files sorted by path: for each file, its path's UTF-8 bytes, a NUL,
/// its length as a little-endian u64, then its bytes. Folders and file modes do not count.
pub(crate) fn content_hash(
    root: &Path,
    files: &[PackageFile],
    limits: &PackageLimits,
) -> Result<String, PackageError> {
    let mut sorted: Vec<&PackageFile> = files.iter().collect();
    sorted.sort_by(|a, b| a.path.cmp(&b.path));
    let mut hasher = Sha256::new();
    for file in sorted {
        let on_disk = super::paths::join(root, &file.path);
        let hashed = fs::File::open(&on_disk).and_then(|f| {
            // Streamed through the hasher (a package's largest file, its eval definition, can
            // be tens of MB): the length, hashed first, is the file's size when opened, and the
            // bytes read must match it.
            let len = f
                .metadata()?
                .len()
                .min(limits.max_file_bytes.saturating_add(1));
            hasher.update(file.path.as_bytes());
            hasher.update([0u8]);
            hasher.update(len.to_le_bytes());
            let copied = std::io::copy(&mut f.take(len), &mut hasher)?;
            if copied == len {
                Ok(())
            } else {
                Err(std::io::Error::other(format!(
                    "the file changed while it was read ({copied} of {len} bytes)"
                )))
            }
        });
        hashed.map_err(|e| PackageError::io(&on_disk, e))?;
    }
    Ok(hex::encode(hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skip_rules() {
        assert!(is_skipped("eval/runs/abc/grading/tc-1.json"));
        assert!(is_skipped("eval/benchmark.json"));
        assert!(is_skipped("eval/version-history.json"));
        assert!(is_skipped("node_modules/x/index.js"));
        assert!(is_skipped("scripts/.git/HEAD"));
        assert!(is_skipped("a/.DS_Store"));
        assert!(!is_skipped("eval/runs.md"));
        assert!(!is_skipped("eval/tests.json"));
        assert!(!is_skipped("scripts/target.py"));
    }

    #[test]
    fn scan_refuses_link_leaving_the_folder() {
        let outside = tempfile::tempdir().expect("tempdir");
        std::fs::write(outside.path().join("secret"), "x").expect("write");
        let pkg = tempfile::tempdir().expect("tempdir");
        std::fs::write(pkg.path().join("SKILL.md"), "x").expect("write");
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(outside.path().join("secret"), pkg.path().join("leak"))
                .expect("symlink");
            let err = scan(pkg.path(), &PackageLimits::default()).expect_err("must refuse");
            assert_eq!(err.limit(), Some("symlink"));
            assert_eq!(err.entry(), Some("leak"));
        }
    }

    #[test]
    fn the_content_hash_is_the_documented_digest_of_the_sorted_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let big = "x".repeat(200_000);
        for (path, content) in [("b.txt", "bee"), ("a/z.json", big.as_str()), ("empty", "")] {
            let on_disk = dir.path().join(path);
            fs::create_dir_all(on_disk.parent().expect("parent")).expect("mkdir");
            fs::write(on_disk, content).expect("write");
        }
        let limits = PackageLimits::default();
        let files = scan(dir.path(), &limits).expect("scan");
        // By hand: path, NUL, length (u64 little-endian), bytes, for each file by path.
        let mut hasher = Sha256::new();
        for (path, content) in [("a/z.json", big.as_str()), ("b.txt", "bee"), ("empty", "")] {
            hasher.update(path.as_bytes());
            hasher.update([0u8]);
            hasher.update((content.len() as u64).to_le_bytes());
            hasher.update(content.as_bytes());
        }
        assert_eq!(
            content_hash(dir.path(), &files, &limits).expect("hash"),
            hex::encode(hasher.finalize())
        );
    }

    #[test]
    fn scan_follows_link_inside_and_counts_limits() {
        let pkg = tempfile::tempdir().expect("tempdir");
        std::fs::write(pkg.path().join("SKILL.md"), "x").expect("write");
        std::fs::create_dir_all(pkg.path().join("node_modules/a")).expect("mkdir");
        std::fs::write(pkg.path().join("node_modules/a/b.js"), "x").expect("write");
        #[cfg(unix)]
        std::os::unix::fs::symlink(pkg.path().join("SKILL.md"), pkg.path().join("alias.md"))
            .expect("symlink");
        let files = scan(pkg.path(), &PackageLimits::default()).expect("scan");
        let names: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        #[cfg(unix)]
        assert_eq!(names, ["SKILL.md", "alias.md"]);
        let limits = PackageLimits {
            max_files: 1,
            ..PackageLimits::default()
        };
        #[cfg(unix)]
        {
            let err = scan(pkg.path(), &limits).expect_err("too many");
            assert_eq!(err.limit(), Some("max_files"));
            assert_eq!(err.entry(), Some("alias.md"));
        }
        let _ = (names, limits);
    }
}
