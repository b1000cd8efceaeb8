//! Which uid a sandboxed process runs as, and leasing one that is clean.
//!
//! `setpriv` is in the sandbox's command line because the kernel does not enforce
//! `RLIMIT_NPROC` for root: when this process runs as root, every sandboxed run gets a uid of
//! its own (leased from a pool, locked across processes with `flock`), so one run's fork bomb
//! cannot eat another run's process budget, and after the run everything that uid still owns
//! is killed (`kill -KILL -1` as that uid), which catches daemons that left the process group.
//! Where such uids cannot be used (a container with a narrow uid map) all runs share `nobody`
//! (65534) and the process budget. Not running as root, no uid change is possible: limits then
//! count the invoking user's processes too, which is documented rather than hidden.
//!
//! **Clean identities.** The kernel counts processes per uid (`RLIMIT_NPROC` is checked against
//! every task of the real uid, zombies included, until their parent reaps them), so a uid is
//! leased only when no task of it exists: a lease scans `/proc` once, skips every pool uid that
//! still owns a task, and kills the live leftovers of an unlocked uid so it is clean for a
//! later lease. Leftovers are routine: bubblewrap's inner process outlives the outer one by a
//! moment and is re-parented to pid 1, which reaps it when it gets to it (a soak saw 50-230
//! such zombies of sandbox uids at any time), and a worker killed mid-run leaves all of its
//! sandboxes' processes the same way, while its lock files are released at once. Processes
//! start leasing at a random slot, so a replacement worker does not begin with the uids its
//! predecessor just left. The start-up probe leases its uid like any run. Each bubblewrap
//! run's `/tmp` is a fresh tmpfs of its own namespace and each unsandboxed run gets a fresh
//! scratch directory, so nothing else of an identity outlives its run.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use nix::fcntl::{Flock, FlockArg};

use crate::policy::SandboxError;

/// Private sandbox uids: far above any real account, one per concurrent run.
pub(crate) const UID_POOL_BASE: u32 = 2_000_000_000;
pub(crate) const UID_POOL_SIZE: u32 = 1024;
/// The fallback identity when private uids cannot be used.
pub(crate) const NOBODY: u32 = 65534;

/// Which uid sandboxed processes run as.
#[derive(Debug, Clone)]
pub(crate) enum Identity {
    /// A private uid per run, leased under `lock_dir`.
    Pool { lock_dir: PathBuf },
    /// Every run shares this uid (and so the process budget); no sweep.
    Shared(u32),
    /// Not root: processes keep this process's uid.
    Inherit,
}

impl Identity {
    /// A uid for one run under this identity. A pool uid that still has live processes and
    /// no holder gets them killed by `kill` (see [`UidPool::lease`]).
    pub(crate) fn lease(&self, kill: &dyn Fn(u32)) -> Result<Option<UidLease>, SandboxError> {
        match self {
            Identity::Inherit => Ok(None),
            Identity::Shared(uid) => Ok(Some(UidLease {
                uid: *uid,
                slot: 0,
                private: false,
                _lock: None,
            })),
            Identity::Pool { lock_dir } => {
                let pool = UidPool {
                    lock_dir,
                    base: UID_POOL_BASE,
                    size: UID_POOL_SIZE,
                };
                let next = next_slot();
                let lease = pool.lease(next.fetch_add(1, Ordering::Relaxed), kill)?;
                next.store(lease.slot.wrapping_add(1), Ordering::Relaxed);
                Ok(Some(lease))
            }
        }
    }
}

pub(crate) struct UidLease {
    pub(crate) uid: u32,
    /// Its place in the pool.
    slot: u32,
    /// Nothing else runs as this uid, so everything it owns may be killed after the run.
    pub(crate) private: bool,
    _lock: Option<Flock<File>>,
}

impl fmt::Debug for UidLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UidLease")
            .field("uid", &self.uid)
            .field("private", &self.private)
            .finish()
    }
}

/// The private uid pool: `size` uids from `base`, leased under `lock_dir`.
#[derive(Debug, Clone)]
struct UidPool<'a> {
    lock_dir: &'a Path,
    base: u32,
    size: u32,
}

