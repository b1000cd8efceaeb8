//! The RabbitMQ topology, named and declared in one place, and publishing with confirms.
//!
//! Every name derives from the configured prefix `p`:
//!
//! ```text
//! exchange p.jobs (direct) --"job"----> queue p.jobs          quorum; dead letters -> p.parking
//!                          --"sample"-> queue p.jobs.samples  classic; dead letters -> p.parking
//! queue p.retry.<ms>          TTL <ms>, dead-letters to p.jobs with key "job"     (one per tier)
//! queue p.retry.samples.<ms>  TTL <ms>, dead-letters to p.jobs with key "sample"  (one per tier)
//! exchange p.parking (fanout) -> queue p.parking    unparseable messages and poison jobs
//! exchange p.events (topic)   -> queue p.coordinator.events ("case.#")  cases leaving `queued`
//! ```
//!
//! **Lanes.** CI jobs (uploads, manual runs) and production samples travel in separate queues.
//! A worker consumes both, each on its own channel with its own prefetch: the main queue gets
//! `worker.concurrency`, the samples queue `worker.samples_concurrency` (a quarter by
//! default). A flood of samples therefore fills only the samples share and never delays a CI
//! job, while samples still progress when CI is busy. (Quorum queues have no message
//! priorities on RabbitMQ 3.x, so priority is by queue, not by message.)
//!
//! **Retries.** A job that faults transiently is re-published, with `attempt + 1`, to the delay
//! queue of its lane whose TTL fits the backoff; when the TTL expires the broker dead-letters it
//! back to the jobs exchange. One queue per tier keeps every message in a queue with the same
//! TTL, so none waits behind a longer one.
//!
//! **Poison guard.** The jobs queue has `x-delivery-limit`: a message redelivered that often
//! (workers dying on it) is dead-lettered to the parking queue instead of looping forever.
//! Workers store such a job `errored` before that limit (`worker.max_redeliveries`, below
//! [`DELIVERY_LIMIT`]) so its run still completes; the broker's limit is the backstop: the
//! coordinator drains the parking queue and records a parked job's case `errored` with the
//! reason (`skilleval_coordinator::parked`).
//!
//! **Clusters.** On a RabbitMQ cluster the jobs queue is replicated on every node (a quorum
//! queue's members are the nodes of the cluster when it is declared) and survives the loss of
//! a minority of them. With `amqp.replicated_queues` every other queue is a quorum queue too:
//! the samples lane, the parking and events queues, and the delay queues, which then
//! dead-letter `at-least-once` (RabbitMQ 3.10's strategy: a message leaves the delay queue only
//! once the jobs exchange's queue confirmed it; it needs `x-overflow` `reject-publish`).
//! Without it those queues are classic, each living on one node: fine for one node, not for a
//! cluster.
//!
//! Queue arguments that depend on configuration are the retry tiers (the delay queues'
//! names and TTLs): the coordinator and the workers must share `worker.retry_tiers_ms`, as they
//! do when they load the same configuration.
//!
//! Declaring is idempotent: both binaries call [`Topology::declare`] at start. Declaring a name
//! that already exists with different arguments fails with `PRECONDITION_FAILED`; change
//! arguments by deploying under a new prefix or deleting the old queues.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use lapin::message::BasicReturnMessage;
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind,
    PublisherConfirm,
};
use skilleval_execution::plan::Job;
use tracing::Instrument;

use crate::config::{AmqpSettings, SecretUrl, Settings};
use crate::failover::BrokerNodes;
use crate::messages::{CaseFinished, CasesFinished, EncodedJob, MessageError};

/// Routing key of CI jobs on the jobs exchange.
pub const JOB_ROUTING_KEY: &str = "job";
/// Routing key of production samples on the jobs exchange.
pub const SAMPLE_ROUTING_KEY: &str = "sample";
/// Header in which a quorum queue counts a message's earlier deliveries.
pub const DELIVERY_COUNT_HEADER: &str = "x-delivery-count";
/// Header carrying why a message was parked.
pub const PARKED_REASON_HEADER: &str = "x-skilleval-parked-reason";
/// Header carrying the queue a parked message was taken from.
pub const PARKED_FROM_HEADER: &str = "x-skilleval-parked-from";
/// W3C trace context header.
pub const TRACEPARENT_HEADER: &str = "traceparent";
/// Header of a job put off because another copy of its case held the case's claim: its
/// worker looks at the case's state and claim again before running it.
pub const DEFERRED_HEADER: &str = "x-skilleval-deferred";
/// `x-delivery-limit` of the jobs queue, defined with the settings that must stay below it
/// (here for the binaries and tests that declare or exercise the queue).
pub use crate::config::DELIVERY_LIMIT;
/// Messages the coordinator's events queue keeps while nobody consumes it (oldest dropped).
const EVENTS_QUEUE_MAX_LENGTH: i64 = 1_000_000;

/// Which queue a job travels in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lane {
    /// Uploads and manual runs: the main, quorum queue.
    Ci,
    /// Production samples: the lower-priority queue.
    Samples,
}

impl Lane {
    /// Every lane; a worker consumes all of them.
    pub const ALL: [Lane; 2] = [Lane::Ci, Lane::Samples];

