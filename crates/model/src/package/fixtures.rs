//! Packages on disk for tests, of this crate and of the crates above it (`test-util`).

use std::path::Path;

use tempfile::TempDir;

use super::{Package, PackageLimits};

/// A `SKILL.md` with the two required fields.
pub const SKILL: &str = "---\nname: demo-skill\ndescription: Does demo things.\n---\n# Demo\n";

/// A temporary folder holding these files (parents created), removed when dropped.
#[allow(clippy::expect_used)]
pub fn package(files: &[(&str, &str)]) -> TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for (path, content) in files {
        let on_disk = dir.path().join(path);
        if let Some(parent) = on_disk.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        std::fs::write(on_disk, content).expect("write");
    }
    dir
}

/// The package in `dir`, opened with the default limits.
#[allow(clippy::expect_used)]
pub fn open(dir: &Path) -> Package {
    Package::open(dir, &PackageLimits::default()).expect("package opens")
}
