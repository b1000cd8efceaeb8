//! Environments: the packages a skill's code imports, installed once per set and mounted
//! read-only into every sandbox of the package's cases.
//!
//! ```text
//! Dependencies (model: PEP 723, setup.dependencies, requirements.txt, pyproject.toml, package.json)
//!   key      sha256(sorted set, interpreters, index URLs)              (build::key)
//!   cache    one directory per key, LRU-evicted by bytes, one build per key at a time (cache)
//!   build    uv venv + uv pip install / npm install --ignore-scripts, in a sandbox session
//!            whose only network is the egress proxy to the configured index    (build)
//!   mount    <dir> read-only at /opt/skilleval-env; PATH, VIRTUAL_ENV, PYTHONPATH, NODE_PATH
//! ```
//!
//! **Whose fault.** A dependency the index does not have, or that does not resolve, is the
//! package's: every case is `errored` with the resolver's message (a permanent fault, cached
//! per key so the cases of one run cost one attempt). An index that cannot be reached, a
//! missing `uv` or `npm`, a worker without a Python that satisfies `requires-python`, and the
//! sandbox's own failures are the host's ([`Fault::Host`](skilleval_model::grade::Fault)):
//! retried, never the skill's grade.

mod build;
mod cache;
mod config;
#[cfg(any(test, feature = "test-util"))]
pub mod fixtures;

pub use build::{Built, ENVIRONMENT_DIR};
pub use cache::Environments;
pub use config::EnvironmentConfig;
