//! What the sandbox is made of on this host: the util-linux tools that apply its limits
//! (`prlimit`, `setpriv`, `kill`), the interpreters a request may name by bare name, and the
//! read-only view of the host's system directories bubblewrap gets. Found once per process
//! ([`Tools::find`]).
//!
//! Tools are looked up in the standard system directories before PATH, so a hostile PATH
//! cannot substitute one. An interpreter outside them (pyenv, nvm) is bound into the sandbox at
//! its install prefix, which the sandbox's uid must be able to reach.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::policy::SandboxError;

/// System directories bubblewrap mirrors from the host (as directories or `/usr` symlinks).
const SYSTEM_DIRS: &[&str] = &["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"];
/// The parts of `/etc` interpreters need; the rest of `/etc` (service configs, credentials)
/// stays out of view.
const ETC_ENTRIES: &[&str] = &[
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "localtime",
    "timezone",
    "nsswitch.conf",
    "host.conf",
    "hosts",
    "mime.types",
    "os-release",
];
/// Interpreters a request may name by bare name.
const INTERPRETERS: &[&str] = &["python3", "node", "sh"];

/// The programs a sandboxed run is composed of, as found on this host.
#[derive(Debug)]
pub(crate) struct Tools {
    pub(crate) prlimit: Option<PathBuf>,
    pub(crate) setpriv: Option<PathBuf>,
    pub(crate) kill: Option<PathBuf>,
    /// bwrap arguments giving the read-only system view.
    pub(crate) system_mounts: Vec<OsString>,
    pub(crate) interpreters: BTreeMap<&'static str, Interpreter>,
    /// PATH inside the sandbox.
    pub(crate) path_env: String,
}

#[derive(Debug, Clone)]
pub(crate) struct Interpreter {
    pub(crate) path: PathBuf,
    /// An install prefix outside the system directories, bound read-only at the same path.
    pub(crate) bind: Option<PathBuf>,
    /// Why it cannot be used from the sandbox.
    pub(crate) problem: Option<String>,
}

impl Tools {
    /// Looks for the tools and interpreters. `drops_privileges`: sandboxed processes will run
    /// as another uid (we are root), so an interpreter must be reachable by that uid.
    pub(crate) fn find(drops_privileges: bool) -> Tools {
        let mut tools = Tools {
            prlimit: find_tool("prlimit"),
            setpriv: find_tool("setpriv"),
            kill: find_tool("kill"),
            system_mounts: system_mounts(),
            interpreters: BTreeMap::new(),
            path_env: String::new(),
        };
        let mut path_dirs = vec![
            "/usr/local/bin".to_string(),
            "/usr/bin".to_string(),
            "/bin".to_string(),
        ];
        for name in INTERPRETERS {
            if let Some(interp) = resolve_interpreter(name, drops_privileges) {
                if let Some(dir) = interp
                    .path
                    .parent()
                    .map(|d| d.to_string_lossy().into_owned())
                {
                    if !path_dirs.contains(&dir) {
                        path_dirs.push(dir);
                    }
                }
                tools.interpreters.insert(name, interp);
            }
        }
        tools.path_env = path_dirs.join(":");
        tools
    }

    /// `argv[0]`: a bare interpreter name becomes the resolved interpreter.
    pub(crate) fn resolve_program(&self, program: &str) -> Result<PathBuf, SandboxError> {
        match self.interpreters.get(program) {
            Some(Interpreter {
                problem: Some(reason),
                ..
            }) => Err(SandboxError::Interpreter {
                name: program.to_string(),
                reason: reason.clone(),
            }),
            Some(interp) => Ok(interp.path.clone()),
            None if INTERPRETERS.contains(&program) => Err(SandboxError::Interpreter {
                name: program.to_string(),
                reason: "not installed on this host".to_string(),
            }),
            None => Ok(PathBuf::from(program)),
        }
    }
}

/// Whether a uid that is neither owner nor group can list and read `dir` (every ancestor
/// searchable, the directory itself readable and searchable).
pub(crate) fn check_world_readable(dir: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    if meta.mode() & 0o005 != 0o005 {
        return Err(format!(
            "{} has mode {:o}, not world-readable",
            dir.display(),
            meta.mode() & 0o7777
        ));
    }
    for ancestor in dir.ancestors().skip(1) {
        let meta =
            std::fs::metadata(ancestor).map_err(|e| format!("{}: {e}", ancestor.display()))?;
        if meta.mode() & 0o001 == 0 {
            return Err(format!(
                "{} has mode {:o}, not world-searchable",
                ancestor.display(),
                meta.mode() & 0o7777
            ));
        }
    }
    Ok(())
}

