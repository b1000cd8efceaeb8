//! Hardened ZIP extraction: the one place uploaded archives are unpacked.
//!
//! Everything is checked from the central directory before a byte is decompressed (names,
//! symlinks, encryption, file count, depth, duplicates, declared sizes), then again while
//! decompressing, counting the bytes actually produced rather than trusting declared sizes:
//! each entry is read through `take(limit + 1)` so a lying header cannot make us write more
//! than a limit plus one byte. Files are written `0644` and folders `0755` so a sandbox running
//! as another user (uid 65534) can read them. `__MACOSX/` resource-fork entries are ignored.
//! When every entry sits below one top-level folder and there is no root `SKILL.md`, that
//! folder is stripped (archives made with "compress folder").

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, Cursor, Read, Write};
use std::path::Path;

use ::zip::ZipArchive;

use super::error::PackageError;
use super::limits::{human_bytes, PackageLimits};
use super::paths;
use super::tree;

/// `S_IFMT` and `S_IFLNK` of a unix mode in an entry's external attributes.
const S_IFMT: u32 = 0o170_000;
const S_IFLNK: u32 = 0o120_000;

/// One entry to extract, after the central-directory checks.
struct Planned {
    index: usize,
    /// Normalised, before the top-level folder is stripped.
    path: String,
    compressed: u64,
}

/// Extracts `bytes` into `dest` (which must exist and be empty), enforcing `limits`.
pub(crate) fn extract(
    bytes: &[u8],
    limits: &PackageLimits,
    dest: &Path,
) -> Result<(), PackageError> {
    let size = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    if size > limits.max_compressed_bytes {
        return Err(PackageError::refused(
            "max_compressed_bytes",
            None,
            format!(
                "the archive is {} (limit max_compressed_bytes = {})",
                human_bytes(size),
                human_bytes(limits.max_compressed_bytes)
            ),
        ));
    }
    let mut archive = ZipArchive::new(Cursor::new(bytes)).map_err(|e| {
        PackageError::refused(
            "not_a_zip",
            None,
            format!("not a readable ZIP archive: {e}"),
        )
    })?;
    if archive.has_duplicate_names() {
        let entry = first_duplicate_raw_name(bytes);
        return Err(PackageError::refused(
            "duplicate_name",
            entry.as_deref(),
            "the archive has two entries with the same name",
        ));
    }

    let (files, dirs) = plan(&archive, limits)?;
    let strip = top_level_folder(&files, &dirs);
    let relocate = |path: &str| -> Option<String> {
        match &strip {
            Some(prefix) => path
                .strip_prefix(prefix.as_str())
                .and_then(|p| p.strip_prefix('/'))
                .map(str::to_string),
            None => Some(path.to_string()),
        }
    };

    for dir in &dirs {
        if let Some(rel) = relocate(dir) {
            create_dir(dest, &rel)?;
        }
    }
    let mut total: u64 = 0;
    for planned in &files {
        let Some(rel) = relocate(&planned.path) else {
            continue;
        };
        total = extract_one(&mut archive, planned, &rel, dest, limits, total)?;
    }
    Ok(())
}

