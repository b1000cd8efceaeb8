//! TLS to PostgreSQL and RabbitMQ, against private servers each test starts with certificates
//! it generates (`skilleval_test_support::tls`): verification against the configured CA
//! succeeds, and a certificate that does not verify is a configuration error that says so.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use skilleval_infra::config::{DatabaseSettings, PgSslMode, SecretUrl, Settings};
use skilleval_infra::store::{SchemaStatus, Store, StoreError};
use skilleval_infra::topology::{self, BrokerError, Topology};
use skilleval_test_support::tls::{Certificates, PrivatePostgres, PrivateRabbit};

use crate::helpers::{free_port, http_get};

fn database(url: String, mode: Option<PgSslMode>, ca: Option<&Path>) -> DatabaseSettings {
    DatabaseSettings {
        url: SecretUrl::new(url),
        max_connections: 2,
        ssl_mode: mode,
        ssl_root_cert: ca.map(Path::to_path_buf),
        ..DatabaseSettings::default()
    }
}

/// Whether the store's session is encrypted, as the server sees it.
async fn encrypted(store: &Store) -> bool {
    sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(store.pool())
        .await
        .expect("pg_stat_ssl")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_verify_full_with_the_ca_connects_and_another_ca_is_a_tls_error() {
    let certs = Certificates::generate();
    let pg = PrivatePostgres::start(&certs);

    // verify-full with the CA, by name and by the address the certificate carries.
    for host in ["localhost", "127.0.0.1"] {
        let settings = database(pg.url(host), Some(PgSslMode::VerifyFull), Some(&certs.ca));
        let store = Store::connect(&settings)
            .await
            .unwrap_or_else(|e| panic!("verify-full to {host}: {e}\n{}", pg.log()));
        assert!(encrypted(&store).await, "{host}: the session is encrypted");
    }

    // The same through the URL alone (sslmode and sslrootcert as libpq spells them).
    let url = format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        pg.url("localhost"),
        certs.ca.display()
    );
    let store = Store::connect_url(&url, 1)
        .await
        .expect("verify-full via the URL");
    assert!(encrypted(&store).await);
    // The schema goes over TLS like everything else.
    store.migrate().await.expect("migrations over TLS");
    assert_eq!(store.schema_status().await.unwrap(), SchemaStatus::Current);

    // A CA that did not sign the server's certificate: a TLS configuration error, not a
    // transient fault, naming the certificate and what to check.
    let settings = database(
        pg.url("localhost"),
        Some(PgSslMode::VerifyFull),
        Some(&certs.other_ca),
    );
    let err = Store::connect(&settings).await.expect_err("another CA");
    assert!(matches!(err, StoreError::Tls { .. }), "{err:?}");
    assert!(err.is_configuration() && !err.is_transient(), "{err:?}");
    let message = err.to_string();
    for expected in [
        "TLS configuration problem",
        "certificate",
        "does not verify",
        "CA",
    ] {
        assert!(message.contains(expected), "`{expected}` in: {message}");
    }
    // The same CA given in the URL, overridden by the setting: the setting wins.
    let mut settings = settings;
    settings.url = SecretUrl::new(url.clone());
    let err = Store::connect(&settings)
        .await
        .expect_err("the configured CA replaces the URL's");
    assert!(matches!(err, StoreError::Tls { .. }), "{err:?}");

    // 127.0.0.2 reaches the same server, but the certificate does not name it: verify-full
    // refuses, verify-ca (chain only) accepts.
    let settings = database(
        pg.url("127.0.0.2"),
        Some(PgSslMode::VerifyFull),
        Some(&certs.ca),
    );
    let err = Store::connect(&settings).await.expect_err("wrong host");
    assert!(matches!(err, StoreError::Tls { .. }), "{err:?}");
    assert!(err.to_string().contains("does not name the host"), "{err}");
    let settings = database(
        pg.url("127.0.0.2"),
        Some(PgSslMode::VerifyCa),
        Some(&certs.ca),
    );
    let store = Store::connect(&settings)
        .await
        .expect("verify-ca to 127.0.0.2");
    assert!(encrypted(&store).await);

    // The role `guest` logs in with a client certificate only (`cert` authentication).
    sqlx::query("CREATE ROLE guest LOGIN")
        .execute(store.pool())
        .await
        .expect("create the certificate's role");
    let guest_url = format!("postgres://guest@localhost:{}/postgres", pg.port);
    let mut settings = database(guest_url, Some(PgSslMode::VerifyFull), Some(&certs.ca));
    let err = Store::connect(&settings)
        .await
        .expect_err("no client certificate");
    assert!(err.to_string().contains("certificate"), "{err}");
    settings.ssl_cert = Some(certs.client_cert.clone());
    settings.ssl_key = Some(certs.client_key.clone());
    let store = Store::connect(&settings)
        .await
        .expect("verify-full with a client certificate");
    let (user, client): (String, Option<String>) = sqlx::query_as(
        "SELECT current_user::text, client_dn FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
    )
    .fetch_one(store.pool())
    .await
    .expect("pg_stat_ssl");
    assert_eq!(
        (user.as_str(), client.as_deref()),
        ("guest", Some("/CN=guest")),
        "authenticated by the certificate"
    );

    // The server accepts TLS connections only: with sslmode=disable it refuses, so the
    // connections above were encrypted because they had to be, not by chance.
    let settings = database(pg.url("localhost"), Some(PgSslMode::Disable), None);
    let err = Store::connect(&settings)
        .await
        .expect_err("plain connection");
    assert!(err.to_string().contains("no encryption"), "{err}");
    assert!(
        !err.is_configuration(),
        "the server's refusal, not TLS: {err:?}"
    );
}

