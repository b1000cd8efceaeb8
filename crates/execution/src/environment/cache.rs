//! The cache of built environments, shared by every case a process runs: one folder per key
//! under the configured directory, found again after a restart (a folder is an environment
//! once its manifest is written), bounded in bytes with the least recently used environment
//! that no case holds removed first, and one build per key at a time: a case that wants an
//! environment being built waits for that build instead of starting its own.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use skilleval_model::grade::Fault;
use skilleval_model::package::Dependencies;
use skilleval_sandbox::Sandbox;

use super::build::{self, BuildInput, Built};
use super::config::EnvironmentConfig;

/// Most permanent failures remembered (a package whose dependencies do not resolve fails
/// every case with one build); past it they are forgotten.
const FAILED_CAPACITY: usize = 256;

/// The environments of one process (see the module's doc).
pub struct Environments {
    cfg: EnvironmentConfig,
    state: Mutex<State>,
    /// The cache folder, its tools and empty folders, and what a restart found in it.
    ready: tokio::sync::OnceCell<()>,
    interpreters: tokio::sync::OnceCell<String>,
    /// The folder holding the copy of `uv` builds mount.
    tools: tokio::sync::OnceCell<PathBuf>,
    builds: AtomicU64,
}

impl std::fmt::Debug for Environments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Environments")
            .field("dir", &self.cfg.cache_dir())
            .field("builds", &self.builds())
            .finish()
    }
}

#[derive(Default)]
struct State {
    entries: HashMap<String, Entry>,
    tick: u64,
    /// Per key being built, the lock its builder holds.
    building: HashMap<String, Arc<tokio::sync::Mutex<()>>>,
    failed: HashMap<String, Fault>,
}

struct Entry {
    built: Arc<Built>,
    last_used: u64,
}

impl Environments {
    pub fn new(cfg: EnvironmentConfig) -> Self {
        Environments {
            cfg,
            state: Mutex::default(),
            ready: tokio::sync::OnceCell::new(),
            interpreters: tokio::sync::OnceCell::new(),
            tools: tokio::sync::OnceCell::new(),
            builds: AtomicU64::new(0),
        }
    }

    pub fn config(&self) -> &EnvironmentConfig {
        &self.cfg
    }

    /// How many builds this cache has run (successful or not).
    pub fn builds(&self) -> u64 {
        self.builds.load(Ordering::Relaxed)
    }

    /// Bytes of the environments held.
    pub fn bytes(&self) -> u64 {
        self.lock().entries.values().map(|e| e.built.bytes).sum()
    }

    /// Keys of the environments held.
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.lock().entries.keys().cloned().collect();
        keys.sort();
        keys
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The environment of `deps` for cases run in `sandbox`, built now if it is not held
    /// (waiting for a build of the same key already under way); with it, whether this call
    /// built it.
    pub async fn get(
        &self,
        sandbox: &Sandbox,
        deps: &Dependencies,
    ) -> Result<(Arc<Built>, bool), Fault> {
        self.ready
            .get_or_try_init(|| self.open_dir())
            .await
            .map_err(|e| {
                Fault::host(format!(
                    "opening the environment cache {}: {e}",
                    self.cfg.cache_dir().display()
                ))
            })?;
        let empty = self.cfg.cache_dir().join(".empty");
        let interpreters = self
            .interpreters
            .get_or_try_init(|| build::interpreters(sandbox, &empty))
            .await?;
        let key = build::key(deps, interpreters, &self.cfg);
        if let Some(found) = self.lookup(&key)? {
            return Ok((found, false));
        }
        let lock = self.lock().building.entry(key.clone()).or_default().clone();
        let _building = lock.lock().await;
        // Whoever held the lock before may have built it.
        if let Some(found) = self.lookup(&key)? {
            return Ok((found, false));
        }
        let result = self.build(sandbox, deps, &key, &empty).await;
        let mut state = self.lock();
        state.building.remove(&key);
        match result {
            Ok(built) => Ok((built, true)),
            Err(fault) => {
                if !fault.is_host() && !fault.is_transient() {
                    if state.failed.len() >= FAILED_CAPACITY {
                        state.failed.clear();
                    }
                    state.failed.insert(key, fault.clone());
                }
                Err(fault)
            }
        }
    }

    /// A held environment (marked used now), or the failure remembered for its key.
    fn lookup(&self, key: &str) -> Result<Option<Arc<Built>>, Fault> {
        let mut state = self.lock();
        if let Some(fault) = state.failed.get(key) {
            return Err(fault.clone());
        }
        state.tick += 1;
        let tick = state.tick;
        Ok(state.entries.get_mut(key).map(|e| {
            e.last_used = tick;
            e.built.clone()
        }))
    }

