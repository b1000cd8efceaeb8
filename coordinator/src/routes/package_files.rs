//! A stored package reworked as files: extracted into a temporary directory (with the package
//! hardening of an upload), its eval definition replaced, and zipped again. Used where a route
//! changes a package before opening or storing it: a profile chosen at upload, a rescore's
//! inline definition, the editor's download. Blocking: call from `spawn_blocking`.

use std::io::{Cursor, Write as _};
use std::path::{Path, PathBuf};

use skilleval_model::package::{Package, PackageError, PackageLimits, EVAL_FILES};

/// Where the replaced definition is written.
pub(crate) const DEFINITION: &str = "eval/tests.json";

/// An extracted package; the directory is removed when this is dropped.
pub(crate) struct Extracted {
    _dir: tempfile::TempDir,
    pub root: PathBuf,
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> PackageError + '_ {
    move |source| PackageError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// `bytes` (a ZIP) extracted under the same limits and checks as an upload.
pub(crate) fn extract(bytes: &[u8], limits: &PackageLimits) -> Result<Extracted, PackageError> {
    let dir = tempfile::tempdir().map_err(io(&std::env::temp_dir()))?;
    let root = Package::extract_files(bytes, limits, dir.path())?;
    Ok(Extracted { _dir: dir, root })
}

/// Removes every eval file of the package under `root` and writes `text` as
/// [`DEFINITION`].
pub(crate) fn replace_definition(root: &Path, text: &[u8]) -> Result<(), PackageError> {
    for file in EVAL_FILES {
        let path = root.join(file);
        if path.is_file() {
            std::fs::remove_file(&path).map_err(io(&path))?;
        }
    }
    let target = root.join(DEFINITION);
    std::fs::create_dir_all(root.join("eval"))
        .and_then(|()| std::fs::write(&target, text))
        .map_err(io(&target))
}

/// The files under `root` as a ZIP, in sorted order (the same tree gives the same bytes).
pub(crate) fn zip_tree(root: &Path) -> Result<Vec<u8>, PackageError> {
    let mut writer = zip::ZipWriter::new(Cursor::new(Vec::new()));
    add_dir(&mut writer, root, "").map_err(io(root))?;
    let out = writer
        .finish()
        .map_err(|e| io(root)(std::io::Error::other(e)))?;
    Ok(out.into_inner())
}

fn add_dir(
    writer: &mut zip::ZipWriter<Cursor<Vec<u8>>>,
    dir: &Path,
    prefix: &str,
) -> std::io::Result<()> {
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated);
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for entry in entries {
        let path = format!("{prefix}{}", entry.file_name().to_string_lossy());
        let kind = entry.file_type()?;
        if kind.is_dir() {
            add_dir(writer, &entry.path(), &format!("{path}/"))?;
        } else if kind.is_file() {
            writer
                .start_file(path, options)
                .map_err(std::io::Error::other)?;
            writer.write_all(&std::fs::read(entry.path())?)?;
        }
    }
    Ok(())
}