fn broker(rabbit: &PrivateRabbit, ca: &Path, identity: Option<(&Path, &Path)>) -> Settings {
    let mut s = Settings::default();
    s.amqp.url = SecretUrl::new(rabbit.url("localhost"));
    s.amqp.prefix = "tlstest".into();
    s.amqp.tls_ca_file = Some(ca.to_path_buf());
    s.amqp.tls_cert_file = identity.map(|(cert, _)| cert.to_path_buf());
    s.amqp.tls_key_file = identity.map(|(_, key)| key.to_path_buf());
    s
}

/// The error of connecting with `settings`, which must fail.
async fn refused(settings: &Settings) -> BrokerError {
    match topology::connect(settings, "skilleval-tls-test").await {
        Ok(_) => panic!("connected with {:?}", settings.amqp),
        Err(e) => e,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbitmq_amqps_with_the_ca_and_a_client_certificate_and_clear_errors_otherwise() {
    let certs = Certificates::generate();
    let rabbit = PrivateRabbit::start(&certs);
    let client = (certs.client_cert.as_path(), certs.client_key.as_path());

    // The CA and a client certificate the broker trusts: connected, the topology declared.
    let settings = broker(&rabbit, &certs.ca, Some(client));
    let conn = topology::connect(&settings, "skilleval-tls-test")
        .await
        .unwrap_or_else(|e| {
            panic!(
                "amqps with CA and client certificate: {e}\n{}",
                rabbit.log()
            )
        });
    let channel = conn.create_channel().await.expect("channel over TLS");
    Topology::from_settings(&settings)
        .declare(&channel)
        .await
        .expect("declare over TLS");
    let _ = conn.close(200, "done".into()).await;

    // A CA that did not sign the broker's certificate.
    let err = refused(&broker(&rabbit, &certs.other_ca, Some(client))).await;
    assert!(matches!(err, BrokerError::Tls { .. }), "{err:?}");
    assert!(err.is_configuration(), "{err:?}");
    let message = err.to_string();
    for expected in [
        "TLS configuration problem",
        "certificate",
        "does not verify",
        "amqp.tls_ca_file",
    ] {
        assert!(message.contains(expected), "`{expected}` in: {message}");
    }

    // No client certificate, or one from a CA the broker does not trust: the broker refuses.
    // Its alert reaches the client (a TLS configuration error), or the reset of the
    // connection overtakes it (a retryable error that still names the likely cause): either
    // way the message points at the client certificate.
    for identity in [
        None,
        Some((certs.stranger_cert.as_path(), certs.stranger_key.as_path())),
    ] {
        let err = refused(&broker(&rabbit, &certs.ca, identity)).await;
        match &err {
            BrokerError::Tls { .. } => assert!(err.is_configuration()),
            BrokerError::ClosedOverTls { .. } => assert!(!err.is_configuration()),
            other => panic!("{identity:?}: {other:?}"),
        }
        assert!(
            err.to_string().contains("client certificate"),
            "{identity:?}: {err}"
        );
    }

    // A CA file that holds no certificate is named before any connection is tried.
    let bogus = certs.dir().join("not-a-ca.pem");
    std::fs::write(&bogus, "hello\n").expect("write");
    let err = refused(&broker(&rabbit, &bogus, Some(client))).await;
    assert!(matches!(err, BrokerError::TlsFile { .. }), "{err:?}");
    assert!(
        err.to_string().contains("amqp.tls_ca_file") && err.to_string().contains("not-a-ca.pem"),
        "{err}"
    );
}

/// The `skilleval-worker` binary against the private servers, configured through its
/// environment as an operator would.
fn worker_command(
    pg: &PrivatePostgres,
    rabbit: &PrivateRabbit,
    certs: &Certificates,
    ca: &Path,
    cache: &Path,
    http_port: u16,
) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_skilleval-worker"));
    cmd.env("SKILLEVAL_CONFIG_DIR", "/nonexistent-skilleval-config")
        .env("DATABASE_URL", pg.url("localhost"))
        .env("SKILLEVAL__DATABASE__SSL_MODE", "verify-full")
        .env("SKILLEVAL__DATABASE__SSL_ROOT_CERT", &certs.ca)
        .env("AMQP_URL", rabbit.url("localhost"))
        .env("SKILLEVAL__AMQP__TLS_CA_FILE", ca)
        .env("SKILLEVAL__AMQP__TLS_CERT_FILE", &certs.client_cert)
        .env("SKILLEVAL__AMQP__TLS_KEY_FILE", &certs.client_key)
        .env("SKILLEVAL__AMQP__PREFIX", "tlsworker")
        .env("SKILLEVAL__WORKER__HTTP_PORT", http_port.to_string())
        .env("SKILLEVAL__WORKER__PACKAGE_CACHE_DIR", cache)
        .env("RUST_LOG", "info")
        .env("SKILLEVAL_LOG_FORMAT", "text")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

/// Kills the child if the test ends while it runs.
struct Reap(std::process::Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_binary_consumes_over_tls_and_exits_at_once_on_a_certificate_that_does_not_verify(
) {
    let certs = Certificates::generate();
    let pg = PrivatePostgres::start(&certs);
    let rabbit = PrivateRabbit::start(&certs);
    let cache = tempfile::tempdir().expect("cache dir");
    let schema = Store::connect(&database(
        pg.url("localhost"),
        Some(PgSslMode::VerifyFull),
        Some(&certs.ca),
    ))
    .await
    .expect("connect to migrate");
    schema.migrate().await.expect("migrate");

    // Both connections verified: the worker becomes ready (consuming, database reachable).
    let port = free_port();
    let mut worker = Reap(
        worker_command(&pg, &rabbit, &certs, &certs.ca, cache.path(), port)
            .spawn()
            .expect("spawn the worker"),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = worker.0.try_wait().expect("try_wait") {
            let mut stderr = String::new();
            if let Some(mut s) = worker.0.stderr.take() {
                use std::io::Read as _;
                let _ = s.read_to_string(&mut stderr);
            }
            panic!("the worker exited ({status}): {stderr}");
        }
        // `http_get` answers only a 200.
        if http_get(port, "/readyz").await.is_some() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "hang guard: not ready after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(worker);

    // The broker's certificate does not verify against the configured CA: the worker exits
    // non-zero at once, saying so, instead of reconnecting ten times.
    let out = worker_command(
        &pg,
        &rabbit,
        &certs,
        &certs.other_ca,
        cache.path(),
        free_port(),
    )
    .output()
    .expect("run the worker");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("TLS configuration problem") && stderr.contains("does not verify"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("broker session could not start"),
        "a certificate problem is not retried: {stderr}"
    );
}
