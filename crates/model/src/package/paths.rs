//! Package-relative path rules shared by ZIP extraction, folder scanning and validation.
//!
//! A package path is relative, `/`-separated, has no `..` segment and no drive or root. Archive
//! names are normalised (`a/./b`, `a//b` and `a\b` all become `a/b`) before anything else looks
//! at them, so two names that land on the same file are caught as duplicates.

use std::path::{Path, PathBuf};

/// Why a path cannot be used inside a package.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathIssue {
    Empty,
    /// `/etc/x`, `\\server\share`, `C:\x`, `C:x`.
    Absolute,
    /// A `..` segment.
    ParentDir,
    /// A NUL or other control character.
    ControlChar,
}

impl PathIssue {
    /// The refusal name used for this issue.
    pub fn limit(self) -> &'static str {
        match self {
            PathIssue::Empty | PathIssue::ControlChar => "invalid_name",
            PathIssue::Absolute => "absolute_path",
            PathIssue::ParentDir => "zip_slip",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            PathIssue::Empty => "the path is empty",
            PathIssue::Absolute => "the path is absolute; package paths must be relative",
            PathIssue::ParentDir => "the path has a `..` segment and would leave the package",
            PathIssue::ControlChar => "the path contains a control character",
        }
    }
}

/// Normalises a relative path: `\` counts as a separator, `.` and empty segments are dropped.
/// Returns the `/`-joined segments (empty string for the root itself, e.g. `./`).
pub fn normalize(raw: &str) -> Result<String, PathIssue> {
    if raw.chars().any(char::is_control) {
        return Err(PathIssue::ControlChar);
    }
    if raw.starts_with('/') || raw.starts_with('\\') || has_drive_prefix(raw) {
        return Err(PathIssue::Absolute);
    }
    let mut segments = Vec::new();
    for segment in raw.split(['/', '\\']) {
        match segment {
            "" | "." => {}
            ".." => return Err(PathIssue::ParentDir),
            s => segments.push(s),
        }
    }
    Ok(segments.join("/"))
}

/// Like [`normalize`] but an empty result is an error: for paths that must name a file.
pub fn normalize_file(raw: &str) -> Result<String, PathIssue> {
    let normalized = normalize(raw)?;
    if normalized.is_empty() {
        Err(PathIssue::Empty)
    } else {
        Ok(normalized)
    }
}

/// `C:`, `c:\...`: a Windows drive letter.
fn has_drive_prefix(raw: &str) -> bool {
    let bytes = raw.as_bytes();
    bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':'
}

/// Number of segments of a normalised path.
pub fn depth(normalized: &str) -> usize {
    if normalized.is_empty() {
        0
    } else {
        normalized.split('/').count()
    }
}

/// The on-disk path of a normalised package path.
pub fn join(root: &Path, normalized: &str) -> PathBuf {
    let mut path = root.to_path_buf();
    for segment in normalized.split('/').filter(|s| !s.is_empty()) {
        path.push(segment);
    }
    path
}

/// Checks a path an eval definition refers to (`input.files`, a fixture, a script): it must be
/// package-relative and name an existing file. Returns the normalised path, or what is wrong.
pub fn check_reference(root: &Path, raw: &str) -> Result<String, String> {
    let normalized =
        normalize_file(raw).map_err(|issue| format!("`{raw}`: {}", issue.describe()))?;
    let on_disk = join(root, &normalized);
    if on_disk.is_file() {
        Ok(normalized)
    } else if on_disk.is_dir() {
        Err(format!("`{raw}` is a folder, not a file"))
    } else {
        Err(format!("`{raw}` does not exist in the package"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises_equivalent_spellings() {
        assert_eq!(normalize("a/./b").as_deref(), Ok("a/b"));
        assert_eq!(normalize("a//b/").as_deref(), Ok("a/b"));
        assert_eq!(normalize("a\\b").as_deref(), Ok("a/b"));
        assert_eq!(normalize("./").as_deref(), Ok(""));
    }

    #[test]
    fn refuses_escapes_and_roots() {
        assert_eq!(normalize("../evil"), Err(PathIssue::ParentDir));
        assert_eq!(normalize("a/../../evil"), Err(PathIssue::ParentDir));
        assert_eq!(normalize("..\\evil"), Err(PathIssue::ParentDir));
        assert_eq!(normalize("/etc/x"), Err(PathIssue::Absolute));
        assert_eq!(normalize("\\\\server\\share"), Err(PathIssue::Absolute));
        assert_eq!(normalize("C:\\x"), Err(PathIssue::Absolute));
        assert_eq!(normalize("c:x"), Err(PathIssue::Absolute));
        assert_eq!(normalize("a\0b"), Err(PathIssue::ControlChar));
        assert_eq!(normalize_file("."), Err(PathIssue::Empty));
    }

    #[test]
    fn depth_counts_segments() {
        assert_eq!(depth(""), 0);
        assert_eq!(depth("a"), 1);
        assert_eq!(depth("a/b/c"), 3);
    }
}