    pub fn routing_key(self) -> &'static str {
        match self {
            Lane::Ci => JOB_ROUTING_KEY,
            Lane::Samples => SAMPLE_ROUTING_KEY,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Ci => "ci",
            Lane::Samples => "samples",
        }
    }
}

/// One queue's state, for metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueDepth {
    pub queue: String,
    /// Messages ready for delivery.
    pub ready: u32,
    pub consumers: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("connecting to RabbitMQ at {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: lapin::Error,
    },
    /// The TLS handshake failed on a certificate: a configuration problem, not retried.
    #[error(
        "connecting to RabbitMQ at {url}: TLS configuration problem: {problem} \
         (amqp.tls_ca_file, amqp.tls_cert_file, amqp.tls_key_file)"
    )]
    Tls {
        url: String,
        problem: String,
        #[source]
        source: Box<lapin::Error>,
    },
    /// An `amqps://` connection the broker reset or closed during the handshake. A broker
    /// refusing the client certificate sends an alert and closes, but the reset often
    /// overtakes the alert (in TLS 1.3 the client has already sent its first AMQP bytes), so
    /// the likely cause is named while the error stays retryable (a restarting broker looks
    /// the same).
    #[error(
        "connecting to RabbitMQ at {url}: {source}: the broker closed the TLS connection during \
         the handshake; if it verifies its peers, check that amqp.tls_cert_file is set to a \
         client certificate signed by a CA it trusts"
    )]
    ClosedOverTls {
        url: String,
        #[source]
        source: Box<lapin::Error>,
    },
    /// A configured TLS file that cannot be read or does not hold what it should.
    #[error("TLS configuration problem: {key} ({path}): {problem}")]
    TlsFile {
        key: &'static str,
        path: String,
        problem: String,
    },
    #[error("connecting to RabbitMQ at {url}: no answer within {secs} s")]
    ConnectTimeout { url: String, secs: u64 },
    /// Every configured node refused or did not answer.
    #[error("none of the {nodes} broker nodes answered: {errors}")]
    NoNode { nodes: usize, errors: String },
    #[error("{context}: {source}")]
    Amqp {
        context: String,
        #[source]
        source: lapin::Error,
    },
    #[error("publishing to `{exchange}` with key `{routing_key}`: unroutable ({reply_code} {reply_text})")]
    Unroutable {
        exchange: String,
        routing_key: String,
        reply_code: u16,
        reply_text: String,
    },
    #[error("publishing to `{exchange}` with key `{routing_key}`: the broker refused it (nack)")]
    Nacked {
        exchange: String,
        routing_key: String,
    },
    #[error("publishing to `{exchange}`: the channel is not in confirm mode")]
    NoConfirm { exchange: String },
    #[error(transparent)]
    Message(#[from] MessageError),
}

impl BrokerError {
    fn amqp(context: impl Into<String>) -> impl FnOnce(lapin::Error) -> BrokerError {
        let context = context.into();
        move |source| BrokerError::Amqp { context, source }
    }

    /// Whether this is a configuration problem that no reconnect can fix (TLS files that do
    /// not load, a certificate that does not verify).
    pub fn is_configuration(&self) -> bool {
        matches!(self, BrokerError::Tls { .. } | BrokerError::TlsFile { .. })
    }
}

/// How long one node may take to accept a connection and finish the AMQP handshake before
/// the next node is tried: a node cut off or half-stopped can hold a TCP connection open
/// without ever answering.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection to one of the configured nodes, and which ([`BrokerNodes::label`]).
#[derive(Debug)]
pub struct Connected {
    pub connection: Connection,
    /// The address's index in [`BrokerNodes`].
    pub node: usize,
}

/// Connects to the first of the configured nodes that answers, in the order [`BrokerNodes`]
/// gives, each tried once; records the node in `nodes`. Fails with the first configuration
/// problem (TLS files, a certificate that does not verify: no other node would do better), or
/// when no node answered.
pub async fn connect_any(
    settings: &Settings,
    nodes: &BrokerNodes,
    name: &str,
) -> Result<Connected, BrokerError> {
    let mut refused = Vec::new();
    for i in nodes.order() {
        let url = nodes.address(i);
        let attempt = tokio::time::timeout(CONNECT_TIMEOUT, connect_url(settings, url, name)).await;
        match attempt {
            Ok(Ok(connection)) => {
                nodes.connected(i);
                if !refused.is_empty() || nodes.len() > 1 {
                    tracing::info!(
                        node = nodes.label(i),
                        connection = name,
                        "connected to broker node"
                    );
                }
                return Ok(Connected {
                    connection,
                    node: i,
                });
            }
            Ok(Err(e)) if e.is_configuration() => return Err(e),
            Ok(Err(e)) => {
                tracing::debug!(node = nodes.label(i), error = %e, "broker node refused");
                refused.push(e);
            }
            Err(_) => {
                tracing::debug!(node = nodes.label(i), "broker node did not answer in time");
                refused.push(BrokerError::ConnectTimeout {
                    url: url.redacted(),
                    secs: CONNECT_TIMEOUT.as_secs(),
                });
            }
        }
    }
    if refused.len() == 1 {
        if let Some(only) = refused.pop() {
            return Err(only);
        }
    }
    Err(BrokerError::NoNode {
        nodes: refused.len(),
        errors: refused
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; "),
    })
}