/// Central-directory checks; returns the files and folders to create, in archive order.
fn plan(
    archive: &ZipArchive<Cursor<&[u8]>>,
    limits: &PackageLimits,
) -> Result<(Vec<Planned>, BTreeSet<String>), PackageError> {
    let mut files = Vec::new();
    let mut dirs = BTreeSet::new();
    // Normalised path -> the raw name it came from, to name both sides of a duplicate.
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    let mut declared_total: u64 = 0;

    for index in 0..archive.len() {
        let entry = archive.by_index_data(index).map_err(|e| {
            PackageError::refused(
                "not_a_zip",
                None,
                format!("unreadable central directory entry {index}: {e}"),
            )
        })?;
        let raw = entry.name_raw();
        let Ok(name) = std::str::from_utf8(raw) else {
            let lossy = String::from_utf8_lossy(raw).into_owned();
            return Err(PackageError::refused(
                "non_utf8_name",
                Some(&lossy),
                "the entry name is not UTF-8; re-create the archive with UTF-8 names",
            ));
        };
        if name.starts_with("__MACOSX/") || name == "__MACOSX" {
            continue;
        }
        let path = paths::normalize(name)
            .map_err(|issue| PackageError::refused(issue.limit(), Some(name), issue.describe()))?;
        if entry
            .unix_mode()
            .is_some_and(|mode| mode & S_IFMT == S_IFLNK)
        {
            return Err(PackageError::refused(
                "symlink",
                Some(name),
                "the entry is a symbolic link; packages may not contain links",
            ));
        }
        if entry.encrypted() {
            return Err(PackageError::refused(
                "encrypted",
                Some(name),
                "the entry is encrypted",
            ));
        }
        if path.is_empty() {
            continue;
        }
        if paths::depth(&path) > limits.max_path_depth {
            return Err(PackageError::refused(
                "max_path_depth",
                Some(name),
                format!(
                    "the path is more than {} folders deep (limit max_path_depth)",
                    limits.max_path_depth
                ),
            ));
        }
        let is_dir = entry.is_dir();
        if let Some(first) = seen.get(&path) {
            let both_dirs = is_dir && dirs.contains(&path);
            if !both_dirs {
                return Err(PackageError::refused(
                    "duplicate_name",
                    Some(name),
                    format!("`{name}` and `{first}` are the same path `{path}`"),
                ));
            }
            continue;
        }
        seen.insert(path.clone(), name.to_string());
        // Every ancestor is a folder; a file may not also be one.
        let mut ancestor = path.as_str();
        while let Some((parent, _)) = ancestor.rsplit_once('/') {
            if seen.contains_key(parent) && !dirs.contains(parent) {
                return Err(PackageError::refused(
                    "duplicate_name",
                    Some(name),
                    format!("`{parent}` is both a file and a folder"),
                ));
            }
            dirs.insert(parent.to_string());
            ancestor = parent;
        }
        if is_dir {
            dirs.insert(path);
            continue;
        }
        if dirs.contains(&path) {
            return Err(PackageError::refused(
                "duplicate_name",
                Some(name),
                format!("`{path}` is both a file and a folder"),
            ));
        }
        if files.len() >= limits.max_files {
            return Err(PackageError::refused(
                "max_files",
                Some(name),
                format!(
                    "the archive has more than {} files (limit max_files)",
                    limits.max_files
                ),
            ));
        }
        // Declared sizes give an early, cheap refusal; the real counting happens while reading.
        let declared = entry.size();
        let compressed = entry.compressed_size();
        check_file_size(name, declared, limits)?;
        check_ratio(name, declared, compressed, limits)?;
        declared_total = declared_total.saturating_add(declared);
        check_total(name, declared_total, limits)?;
        files.push(Planned {
            index,
            path,
            compressed,
        });
    }
    Ok((files, dirs))
}

/// The single top-level folder to strip, when there is no root `SKILL.md` and everything is in it.
fn top_level_folder(files: &[Planned], dirs: &BTreeSet<String>) -> Option<String> {
    if files.iter().any(|f| f.path == "SKILL.md") {
        return None;
    }
    // Junk that is never part of a package (`.DS_Store`, `.git/`) does not stop the strip.
    let mut tops = files
        .iter()
        .map(|f| f.path.as_str())
        .filter(|p| !tree::is_skipped(p))
        .chain(
            dirs.iter()
                .map(String::as_str)
                .filter(|d| !tree::is_skipped(&format!("{d}/x"))),
        )
        .map(|p| p.split('/').next().unwrap_or(p));
    let first = tops.next()?;
    let single = tops.all(|t| t == first);
    // A lone root file (`a.txt`) is not a folder to strip.
    let is_folder = dirs.contains(first);
    (single && is_folder).then(|| first.to_string())
}

fn check_file_size(name: &str, bytes: u64, limits: &PackageLimits) -> Result<(), PackageError> {
    if bytes > limits.max_file_bytes {
        return Err(PackageError::refused(
            "max_file_bytes",
            Some(name),
            format!(
                "the file is larger than {} once decompressed (limit max_file_bytes)",
                human_bytes(limits.max_file_bytes)
            ),
        ));
    }
    Ok(())
}

fn check_total(name: &str, total: u64, limits: &PackageLimits) -> Result<(), PackageError> {
    if total > limits.max_uncompressed_bytes {
        return Err(PackageError::refused(
            "max_uncompressed_bytes",
            Some(name),
            format!(
                "the archive decompresses to more than {} (limit max_uncompressed_bytes)",
                human_bytes(limits.max_uncompressed_bytes)
            ),
        ));
    }
    Ok(())
}

