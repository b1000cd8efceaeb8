//! Private TLS servers for the TLS tests: certificates generated on the spot (a CA, a server
//! certificate for `localhost` and 127.0.0.1, a client certificate, and a second CA that signed
//! none of them), a PostgreSQL instance with `ssl = on` that accepts TLS connections only, and
//! a RabbitMQ node whose only AMQP listener is TLS and verifies its peers. Each server runs in a
//! temporary folder on free ports beside the machine's own services and is stopped, its folder
//! removed, when its guard is dropped, however the test ends.
//!
//! Run as root (CI), the servers run as the `postgres` and `rabbitmq` users through `setpriv`,
//! as PostgreSQL refuses root and RabbitMQ's node then shares the system node's Erlang cookie
//! (`/var/lib/rabbitmq/.erlang.cookie`), which `rabbitmqctl` needs to stop it. Run as another
//! user, they run as that user.

use std::fs;
use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::{Pid, User};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use tempfile::TempDir;
use uuid::Uuid;

/// Debian's PostgreSQL server binaries, the newest version installed (15 on bookworm).
pub fn pg_bin() -> PathBuf {
    let versions = fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL's server binaries in /usr/lib/postgresql (Debian's postgresql)");
    versions
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|v| Path::new(&format!("/usr/lib/postgresql/{v}/bin/initdb")).is_file())
        .max()
        .map(|v| PathBuf::from(format!("/usr/lib/postgresql/{v}/bin")))
        .expect("no /usr/lib/postgresql/<version>/bin/initdb")
}
/// RabbitMQ's scripts themselves, not `/usr/sbin`'s wrappers (which reset the environment).
pub const RABBITMQ_BIN: &str = "/usr/lib/rabbitmq/bin";
/// Where the system RabbitMQ keeps its Erlang cookie (the `rabbitmq` user's home).
const RABBITMQ_HOME: &str = "/var/lib/rabbitmq";

/// The certificates of one test, as PEM files in a temporary folder.
#[derive(Debug)]
pub struct Certificates {
    dir: TempDir,
    /// The CA that signed the server and client certificates.
    pub ca: PathBuf,
    /// A CA that signed nothing here: trusting only it, no server certificate verifies.
    pub other_ca: PathBuf,
    /// The server's certificate, for `localhost` and 127.0.0.1 only, and its key.
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// A client certificate (CN `guest`) and its key.
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// A client certificate signed by [`Certificates::other_ca`], which the servers reject.
    pub stranger_cert: PathBuf,
    pub stranger_key: PathBuf,
}

impl Certificates {
    /// Generates them all (ECDSA P-256).
    pub fn generate() -> Certificates {
        let dir = world_readable_tempdir();
        let write = |name: &str, pem: &str| {
            let path = dir.path().join(name);
            fs::write(&path, pem).expect("write a PEM file");
            fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).expect("chmod");
            path
        };
        let ca = new_ca("skilleval test CA");
        let other_ca = new_ca("skilleval stranger CA");
        let (server_cert, server_key) = leaf(
            &ca,
            vec!["localhost".into(), "127.0.0.1".into()],
            "localhost",
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let (client_cert, client_key) =
            leaf(&ca, vec![], "guest", ExtendedKeyUsagePurpose::ClientAuth);
        let (stranger_cert, stranger_key) = leaf(
            &other_ca,
            vec![],
            "guest",
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        Certificates {
            ca: write("ca.pem", &ca.pem()),
            other_ca: write("other-ca.pem", &other_ca.pem()),
            server_cert: write("server.pem", &server_cert),
            server_key: write("server.key", &server_key),
            client_cert: write("client.pem", &client_cert),
            client_key: write("client.key", &client_key),
            stranger_cert: write("stranger.pem", &stranger_cert),
            stranger_key: write("stranger.key", &stranger_key),
            dir,
        }
    }

    /// The folder holding the files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

fn new_ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().expect("CA key");
    CertifiedIssuer::self_signed(params, key).expect("self-signed CA")
}

/// A certificate signed by `ca`, as (certificate PEM, PKCS#8 key PEM).
fn leaf(
    ca: &CertifiedIssuer<'static, KeyPair>,
    names: Vec<String>,
    common_name: &str,
    usage: ExtendedKeyUsagePurpose,
) -> (String, String) {
    let mut params = CertificateParams::new(names).expect("leaf parameters");
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![usage];
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().expect("leaf key");
    let cert = params.signed_by(&key, ca).expect("signed leaf");
    (cert.pem(), key.serialize_pem())
}

/// A port nobody listens on now on 127.0.0.1 (the server binding it next may still race with
/// another process; the odds are small and the failure would be loud).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral port")
        .port()
}

