//! Building one environment: its key, the install in a sandbox session that reaches only the
//! configured index, what was installed (the pins), and the mount every sandbox of the
//! package gets.
//!
//! The build runs in a [`SandboxSession`](skilleval_sandbox::SandboxSession) with three
//! mounts: the environment's folder (writable, at [`ENVIRONMENT_DIR`]: the path the cases see
//! it at too, so the scripts a venv writes name the right interpreter), the installers
//! (read-only: a copy of `uv`, which may live where the sandbox's uid cannot read), and a
//! scratch folder for the resolvers' caches and temporary files. Its only network is the
//! egress proxy, allowed the index's host and port and nothing else; the configured index is
//! the operator's, so it may be on a loopback or private address (the sandbox policy's
//! `allow_private_egress` is set for the build, whose allowed hosts name nothing else).

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use skilleval_model::grade::Fault;
use skilleval_model::package::Dependencies;
use skilleval_sandbox::egress::AllowedHosts;
use skilleval_sandbox::{Sandbox, SandboxBind, SandboxEnvironment, SandboxMode, SandboxRequest};

use super::config::EnvironmentConfig;

/// Where every sandbox of a package sees its environment (read-only).
pub const ENVIRONMENT_DIR: &str = "/opt/skilleval-env";
/// Where the build sees the installers.
const TOOLS_DIR: &str = "/opt/skilleval-tools";
/// Where the build keeps its caches, temporary files and inputs.
const SCRATCH_DIR: &str = "/opt/skilleval-build";
/// Written last into an environment's folder: its presence marks a finished build.
pub(crate) const MANIFEST: &str = "skilleval-environment.json";
/// Changes when what a key's folder holds changes (a different layout is another key).
const LAYOUT: &str = "1";

/// What a finished build left, kept in its folder as [`MANIFEST`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub key: String,
    /// `uv pip freeze`: every Python distribution installed, `name==version`.
    #[serde(default)]
    pub python: Vec<String>,
    /// npm's lock: every Node package installed, `name@version`.
    #[serde(default)]
    pub node: Vec<String>,
    /// The venv's `site-packages`, relative to the folder.
    #[serde(default)]
    pub site_packages: Option<String>,
    pub build_ms: u64,
}

/// A built environment in the cache.
#[derive(Debug)]
pub struct Built {
    pub key: String,
    /// Its folder on the host.
    pub dir: PathBuf,
    pub bytes: u64,
    pub manifest: Manifest,
    /// What a sandbox mounts.
    pub mount: Arc<SandboxEnvironment>,
}

impl Built {
    pub(crate) fn load(dir: &Path) -> Option<Built> {
        let text = std::fs::read_to_string(dir.join(MANIFEST)).ok()?;
        let manifest: Manifest = serde_json::from_str(&text).ok()?;
        Some(Built {
            key: manifest.key.clone(),
            dir: dir.to_path_buf(),
            bytes: tree_bytes(dir),
            mount: Arc::new(mount_of(dir, &manifest)),
            manifest,
        })
    }

    /// What a case's result records (`details.environment`): the key, the pins, and whether
    /// this case waited for the build.
    pub fn details(&self, built_for_this_case: bool) -> Value {
        serde_json::json!({
            "key": self.key,
            "python": self.manifest.python,
            "node": self.manifest.node,
            "built": built_for_this_case,
            "build_ms": self.manifest.build_ms,
        })
    }
}

/// The mount of an environment's folder and the variables that make it found.
pub(crate) fn mount_of(dir: &Path, manifest: &Manifest) -> SandboxEnvironment {
    let at = |rel: &str| format!("{ENVIRONMENT_DIR}/{rel}");
    let mut path = Vec::new();
    let mut vars = BTreeMap::new();
    if dir.join("python").is_dir() {
        path.push(at("python/bin"));
        vars.insert("VIRTUAL_ENV".into(), at("python"));
        if let Some(site) = &manifest.site_packages {
            vars.insert("PYTHONPATH".into(), at(site));
        }
    }
    if dir.join("node/node_modules").is_dir() {
        path.push(at("node/node_modules/.bin"));
        vars.insert("NODE_PATH".into(), at("node/node_modules"));
    }
    SandboxEnvironment {
        source: dir.to_path_buf(),
        dest: PathBuf::from(ENVIRONMENT_DIR),
        path,
        vars,
    }
}

