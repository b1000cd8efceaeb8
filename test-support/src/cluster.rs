//! A RabbitMQ cluster of this test: three nodes (or any number) of Debian's `rabbitmq-server`
//! on loopback, beside the machine's own node, each with its own node name
//! (`skilleval-c<random>-<n>@localhost`), AMQP and distribution ports and data folder, all
//! sharing an Erlang cookie of their own (not the system node's), clustered with
//! `join_cluster`. The faults the node-loss tests inject are here: a node killed with SIGKILL
//! (the Erlang VM itself, not the script that started it), a node's application stopped
//! (`stop_app`: the broker closes its clients' connections and leaves the cluster's
//! majority), and each undone by starting the node again. Every node is stopped and the
//! folder removed when the guard is dropped, however the test ends.
//!
//! `deploy/local/rabbitmq-cluster.sh` does the same from a shell, for running the service on
//! a cluster by hand.

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tempfile::TempDir;
use uuid::Uuid;

use crate::tls::{
    free_port, stop_child, wait_listening, world_readable_tempdir, RunAs, RABBITMQ_BIN,
};

/// How long a node may take to start (the machine may be busy with a build).
const START_TIMEOUT: Duration = Duration::from_secs(180);

/// Settings of a test's own for every node of a [`RabbitCluster`].
#[derive(Debug, Clone, Default)]
pub struct NodeConfig {
    /// Lines appended to each node's `rabbitmq.conf` (e.g. `consumer_timeout = 2000\n`).
    pub conf: String,
    /// Each node's `advanced.config` (Erlang terms, for application settings `rabbitmq.conf`
    /// does not have, e.g. `[{rabbit, [{channel_tick_interval, 500}]}].`); none by default.
    pub advanced: Option<String>,
}

/// One node of a [`RabbitCluster`].
#[derive(Debug)]
pub struct ClusterNode {
    /// `skilleval-c<random>-<n>@localhost`.
    pub name: String,
    /// The AMQP listener, on 127.0.0.1.
    pub amqp_port: u16,
    dist_port: u16,
    /// Its data, logs and configuration.
    base: PathBuf,
    /// The `rabbitmq-server` script while the node runs (`None` after a kill). Behind a lock
    /// so a shared cluster can be faulted from several threads.
    child: Mutex<Option<Child>>,
}

impl ClusterNode {
    /// `host:port` of its AMQP listener, as the service's readiness names a node.
    pub fn label(&self) -> String {
        format!("127.0.0.1:{}", self.amqp_port)
    }

    /// An `amqp://` URL of the listener, as guest.
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.amqp_port)
    }

    fn log(&self) -> PathBuf {
        self.base.join("server.log")
    }
}

/// The nodes of one test, clustered; stopped and removed on drop.
#[derive(Debug)]
pub struct RabbitCluster {
    pub nodes: Vec<ClusterNode>,
    user: RunAs,
    /// `HOME` of every node and `rabbitmqctl` call: holds the cluster's Erlang cookie.
    home: PathBuf,
    dir: TempDir,
}

impl RabbitCluster {
    /// Starts `n` nodes (in parallel), joins the others to the first, and returns once every
    /// node runs the broker and sees all `n` as running.
    pub fn start(n: usize) -> RabbitCluster {
        RabbitCluster::start_configured(n, &NodeConfig::default())
    }

    /// [`RabbitCluster::start`] with settings of the test's own on every node.
    pub fn start_configured(n: usize, extra: &NodeConfig) -> RabbitCluster {
        assert!(n >= 1, "a cluster has a node at least");
        let user = RunAs::service("rabbitmq");
        let dir = world_readable_tempdir();
        let id = &Uuid::new_v4().simple().to_string()[..10];
        let home = dir.path().join("home");
        fs::create_dir(&home).expect("home folder");
        user.own(&home);
        let cookie = home.join(".erlang.cookie");
        fs::write(&cookie, Uuid::new_v4().simple().to_string().to_uppercase())
            .expect("Erlang cookie");
        fs::set_permissions(&cookie, fs::Permissions::from_mode(0o400)).expect("chmod cookie");
        user.own(&cookie);
        let mut cluster = RabbitCluster {
            nodes: Vec::new(),
            user,
            home,
            dir,
        };
        for i in 1..=n {
            let base = cluster.dir.path().join(format!("node{i}"));
            fs::create_dir(&base).expect("node folder");
            cluster.user.own(&base);
            let node = ClusterNode {
                name: format!("skilleval-c{id}-{i}@localhost"),
                amqp_port: free_port(),
                dist_port: free_port(),
                base,
                child: Mutex::new(None),
            };
            cluster.configure(&node, extra);
            cluster.nodes.push(node);
        }
        // Spawned together, awaited one by one: the boots overlap.
        for i in 0..n {
            cluster.spawn(i);
        }
        for i in 0..n {
            cluster.await_node(i);
        }
        let first = cluster.nodes[0].name.clone();
        for i in 1..n {
            cluster.ctl_ok(i, &["stop_app"]);
            cluster.ctl_ok(i, &["join_cluster", &first]);
            cluster.ctl_ok(i, &["start_app"]);
            cluster.ctl_ok(i, &["await_startup", "--timeout", "120"]);
        }
        cluster.await_running(n);
        cluster
    }

