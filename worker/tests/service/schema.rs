//! A worker refuses to consume against a database whose migrations are not the ones it embeds:
//! an empty database, one a migration behind, one migrated by a newer release.

use std::time::Duration;

use skilleval_infra::store::{create_database_if_missing, SchemaStatus, Store};
use uuid::Uuid;

use skilleval_test_support::DropDatabase;

use crate::helpers::{free_port, TestEnv};

const NEWER: i64 = 99_991_231_000_000;

/// Starts the worker binary with `extra` settings and returns its stderr once it exited,
/// asserting it failed.
async fn refused(env: &TestEnv, name: &str, extra: &[(&str, String)]) -> String {
    let mut worker = env.spawn_worker_process(name, free_port(), extra);
    let (status, stderr) = worker.wait(Duration::from_secs(30)).await;
    assert!(
        !status.success(),
        "the worker should exit non-zero: {stderr}"
    );
    assert!(stderr.contains("refusing to consume"), "{stderr}");
    // Text logs into a pipe: plain, no colour codes.
    assert!(
        !stderr.contains('\u{1b}'),
        "colour codes in a pipe: {stderr:?}"
    );
    stderr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_refuses_a_schema_older_or_newer_than_its_own() {
    let env = TestEnv::new().await;
    assert_eq!(
        env.store.schema_status().await.unwrap(),
        SchemaStatus::Current
    );
    let pool = env.store.pool();

    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES ($1, 'from a newer release', true, '\\x00', 0)",
    )
    .bind(NEWER)
    .execute(pool)
    .await
    .unwrap();
    assert_eq!(
        env.store.schema_status().await.unwrap(),
        SchemaStatus::Ahead {
            unknown: vec![NEWER]
        }
    );
    let stderr = refused(&env, "newer", &[]).await;
    assert!(stderr.contains("newer than this binary"), "{stderr}");
    assert!(stderr.contains(&NEWER.to_string()), "{stderr}");

    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = $1")
        .bind(NEWER)
        .execute(pool)
        .await
        .unwrap();
    let latest: i64 = sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations")
        .fetch_one(pool)
        .await
        .unwrap();
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = $1")
        .bind(latest)
        .execute(pool)
        .await
        .unwrap();
    let stderr = refused(&env, "older", &[]).await;
    assert!(stderr.contains("older than this binary"), "{stderr}");
    assert!(stderr.contains(&latest.to_string()), "{stderr}");
    assert!(
        stderr.contains("migrate"),
        "the message says what to run: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_refuses_an_empty_database_that_migrate_can_create() {
    let env = TestEnv::new().await;
    let name = format!(
        "skilleval_test_empty_{}",
        &Uuid::new_v4().simple().to_string()[..12]
    );
    let cleanup = DropDatabase(name.clone());
    let url = cleanup.url();
    assert!(create_database_if_missing(&url).await.unwrap(), "created");
    assert!(
        !create_database_if_missing(&url).await.unwrap(),
        "exists now"
    );

    let empty = Store::connect_url(&url, 1).await.unwrap();
    let status = empty.schema_status().await.unwrap();
    assert!(
        matches!(&status, SchemaStatus::Behind { missing } if !missing.is_empty()),
        "{status:?}"
    );
    empty.pool().close().await;
    let stderr = refused(&env, "empty", &[("DATABASE_URL", url.clone())]).await;
    assert!(stderr.contains("older than this binary"), "{stderr}");
}
