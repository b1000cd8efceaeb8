//! The coordinator over TLS to both services, against a private PostgreSQL and a private
//! RabbitMQ started with generated certificates (`skilleval_test_support::tls`):
//! `migrate --create-database` creates and migrates its database over verified TLS, the
//! application starts with both connections verified, and a broker certificate that does not
//! verify stops it with a TLS configuration error.

use std::process::Command;

use skilleval_coordinator::startup::Application;
use skilleval_infra::config::{PgSslMode, SecretUrl, Settings};
use skilleval_infra::store::{SchemaStatus, Store};
use skilleval_test_support::tls::{Certificates, PrivatePostgres, PrivateRabbit};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinator_migrates_and_starts_over_tls_and_refuses_a_broker_it_cannot_verify() {
    let certs = Certificates::generate();
    let pg = PrivatePostgres::start(&certs);
    let rabbit = PrivateRabbit::start(&certs);
    let db_url = format!("postgres://postgres@localhost:{}/skilleval_tls", pg.port);

    // The migrate Job as an operator configures it: a plain URL, TLS in the settings.
    let out = Command::new(env!("CARGO_BIN_EXE_skilleval-coordinator"))
        .args(["migrate", "--create-database"])
        .env("SKILLEVAL_CONFIG_DIR", "/nonexistent-skilleval-config")
        .env("DATABASE_URL", &db_url)
        .env("SKILLEVAL__DATABASE__SSL_MODE", "verify-full")
        .env("SKILLEVAL__DATABASE__SSL_ROOT_CERT", &certs.ca)
        .env("SKILLEVAL_LOG_FORMAT", "text")
        .env("RUST_LOG", "info")
        .output()
        .expect("run migrate");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}\n{}", pg.log());
    assert!(stderr.contains("database created"), "{stderr}");

    let mut settings = Settings::default();
    settings.database.url = SecretUrl::new(db_url);
    settings.database.ssl_mode = Some(PgSslMode::VerifyFull);
    settings.database.ssl_root_cert = Some(certs.ca.clone());
    settings.database.max_connections = 2;
    let store = Store::connect(&settings.database)
        .await
        .expect("connect over TLS");
    assert_eq!(store.schema_status().await.unwrap(), SchemaStatus::Current);

    // Both connections verified (the broker also wants our client certificate): it starts.
    settings.amqp.url = SecretUrl::new(rabbit.url("localhost"));
    settings.amqp.prefix = "tlscoord".into();
    settings.amqp.tls_ca_file = Some(certs.ca.clone());
    settings.amqp.tls_cert_file = Some(certs.client_cert.clone());
    settings.amqp.tls_key_file = Some(certs.client_key.clone());
    settings.coordinator.bind = "127.0.0.1:0".into();
    let app = Application::build_with(settings.clone(), false)
        .await
        .unwrap_or_else(|e| panic!("build over TLS: {e:#}\n{}", rabbit.log()));
    assert!(app.port() > 0);
    drop(app);

    // The broker's certificate against another CA: the coordinator does not start, and says why.
    settings.amqp.tls_ca_file = Some(certs.other_ca.clone());
    let err = Application::build_with(settings, false)
        .await
        .expect_err("a broker certificate that does not verify");
    let message = format!("{err:#}");
    assert!(
        message.contains("TLS configuration problem") && message.contains("does not verify"),
        "{message}"
    );
}