    /// Every node's AMQP URL, comma-separated: what `AMQP_URL` takes for a cluster.
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(ClusterNode::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The index of the node whose listener `label` (`127.0.0.1:<port>`) names.
    pub fn index_of(&self, label: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.label() == label)
    }

    /// Kills node `i`'s Erlang VM with SIGKILL: no goodbye to its clients or its peers.
    pub fn kill(&self, i: usize) {
        let pid = self.vm_pid(i);
        kill(Pid::from_raw(pid), Signal::SIGKILL).expect("SIGKILL the node");
        if let Some(mut child) = self.child(i).take() {
            // The script's `wait` returns once the VM is gone.
            let _ = child.wait();
        }
        // The node's name is free once epmd saw the VM's socket close.
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.ctl(i, &["ping"]).is_ok_and(|o| o.status.success()) {
            assert!(
                Instant::now() < deadline,
                "node {i} still answers after SIGKILL"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Starts node `i` again after [`RabbitCluster::kill`], on its data; returns once it runs
    /// and the cluster sees every node running.
    pub fn restart(&self, i: usize) {
        assert!(self.child(i).is_none(), "node {i} is still running");
        self.spawn(i);
        self.await_node(i);
        self.await_running(self.nodes.len());
    }

    /// `rabbitmqctl stop_app` on node `i`: the broker closes its clients' connections and
    /// stops, the Erlang VM stays.
    pub fn stop_app(&self, i: usize) {
        self.ctl_ok(i, &["stop_app"]);
    }

    /// `rabbitmqctl start_app` on node `i`; returns once the cluster sees every node running.
    pub fn start_app(&self, i: usize) {
        self.ctl_ok(i, &["start_app"]);
        self.ctl_ok(i, &["await_startup", "--timeout", "120"]);
        self.await_running(self.nodes.len());
    }

    /// The members of queue `name` (of the default vhost) and its leader, as node `i` sees
    /// them: `(leader, members)`.
    pub fn quorum_members(&self, i: usize, queue: &str) -> (String, Vec<String>) {
        let out = self.ctl_ok(
            i,
            &[
                "list_queues",
                "--quiet",
                "--no-table-headers",
                "name",
                "leader",
                "members",
            ],
        );
        let line = out
            .lines()
            .find(|l| l.split('\t').next() == Some(queue))
            .unwrap_or_else(|| panic!("no queue {queue} on node {i}:\n{out}"));
        let mut fields = line.split('\t');
        let _name = fields.next();
        let leader = fields
            .next()
            .unwrap_or_default()
            .trim()
            .trim_matches('\'')
            .to_string();
        let members = fields
            .next()
            .unwrap_or_default()
            .trim_matches(|c| c == '[' || c == ']')
            .split(',')
            .map(|m| m.trim().trim_matches('\'').to_string())
            .filter(|m| !m.is_empty())
            .collect();
        (leader, members)
    }

    /// The index of the node named `name`.
    pub fn index_of_name(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// A node's log so far (for assertion messages).
    pub fn log(&self, i: usize) -> String {
        fs::read_to_string(self.nodes[i].log()).unwrap_or_default()
    }

    fn configure(&self, node: &ClusterNode, extra: &NodeConfig) {
        let base = &node.base;
        let config = format!(
            "listeners.tcp.1 = 127.0.0.1:{port}\n\
             cluster_partition_handling = pause_minority\n{conf}",
            port = node.amqp_port,
            conf = extra.conf
        );
        let advanced = extra.advanced.as_deref().unwrap_or("[].\n");
        for (name, text) in [
            ("rabbitmq.conf", config.as_str()),
            ("advanced.config", advanced),
            // No plugins: the system node's management plugin already holds port 15672.
            ("enabled_plugins", "[].\n"),
            // Not /etc/rabbitmq/rabbitmq-env.conf, which names the system node.
            ("rabbitmq-env.conf", ""),
        ] {
            fs::write(base.join(name), text).expect("node configuration");
            self.user.own(&base.join(name));
        }
    }

    /// The variables every command of node `i` runs with.
    fn environment(&self, cmd: &mut Command, i: usize) {
        let node = &self.nodes[i];
        cmd.env("RABBITMQ_NODENAME", &node.name)
            .env(
                "RABBITMQ_CONF_ENV_FILE",
                node.base.join("rabbitmq-env.conf"),
            )
            .env("HOME", &self.home);
    }

    fn child(&self, i: usize) -> MutexGuard<'_, Option<Child>> {
        self.nodes[i]
            .child
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Force-closes every client connection of the cluster (`close_all_connections --global`,
    /// through the first node whose broker runs).
    pub fn close_connections(&self, reason: &str) {
        for i in 0..self.nodes.len() {
            if self.child(i).is_none() {
                continue;
            }
            let closed = self
                .ctl(
                    i,
                    &[
                        "close_all_connections",
                        "--global",
                        "--limit",
                        "100000",
                        "--quiet",
                        reason,
                    ],
                )
                .is_ok_and(|o| o.status.success());
            // A node whose broker is stopped refuses: the next one does it.
            if closed {
                return;
            }
        }
    }

    fn spawn(&self, i: usize) {
        let node = &self.nodes[i];
        let base = node.base.clone();
        // Appended to: a restarted node's log follows its first life's.
        let out = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(node.log())
            .expect("node log");
        let err = out.try_clone().expect("node log");
        let mut server = self
            .user
            .command(&Path::new(RABBITMQ_BIN).join("rabbitmq-server"));
        self.environment(&mut server, i);
        server
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", node.amqp_port.to_string())
            .env("RABBITMQ_DIST_PORT", node.dist_port.to_string())
            .env("RABBITMQ_CONFIG_FILE", base.join("rabbitmq.conf"))
            .env(
                "RABBITMQ_ADVANCED_CONFIG_FILE",
                base.join("advanced.config"),
            )
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                base.join("enabled_plugins"),
            )
            .env("RABBITMQ_MNESIA_BASE", base.join("mnesia"))
            .env("RABBITMQ_PID_FILE", base.join("node.pid"))
            .env("RABBITMQ_LOG_BASE", base.join("log"))
            .env("RABBITMQ_LOGS", "-")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = server.spawn().expect("start rabbitmq-server");
        *self.child(i) = Some(child);
    }

    fn await_node(&self, i: usize) {
        let addr = format!("127.0.0.1:{}", self.nodes[i].amqp_port);
        let log = self.nodes[i].log();
        {
            let mut child = self.child(i);
            let child = child.as_mut().expect("node started");
            wait_listening(child, &addr, START_TIMEOUT, &log);
        }
        self.ctl_ok(i, &["await_startup", "--timeout", "120"]);
    }

    /// Waits until node 0 (or the first node that answers) sees `n` running nodes.
    fn await_running(&self, n: usize) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let running = (0..self.nodes.len()).find_map(|i| {
                let out = self
                    .ctl(i, &["eval", "length(rabbit_nodes:all_running())."])
                    .ok()?;
                if !out.status.success() {
                    return None;
                }
                String::from_utf8_lossy(&out.stdout)
                    .trim()
                    .parse::<usize>()
                    .ok()
            });
            if running == Some(n) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster never had {n} running nodes (last count {running:?})"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// The OS pid of node `i`'s Erlang VM.
    fn vm_pid(&self, i: usize) -> i32 {
        let from_file = fs::read_to_string(self.nodes[i].base.join("node.pid"))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok());
        if let Some(pid) = from_file {
            return pid;
        }
        let out = self.ctl_ok(i, &["eval", "list_to_integer(os:getpid())."]);
        out.trim()
            .parse()
            .unwrap_or_else(|_| panic!("node {i}'s pid: {out}"))
    }

    /// `rabbitmqctl -n <node i> args...`, as the nodes' user.
    fn ctl(&self, i: usize, args: &[&str]) -> std::io::Result<std::process::Output> {
        let mut cmd = self
            .user
            .command(&Path::new(RABBITMQ_BIN).join("rabbitmqctl"));
        self.environment(&mut cmd, i);
        cmd.args(["-n", &self.nodes[i].name])
            .args(args)
            .stdin(Stdio::null())
            .output()
    }

    /// [`RabbitCluster::ctl`], panicking with the output when it fails; returns stdout.
    fn ctl_ok(&self, i: usize, args: &[&str]) -> String {
        let mut cmd = self
            .user
            .command(&Path::new(RABBITMQ_BIN).join("rabbitmqctl"));
        self.environment(&mut cmd, i);
        cmd.args(["-n", &self.nodes[i].name]).args(args);
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("rabbitmqctl {args:?}: cannot start: {e}"));
        assert!(
            out.status.success(),
            "rabbitmqctl -n {} {args:?} failed ({}): {}{}\nnode log:\n{}",
            self.nodes[i].name,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            tail(&self.log(i), 40)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

impl Drop for RabbitCluster {
    /// `rabbitmqctl stop` on every node still running, then SIGTERM/SIGKILL to what is left;
    /// the folder goes with the guard.
    fn drop(&mut self) {
        for i in (0..self.nodes.len()).rev() {
            if self.child(i).is_none() {
                continue;
            }
            let stopped = self.ctl(i, &["stop"]).is_ok_and(|o| o.status.success());
            if !stopped {
                eprintln!(
                    "cleanup: rabbitmqctl stop failed for {}",
                    self.nodes[i].name
                );
                if let Some(pid) = fs::read_to_string(self.nodes[i].base.join("node.pid"))
                    .ok()
                    .and_then(|s| s.trim().parse::<i32>().ok())
                {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
            }
            if let Some(child) = self.child(i).as_mut() {
                stop_child(child, Signal::SIGTERM, Duration::from_secs(30));
            }
        }
    }
}