    async fn build(
        &self,
        sandbox: &Sandbox,
        deps: &Dependencies,
        key: &str,
        empty: &Path,
    ) -> Result<Arc<Built>, Fault> {
        let tools = if deps.python.is_empty() {
            None
        } else {
            Some(
                self.tools
                    .get_or_try_init(|| self.prepare_uv())
                    .await?
                    .clone(),
            )
        };
        let root = self.cfg.cache_dir();
        let dir = root.join(key);
        // Another process with the same folder may be building this key: one at a time, and
        // what it finished is taken as it is.
        let _lock = lock_key(&root, key, true)
            .await
            .map_err(|e| Fault::host(format!("locking {}: {e}", dir.display())))?;
        if let Some(done) = Built::load(&dir).filter(|b| b.key == key) {
            let done = Arc::new(done);
            self.insert(done.clone());
            return Ok(done);
        }
        let fresh = || -> std::io::Result<()> {
            if dir.exists() {
                std::fs::remove_dir_all(&dir)?;
            }
            std::fs::create_dir(&dir)?;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
        };
        fresh().map_err(|e| Fault::host(format!("creating {}: {e}", dir.display())))?;
        self.builds.fetch_add(1, Ordering::Relaxed);
        tracing::info!(key, python = ?deps.python, node = ?deps.node, "building an environment");
        let built = build::build(BuildInput {
            cfg: &self.cfg,
            sandbox,
            deps,
            key,
            dir: &dir,
            tools: tools.as_deref(),
            empty,
            scratch_in: &root,
        })
        .await;
        let manifest = match built {
            Ok(m) => m,
            Err(fault) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(fault);
            }
        };
        let built = Arc::new(Built {
            key: key.to_string(),
            bytes: build::tree_bytes(&dir),
            mount: Arc::new(build::mount_of(&dir, &manifest)),
            dir,
            manifest,
        });
        self.insert(built.clone());
        Ok(built)
    }

    /// Holds `built`, then removes the least recently used environments no case holds until
    /// the cache is within its bound (the new one stays even if it alone is larger).
    fn insert(&self, built: Arc<Built>) {
        let victims: Vec<PathBuf> = {
            let mut state = self.lock();
            state.tick += 1;
            let tick = state.tick;
            let key = built.key.clone();
            state.entries.insert(
                key.clone(),
                Entry {
                    built,
                    last_used: tick,
                },
            );
            let mut total: u64 = state.entries.values().map(|e| e.built.bytes).sum();
            let mut order: Vec<(u64, String)> = state
                .entries
                .iter()
                .filter(|(k, e)| **k != key && Arc::strong_count(&e.built) == 1)
                .map(|(k, e)| (e.last_used, k.clone()))
                .collect();
            order.sort();
            let mut victims = Vec::new();
            for (_, k) in order {
                if total <= self.cfg.max_bytes {
                    break;
                }
                if let Some(e) = state.entries.remove(&k) {
                    total = total.saturating_sub(e.built.bytes);
                    tracing::info!(key = %k, bytes = e.built.bytes, "evicting an environment");
                    victims.push(e.built.dir.clone());
                }
            }
            victims
        };
        for dir in victims {
            let _ = std::fs::remove_dir_all(dir);
        }
    }

    /// Creates the cache folder (world-searchable: the sandbox's uids read it), and takes in
    /// what a previous process left: finished environments are held (least recently used
    /// first by their folder's age), unfinished builds removed.
    async fn open_dir(&self) -> std::io::Result<()> {
        let root = self.cfg.cache_dir();
        std::fs::create_dir_all(&root)?;
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755))?;
        for sub in [".empty", ".tools"] {
            let dir = root.join(sub);
            std::fs::create_dir_all(&dir)?;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
        }
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&root)?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if name.starts_with(".scratch-") {
                // A build's scratch folder left by a process that died: one older than the
                // longest build cannot be in use.
                let stale = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age.as_secs() > 2 * self.cfg.build_timeout_secs);
                if stale {
                    let _ = std::fs::remove_dir_all(&path);
                }
                continue;
            }
            if name.len() != 64 || !name.bytes().all(|b| b.is_ascii_hexdigit()) {
                continue;
            }
            match Built::load(&path) {
                Some(built) if built.key == name => {
                    let age = entry.metadata().and_then(|m| m.modified()).ok();
                    found.push((age, built));
                }
                // Unfinished: removed unless another process is building it now.
                _ => {
                    if let Ok(Some(_lock)) = lock_key(&root, &name, false).await {
                        let _ = std::fs::remove_dir_all(&path);
                    }
                }
            }
        }
        found.sort_by_key(|(age, _)| *age);
        for (_, built) in found {
            self.insert(Arc::new(built));
        }
        Ok(())
    }

    /// Copies `uv` into the cache's tools folder, where the build's uid can read it.
    async fn prepare_uv(&self) -> Result<PathBuf, Fault> {
        let uv = build::find_uv(&self.cfg)?;
        let tools = self.cfg.cache_dir().join(".tools");
        let target = tools.join("uv");
        let copy = {
            let target = target.clone();
            move || -> std::io::Result<()> {
                let size = std::fs::metadata(&uv)?.len();
                if std::fs::metadata(&target).is_ok_and(|m| m.len() == size) {
                    return Ok(());
                }
                let partial = target.with_extension("partial");
                std::fs::copy(&uv, &partial)?;
                std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755))?;
                std::fs::rename(&partial, &target)
            }
        };
        tokio::task::spawn_blocking(copy)
            .await
            .map_err(|e| Fault::host(format!("copying uv: {e}")))?
            .map_err(|e| Fault::host(format!("copying uv into {}: {e}", tools.display())))?;
        Ok(tools)
    }
}

/// The lock of one key's folder (`KEY.lock` beside it), held while it is built, by this or
/// another process using the same cache folder. `wait`: block until it is free; otherwise
/// `None` when someone holds it.
async fn lock_key(root: &Path, key: &str, wait: bool) -> std::io::Result<Option<std::fs::File>> {
    let path = root.join(format!("{key}.lock"));
    tokio::task::spawn_blocking(move || {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)?;
        // flock(2) through rustix: `File::lock` is newer than the workspace's MSRV.
        use rustix::fs::{flock, FlockOperation};
        if wait {
            flock(&file, FlockOperation::LockExclusive)?;
            return Ok(Some(file));
        }
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Some(file)),
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => Ok(None),
            Err(e) => Err(e.into()),
        }
    })
    .await
    .map_err(std::io::Error::other)?
}