/// The cache key: the dependency set (sorted by the model), the interpreters it is built for,
/// and the index each half comes from.
pub(crate) fn key(deps: &Dependencies, interpreters: &str, cfg: &EnvironmentConfig) -> String {
    let python = !deps.python.is_empty();
    let node = !deps.node.is_empty();
    let identity = serde_json::json!({
        "layout": LAYOUT,
        "python": deps.python,
        "requires_python": deps.requires_python,
        "node": deps.node,
        "interpreters": interpreters,
        "python_index": python.then_some(&cfg.python_index),
        "npm_registry": node.then_some(&cfg.npm_registry),
    });
    hex::encode(Sha256::digest(identity.to_string().as_bytes()))
}

/// The versions of `python3` and `node` in the sandbox (`python3 3.11.2; node v20.20.2`),
/// part of every key: an environment is built for the interpreters that will run it.
pub(crate) async fn interpreters(sandbox: &Sandbox, empty: &Path) -> Result<String, Fault> {
    let script = "printf 'python3 '; python3 -c 'import sys; print(sys.version.split()[0])' 2>/dev/null || echo none; printf 'node '; node --version 2>/dev/null || echo none";
    let out = sandbox
        .run(SandboxRequest {
            argv: vec!["sh".into(), "-c".into(), script.into()],
            package_root: empty.to_path_buf(),
            stdin: Vec::new(),
            timeout: Duration::from_secs(60),
            env: BTreeMap::new(),
        })
        .await
        .map_err(|e| Fault::host(format!("finding the sandbox's interpreters: {e}")))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .collect::<Vec<_>>()
        .join("; "))
}

/// The `uv` binary: the configured one, else `uv` on PATH. A pyenv shim or pip's wrapper
/// script is followed to the real binary (the uv package's `find_uv_bin`), which the build
/// mounts by itself.
pub(crate) fn find_uv(cfg: &EnvironmentConfig) -> Result<PathBuf, Fault> {
    let missing = |why: String| {
        Fault::host(format!(
            "uv is needed to build the environment of a package that declares Python dependencies, and {why}: install it (`python3 -m pip install uv`) or set environments.uv"
        ))
    };
    let found = match &cfg.uv {
        Some(p) => p.clone(),
        None => std::env::var_os("PATH")
            .and_then(|path| {
                std::env::split_paths(&path)
                    .map(|d| d.join("uv"))
                    .find(|p| p.is_file())
            })
            .ok_or_else(|| missing("it is not on PATH".into()))?,
    };
    let head = std::fs::read(&found)
        .map_err(|e| missing(format!("{} cannot be read: {e}", found.display())))?;
    if !head.starts_with(b"#!") {
        return Ok(found);
    }
    // A script in front of the binary: ask the Python package where its binary is.
    let out = std::process::Command::new("python3")
        .args(["-c", "import uv; print(uv.find_uv_bin())"])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| {
            missing(format!(
                "{} is a script and python3 could not be asked for the binary: {e}",
                found.display()
            ))
        })?;
    let real = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if out.status.success() && real.is_file() {
        Ok(real)
    } else {
        Err(missing(format!(
            "{} is a script whose binary python3's `uv` package does not name",
            found.display()
        )))
    }
}

/// What a build needs.
pub(crate) struct BuildInput<'a> {
    pub(crate) cfg: &'a EnvironmentConfig,
    pub(crate) sandbox: &'a Sandbox,
    pub(crate) deps: &'a Dependencies,
    pub(crate) key: &'a str,
    /// The environment's folder (created empty by the caller).
    pub(crate) dir: &'a Path,
    /// A folder holding `uv` (world-readable), when the build needs it.
    pub(crate) tools: Option<&'a Path>,
    /// An empty, world-readable folder (the session's package).
    pub(crate) empty: &'a Path,
    /// Where the build's scratch folder goes.
    pub(crate) scratch_in: &'a Path,
}