/// Connects to the first configured node that answers, trying them in the configured order
/// (tests and tools; the service's processes use [`connect_any`] with their shared
/// [`BrokerNodes`]).
pub async fn connect(settings: &Settings, name: &str) -> Result<Connection, BrokerError> {
    let nodes = BrokerNodes::new(settings.amqp.connect_urls(), 0);
    connect_any(settings, &nodes, name)
        .await
        .map(|c| c.connection)
}

/// Opens a connection to `url` named `name` (shown by `rabbitmqctl list_connections`) with the
/// configured heartbeat, over TLS with the configured CA and client certificate when the URL
/// is `amqps://`. The certificate files are read at each connect, so renewed ones are used
/// from the next reconnect on.
async fn connect_url(
    settings: &Settings,
    url: &SecretUrl,
    name: &str,
) -> Result<Connection, BrokerError> {
    let properties = ConnectionProperties::default().with_connection_name(LongString::from(name));
    let tls = tls_config(&settings.amqp)?;
    let runtime = lapin::runtime::default_runtime().map_err(|source| BrokerError::Connect {
        url: url.redacted(),
        source,
    })?;
    Connection::connect_with_config(url.expose(), properties, tls, runtime)
        .await
        .map_err(|source| match crate::tls::certificate_problem(&source) {
            Some(problem) => BrokerError::Tls {
                url: url.redacted(),
                problem,
                source: Box::new(source),
            },
            None if url.expose().starts_with("amqps://") && closed_by_peer(&source) => {
                BrokerError::ClosedOverTls {
                    url: url.redacted(),
                    source: Box::new(source),
                }
            }
            None => BrokerError::Connect {
                url: url.redacted(),
                source,
            },
        })
}

/// Whether the connection was reset or closed under us (rather than refused, or timed out).
fn closed_by_peer(err: &lapin::Error) -> bool {
    use std::io::ErrorKind;
    match err.kind() {
        lapin::ErrorKind::IOError(io) => matches!(
            io.kind(),
            ErrorKind::ConnectionReset
                | ErrorKind::ConnectionAborted
                | ErrorKind::UnexpectedEof
                | ErrorKind::BrokenPipe
        ),
        _ => false,
    }
}

/// The CA and client identity of `amqps://` connections, read from the configured files.
/// Each file must hold what it is named for: lapin skips unparseable CA certificates silently,
/// which would turn a wrong file into a puzzling "unknown issuer" later.
fn tls_config(amqp: &AmqpSettings) -> Result<OwnedTLSConfig, BrokerError> {
    let cert_chain = match &amqp.tls_ca_file {
        Some(path) => {
            let bytes = read_certificates("amqp.tls_ca_file", path)?;
            Some(String::from_utf8_lossy(&bytes).into_owned())
        }
        None => None,
    };
    let identity = match (&amqp.tls_cert_file, &amqp.tls_key_file) {
        (Some(cert), Some(key)) => Some(OwnedIdentity::PKCS8 {
            pem: read_certificates("amqp.tls_cert_file", cert)?,
            key: read_private_key("amqp.tls_key_file", key)?,
        }),
        (None, None) => None,
        (Some(path), None) => {
            return Err(tls_file(
                "amqp.tls_cert_file",
                path,
                "set without amqp.tls_key_file",
            ))
        }
        (None, Some(path)) => {
            return Err(tls_file(
                "amqp.tls_key_file",
                path,
                "set without amqp.tls_cert_file",
            ))
        }
    };
    Ok(OwnedTLSConfig {
        identity,
        cert_chain,
    })
}

fn tls_file(key: &'static str, path: &Path, problem: impl Into<String>) -> BrokerError {
    BrokerError::TlsFile {
        key,
        path: path.display().to_string(),
        problem: problem.into(),
    }
}

/// The file's bytes when it holds one PEM certificate or more, and nothing unparseable.
fn read_certificates(key: &'static str, path: &Path) -> Result<Vec<u8>, BrokerError> {
    use rustls::pki_types::{pem::PemObject as _, CertificateDer};
    let bytes = std::fs::read(path).map_err(|e| tls_file(key, path, e.to_string()))?;
    let certificates = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_file(key, path, format!("not PEM certificates: {e}")))?;
    if certificates.is_empty() {
        return Err(tls_file(key, path, "holds no PEM certificate"));
    }
    Ok(bytes)
}

/// The file's bytes when it holds a PEM private key.
fn read_private_key(key: &'static str, path: &Path) -> Result<Vec<u8>, BrokerError> {
    use rustls::pki_types::{pem::PemObject as _, PrivateKeyDer};
    let bytes = std::fs::read(path).map_err(|e| tls_file(key, path, e.to_string()))?;
    PrivateKeyDer::from_pem_slice(&bytes)
        .map_err(|e| tls_file(key, path, format!("not a PEM private key: {e}")))?;
    Ok(bytes)
}