/// A temporary folder other users can read (the servers run as their own users).
pub(crate) fn world_readable_tempdir() -> TempDir {
    let dir = tempfile::Builder::new()
        .prefix("skilleval-tls-")
        .tempdir()
        .expect("temporary folder");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    dir
}

/// The user a server runs as: `name` when we are root, ourselves otherwise.
#[derive(Debug, Clone)]
pub(crate) struct RunAs(Option<User>);

impl RunAs {
    pub(crate) fn service(name: &str) -> RunAs {
        if !nix::unistd::geteuid().is_root() {
            return RunAs(None);
        }
        let user = User::from_name(name)
            .expect("look up the service user")
            .unwrap_or_else(|| panic!("no `{name}` user: install the server's Debian package"));
        RunAs(Some(user))
    }

    /// `program` run as this user.
    pub(crate) fn command(&self, program: &Path) -> Command {
        match &self.0 {
            Some(user) => {
                let mut cmd = Command::new("setpriv");
                cmd.arg(format!("--reuid={}", user.uid))
                    .arg(format!("--regid={}", user.gid))
                    .arg("--init-groups")
                    .arg(program);
                cmd
            }
            None => Command::new(program),
        }
    }

    /// Gives `path` to this user (a no-op when we run as ourselves).
    pub(crate) fn own(&self, path: &Path) {
        if let Some(user) = &self.0 {
            nix::unistd::chown(path, Some(user.uid), Some(user.gid)).expect("chown");
        }
    }

    /// Copies `from` to `to`, owned by this user, with `mode`.
    fn install(&self, from: &Path, to: &Path, mode: u32) {
        fs::copy(from, to).expect("copy a certificate file");
        fs::set_permissions(to, fs::Permissions::from_mode(mode)).expect("chmod");
        self.own(to);
    }
}

