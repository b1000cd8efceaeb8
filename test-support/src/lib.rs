//! What the coordinator's and the worker's integration tests share (dev-only, never
//! published): the services of this machine, and a [`Scratch`] per test — a freshly created
//! database with a random name and a random broker prefix — removed when the test ends,
//! however it ends (`DROP DATABASE ... WITH (FORCE)`, every queue and exchange of the prefix).
//!
//! The services default to PostgreSQL on 127.0.0.1:5432 (trust auth) and RabbitMQ on
//! 127.0.0.1:5672 (guest/guest); `SKILLEVAL_TEST_PG` (an admin URL without the database) and
//! `SKILLEVAL_TEST_AMQP` point elsewhere. [`tls`] starts private PostgreSQL and RabbitMQ
//! servers with generated certificates, for the TLS tests; [`cluster`] starts a private
//! RabbitMQ cluster of three nodes, for the node-loss tests.

pub mod cluster;
pub mod tls;

use lapin::types::ShortString;
use lapin::Connection;
use skilleval_infra::topology::Topology;
use sqlx::{AssertSqlSafe, Connection as _, PgConnection};
use uuid::Uuid;

/// The PostgreSQL server, as an admin URL without the database.
pub fn pg_admin_base() -> String {
    std::env::var("SKILLEVAL_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

/// The maintenance database, through which test databases are created and dropped.
pub fn admin_url() -> String {
    format!("{}/postgres", pg_admin_base())
}

/// The RabbitMQ server.
pub fn amqp_url() -> String {
    std::env::var("SKILLEVAL_TEST_AMQP")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// One test's database and broker prefix, removed on drop.
#[derive(Debug)]
pub struct Scratch {
    /// The database's name (`skilleval_test_<random>`), created empty.
    pub db_name: String,
    /// A URL of the database.
    pub db_url: String,
    /// The broker prefix (`t<random>`): every queue and exchange of the test carries it.
    pub prefix: String,
    /// The topology deleted at the end, once the test declared it ([`Scratch::owns`]).
    topology: Option<Topology>,
}

impl Scratch {
    /// Creates a fresh, empty database and picks a prefix nobody else uses.
    pub async fn create() -> Scratch {
        let id = Uuid::new_v4().simple().to_string();
        let db_name = format!("skilleval_test_{}", &id[..16]);
        let prefix = format!("t{}", &id[16..28]);
        let mut admin = PgConnection::connect(&admin_url())
            .await
            .expect("connect to the maintenance database");
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE \"{db_name}\"")))
            .execute(&mut admin)
            .await
            .expect("create the test database");
        let _ = admin.close().await;
        Scratch {
            db_url: format!("{}/{db_name}", pg_admin_base()),
            db_name,
            prefix,
            topology: None,
        }
    }

    /// Deletes this topology's queues and exchanges with the database at the end.
    pub fn owns(&mut self, topology: Topology) {
        self.topology = Some(topology);
    }

    /// Removes the database and the broker objects now (the drop does it again, harmlessly).
    pub async fn remove(&self) {
        remove(&self.db_name, self.topology.as_ref()).await;
    }
}

impl Drop for Scratch {
    /// Drop cannot await: a thread with its own runtime can, even while a test unwinds.
    fn drop(&mut self) {
        let db_name = self.db_name.clone();
        let topology = self.topology.clone();
        let done = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(remove(&db_name, topology.as_ref()));
        });
        let _ = done.join();
    }
}

/// A database the code under test creates itself (`migrate --create-database`, the worker's
/// schema check): dropped when the guard goes, however the test ends.
#[derive(Debug)]
pub struct DropDatabase(pub String);

impl DropDatabase {
    /// A URL of the database.
    pub fn url(&self) -> String {
        format!("{}/{}", pg_admin_base(), self.0)
    }
}

impl Drop for DropDatabase {
    fn drop(&mut self) {
        let db_name = self.0.clone();
        let done = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(remove(&db_name, None));
        });
        let _ = done.join();
    }
}

/// Drops the database (closing its connections) and deletes the topology; a failure is
/// printed, never raised (a test's end must not fail on it).
async fn remove(db_name: &str, topology: Option<&Topology>) {
    if let Some(topology) = topology {
        match Connection::connect(&amqp_url(), lapin::ConnectionProperties::default()).await {
            Ok(conn) => {
                if let Ok(ch) = conn.create_channel().await {
                    if let Err(e) = topology.delete(&ch).await {
                        eprintln!("cleanup: deleting queues of {}: {e}", topology.prefix());
                    }
                }
                let _ = conn.close(200, ShortString::from("cleanup")).await;
            }
            Err(e) => eprintln!("cleanup: connecting to RabbitMQ: {e}"),
        }
    }
    match PgConnection::connect(&admin_url()).await {
        Ok(mut admin) => {
            let drop = format!("DROP DATABASE IF EXISTS \"{db_name}\" WITH (FORCE)");
            if let Err(e) = sqlx::query(AssertSqlSafe(drop)).execute(&mut admin).await {
                eprintln!("cleanup: dropping {db_name}: {e}");
            }
            let _ = admin.close().await;
        }
        Err(e) => eprintln!("cleanup: connecting to PostgreSQL: {e}"),
    }
}