/// The names and arguments of every exchange and queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    prefix: String,
    retry_tiers_ms: Vec<u64>,
    delivery_limit: u32,
    /// Every queue a quorum queue (`amqp.replicated_queues`).
    replicated: bool,
}

impl Topology {
    /// `retry_tiers_ms` must be non-empty and increasing (as [`Settings::validate`] checks).
    pub fn new(
        prefix: impl Into<String>,
        retry_tiers_ms: Vec<u64>,
        delivery_limit: u32,
    ) -> Topology {
        let mut tiers = retry_tiers_ms;
        tiers.sort_unstable();
        tiers.dedup();
        if tiers.is_empty() {
            tiers.push(1_000);
        }
        Topology {
            prefix: prefix.into(),
            retry_tiers_ms: tiers,
            delivery_limit: delivery_limit.max(1),
            replicated: false,
        }
    }

    /// The same names, with every queue a quorum queue (`true`) or only the jobs queue.
    pub fn replicated(mut self, replicated: bool) -> Topology {
        self.replicated = replicated;
        self
    }

    pub fn from_settings(settings: &Settings) -> Topology {
        Topology::new(
            settings.amqp.prefix.clone(),
            settings.worker.retry_tiers_ms.clone(),
            DELIVERY_LIMIT,
        )
        .replicated(settings.amqp.replicated_queues)
    }