/// Installs the dependencies into `input.dir` and writes its manifest.
pub(crate) async fn build(input: BuildInput<'_>) -> Result<Manifest, Fault> {
    let started = Instant::now();
    let sandbox = input.sandbox;
    if sandbox.mode() != SandboxMode::Bubblewrap {
        return Err(Fault::host(
            "building an environment needs bubblewrap (its network is limited to the index); this host runs without it",
        ));
    }
    let deps = input.deps;
    let scratch = tempfile::Builder::new()
        .prefix(".scratch-")
        .tempdir_in(input.scratch_in)
        .map_err(|e| io_fault("creating the build's scratch folder", &e))?;
    let mut hosts = Vec::new();
    let mut script =
        String::from("set -e\nexport TMPDIR=/opt/skilleval-build/tmp\nmkdir -p \"$TMPDIR\"\n");
    if !deps.python.is_empty() {
        if input.tools.is_none() {
            return Err(Fault::host("uv was not prepared for the build"));
        }
        hosts.push(host_of(
            &input.cfg.python_index,
            "environments.python_index",
        )?);
        let mut requirements = deps.python.join("\n");
        requirements.push('\n');
        write(scratch.path(), "requirements.txt", &requirements)?;
        let python = deps.requires_python.as_deref().unwrap_or("python3");
        write(scratch.path(), "python-request", python)?;
        script.push_str(&format!(
            r#"export UV_CACHE_DIR=/opt/skilleval-build/uv-cache UV_PYTHON_DOWNLOADS=never UV_PYTHON_PREFERENCE=only-system UV_NO_PROGRESS=1 UV_NO_CONFIG=1 UV_LINK_MODE=copy
uv={TOOLS_DIR}/uv
py=/opt/skilleval-env/python/bin/python
"$uv" venv --quiet --python "$(cat {SCRATCH_DIR}/python-request)" /opt/skilleval-env/python
"$uv" pip install --quiet --python "$py" --index-url {index} -r {SCRATCH_DIR}/requirements.txt
"$uv" pip freeze --python "$py" > {SCRATCH_DIR}/python-freeze.txt
"#,
            index = shell_quote(&input.cfg.python_index),
        ));
    }
    if !deps.node.is_empty() {
        hosts.push(host_of(
            &input.cfg.npm_registry,
            "environments.npm_registry",
        )?);
        let manifest = serde_json::json!({
            "name": "skilleval-environment",
            "private": true,
            "dependencies": deps.node,
        });
        write(scratch.path(), "package.json", &manifest.to_string())?;
        script.push_str(&format!(
            r#"export npm_config_cache=/opt/skilleval-build/npm-cache npm_config_registry={registry} npm_config_proxy="$HTTP_PROXY" npm_config_https_proxy="$HTTP_PROXY" npm_config_update_notifier=false npm_config_audit=false npm_config_fund=false npm_config_loglevel=error
mkdir -p /opt/skilleval-env/node
cp {SCRATCH_DIR}/package.json /opt/skilleval-env/node/package.json
cd /opt/skilleval-env/node
npm install --ignore-scripts --no-audit --no-fund
"#,
            registry = shell_quote(&input.cfg.npm_registry),
        ));
    }
    let allowed = AllowedHosts::parse(&hosts)
        .map_err(|e| Fault::host(format!("the configured index: {e}")))?;
    let mut builder = sandbox.clone();
    let policy = &mut builder.policy;
    policy.memory_bytes = policy.memory_bytes.max(4 << 30);
    policy.cpu_seconds = policy.cpu_seconds.max(input.cfg.build_timeout_secs);
    policy.file_size_bytes = policy.file_size_bytes.max(1 << 30);
    policy.max_processes = policy.max_processes.max(256);
    policy.max_output_bytes = policy.max_output_bytes.max(1 << 20);
    // Only the index's host and port are allowed: the operator configured it.
    policy.allow_private_egress = true;
    let mut binds = vec![
        SandboxBind {
            source: input.dir.to_path_buf(),
            dest: ENVIRONMENT_DIR,
            writable: true,
        },
        SandboxBind {
            source: scratch.path().to_path_buf(),
            dest: SCRATCH_DIR,
            writable: true,
        },
    ];
    if let Some(tools) = input.tools {
        binds.push(SandboxBind {
            source: tools.to_path_buf(),
            dest: TOOLS_DIR,
            writable: false,
        });
    }
    let control = builder
        .session_scratch("skilleval-build-")
        .map_err(|e| io_fault("creating the build's control folder", &e))?;
    let mut session = builder
        .open_session(
            input.empty,
            &binds,
            control.path(),
            BTreeMap::new(),
            &allowed,
        )
        .await
        .map_err(|e| Fault::host(format!("starting the environment's build sandbox: {e}")))?;
    let timeout = Duration::from_secs(input.cfg.build_timeout_secs);
    let ran = session.run(&script, timeout).await;
    session.close().await;
    let out = ran.map_err(|e| Fault::host(format!("the environment's build sandbox: {e}")))?;
    let text = String::from_utf8_lossy(&out.output).trim().to_string();
    if out.timed_out {
        return Err(Fault::host(format!(
            "building the environment took more than {}s (environments.build_timeout_secs): {}",
            input.cfg.build_timeout_secs,
            tail(&text)
        )));
    }
    if out.exit_code != 0 {
        return Err(classify(&text, input.cfg, deps));
    }
    let python = std::fs::read_to_string(scratch.path().join("python-freeze.txt"))
        .map(|t| {
            t.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    let node = node_pins(&input.dir.join("node/package-lock.json"));
    let site_packages = site_packages(input.dir);
    seal(input.dir).map_err(|e| io_fault("making the environment read-only", &e))?;
    let manifest = Manifest {
        key: input.key.to_string(),
        python,
        node,
        site_packages,
        build_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    };
    let json = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| Fault::host(format!("writing the environment's manifest: {e}")))?;
    let path = input.dir.join(MANIFEST);
    std::fs::write(&path, json).map_err(|e| io_fault("writing the environment's manifest", &e))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
        .map_err(|e| io_fault("writing the environment's manifest", &e))?;
    Ok(manifest)
}

/// Whose fault a failed build is: an index that could not be reached (the proxy's or the
/// resolver's words for it), or no interpreter for `requires-python`, is the host's; anything
/// else (a dependency the index does not have, versions that do not resolve) the package's.
fn classify(text: &str, cfg: &EnvironmentConfig, deps: &Dependencies) -> Fault {
    const UNREACHABLE: &[&str] = &[
        "skilleval sandbox proxy: cannot connect",
        "skilleval sandbox proxy: cannot resolve",
        "skilleval sandbox proxy: resolving",
        "502 Bad Gateway",
        "504 Gateway Timeout",
        "error sending request",
        "Failed to fetch",
        "Connection refused",
        "ECONNREFUSED",
        "ECONNRESET",
        "ETIMEDOUT",
        "ENOTFOUND",
        "EAI_AGAIN",
        "E502",
        "E503",
        "E504",
    ];
    if text.contains("No interpreter found") {
        return Fault::host(format!(
            "no Python in the sandbox satisfies the package's requires-python `{}`: {}",
            deps.requires_python.as_deref().unwrap_or(""),
            tail(text)
        ));
    }
    if UNREACHABLE.iter().any(|w| text.contains(w)) {
        let mut indexes = Vec::new();
        if !deps.python.is_empty() {
            indexes.push(cfg.python_index.as_str());
        }
        if !deps.node.is_empty() {
            indexes.push(cfg.npm_registry.as_str());
        }
        return Fault::host(format!(
            "the package index could not be reached ({}): {}",
            indexes.join(", "),
            tail(text)
        ));
    }
    Fault::permanent(format!(
        "the package's dependencies could not be installed: {}",
        tail(text)
    ))
}

/// The last 2,000 characters of a resolver's output.
fn tail(text: &str) -> String {
    const KEEP: usize = 2_000;
    if text.len() <= KEEP {
        return text.to_string();
    }
    let mut start = text.len() - KEEP;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &text[start..])
}