impl UidPool<'_> {
    /// Leases a uid no other run (in this or another process on the host) is using and no
    /// task of which exists (see the module docs). The lock is a `flock` on a per-uid file,
    /// released by the kernel even if this process dies; the task census is what makes that
    /// safe, since a dead holder's processes may outlive its lock. A uid that still has live
    /// tasks and no holder gets them killed (`kill` runs `sweep`) and is skipped this time.
    fn lease(&self, start: u32, kill: &dyn Fn(u32)) -> Result<UidLease, SandboxError> {
        let busy = census(&(self.base..self.base + self.size));
        for i in 0..self.size {
            let slot = start.wrapping_add(i) % self.size;
            let uid = self.base + slot;
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(self.lock_dir.join(format!("{uid}.lock")))?;
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => match busy.get(&uid).map(|pids| classify(pids)) {
                    None => {
                        return Ok(UidLease {
                            uid,
                            slot,
                            private: true,
                            _lock: Some(lock),
                        })
                    }
                    Some(tasks) => {
                        tracing::debug!(
                            uid,
                            live = tasks.live,
                            zombies = tasks.zombies,
                            "sandbox: uid still has processes from an earlier holder; skipped"
                        );
                        if tasks.live > 0 {
                            kill(uid);
                        }
                    }
                },
                Err((_, nix::errno::Errno::EWOULDBLOCK)) => continue,
                Err((_, errno)) => return Err(SandboxError::Io(std::io::Error::from(errno))),
            }
        }
        Err(SandboxError::Busy(self.size))
    }
}

/// Tasks of one uid found in `/proc`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct UidTasks {
    live: u32,
    /// Dead, not yet reaped by their parent: still counted against the uid's process limit.
    zombies: u32,
}

/// The pids of every uid in `range` that owns a process, by real uid (what `RLIMIT_NPROC`
/// counts).
///
/// `/proc/<pid>` belongs to the task's effective uid, or to root while the task is not dumpable
/// (for a moment after a uid change, or after `prctl(PR_SET_DUMPABLE, 0)`). A sandbox task
/// cannot make its real and effective uids differ (no capabilities, no new privileges, one uid
/// mapped), so the directory's owner is its real uid unless it is root: one `stat` per task
/// decides, and only root-owned tasks have their `status` read. Reading every task's `status`
/// (which the kernel renders with signal masks and CPU lists) made a lease cost milliseconds
/// with a few hundred sandboxes up.
fn census(range: &std::ops::Range<u32>) -> BTreeMap<u32, Vec<u32>> {
    let mut found: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (pid, entry) in proc_entries() {
        // A process that exits meanwhile simply has no entry any more.
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        let uid = match meta.uid() {
            owner if range.contains(&owner) => Some(owner),
            0 => real_uid(pid).filter(|u| range.contains(u)),
            _ => None,
        };
        if let Some(uid) = uid {
            found.entry(uid).or_default().push(pid);
        }
    }
    found
}

/// The pid entries of `/proc` (one per process), with their pids; none when `/proc` cannot
/// be read.
pub(crate) fn proc_entries() -> impl Iterator<Item = (u32, std::fs::DirEntry)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse::<u32>().ok()?, e)))
}

/// The real uid of a task, from its `status`.
fn real_uid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|uids| uids.split_whitespace().next())
        .and_then(|u| u.parse::<u32>().ok())
}

/// How many of `pids` are alive and how many are zombies (from their `stat` state).
fn classify(pids: &[u32]) -> UidTasks {
    let mut tasks = UidTasks::default();
    for pid in pids {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `pid (comm) S ...`: the state follows the last `)` (comm may hold anything).
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].trim_start().chars().next());
        if state == Some('Z') {
            tasks.zombies += 1;
        } else {
            tasks.live += 1;
        }
    }
    tasks
}

/// Every uid in `range` that owns a process, with how many live and zombie processes it has.
/// Hands a host directory tree to the sandbox's uid, so the sandboxed process may write it
/// (a writable bind: a session's `/workspace`, a run's case workspace).
pub(crate) fn chown_tree(dir: &Path, uid: u32) -> Result<(), SandboxError> {
    std::os::unix::fs::lchown(dir, Some(uid), Some(uid))?;
    if dir.is_dir() && !dir.is_symlink() {
        for entry in std::fs::read_dir(dir)? {
            chown_tree(&entry?.path(), uid)?;
        }
    }
    Ok(())
}