/// Runs `cmd` to completion, panicking with its output when it fails.
pub(crate) fn run(mut cmd: Command, what: &str) {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Stops `child` with `signal`, then SIGKILL after `grace`.
pub(crate) fn stop_child(child: &mut Child, signal: Signal, grace: Duration) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = kill(Pid::from_raw(pid), signal);
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Waits until `addr` accepts TCP connections, `child` exits (a panic with `log`), or
/// `timeout` passes (a panic too).
pub(crate) fn wait_listening(child: &mut Child, addr: &str, timeout: Duration, log: &Path) {
    let deadline = Instant::now() + timeout;
    loop {
        if TcpStream::connect(addr).is_ok() {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "the server exited ({status}) before listening on {addr}: {}",
                fs::read_to_string(log).unwrap_or_default()
            );
        }
        assert!(
            Instant::now() < deadline,
            "nothing listens on {addr} after {timeout:?}: {}",
            fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub(crate) fn log_file(path: &Path) -> (fs::File, fs::File) {
    let file = fs::File::create(path).expect("log file");
    let copy = file.try_clone().expect("log file");
    (file, copy)
}

/// A PostgreSQL instance of this test: `ssl = on` with the generated server certificate,
/// TLS connections only (`hostssl` lines), listening on 127.0.0.1 and on 127.0.0.2, an
/// address the certificate does not name. Trust authentication, except for the role `guest`
/// (which the test creates), authenticated by a client certificate for `CN=guest` signed by
/// the test CA. Stopped on drop.
#[derive(Debug)]
pub struct PrivatePostgres {
    pub port: u16,
    child: Child,
    dir: TempDir,
}

impl PrivatePostgres {
    /// initdb, then postgres; returns once it accepts connections.
    pub fn start(certs: &Certificates) -> PrivatePostgres {
        let user = RunAs::service("postgres");
        let dir = world_readable_tempdir();
        let data = dir.path().join("data");
        user.own(dir.path());
        let bin = pg_bin();
        let mut initdb = user.command(&bin.join("initdb"));
        initdb.arg("-D").arg(&data).args([
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        ]);
        run(initdb, "initdb");
        // PostgreSQL refuses a key others can read.
        user.install(&certs.server_cert, &data.join("server.crt"), 0o644);
        user.install(&certs.server_key, &data.join("server.key"), 0o600);
        user.install(&certs.ca, &data.join("ca.crt"), 0o644);
        fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\n\
             hostssl all guest 127.0.0.0/8 cert\n\
             hostssl all all 127.0.0.0/8 trust\n",
        )
        .expect("pg_hba.conf");
        let port = free_port();
        let log = dir.path().join("postgres.log");
        let (out, err) = log_file(&log);
        let mut postgres = user.command(&bin.join("postgres"));
        postgres
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1,127.0.0.2"])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", dir.path().display()))
            .args(["-c", "ssl=on"])
            .args(["-c", "ssl_cert_file=server.crt"])
            .args(["-c", "ssl_key_file=server.key"])
            .args(["-c", "ssl_ca_file=ca.crt"])
            .args(["-c", "fsync=off"])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        // The guard first: a panic while waiting stops the server too.
        let mut pg = PrivatePostgres {
            port,
            child: postgres.spawn().expect("start postgres"),
            dir,
        };
        wait_listening(
            &mut pg.child,
            &format!("127.0.0.1:{port}"),
            Duration::from_secs(60),
            &log,
        );
        // Listening is not accepting yet: wait for the end of startup.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = Command::new(bin.join("pg_isready"))
                .args(["-q", "-h", "127.0.0.1", "-p", &port.to_string()])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "postgres never became ready: {}",
                pg.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        pg
    }

    /// A URL of its `postgres` database through `host`, without TLS parameters.
    pub fn url(&self, host: &str) -> String {
        format!("postgres://postgres@{host}:{}/postgres", self.port)
    }

    /// The server's log so far (for assertion messages).
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }
}

impl Drop for PrivatePostgres {
    /// SIGINT is PostgreSQL's fast shutdown: sessions are ended, the server exits at once.
    fn drop(&mut self) {
        stop_child(&mut self.child, Signal::SIGINT, Duration::from_secs(20));
    }
}

/// A RabbitMQ node of this test (`skilleval-tls-<random>@localhost`): a plain listener on a
/// free loopback port, and a TLS listener with the generated server certificate that requires
/// a client certificate signed by the test CA. No plugins. Stopped with `rabbitmqctl stop` on
/// drop (SIGTERM, then SIGKILL, if that fails).

#[derive(Debug)]
pub struct PrivateRabbit {
    pub node: String,
    /// The TLS listener's port.
    pub tls_port: u16,
    child: Child,
    user: RunAs,
    dir: TempDir,
}

