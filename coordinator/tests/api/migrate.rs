//! `skilleval-coordinator migrate` (what the Kubernetes Job runs): with `--create-database` it
//! creates a missing database and migrates it; without, a missing database is a clear error.

use std::process::Command;

use skilleval_infra::store::{SchemaStatus, Store};
use uuid::Uuid;

use skilleval_test_support::DropDatabase;

fn migrate(url: &str, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_skilleval-coordinator"))
        .arg("migrate")
        .args(extra)
        .env("SKILLEVAL_CONFIG_DIR", "/nonexistent-skilleval-config")
        .env("DATABASE_URL", url)
        .env("SKILLEVAL_LOG_FORMAT", "text")
        .env("RUST_LOG", "info")
        .output()
        .unwrap()
}

#[tokio::test]
async fn migrate_creates_the_database_only_when_allowed() {
    let name = format!(
        "skilleval_test_mig_{}",
        &Uuid::new_v4().simple().to_string()[..12]
    );
    let cleanup = DropDatabase(name.clone());
    let url = cleanup.url();

    let refused = migrate(&url, &[]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains(&name), "names the database: {stderr}");

    let created = migrate(&url, &["--create-database"]);
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    assert!(String::from_utf8_lossy(&created.stderr).contains("database created"));
    let store = Store::connect_url(&url, 1).await.unwrap();
    assert_eq!(store.schema_status().await.unwrap(), SchemaStatus::Current);
    store.pool().close().await;

    // Again: the database exists and nothing is pending; still a success.
    let again = migrate(&url, &["--create-database"]);
    assert!(again.status.success());
    assert!(!String::from_utf8_lossy(&again.stderr).contains("database created"));
}