    /// The arguments every queue but the jobs queue starts from: a quorum queue's type when
    /// the topology is replicated, none otherwise.
    fn base_args(&self) -> FieldTable {
        let mut args = FieldTable::default();
        if self.replicated {
            args.insert("x-queue-type".into(), long_string("quorum"));
        }
        args
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn retry_tiers_ms(&self) -> &[u64] {
        &self.retry_tiers_ms
    }

    pub fn jobs_exchange(&self) -> String {
        format!("{}.jobs", self.prefix)
    }

    pub fn jobs_queue(&self) -> String {
        format!("{}.jobs", self.prefix)
    }

    pub fn samples_queue(&self) -> String {
        format!("{}.jobs.samples", self.prefix)
    }

    /// The queue a lane's jobs are consumed from.
    pub fn queue(&self, lane: Lane) -> String {
        match lane {
            Lane::Ci => self.jobs_queue(),
            Lane::Samples => self.samples_queue(),
        }
    }

    pub fn retry_queue(&self, lane: Lane, tier_ms: u64) -> String {
        match lane {
            Lane::Ci => format!("{}.retry.{tier_ms}", self.prefix),
            Lane::Samples => format!("{}.retry.samples.{tier_ms}", self.prefix),
        }
    }

    pub fn parking_exchange(&self) -> String {
        format!("{}.parking", self.prefix)
    }

    pub fn parking_queue(&self) -> String {
        format!("{}.parking", self.prefix)
    }

    pub fn events_exchange(&self) -> String {
        format!("{}.events", self.prefix)
    }

    /// The durable queue the coordinator replicas share for case events.
    pub fn coordinator_events_queue(&self) -> String {
        format!("{}.coordinator.events", self.prefix)
    }

    /// Routing key of an event (`case.passed`, ...: the most serious status of its cases);
    /// bind `case.#` for all.
    pub fn event_routing_key(status: skilleval_execution::result::CaseStatus) -> String {
        format!("case.{}", status.as_str())
    }

    /// The smallest tier not shorter than `delay`, or the largest.
    pub fn tier_for(&self, delay: Duration) -> u64 {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.retry_tiers_ms
            .iter()
            .copied()
            .find(|t| *t >= ms)
            .or_else(|| self.retry_tiers_ms.last().copied())
            .unwrap_or(1_000)
    }

    /// Ready messages and consumers of every queue, as the broker answers a passive declare
    /// (which changes nothing). Unacknowledged messages are not in the count.
    pub async fn queue_depths(&self, ch: &Channel) -> Result<Vec<QueueDepth>, BrokerError> {
        let mut out = Vec::new();
        for queue in self.queues() {
            let q = ch
                .queue_declare(
                    ShortString::from(queue.as_str()),
                    QueueDeclareOptions {
                        passive: true,
                        ..QueueDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .map_err(BrokerError::amqp(format!("reading the depth of `{queue}`")))?;
            out.push(QueueDepth {
                queue,
                ready: q.message_count(),
                consumers: q.consumer_count(),
            });
        }
        Ok(out)
    }

    /// Every queue, for cleanup.
    pub fn queues(&self) -> Vec<String> {
        let mut q = vec![
            self.jobs_queue(),
            self.samples_queue(),
            self.parking_queue(),
            self.coordinator_events_queue(),
        ];
        for lane in [Lane::Ci, Lane::Samples] {
            for tier in &self.retry_tiers_ms {
                q.push(self.retry_queue(lane, *tier));
            }
        }
        q
    }

    /// Every exchange, for cleanup.
    pub fn exchanges(&self) -> Vec<String> {
        vec![
            self.jobs_exchange(),
            self.parking_exchange(),
            self.events_exchange(),
        ]
    }

    /// Declares everything (idempotent).
    pub async fn declare(&self, ch: &Channel) -> Result<(), BrokerError> {
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        for (name, kind) in [
            (self.jobs_exchange(), ExchangeKind::Direct),
            (self.parking_exchange(), ExchangeKind::Fanout),
            (self.events_exchange(), ExchangeKind::Topic),
        ] {
            ch.exchange_declare(
                ShortString::from(name.as_str()),
                kind,
                durable,
                FieldTable::default(),
            )
            .await
            .map_err(BrokerError::amqp(format!("declaring exchange `{name}`")))?;
        }

        let mut jobs_args = FieldTable::default();
        jobs_args.insert("x-queue-type".into(), long_string("quorum"));
        jobs_args.insert(
            "x-dead-letter-exchange".into(),
            long_string(&self.parking_exchange()),
        );
        jobs_args.insert(
            "x-delivery-limit".into(),
            AMQPValue::LongLongInt(i64::from(self.delivery_limit)),
        );
        self.declare_queue(ch, &self.jobs_queue(), jobs_args)
            .await?;

        let mut samples_args = self.base_args();
        samples_args.insert(
            "x-dead-letter-exchange".into(),
            long_string(&self.parking_exchange()),
        );
        self.declare_queue(ch, &self.samples_queue(), samples_args)
            .await?;

        self.bind(
            ch,
            &self.jobs_queue(),
            &self.jobs_exchange(),
            JOB_ROUTING_KEY,
        )
        .await?;
        self.bind(
            ch,
            &self.samples_queue(),
            &self.jobs_exchange(),
            SAMPLE_ROUTING_KEY,
        )
        .await?;

        for lane in [Lane::Ci, Lane::Samples] {
            for tier in &self.retry_tiers_ms {
                let mut args = self.base_args();
                if self.replicated {
                    args.insert(
                        "x-dead-letter-strategy".into(),
                        long_string("at-least-once"),
                    );
                    args.insert("x-overflow".into(), long_string("reject-publish"));
                }
                args.insert(
                    "x-message-ttl".into(),
                    AMQPValue::LongLongInt(i64::try_from(*tier).unwrap_or(i64::MAX)),
                );
                args.insert(
                    "x-dead-letter-exchange".into(),
                    long_string(&self.jobs_exchange()),
                );
                args.insert(
                    "x-dead-letter-routing-key".into(),
                    long_string(lane.routing_key()),
                );
                self.declare_queue(ch, &self.retry_queue(lane, *tier), args)
                    .await?;
            }
        }

        self.declare_queue(ch, &self.parking_queue(), self.base_args())
            .await?;
        self.bind(ch, &self.parking_queue(), &self.parking_exchange(), "")
            .await?;

        let mut events_args = self.base_args();
        events_args.insert(
            "x-max-length".into(),
            AMQPValue::LongLongInt(EVENTS_QUEUE_MAX_LENGTH),
        );
        self.declare_queue(ch, &self.coordinator_events_queue(), events_args)
            .await?;
        self.bind(
            ch,
            &self.coordinator_events_queue(),
            &self.events_exchange(),
            "case.#",
        )
        .await?;
        Ok(())
    }

    /// Deletes everything this topology declares (tests, decommissioning a prefix).
    pub async fn delete(&self, ch: &Channel) -> Result<(), BrokerError> {
        for q in self.queues() {
            ch.queue_delete(ShortString::from(q.as_str()), QueueDeleteOptions::default())
                .await
                .map_err(BrokerError::amqp(format!("deleting queue `{q}`")))?;
        }
        for x in self.exchanges() {
            ch.exchange_delete(
                ShortString::from(x.as_str()),
                ExchangeDeleteOptions::default(),
            )
            .await
            .map_err(BrokerError::amqp(format!("deleting exchange `{x}`")))?;
        }
        Ok(())
    }

    async fn declare_queue(
        &self,
        ch: &Channel,
        name: &str,
        args: FieldTable,
    ) -> Result<(), BrokerError> {
        ch.queue_declare(
            ShortString::from(name),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            args,
        )
        .await
        .map_err(BrokerError::amqp(format!("declaring queue `{name}`")))?;
        Ok(())
    }

    async fn bind(
        &self,
        ch: &Channel,
        queue: &str,
        exchange: &str,
        key: &str,
    ) -> Result<(), BrokerError> {
        ch.queue_bind(
            ShortString::from(queue),
            ShortString::from(exchange),
            ShortString::from(key),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(BrokerError::amqp(format!(
            "binding `{queue}` to `{exchange}`"
        )))
    }
}

fn long_string(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

/// A confirm-mode channel that publishes jobs, retries, parked messages and events. Every
/// publish is persistent and awaited until the broker confirms it; with `mandatory`, a message
/// no queue takes comes back as [`BrokerError::Unroutable`], never as a success. Cheap to clone
/// (clones share the channel).
#[derive(Debug, Clone)]
pub struct Publisher {
    channel: Channel,
    topology: Topology,
    /// Held while a publish (or a batch) queues its messages on the channel, not while it
    /// waits for confirms. lapin takes a message's confirm tag and queues its frames under two
    /// locks, so two tasks publishing at the same instant could send the broker the messages
    /// in another order than their tags; the broker numbers confirms by arrival, and a nack
    /// would then be charged to the wrong message — a run's creation would count the nacked
    /// job's chunk as confirmed and never send that job again. One queueing at a time keeps
    /// tag order and wire order the same.
    order: Arc<tokio::sync::Mutex<()>>,
}

/// One message for [`Publisher::publish`]: persistent, JSON.
#[derive(Debug)]
pub struct Outgoing<'a> {
    pub exchange: &'a str,
    pub routing_key: &'a str,
    pub body: &'a [u8],
    pub headers: FieldTable,
    /// The AMQP `message-id` property (a job's is `<run id>/<test case id>/<attempt>`).
    pub message_id: Option<&'a str>,
    /// A message no queue takes comes back as [`BrokerError::Unroutable`] instead of being
    /// dropped.
    pub mandatory: bool,
}

/// A publish sent and not yet confirmed.
#[derive(Debug)]
pub struct PendingConfirm {
    confirm: PublisherConfirm,
    exchange: String,
    routing_key: String,
}

impl PendingConfirm {
    /// Waits for the broker's answer.
    pub async fn wait(self) -> Result<(), BrokerError> {
        let confirmation = self.confirm.await.map_err(BrokerError::amqp(format!(
            "waiting for the confirm of a publish to `{}`",
            self.exchange
        )))?;
        check_confirmation(confirmation, self.exchange, self.routing_key)
    }
}

fn check_confirmation(
    confirmation: Confirmation,
    exchange: String,
    routing_key: String,
) -> Result<(), BrokerError> {
    match confirmation {
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Ack(Some(returned)) => Err(unroutable(&returned, exchange, routing_key)),
        Confirmation::Nack(_) => Err(BrokerError::Nacked {
            exchange,
            routing_key,
        }),
        Confirmation::NotRequested => Err(BrokerError::NoConfirm { exchange }),
    }
}

fn unroutable(returned: &BasicReturnMessage, exchange: String, routing_key: String) -> BrokerError {
    BrokerError::Unroutable {
        exchange,
        routing_key,
        reply_code: returned.reply_code,
        reply_text: returned.reply_text.to_string(),
    }
}

impl Publisher {
    /// Opens a channel on `conn` and puts it in confirm mode.
    pub async fn open(conn: &Connection, topology: Topology) -> Result<Publisher, BrokerError> {
        let channel = conn
            .create_channel()
            .await
            .map_err(BrokerError::amqp("opening a publishing channel"))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(BrokerError::amqp("enabling publisher confirms"))?;
        Ok(Publisher {
            channel,
            topology,
            order: Arc::new(tokio::sync::Mutex::new(())),
        })
    }

    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    /// Runs `queueing` (sends of one message or of a batch) holding `order`, so no other
    /// publish on the channel interleaves with it; its confirms are awaited after.
    async fn in_order<F: std::future::Future>(&self, queueing: F) -> F::Output {
        let _order = self.order.lock().await;
        queueing.await
    }

    /// Publishes one message and waits for the broker's confirm.
    pub async fn publish(&self, message: Outgoing<'_>) -> Result<(), BrokerError> {
        self.in_order(self.send(message)).await?.wait().await
    }

    /// Sends one message, inside [`Publisher::in_order`]; the returned [`PendingConfirm`]
    /// says whether the broker took it.
    async fn send(&self, message: Outgoing<'_>) -> Result<PendingConfirm, BrokerError> {
        let Outgoing {
            exchange,
            routing_key,
            body,
            headers,
            message_id,
            mandatory,
        } = message;
        // The publish time (AMQP timestamps are whole seconds): consumers measure how long a
        // message waited in its queue from it.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type(ShortString::from("application/json"))
            .with_timestamp(now)
            .with_headers(headers);
        if let Some(id) = message_id {
            properties = properties.with_message_id(ShortString::from(id));
        }
        let confirm = self
            .channel
            .basic_publish(
                ShortString::from(exchange),
                ShortString::from(routing_key),
                BasicPublishOptions {
                    mandatory,
                    ..BasicPublishOptions::default()
                },
                body,
                properties,
            )
            .await
            .map_err(BrokerError::amqp(format!("publishing to `{exchange}`")))?;
        Ok(PendingConfirm {
            confirm,
            exchange: exchange.to_string(),
            routing_key: routing_key.to_string(),
        })
    }

    /// The headers of a job message: the trace context of the `send` span that publishes it.
    fn trace_headers(span: &tracing::Span) -> FieldTable {
        let mut headers = FieldTable::default();
        if let Some(tp) = crate::telemetry::traceparent(span) {
            headers.insert(TRACEPARENT_HEADER.into(), long_string(&tp));
        }
        headers
    }

    /// Publishes a job to its lane and waits for the confirm.
    pub async fn publish_job(&self, job: &Job, lane: Lane) -> Result<(), BrokerError> {
        self.publish_jobs(std::slice::from_ref(job), lane)
            .await
            .pop()
            .unwrap_or(Ok(()))
    }

    /// Publishes every job, then waits for all the confirms: one round trip for the batch.
    /// Returns, per job in order, whether the broker took it.
    pub async fn publish_jobs(&self, jobs: &[Job], lane: Lane) -> Vec<Result<(), BrokerError>> {
        let mut encoded = Vec::with_capacity(jobs.len());
        let mut failed = Vec::new();
        for (i, job) in jobs.iter().enumerate() {
            match EncodedJob::from_job(job) {
                Ok(e) => encoded.push(e),
                Err(e) => failed.push((i, e)),
            }
        }
        let mut sent = self.publish_encoded(&encoded, lane).await.into_iter();
        let mut failed = failed.into_iter().peekable();
        (0..jobs.len())
            .map(|i| match failed.next_if(|(at, _)| *at == i) {
                Some((_, e)) => Err(BrokerError::from(e)),
                None => sent.next().unwrap_or(Ok(())),
            })
            .collect()
    }

    /// [`Publisher::publish_jobs`] for jobs already encoded (a run's stored rows): one
    /// PRODUCER `send` span for the batch, whose trace context every message carries.
    pub async fn publish_encoded(
        &self,
        jobs: &[EncodedJob],
        lane: Lane,
    ) -> Vec<Result<(), BrokerError>> {
        let exchange = self.topology.jobs_exchange();
        let span = send_span(&exchange, lane.routing_key(), jobs);
        let headers = Self::trace_headers(&span);
        let exchange = exchange.as_str();
        let headers = &headers;
        self.publish_all(
            jobs.iter()
                .map(|job| self.send_job(exchange, lane.routing_key(), job, headers.clone())),
        )
        .instrument(span)
        .await
    }

    /// Sends a job (mandatory, persistent); the confirm is awaited later. Inside
    /// [`Publisher::in_order`].
    async fn send_job(
        &self,
        exchange: &str,
        routing_key: &str,
        job: &EncodedJob,
        headers: FieldTable,
    ) -> Result<PendingConfirm, BrokerError> {
        self.send(Outgoing {
            exchange,
            routing_key,
            body: &job.body,
            headers,
            message_id: Some(&job.message_id()),
            mandatory: true,
        })
        .await
    }

    /// A batch: every send queued in order (one [`Publisher::in_order`]), then every confirm
    /// awaited. Each message's frames are queued before any is awaited: lapin resolves a
    /// `basic_publish` only once its IO thread has written the frames, so awaiting each before
    /// queueing the next cost a hand-off between the two threads per message (the creation of
    /// a 100,000-case run spent more time waiting on that than on its inserts).
    async fn publish_all<F>(&self, sends: impl Iterator<Item = F>) -> Vec<Result<(), BrokerError>>
    where
        F: std::future::Future<Output = Result<PendingConfirm, BrokerError>>,
    {
        let pending = self.in_order(futures::future::join_all(sends)).await;
        Self::confirms(pending).await
    }

    async fn confirms(
        pending: Vec<Result<PendingConfirm, BrokerError>>,
    ) -> Vec<Result<(), BrokerError>> {
        futures::future::join_all(pending.into_iter().map(|sent| async move {
            match sent {
                Ok(p) => p.wait().await,
                Err(e) => Err(e),
            }
        }))
        .await
    }

    /// Publishes a job for a later attempt into the delay queue of `tier_ms` (which dead-letters
    /// it back to the lane's queue when the TTL expires), and waits for the confirm.
    pub async fn publish_retry(
        &self,
        job: &Job,
        lane: Lane,
        tier_ms: u64,
    ) -> Result<(), BrokerError> {
        self.publish_delayed(job, lane, tier_ms, false).await
    }

    /// Puts a job off into the delay queue of `tier_ms` (as [`Publisher::publish_retry`], the
    /// attempt unchanged), marked with [`DEFERRED_HEADER`]: another copy of its case holds
    /// the case's claim, and the worker that gets it back looks again before running it.
    pub async fn publish_deferred(
        &self,
        job: &Job,
        lane: Lane,
        tier_ms: u64,
    ) -> Result<(), BrokerError> {
        self.publish_delayed(job, lane, tier_ms, true).await
    }

    async fn publish_delayed(
        &self,
        job: &Job,
        lane: Lane,
        tier_ms: u64,
        deferred: bool,
    ) -> Result<(), BrokerError> {
        let encoded = EncodedJob::from_job(job)?;
        let queue = self.topology.retry_queue(lane, tier_ms);
        // The default exchange routes by queue name.
        let span = send_span("", &queue, std::slice::from_ref(&encoded));
        let mut headers = Self::trace_headers(&span);
        if deferred {
            headers.insert(DEFERRED_HEADER.into(), AMQPValue::Boolean(true));
        }
        async {
            let sent = self
                .in_order(self.send_job("", &queue, &encoded, headers))
                .await?;
            sent.wait().await
        }
        .instrument(span)
        .await
    }

    /// Parks a message that could not be handled, with the reason in its headers.
    pub async fn publish_parked(
        &self,
        body: &[u8],
        reason: &str,
        from_queue: &str,
        original_headers: Option<&FieldTable>,
    ) -> Result<(), BrokerError> {
        let mut headers = original_headers.cloned().unwrap_or_default();
        headers.insert(PARKED_REASON_HEADER.into(), long_string(reason));
        headers.insert(PARKED_FROM_HEADER.into(), long_string(from_queue));
        self.publish(Outgoing {
            exchange: &self.topology.parking_exchange(),
            routing_key: "",
            body,
            headers,
            message_id: None,
            mandatory: true,
        })
        .await
    }

    /// Announces finished cases, one message per run (pipelined; see [`CasesFinished`]).
    /// Not `mandatory`: an events exchange nobody listens to is not an error (the
    /// coordinator's sweep catches up). One outcome per message sent.
    pub async fn publish_events(&self, cases: &[CaseFinished]) -> Vec<Result<(), BrokerError>> {
        let exchange = self.topology.events_exchange();
        let events = CasesFinished::group(cases.iter().cloned());
        self.publish_all(events.iter().map(|event| {
            let exchange = &exchange;
            async move {
                let key = Topology::event_routing_key(event.worst_status());
                let body = event.encode()?;
                self.send(Outgoing {
                    exchange,
                    routing_key: &key,
                    body: &body,
                    headers: FieldTable::default(),
                    message_id: None,
                    mandatory: false,
                })
                .await
            }
        }))
        .await
    }
}

/// (Integers are recorded as `i64`: `tracing-opentelemetry` exports unsigned ones as text.)
///
/// The PRODUCER span of one publish of jobs (a batch, or a retry's one message), following the
/// messaging semantic conventions. A batch's span names its size; the message id, the test
/// case and the attempt are named only for a single message, the run when all are of one run.
fn send_span(exchange: &str, routing_key: &str, jobs: &[EncodedJob]) -> tracing::Span {
    // RabbitMQ's default exchange has the empty name; the conventions call it `amq.default`.
    let destination = if exchange.is_empty() {
        "amq.default"
    } else {
        exchange
    };
    let span = tracing::info_span!(
        "send",
        otel.name = %format_args!("send {destination}"),
        otel.kind = "producer",
        messaging.system = "rabbitmq",
        messaging.operation.type = "send",
        messaging.operation.name = "send",
        messaging.destination.name = destination,
        messaging.rabbitmq.destination.routing_key = routing_key,
        messaging.batch.message_count = tracing::field::Empty,
        messaging.message.id = tracing::field::Empty,
        skilleval.run_id = tracing::field::Empty,
        skilleval.test_case_id = tracing::field::Empty,
        skilleval.attempt = tracing::field::Empty,
    );
    match jobs {
        [job] => {
            span.record("messaging.message.id", job.message_id().as_str());
            span.record("skilleval.run_id", tracing::field::display(job.run_id));
            span.record("skilleval.test_case_id", job.test_case_id.as_str());
            span.record("skilleval.attempt", i64::from(job.attempt));
        }
        [first, rest @ ..] => {
            span.record(
                "messaging.batch.message_count",
                i64::try_from(jobs.len()).unwrap_or(i64::MAX),
            );
            if rest.iter().all(|j| j.run_id == first.run_id) {
                span.record("skilleval.run_id", tracing::field::display(first.run_id));
            }
        }
        [] => {}
    }
    span
}

/// A text header value (long or short string), as the broker or a publisher set it.
pub fn header_text(v: &AMQPValue) -> Option<String> {
    match v {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.to_string()),
        _ => None,
    }
}

/// An integer header value of any width (RabbitMQ's `x-delivery-count` and `x-death` counts
/// come in different ones depending on the client that set them).
pub fn header_integer(v: &AMQPValue) -> Option<i64> {
    match v {
        AMQPValue::ShortShortInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortShortUInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortUInt(n) => Some(i64::from(*n)),
        AMQPValue::LongInt(n) => Some(i64::from(*n)),
        AMQPValue::LongUInt(n) => Some(i64::from(*n)),
        AMQPValue::LongLongInt(n) => Some(*n),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_derive_from_the_prefix() {
        let t = Topology::new("p", vec![5_000, 1_000, 30_000], 10);
        assert_eq!(t.jobs_queue(), "p.jobs");
        assert_eq!(t.samples_queue(), "p.jobs.samples");
        assert_eq!(t.retry_queue(Lane::Ci, 1_000), "p.retry.1000");
        assert_eq!(t.retry_queue(Lane::Samples, 1_000), "p.retry.samples.1000");
        assert_eq!(t.parking_queue(), "p.parking");
        assert_eq!(t.events_exchange(), "p.events");
        assert_eq!(t.retry_tiers_ms(), &[1_000, 5_000, 30_000]);
        assert_eq!(t.queues().len(), 4 + 6);
    }

    #[test]
    fn a_delay_goes_to_the_smallest_tier_that_fits() {
        let t = Topology::new("p", vec![1_000, 5_000, 30_000], 10);
        assert_eq!(t.tier_for(Duration::from_millis(10)), 1_000);
        assert_eq!(t.tier_for(Duration::from_millis(1_000)), 1_000);
        assert_eq!(t.tier_for(Duration::from_millis(1_001)), 5_000);
        assert_eq!(t.tier_for(Duration::from_secs(600)), 30_000);
    }
}