impl PrivateRabbit {
    /// Starts the node; returns once its TLS listener accepts connections.
    pub fn start(certs: &Certificates) -> PrivateRabbit {
        let user = RunAs::service("rabbitmq");
        let dir = world_readable_tempdir();
        let base = dir.path();
        user.own(base);
        let node = format!(
            "skilleval-tls-{}@localhost",
            &Uuid::new_v4().simple().to_string()[..12]
        );
        let (tcp_port, tls_port, dist_port) = (free_port(), free_port(), free_port());
        user.install(&certs.ca, &base.join("ca.pem"), 0o644);
        user.install(&certs.server_cert, &base.join("server.pem"), 0o644);
        user.install(&certs.server_key, &base.join("server.key"), 0o600);
        let config = format!(
            "listeners.tcp.1 = 127.0.0.1:{tcp_port}\n\
             listeners.ssl.1 = 127.0.0.1:{tls_port}\n\
             ssl_options.cacertfile = {ca}\n\
             ssl_options.certfile = {cert}\n\
             ssl_options.keyfile = {key}\n\
             ssl_options.verify = verify_peer\n\
             ssl_options.fail_if_no_peer_cert = true\n",
            ca = base.join("ca.pem").display(),
            cert = base.join("server.pem").display(),
            key = base.join("server.key").display(),
        );
        fs::write(base.join("rabbitmq.conf"), config).expect("rabbitmq.conf");
        // No plugins: the system node's management plugin already holds port 15672.
        fs::write(base.join("enabled_plugins"), "[].\n").expect("enabled_plugins");
        // Not /etc/rabbitmq/rabbitmq-env.conf, which names the system node.
        fs::write(base.join("rabbitmq-env.conf"), "").expect("rabbitmq-env.conf");
        for name in ["rabbitmq.conf", "enabled_plugins", "rabbitmq-env.conf"] {
            user.own(&base.join(name));
        }
        let log = base.join("server.log");
        let (out, err) = log_file(&log);
        let mut server = user.command(&Path::new(RABBITMQ_BIN).join("rabbitmq-server"));
        Self::environment(&mut server, &user, base, &node);
        server
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", tcp_port.to_string())
            .env("RABBITMQ_DIST_PORT", dist_port.to_string())
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
            .env("RABBITMQ_LOG_BASE", base.join("log"))
            .env("RABBITMQ_LOGS", "-")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        // The guard first: a panic while waiting stops the node too.
        let mut rabbit = PrivateRabbit {
            node,
            tls_port,
            child: server.spawn().expect("start rabbitmq-server"),
            user,
            dir,
        };
        wait_listening(
            &mut rabbit.child,
            &format!("127.0.0.1:{tls_port}"),
            Duration::from_secs(120),
            &log,
        );
        let mut ctl = rabbit.ctl();
        ctl.args(["await_startup", "--timeout", "60"]);
        run(ctl, "rabbitmqctl await_startup");
        rabbit
    }

    /// The variables every command of this node runs with.
    fn environment(cmd: &mut Command, user: &RunAs, base: &Path, node: &str) {
        cmd.env("RABBITMQ_NODENAME", node)
            .env("RABBITMQ_CONF_ENV_FILE", base.join("rabbitmq-env.conf"));
        if user.0.is_some() {
            // The system node's cookie, readable by the rabbitmq user only.
            cmd.env("HOME", RABBITMQ_HOME);
        }
    }

    /// `rabbitmqctl -n <node>`, as the node's user.
    fn ctl(&self) -> Command {
        let mut cmd = self
            .user
            .command(&Path::new(RABBITMQ_BIN).join("rabbitmqctl"));
        Self::environment(&mut cmd, &self.user, self.dir.path(), &self.node);
        cmd.args(["-n", &self.node]);
        cmd
    }

    /// An `amqps://` URL of the TLS listener through `host`, as guest.
    pub fn url(&self, host: &str) -> String {
        format!("amqps://guest:guest@{host}:{}/%2f", self.tls_port)
    }

    /// The node's output so far (for assertion messages).
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for PrivateRabbit {
    fn drop(&mut self) {
        let mut ctl = self.ctl();
        ctl.arg("stop")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let stopped: io::Result<_> = ctl.status();
        if !stopped.is_ok_and(|s| s.success()) {
            eprintln!("cleanup: rabbitmqctl stop failed for {}", self.node);
        }
        stop_child(&mut self.child, Signal::SIGTERM, Duration::from_secs(30));
    }
}