/// `host:port` of an index URL, for the build's allowed hosts.
fn host_of(url: &str, field: &str) -> Result<String, Fault> {
    let parsed = url::Url::parse(url)
        .map_err(|e| Fault::host(format!("{field} `{url}` is not a URL: {e}")))?;
    let host = parsed
        .host_str()
        .ok_or_else(|| Fault::host(format!("{field} `{url}` names no host")))?;
    let port = parsed
        .port_or_known_default()
        .ok_or_else(|| Fault::host(format!("{field} `{url}` has no port")))?;
    Ok(if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    })
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn write(dir: &Path, name: &str, text: &str) -> Result<(), Fault> {
    let path = dir.join(name);
    std::fs::write(&path, text)
        .and_then(|()| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)))
        .map_err(|e| io_fault("writing the build's inputs", &e))
}

fn io_fault(what: &str, e: &std::io::Error) -> Fault {
    Fault::host(format!("{what}: {e}"))
}

/// `name@version` of every package npm's lock names.
fn node_pins(lock: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(lock) else {
        return Vec::new();
    };
    let Ok(doc) = serde_json::from_str::<Value>(&text) else {
        return Vec::new();
    };
    let mut pins: Vec<String> = doc
        .get("packages")
        .and_then(Value::as_object)
        .map(|packages| {
            packages
                .iter()
                .filter_map(|(path, meta)| {
                    let (_, name) = path.rsplit_once("node_modules/")?;
                    let version = meta.get("version")?.as_str()?;
                    Some(format!("{name}@{version}"))
                })
                .collect()
        })
        .unwrap_or_default();
    pins.sort();
    pins.dedup();
    pins
}