/// A system tool: the standard directories first, so a hostile PATH cannot substitute one.
pub(crate) fn find_tool(name: &str) -> Option<PathBuf> {
    ["/usr/bin", "/bin", "/usr/sbin", "/sbin", "/usr/local/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| is_executable(p))
        .or_else(|| search_path(name))
}

fn search_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0)
}

/// Under the system directories bubblewrap always mounts.
fn is_system_path(path: &Path) -> bool {
    path.starts_with("/usr") || SYSTEM_DIRS.iter().any(|d| path.starts_with(d))
}

/// Finds an interpreter. The system one wins (`/usr/bin`, `/usr/local/bin`): it is what a
/// production image has and the sandbox can always reach it. Otherwise the one on PATH is
/// resolved to its real install prefix (for pyenv, asking Python itself, since PATH holds a
/// shell shim), which is then bound into the sandbox — provided another uid can reach it.
fn resolve_interpreter(name: &str, drops_privileges: bool) -> Option<Interpreter> {
    for dir in ["/usr/bin", "/usr/local/bin", "/bin"] {
        let path = Path::new(dir).join(name);
        if is_executable(&path) {
            return Some(Interpreter {
                path,
                bind: None,
                problem: None,
            });
        }
    }
    let found = search_path(name)?;
    let (exe, prefix) = if name.starts_with("python") {
        let out = std::process::Command::new(&found)
            .args([
                "-c",
                "import sys; print(sys.executable); print(sys.base_prefix)",
            ])
            .stdin(Stdio::null())
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut lines = text.lines();
        let exe = PathBuf::from(lines.next()?);
        let prefix = PathBuf::from(lines.next()?);
        (exe, prefix)
    } else {
        let exe = std::fs::canonicalize(&found).ok()?;
        // <prefix>/bin/<name>
        let prefix = exe.parent()?.parent()?.to_path_buf();
        (exe, prefix)
    };
    if is_system_path(&exe) {
        return Some(Interpreter {
            path: exe,
            bind: None,
            problem: None,
        });
    }
    let problem = if drops_privileges {
        check_world_readable(&prefix).err().map(|reason| {
            format!(
                "{} lives in {}, which the sandbox user cannot reach ({reason}); install it system-wide (e.g. Debian's `python3`/`nodejs`) or under a world-readable prefix",
                exe.display(),
                prefix.display()
            )
        })
    } else {
        None
    };
    if let Some(problem) = &problem {
        tracing::warn!(interpreter = name, %problem, "sandbox: interpreter not usable");
    }
    Some(Interpreter {
        path: exe,
        bind: Some(prefix),
        problem,
    })
}

/// bwrap arguments mirroring the host's system directories read-only: `/usr`, the top-level
/// library and binary directories as they are on the host (real directories, or the symlinks
/// into `/usr` of a merged-/usr system), and the few `/etc` entries interpreters need.
fn system_mounts() -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["--ro-bind".into(), "/usr".into(), "/usr".into()];
    for dir in SYSTEM_DIRS {
        let path = Path::new(dir);
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            if let Ok(target) = std::fs::read_link(path) {
                args.extend(["--symlink".into(), target.into(), path.into()]);
            }
        } else if meta.is_dir() {
            args.extend(["--ro-bind".into(), path.into(), path.into()]);
        }
    }
    let mut etc: Vec<String> = ETC_ENTRIES.iter().map(|e| (*e).to_string()).collect();
    // Debian's per-version Python configuration (/etc/python3.11, ...).
    if let Ok(entries) = std::fs::read_dir("/etc") {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("python") {
                etc.push(name);
            }
        }
    }
    etc.sort();
    etc.dedup();
    for name in etc {
        let path = Path::new("/etc").join(name);
        args.extend(["--ro-bind-try".into(), path.clone().into(), path.into()]);
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_view_has_usr_and_no_whole_etc() {
        let mounts = system_mounts();
        let text = crate::argv::display_argv(&mounts);
        assert!(text.starts_with("--ro-bind /usr /usr"), "{text}");
        assert!(!text.contains("/etc /etc"), "{text}");
    }
}