#[cfg(test)]
fn uids_with_tasks(range: std::ops::Range<u32>) -> BTreeMap<u32, UidTasks> {
    census(&range)
        .into_iter()
        .map(|(uid, pids)| (uid, classify(&pids)))
        .filter(|(_, t)| t.live + t.zombies > 0)
        .collect()
}

/// Where the next lease of this process starts looking: random at first, so processes that
/// start together (or one that replaces a killed one) do not all begin with the same uids.
fn next_slot() -> &'static AtomicU32 {
    static NEXT: OnceLock<AtomicU32> = OnceLock::new();
    NEXT.get_or_init(|| AtomicU32::new(rand::random::<u32>() % UID_POOL_SIZE))
}

/// Where uid lease locks live: a root-owned directory nobody else can plant files in.
pub(crate) fn uid_lock_dir() -> Option<PathBuf> {
    let candidates = [
        PathBuf::from("/run/skilleval-sandbox"),
        std::env::temp_dir().join("skilleval-sandbox-uids"),
    ];
    let me = nix::unistd::geteuid().as_raw();
    candidates.into_iter().find(|dir| {
        if std::fs::create_dir_all(dir).is_err() {
            return false;
        }
        let Ok(meta) = std::fs::symlink_metadata(dir) else {
            return false;
        };
        if !meta.is_dir() || meta.uid() != me {
            return false;
        }
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).is_ok()
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use super::*;

    /// How long to wait for a process state that follows at once: only a guard against a hang.
    const HANG_GUARD: Duration = Duration::from_secs(30);

    /// A process running as `uid` (we are root), killed and reaped on drop.
    struct Squatter(std::process::Child);

    impl Squatter {
        fn start(uid: u32) -> Squatter {
            let child = std::process::Command::new("setpriv")
                .args([
                    format!("--reuid={uid}"),
                    format!("--regid={uid}"),
                    "--clear-groups".to_string(),
                    "--".to_string(),
                    "sleep".to_string(),
                    "60".to_string(),
                ])
                .spawn()
                .expect("setpriv sleep");
            let start = Instant::now();
            while !uids_with_tasks(uid..uid + 1).contains_key(&uid) {
                assert!(
                    start.elapsed() < HANG_GUARD,
                    "hang guard: the squatter was not seen after {HANG_GUARD:?}"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            Squatter(child)
        }
    }

    impl Drop for Squatter {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn a_uid_is_not_leased_while_a_process_of_it_lives() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root to run a process as another uid");
            return;
        }
        // A range no real sandbox uses, so this test cannot meet another test's runs.
        let base = 2_100_000_000 + (std::process::id() % 1000) * 8;
        let lock_dir = tempfile::tempdir().expect("lock dir");
        let pool = UidPool {
            lock_dir: lock_dir.path(),
            base,
            size: 4,
        };
        let mut squatter = Squatter::start(base);
        let killed = Mutex::new(Vec::new());
        let kill = |uid: u32| killed.lock().expect("not poisoned").push(uid);

        let lease = pool.lease(0, &kill).expect("a lease");
        assert_eq!(
            lease.uid,
            base + 1,
            "the uid with a live process is skipped"
        );
        assert_eq!(
            *killed.lock().expect("not poisoned"),
            vec![base],
            "and its leftovers killed"
        );
        drop(lease);

        // Killed but not reaped yet: a zombie still counts against the uid's process limit.
        squatter.0.kill().expect("kill");
        let start = Instant::now();
        while uids_with_tasks(base..base + 1)
            .get(&base)
            .map(|t| t.zombies)
            != Some(1)
        {
            assert!(
                start.elapsed() < HANG_GUARD,
                "hang guard: no zombie seen after {HANG_GUARD:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(pool.lease(0, &kill).expect("a lease").uid, base + 1);

        // Reaped: the uid is clean again and leased.
        squatter.0.wait().expect("reap");
        assert_eq!(pool.lease(0, &kill).expect("a lease").uid, base);
    }
}
