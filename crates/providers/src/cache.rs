//! The model response cache: the same request to the same provider and model gets the stored
//! answer instead of a second (paid, slow, possibly different) call.
//!
//! Keys are the SHA-256 of the canonical JSON of (provider, endpoint, model, messages,
//! parameters, schema, a caller salt such as the repeat number) — [`cache_key`]. Only answers
//! the caller accepted are stored: errors, and judge answers that could not be parsed, never
//! are. [`ResponseCache`] is the seam: the CLI uses [`DirCache`] (a folder of JSON files), the
//! service plugs a Postgres-backed one in; [`NoCache`] is `--no-cache`.
//!
//! A cache is an optimisation, so its failures are not the caller's: an unreadable entry is a
//! miss and a failed write is logged and dropped.
//!
//! **Owners.** The service deletes the answers a run used when the run is deleted
//! (docs/security.md). Rather than thread a run id through every grader and client, the worker
//! runs each job inside [`CacheOwner::scope`] and a cache that keeps owners (the service's
//! Postgres one) reads [`CacheOwner::current`] on each `get` and `put`. Outside a scope (the
//! CLI, the coordinator) there is no owner; caches that keep none ignore it.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use async_trait::async_trait;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The run on whose behalf model calls are made: the answers it stores or is served are linked
/// to it, and go when it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheOwner {
    pub run_id: uuid::Uuid,
}

tokio::task_local! {
    static CACHE_OWNER: CacheOwner;
}

impl CacheOwner {
    /// Runs `f` with `self` as the owner of every cache read and write it makes (on this task:
    /// a task `f` spawns has no owner).
    pub async fn scope<F: std::future::Future>(self, f: F) -> F::Output {
        CACHE_OWNER.scope(self, f).await
    }

    /// The owner of the current task's model calls, `None` outside [`CacheOwner::scope`].
    pub fn current() -> Option<CacheOwner> {
        CACHE_OWNER.try_with(|o| *o).ok()
    }
}

/// Stores model answers by key.
#[async_trait]
pub trait ResponseCache: Send + Sync + fmt::Debug {
    /// The stored answer, `None` on a miss (or an unreadable entry).
    async fn get(&self, key: &str) -> Option<Value>;
    /// Stores an answer; failures are the cache's to log, never the caller's.
    async fn put(&self, key: &str, value: &Value);
}

/// SHA-256 (hex) of the JSON of `parts`. Build `parts` with a fixed field order (the crate
/// keeps JSON objects in insertion order), so equal requests give equal keys.
pub fn cache_key(parts: &Value) -> String {
    let bytes = serde_json::to_vec(parts).unwrap_or_default();
    hex::encode(Sha256::digest(&bytes))
}

/// Caches nothing (`--no-cache`).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoCache;

#[async_trait]
impl ResponseCache for NoCache {
    async fn get(&self, _key: &str) -> Option<Value> {
        None
    }

    async fn put(&self, _key: &str, _value: &Value) {}
}

/// An in-memory cache, bounded (emptied when full): for tests and as a first level.
#[derive(Debug, Default)]
pub struct MemoryCache {
    entries: Mutex<HashMap<String, Value>>,
}

/// Most entries a [`MemoryCache`] holds before it starts over.
const MEMORY_CACHE_CAPACITY: usize = 10_000;

