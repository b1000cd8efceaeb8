//! Packages on local disk, fetched once per content hash.
//!
//! A job names its package by content hash. The first job of a hash reads the ZIP from
//! `skill_versions.package_bytes`, extracts its files (the same hardened extraction as
//! uploads, without parsing the eval definition: the jobs carry their cases) into a temporary
//! folder beside the cache and renames it to `<cache>/<hash>`: the rename is
//! atomic, so another worker process sharing the folder sees either nothing or a whole package.
//! Within this process, concurrent first jobs of the same hash wait on a per-hash async mutex
//! and only one of them fetches.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use skilleval_infra::store::Store;
use skilleval_model::grade::Fault;
use skilleval_model::package::{Package, PackageLimits};

/// Folders of packages being extracted start with this; leftovers of a crash are removed at
/// start once they are [`STALE_AFTER`] old.
const TMP_PREFIX: &str = ".tmp-";

/// How old a half-extracted folder must be before a starting worker removes it. Several
/// worker processes may share one cache folder (a host's volume), so a folder of that prefix
/// may be another live worker's extraction in progress, which takes seconds; a crash's
/// leftover is only in the way of disk space, so waiting costs nothing.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(15 * 60);

#[derive(Debug)]
pub struct PackageCache {
    dir: PathBuf,
    limits: PackageLimits,
    store: Store,
    /// Per hash: the package root once known. The async mutex is what serialises first fetches.
    entries: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<PathBuf>>>>>,
    /// Packages read from the database by this cache.
    fetches: AtomicU64,
}

impl PackageCache {
    pub fn new(dir: PathBuf, limits: PackageLimits, store: Store) -> PackageCache {
        PackageCache {
            dir,
            limits,
            store,
            entries: Mutex::new(HashMap::new()),
            fetches: AtomicU64::new(0),
        }
    }

    /// How many packages this cache read from the database.
    pub fn fetches(&self) -> u64 {
        self.fetches.load(Ordering::Relaxed)
    }

    /// Creates the cache folder and removes half-extracted leftovers of crashed workers: the
    /// ones untouched for [`STALE_AFTER`], never a sibling's extraction in progress.
    pub fn prepare(&self) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        for entry in std::fs::read_dir(&self.dir)?.flatten() {
            if !entry.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
                continue;
            }
            let stale = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|modified| modified.elapsed().ok())
                .is_some_and(|age| age >= STALE_AFTER);
            if stale {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        Ok(())
    }

    /// The package's root folder, fetched and extracted on first use. A database blip is a
    /// transient fault; a missing or broken package is permanent; a cache this host cannot
    /// write or read is the host's fault (retried, possibly on another worker).
    pub async fn root(&self, hash: &str) -> Result<PathBuf, Fault> {
        if hash.is_empty() || hash.len() > 128 || !hash.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(Fault::permanent(format!("invalid package hash `{hash}`")));
        }
        let slot = {
            let mut entries = self
                .entries
                .lock()
                .map_err(|_| Fault::transient("package cache lock poisoned"))?;
            entries.entry(hash.to_string()).or_default().clone()
        };
        let mut slot = slot.lock().await;
        if let Some(root) = slot.as_ref() {
            return Ok(root.clone());
        }
        let root = self.load(hash).await?;
        *slot = Some(root.clone());
        Ok(root)
    }

    async fn load(&self, hash: &str) -> Result<PathBuf, Fault> {
        let final_dir = self.dir.join(hash);
        if final_dir.is_dir() {
            return Package::root_of(&final_dir)
                .map_err(|e| Fault::host(format!("cached package {hash} does not open: {e}")));
        }
        self.fetches.fetch_add(1, Ordering::Relaxed);
        let bytes = self
            .store
            .package_bytes(hash)
            .await
            .map_err(|e| {
                if e.is_transient() {
                    Fault::transient(format!("fetching package {hash}: {e}"))
                } else {
                    Fault::permanent(format!("fetching package {hash}: {e}"))
                }
            })?
            .ok_or_else(|| Fault::permanent(format!("package {hash} is not stored")))?;
        std::fs::create_dir_all(&self.dir).map_err(|e| {
            Fault::host(format!(
                "creating the package cache {}: {e}",
                self.dir.display()
            ))
        })?;
        let tmp = self.dir.join(format!(
            "{TMP_PREFIX}{hash}-{}",
            uuid::Uuid::new_v4().simple()
        ));
        let limits = self.limits.clone();
        let tmp_for_extract = tmp.clone();
        // Only the files: the jobs carry their cases, so the eval definition is not parsed.
        let extracted =
            blocking(move || Package::extract_files(&bytes, &limits, &tmp_for_extract)).await;
        let root = match extracted {
            Ok(root) => root,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&tmp);
                return Err(Fault::permanent(format!(
                    "package {hash} does not extract: {e}"
                )));
            }
        };
        let relative = root
            .strip_prefix(&tmp)
            .map(Path::to_path_buf)
            .unwrap_or_default();
        if let Err(e) = std::fs::rename(&tmp, &final_dir) {
            // Another process renamed the same package first: use theirs.
            let _ = std::fs::remove_dir_all(&tmp);
            if !final_dir.is_dir() {
                return Err(Fault::host(format!(
                    "moving package {hash} into {}: {e}",
                    final_dir.display()
                )));
            }
        }
        tracing::info!(package_hash = hash, dir = %final_dir.display(), "package cached");
        Ok(final_dir.join(relative))
    }
}

async fn blocking<T, E>(f: impl FnOnce() -> Result<T, E> + Send + 'static) -> Result<T, String>
where
    T: Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(e) => Err(format!("extraction task failed: {e}")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_starting_worker_removes_a_crash_leftover_but_not_a_siblings_extraction_in_progress()
    {
        let dir = tempfile::tempdir().unwrap();
        let leftover = dir.path().join(format!("{TMP_PREFIX}aaaa-1"));
        let in_progress = dir.path().join(format!("{TMP_PREFIX}bbbb-2"));
        let package = dir.path().join("cccc");
        for d in [&leftover, &in_progress, &package] {
            std::fs::create_dir_all(d.join("eval")).unwrap();
        }
        let old = std::time::SystemTime::now() - STALE_AFTER - std::time::Duration::from_secs(60);
        std::fs::File::open(&leftover)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let store = Store::from_pool(
            sqlx::postgres::PgPoolOptions::new()
                .connect_lazy("postgres://127.0.0.1/unused")
                .unwrap(),
        );
        let cache = PackageCache::new(dir.path().to_path_buf(), PackageLimits::default(), store);
        cache.prepare().unwrap();
        assert!(!leftover.exists(), "a crash's leftover is removed");
        assert!(
            in_progress.join("eval").is_dir(),
            "a sibling's extraction in progress is left alone"
        );
        assert!(package.is_dir(), "extracted packages stay");
    }
}