/// `python/lib/pythonX.Y/site-packages`, when the venv has one.
fn site_packages(dir: &Path) -> Option<String> {
    let lib = dir.join("python/lib");
    let mut found: Vec<String> = std::fs::read_dir(&lib)
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("python") && lib.join(n).join("site-packages").is_dir())
        .collect();
    found.sort();
    found.pop().map(|n| format!("python/lib/{n}/site-packages"))
}

/// Hands the folder back to the owner of its parent (the build ran as a sandbox uid), every
/// file readable by all and writable by none but that owner: every case's uid reads it.
fn seal(dir: &Path) -> std::io::Result<()> {
    let owner = std::fs::metadata(dir.parent().unwrap_or(dir))?;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = std::fs::symlink_metadata(&path)?;
        if meta.uid() != owner.uid() || meta.gid() != owner.gid() {
            std::os::unix::fs::lchown(&path, Some(owner.uid()), Some(owner.gid()))?;
        }
        if meta.file_type().is_symlink() {
            continue;
        }
        let mode = meta.mode() & 0o7777;
        let wanted = if meta.is_dir() {
            (mode | 0o555) & !0o022
        } else {
            (mode | 0o444) & !0o022
        };
        if wanted != mode {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(wanted))?;
        }
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                stack.push(entry?.path());
            }
        }
    }
    Ok(())
}

/// Bytes of every file under `dir` (links not followed).
pub(crate) fn tree_bytes(dir: &Path) -> u64 {
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&path) {
                stack.extend(entries.flatten().map(|e| e.path()));
            }
        } else {
            total = total.saturating_add(meta.len());
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_follows_the_set_the_interpreters_and_the_index() {
        let cfg = EnvironmentConfig::default();
        let deps = Dependencies {
            python: vec!["a".into(), "b>=1".into()],
            ..Dependencies::default()
        };
        let k = key(&deps, "python3 3.11.2", &cfg);
        assert_eq!(k, key(&deps, "python3 3.11.2", &cfg));
        assert_ne!(k, key(&deps, "python3 3.12.0", &cfg));
        let mirror = EnvironmentConfig {
            python_index: "http://mirror.local/simple".into(),
            ..cfg.clone()
        };
        assert_ne!(k, key(&deps, "python3 3.11.2", &mirror));
        // The npm registry is not part of a Python-only key.
        let npm = EnvironmentConfig {
            npm_registry: "http://npm.local/".into(),
            ..cfg.clone()
        };
        assert_eq!(k, key(&deps, "python3 3.11.2", &npm));
        let more = Dependencies {
            python: vec!["a".into(), "b>=1".into(), "c".into()],
            ..Dependencies::default()
        };
        assert_ne!(k, key(&more, "python3 3.11.2", &cfg));
    }

    #[test]
    fn unreachable_indexes_are_the_hosts_and_missing_packages_the_packages() {
        let cfg = EnvironmentConfig::default();
        let deps = Dependencies {
            python: vec!["nope".into()],
            ..Dependencies::default()
        };
        let missing = classify(
            "× No solution found when resolving dependencies:\n  ╰─▶ Because nope was not found in the package registry and you require nope, we can conclude that your requirements are unsatisfiable.",
            &cfg,
            &deps,
        );
        assert!(!missing.is_host() && !missing.is_transient(), "{missing:?}");
        assert!(missing.to_string().contains("nope was not found"));
        let down = classify(
            "error: Failed to fetch: `http://127.0.0.1:9/simple/nope/`\n  Caused by: HTTP status server error (502 Bad Gateway)",
            &cfg,
            &deps,
        );
        assert!(down.is_host(), "{down:?}");
        assert!(down.to_string().contains("https://pypi.org/simple"));
    }

    #[test]
    fn index_hosts_carry_their_port() {
        assert_eq!(
            host_of("https://pypi.org/simple", "f").ok(),
            Some("pypi.org:443".into())
        );
        assert_eq!(
            host_of("http://127.0.0.1:8080/simple/", "f").ok(),
            Some("127.0.0.1:8080".into())
        );
        assert_eq!(
            host_of("http://[::1]:81/", "f").ok(),
            Some("[::1]:81".into())
        );
        assert!(host_of("not a url", "f").is_err());
    }
}
