//! What an operator sets about environments: where they are cached and how big the cache may
//! grow, which index and registry they are installed from, and how long a build may take.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The public Python package index (PEP 503 "simple" API).
pub const DEFAULT_PYTHON_INDEX: &str = "https://pypi.org/simple";
/// The public npm registry.
pub const DEFAULT_NPM_REGISTRY: &str = "https://registry.npmjs.org/";

/// Settings of the environment cache. Missing fields take their defaults.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct EnvironmentConfig {
    /// Where built environments are kept (one folder per key); unset: `skilleval-environments`
    /// in the temporary directory. Its ancestors must be searchable by every user (the
    /// sandbox's uids read it).
    pub dir: Option<PathBuf>,
    /// The cache's size bound: past it, the least recently used environments not in use
    /// are removed.
    pub max_bytes: u64,
    /// The Python index (`--index-url`): PyPI, or a mirror for a cluster without internet.
    pub python_index: String,
    /// The npm registry.
    pub npm_registry: String,
    /// Longest a build may take, in seconds.
    pub build_timeout_secs: u64,
    /// The `uv` binary; unset: `uv` on PATH (a pyenv shim or pip's wrapper is followed to the
    /// real binary).
    pub uv: Option<PathBuf>,
}

impl Default for EnvironmentConfig {
    fn default() -> Self {
        EnvironmentConfig {
            dir: None,
            max_bytes: 4 << 30,
            python_index: DEFAULT_PYTHON_INDEX.to_string(),
            npm_registry: DEFAULT_NPM_REGISTRY.to_string(),
            build_timeout_secs: 600,
            uv: None,
        }
    }
}

impl EnvironmentConfig {
    pub(crate) fn cache_dir(&self) -> PathBuf {
        self.dir
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join("skilleval-environments"))
    }
}