impl MemoryCache {
    pub fn len(&self) -> usize {
        self.entries.lock().map(|e| e.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[async_trait]
impl ResponseCache for MemoryCache {
    async fn get(&self, key: &str) -> Option<Value> {
        self.entries.lock().ok()?.get(key).cloned()
    }

    async fn put(&self, key: &str, value: &Value) {
        if let Ok(mut entries) = self.entries.lock() {
            if entries.len() >= MEMORY_CACHE_CAPACITY {
                entries.clear();
            }
            entries.insert(key.to_string(), value.clone());
        }
    }
}

/// One JSON file per answer under a folder: `<dir>/<first two hex digits>/<key>.json`.
#[derive(Debug, Clone)]
pub struct DirCache {
    dir: PathBuf,
}

impl DirCache {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        DirCache { dir: dir.into() }
    }

    /// `$XDG_CACHE_HOME/skilleval/llm`, else `~/.cache/skilleval/llm`; `None` without a home.
    pub fn default_dir(lookup: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
        let non_empty = |k: &str| lookup(k).filter(|v| !v.trim().is_empty());
        non_empty("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| non_empty("HOME").map(|h| Path::new(&h).join(".cache")))
            .map(|base| base.join("skilleval").join("llm"))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, key: &str) -> Option<PathBuf> {
        // Keys are hex digests; anything else is refused rather than turned into a path.
        if key.len() < 8 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        Some(self.dir.join(&key[..2]).join(format!("{key}.json")))
    }
}

#[async_trait]
impl ResponseCache for DirCache {
    async fn get(&self, key: &str) -> Option<Value> {
        let path = self.path(key)?;
        let bytes = tokio::fs::read(&path).await.ok()?;
        match serde_json::from_slice(&bytes) {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "unreadable cache entry; a miss");
                None
            }
        }
    }

    async fn put(&self, key: &str, value: &Value) {
        let Some(path) = self.path(key) else {
            return;
        };
        let result = async {
            let parent = path.parent().unwrap_or(&self.dir);
            tokio::fs::create_dir_all(parent).await?;
            // Written whole then renamed, so a reader never sees half an entry.
            let tmp = parent.join(format!(".{key}.{}.tmp", uuid::Uuid::new_v4().simple()));
            tokio::fs::write(&tmp, serde_json::to_vec(value).unwrap_or_default()).await?;
            tokio::fs::rename(&tmp, &path).await
        }
        .await;
        if let Err(e) = result {
            tracing::warn!(path = %path.display(), error = %e, "could not write a model response to the cache");
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_follow_every_part() {
        let a = cache_key(&json!({"provider": "p", "model": "m", "messages": ["hi"]}));
        let b = cache_key(&json!({"provider": "p", "model": "m", "messages": ["hi"]}));
        let c = cache_key(&json!({"provider": "p", "model": "m2", "messages": ["hi"]}));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(a.len(), 64);
    }

    #[tokio::test]
    async fn dir_cache_round_trips_and_misses() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DirCache::new(dir.path().join("llm"));
        let key = cache_key(&json!("k"));
        assert_eq!(cache.get(&key).await, None);
        cache.put(&key, &json!({"text": "hello"})).await;
        assert_eq!(cache.get(&key).await, Some(json!({"text": "hello"})));
        assert!(dir
            .path()
            .join("llm")
            .join(&key[..2])
            .join(format!("{key}.json"))
            .exists());
        // Not a hex key: never a path.
        cache.put("../../etc/passwd", &json!(1)).await;
        assert_eq!(cache.get("../../etc/passwd").await, None);
    }

    #[tokio::test]
    async fn the_owner_is_known_inside_its_scope_only() {
        assert_eq!(CacheOwner::current(), None);
        let owner = CacheOwner {
            run_id: uuid::Uuid::now_v7(),
        };
        let seen = owner.scope(async { CacheOwner::current() }).await;
        assert_eq!(seen, Some(owner));
        assert_eq!(CacheOwner::current(), None, "not after the scope");
    }

    #[test]
    fn default_dir_follows_xdg_then_home() {
        let d = DirCache::default_dir(|k| (k == "HOME").then(|| "/home/a".to_string()));
        assert_eq!(d, Some(PathBuf::from("/home/a/.cache/skilleval/llm")));
        let d = DirCache::default_dir(|k| (k == "XDG_CACHE_HOME").then(|| "/c".to_string()));
        assert_eq!(d, Some(PathBuf::from("/c/skilleval/llm")));
        assert_eq!(DirCache::default_dir(|_| None), None);
    }
}