fn check_ratio(
    name: &str,
    uncompressed: u64,
    compressed: u64,
    limits: &PackageLimits,
) -> Result<(), PackageError> {
    if uncompressed <= limits.compression_ratio_min_bytes {
        return Ok(());
    }
    // Message-level arithmetic: f64 precision is plenty.
    #[allow(clippy::cast_precision_loss)]
    let ratio = uncompressed as f64 / compressed.max(1) as f64;
    if ratio > limits.max_compression_ratio {
        return Err(PackageError::refused(
            "compression_ratio",
            Some(name),
            format!(
                "the entry expands more than {}:1 (limit max_compression_ratio); this looks like a zip bomb",
                limits.max_compression_ratio
            ),
        ));
    }
    Ok(())
}

/// Decompresses one entry, counting real bytes; returns the new running total.
fn extract_one(
    archive: &mut ZipArchive<Cursor<&[u8]>>,
    planned: &Planned,
    rel: &str,
    dest: &Path,
    limits: &PackageLimits,
    total_before: u64,
) -> Result<u64, PackageError> {
    let name = planned.path.as_str();
    let corrupt = |e: &dyn std::fmt::Display| {
        PackageError::refused(
            "corrupt_entry",
            Some(name),
            format!("the entry cannot be decompressed: {e}"),
        )
    };
    let entry = archive.by_index(planned.index).map_err(|e| corrupt(&e))?;
    let target = paths::join(dest, rel);
    if let Some(parent) = target.parent() {
        fs::create_dir_all(parent).map_err(|e| PackageError::io(parent, e))?;
    }
    let mut out = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&target)
        .map_err(|e| {
            if e.kind() == io::ErrorKind::AlreadyExists {
                // Only reachable on case-insensitive file systems (`A.md` and `a.md`).
                PackageError::refused(
                    "duplicate_name",
                    Some(name),
                    "another entry already wrote this path",
                )
            } else {
                PackageError::io(&target, e)
            }
        })?;

    let written = copy_counted(
        entry,
        &mut out,
        name,
        planned.compressed,
        total_before,
        limits,
    )
    .map_err(|e| match e {
        CopyError::Refused(refusal) => refusal,
        CopyError::Read(e) => corrupt(&e),
        CopyError::Write(e) => PackageError::io(&target, e),
    })?;
    out.flush().map_err(|e| PackageError::io(&target, e))?;
    set_mode(&target, 0o644)?;
    Ok(total_before.saturating_add(written))
}

enum CopyError {
    Refused(PackageError),
    Read(io::Error),
    Write(io::Error),
}

/// Copies an entry's decompressed bytes, counting them: never reads more than the smallest
/// remaining allowance (file size, archive total) plus one byte, and checks the ratio against
/// the entry's compressed size as it goes. Returns the bytes written.
fn copy_counted(
    reader: impl Read,
    out: &mut impl Write,
    name: &str,
    compressed: u64,
    total_before: u64,
    limits: &PackageLimits,
) -> Result<u64, CopyError> {
    let remaining_total = limits.max_uncompressed_bytes.saturating_sub(total_before);
    let cap = limits.max_file_bytes.min(remaining_total).saturating_add(1);
    let mut reader = reader.take(cap);
    let mut buf = vec![0u8; 64 * 1024];
    let mut written: u64 = 0;
    loop {
        let n = reader.read(&mut buf).map_err(CopyError::Read)?;
        if n == 0 {
            return Ok(written);
        }
        written = written.saturating_add(n as u64);
        check_file_size(name, written, limits).map_err(CopyError::Refused)?;
        check_total(name, total_before.saturating_add(written), limits)
            .map_err(CopyError::Refused)?;
        check_ratio(name, written, compressed, limits).map_err(CopyError::Refused)?;
        out.write_all(&buf[..n]).map_err(CopyError::Write)?;
    }
}

fn create_dir(dest: &Path, rel: &str) -> Result<(), PackageError> {
    if rel.is_empty() {
        return Ok(());
    }
    let mut path = dest.to_path_buf();
    for segment in rel.split('/') {
        path.push(segment);
        if !path.is_dir() {
            fs::create_dir(&path).map_err(|e| PackageError::io(&path, e))?;
            set_mode(&path, 0o755)?;
        }
    }
    Ok(())
}

