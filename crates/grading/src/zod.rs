//! Zod schemas: a case's `expected.zodSchema` holds a Zod schema's source (Zod 3 or 4
//! syntax), which the `json_schema` strategy converts to JSON Schema when it compiles the case
//! and then grades with exactly as it grades `expected.jsonSchema`.
//!
//! The conversion is JavaScript, so it runs where the project's other untrusted code runs: in
//! the sandbox, as `node convert.cjs` in the converter's folder (`tools/zod` in the
//! repository: the script and the Zod its `package-lock.json` pins, installed with `npm ci` by
//! `scripts/test.sh` and the deploy files). The source goes in on stdin; the script evaluates
//! it with Zod 4, then with the Zod 3 API the same package ships, and answers with the JSON
//! Schema or Node's message. Answers are cached by the SHA-256 of the source, so a suite of
//! cases sharing one schema converts it once per process; a source that is not a schema is
//! cached too (it fails the same way every time), a failure of the host is not.
//!
//! Converting happens at validation. A service that stores the definition for workers to run
//! ([`inline_converted`]) stores the converted schema in `jsonSchema` and the source in
//! `expected.zodSource`, so workers grade a plain JSON Schema and never run Node.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::StrategyRegistry;
use skilleval_model::definition::TestCase;
use skilleval_sandbox::{Sandbox, SandboxPolicy, SandboxRequest};

/// The script the converter's folder holds.
pub const SCRIPT: &str = "convert.cjs";
/// Where [`inline_converted`] keeps a converted case's Zod source, under `expected`.
pub const SOURCE_KEY: &str = "zodSource";
/// Wall-clock limit of one conversion (Node's start-up included; the script also stops a
/// source's own evaluation after 2 s).
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// Why a source did not convert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ZodError {
    /// The source is not a Zod schema Zod can convert: Node's message. The package's fault.
    Source(String),
    /// The converter could not run here (no Node, not installed, no sandbox): the host's.
    Host(String),
}

impl fmt::Display for ZodError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ZodError::Source(m) | ZodError::Host(m) => f.write_str(m),
        }
    }
}

/// SHA-256 of a source -> its schema, or Node's message.
type Cache = HashMap<[u8; 32], Result<Value, String>>;

/// Converts Zod sources to JSON Schema in the sandbox, caching by the source's hash.
pub struct ZodConverter {
    sandbox: Arc<Sandbox>,
    /// The folder holding `convert.cjs` and its `node_modules`.
    dir: PathBuf,
    cache: Mutex<Cache>,
}

impl fmt::Debug for ZodConverter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZodConverter")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

fn key(source: &str) -> [u8; 32] {
    Sha256::digest(source.as_bytes()).into()
}

impl ZodConverter {
    /// A converter running `convert.cjs` of `dir` in `sandbox`.
    pub fn new(sandbox: Arc<Sandbox>, dir: impl Into<PathBuf>) -> Self {
        ZodConverter {
            sandbox,
            dir: dir.into(),
            cache: Mutex::default(),
        }
    }

    /// A converter in a sandbox of its own under `policy` (bubblewrap found as
    /// [`Sandbox::detect`] finds it).
    pub fn detect(policy: SandboxPolicy, dir: impl Into<PathBuf>) -> Self {
        ZodConverter::new(Arc::new(Sandbox::detect(policy)), dir)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The schema `source` converted to, if it was converted already.
    pub fn cached(&self, source: &str) -> Option<Value> {
        self.cache().get(&key(source)).and_then(|r| r.clone().ok())
    }

    /// How many distinct sources were converted (or refused) so far.
    pub fn cached_len(&self) -> usize {
        self.cache().len()
    }

    /// The JSON Schema `source` converts to. Blocks while Node runs (once per distinct
    /// source): callers validate off the async runtime's worker threads, as every caller of
    /// validation does.
    pub fn convert(&self, source: &str) -> Result<Value, ZodError> {
        let key = key(source);
        if let Some(hit) = self.cache().get(&key) {
            return hit.clone().map_err(ZodError::Source);
        }
        let answer = self.run(source).map_err(ZodError::Host)?;
        self.cache().insert(key, answer.clone());
        answer.map_err(ZodError::Source)
    }

    /// One run of the script: `Ok` with its answer, `Err` when the host could not give one.
    fn run(&self, source: &str) -> Result<Result<Value, String>, String> {
        let script = self.dir.join(SCRIPT);
        if !script.is_file() || !self.dir.join("node_modules/zod").is_dir() {
            return Err(format!(
                "the Zod converter is not installed in {} (run `npm ci` there; scripts/test.sh and the deploy files do)",
                self.dir.display()
            ));
        }
        let request = SandboxRequest {
            argv: vec!["node".to_string(), SCRIPT.to_string()],
            package_root: self.dir.clone(),
            stdin: source.as_bytes().to_vec(),
            timeout: TIMEOUT,
            env: Default::default(),
        };
        let sandbox = self.sandbox.clone();
        // The sandbox is async; validation is not, and may be called on a runtime's thread
        // (whose `block_on` would panic) or off any: a thread of its own with a small runtime
        // serves both.
        let ran = std::thread::scope(|scope| {
            scope
                .spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| format!("starting the Zod converter's runtime: {e}"))?;
                    runtime
                        .block_on(sandbox.run(request))
                        .map_err(|e| format!("running the Zod converter: {e}"))
                })
                .join()
        });
        let out = ran.map_err(|_| "the Zod converter's thread panicked".to_string())??;
        if out.timed_out {
            return Ok(Err(format!(
                "converting the Zod schema took longer than {} s",
                TIMEOUT.as_secs()
            )));
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        let answer: Option<Value> = serde_json::from_slice(&out.stdout).ok();
        match answer {
            Some(Value::Object(mut map)) if out.exit_code == Some(0) => {
                match (map.remove("ok"), map.remove("schema"), map.remove("error")) {
                    (Some(Value::Bool(true)), Some(schema), _) => Ok(Ok(schema)),
                    (_, _, Some(Value::String(error))) => Ok(Err(error)),
                    _ => Err(format!(
                        "the Zod converter answered something unexpected: {}",
                        String::from_utf8_lossy(&out.stdout)
                    )),
                }
            }
            _ => Err(format!(
                "the Zod converter failed ({}): {}",
                out.exit_code
                    .map_or_else(|| "killed".to_string(), |c| format!("exit code {c}")),
                stderr.trim()
            )),
        }
    }
}

/// Puts each case's converted Zod schema into `expected.jsonSchema`, moving the source to
/// `expected.zodSource`: what a service stores after validating, so the definition its
/// workers grade holds a plain JSON Schema. Only sources already converted (by validation)
/// are touched; nothing runs Node here.
pub fn inline_converted(registry: &StrategyRegistry, cases: &mut [TestCase]) {
    let Some(converter) = registry.zod() else {
        return;
    };
    for case in cases {
        let expected = &mut case.expected;
        if expected.json_schema.is_some() {
            continue;
        }
        let Some(Value::String(source)) = &expected.zod_schema else {
            continue;
        };
        if let Some(schema) = converter.cached(source) {
            let source = source.clone();
            expected.json_schema = Some(schema);
            expected.zod_schema = None;
            expected
                .extra
                .insert(SOURCE_KEY.to_string(), Value::String(source));
        }
    }
}