/// Sets unix permission bits explicitly (the umask may be stricter than the sandbox needs).
pub(crate) fn set_mode(path: &Path, mode: u32) -> Result<(), PackageError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(path, fs::Permissions::from_mode(mode))
            .map_err(|e| PackageError::io(path, e))?;
    }
    #[cfg(not(unix))]
    {
        let _ = (path, mode);
    }
    Ok(())
}

/// Walks the raw central directory to name the first duplicated entry (the reader's index
/// keeps one entry per name, so it cannot say which). `None` for ZIP64 or odd archives.
fn first_duplicate_raw_name(bytes: &[u8]) -> Option<String> {
    const EOCD: [u8; 4] = [0x50, 0x4b, 0x05, 0x06];
    const CDH: [u8; 4] = [0x50, 0x4b, 0x01, 0x02];
    let u16_at = |at: usize| -> Option<usize> {
        bytes
            .get(at..at + 2)
            .map(|b| usize::from(u16::from_le_bytes([b[0], b[1]])))
    };
    let u32_at = |at: usize| -> Option<usize> {
        bytes
            .get(at..at + 4)
            .and_then(|b| usize::try_from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])).ok())
    };
    let lowest = bytes.len().saturating_sub(22 + 65_535);
    let eocd = (lowest..=bytes.len().saturating_sub(22))
        .rev()
        .find(|&i| bytes.get(i..i + 4) == Some(&EOCD[..]))?;
    let entries = u16_at(eocd + 10)?;
    let cd_size = u32_at(eocd + 12)?;
    let mut at = eocd.checked_sub(cd_size)?;
    let mut seen = BTreeSet::new();
    for _ in 0..entries {
        if bytes.get(at..at + 4) != Some(&CDH[..]) {
            return None;
        }
        let name_len = u16_at(at + 28)?;
        let extra_len = u16_at(at + 30)?;
        let comment_len = u16_at(at + 32)?;
        let name = bytes.get(at + 46..at + 46 + name_len)?;
        let name = String::from_utf8_lossy(name).into_owned();
        if !seen.insert(name.clone()) {
            return Some(name);
        }
        at += 46 + name_len + extra_len + comment_len;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(
        len: u64,
        compressed: u64,
        total_before: u64,
        limits: &PackageLimits,
    ) -> Result<u64, (&'static str, u64)> {
        let mut sink = CountingSink(0);
        let result = copy_counted(
            io::repeat(0).take(len),
            &mut sink,
            "x",
            compressed,
            total_before,
            limits,
        );
        match result {
            Ok(n) => Ok(n),
            Err(CopyError::Refused(e)) => Err((e.limit().unwrap_or(""), sink.0)),
            Err(_) => Err(("io", sink.0)),
        }
    }

    struct CountingSink(u64);

    impl Write for CountingSink {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    const MIB: u64 = 1024 * 1024;

    #[test]
    fn counts_real_bytes_whatever_was_declared() {
        let limits = PackageLimits {
            max_file_bytes: 3 * MIB,
            max_uncompressed_bytes: 5 * MIB,
            max_compression_ratio: 1e9,
            ..PackageLimits::default()
        };
        assert_eq!(copy(2 * MIB, 1, 0, &limits), Ok(2 * MIB));
        // Per file: stops just past the limit, never writes past it.
        let (limit, written) = copy(100 * MIB, 1, 0, &limits).expect_err("too big");
        assert_eq!(limit, "max_file_bytes");
        assert!(written <= 3 * MIB, "{written}");
        // Total: what earlier entries used counts.
        let (limit, written) = copy(3 * MIB, 1, 4 * MIB, &limits).expect_err("over total");
        assert_eq!(limit, "max_uncompressed_bytes");
        assert!(written <= MIB, "{written}");
    }

    #[test]
    fn ratio_is_checked_on_real_bytes_above_the_minimum() {
        let limits = PackageLimits::default();
        // Tiny, extremely compressible files are fine.
        assert_eq!(copy(MIB, 10, 0, &limits), Ok(MIB));
        // Past 1 MiB, 100:1 is the most an entry may expand.
        let (limit, written) = copy(50 * MIB, 10_000, 0, &limits).expect_err("bomb");
        assert_eq!(limit, "compression_ratio");
        assert!(written <= 2 * MIB, "{written}");
        assert_eq!(copy(2 * MIB, 30_000, 0, &limits), Ok(2 * MIB));
    }
}
