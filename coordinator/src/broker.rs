//! The coordinator's side of RabbitMQ: a [`JobSink`] over the shared confirm-mode
//! [`Publisher`], and the loop that consumes case events.
//!
//! Both reconnect on their own: a publish that finds the connection gone drops it and the next
//! one reconnects (the rows stay unpublished until then, and the sweeper retries them); the
//! events loop reconnects with backoff when its consumer stream ends. A lost broker therefore
//! degrades readiness, never correctness.
//!
//! With several broker addresses (a cluster), every connection of the process goes through
//! one shared [`BrokerNodes`]: a reconnect after a lost node tries the other nodes first, and
//! readiness names the node the process is on. A chunk whose confirms were cut off by the loss
//! is not confirmed, so its watermark does not move and it is published again through the new
//! node; the copies that did arrive are recorded once (results are keyed by run and case).

use std::sync::Arc;

use anyhow::Context as _;
use async_trait::async_trait;
use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::Connection;
use skilleval_infra::config::Settings;
use skilleval_infra::failover::{Backoff, BrokerNodes};
use skilleval_infra::messages::{CasesFinished, EncodedJob};
use skilleval_infra::topology::{self, Lane, Publisher, QueueDepth, Topology};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::aggregate::RunAggregator;
use crate::jobs::{JobSink, PublishError};

/// Events handled at once by one coordinator (the events queue's prefetch).
const EVENTS_PREFETCH: u16 = 32;

/// A connection and its confirm-mode publisher, replaced when the connection dies.
#[derive(Debug)]
struct Link {
    connection: Connection,
    publisher: Publisher,
    /// The node it is connected to, in [`BrokerNodes`].
    node: usize,
}

/// Publishes jobs through the topology's publisher, reconnecting when needed.
#[derive(Debug)]
pub struct BrokerJobSink {
    settings: Settings,
    topology: Topology,
    nodes: Arc<BrokerNodes>,
    link: Mutex<Option<Link>>,
}

impl BrokerJobSink {
    /// Connects to one of `nodes`, declares the topology (idempotent) and opens the publisher.
    pub async fn connect(
        settings: &Settings,
        nodes: Arc<BrokerNodes>,
    ) -> anyhow::Result<Arc<BrokerJobSink>> {
        let sink = BrokerJobSink {
            settings: settings.clone(),
            topology: Topology::from_settings(settings),
            nodes,
            link: Mutex::new(None),
        };
        let link = sink.open().await?;
        *sink.link.lock().await = Some(link);
        Ok(Arc::new(sink))
    }

    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    async fn open(&self) -> anyhow::Result<Link> {
        let topology::Connected { connection, node } =
            topology::connect_any(&self.settings, &self.nodes, "skilleval-coordinator")
                .await
                .context("connecting to RabbitMQ")?;
        let channel = connection
            .create_channel()
            .await
            .context("opening a channel to declare the topology")?;
        self.topology
            .declare(&channel)
            .await
            .context("declaring the topology")?;
        let _ = channel.close(200, "declared".into()).await;
        let publisher = Publisher::open(&connection, self.topology.clone())
            .await
            .context("opening the publisher")?;
        Ok(Link {
            connection,
            publisher,
            node,
        })
    }

    /// The publisher, reconnecting first when the connection or channel is gone.
    async fn publisher(&self) -> anyhow::Result<Publisher> {
        let mut link = self.link.lock().await;
        let healthy = link.as_ref().is_some_and(|l| {
            l.connection.status().connected() && l.publisher.channel().status().connected()
        });
        if !healthy {
            if let Some(lost) = link.take() {
                self.nodes.lost(lost.node);
                tracing::warn!(
                    node = self.nodes.label(lost.node),
                    "the publishing connection is gone; reconnecting"
                );
            }
            *link = Some(self.open().await?);
        }
        link.as_ref()
            .map(|l| l.publisher.clone())
            .context("no broker link after reconnecting")
    }
}

#[async_trait]
impl JobSink for BrokerJobSink {
    async fn publish(&self, jobs: &[EncodedJob], lane: Lane) -> Vec<Result<(), PublishError>> {
        let publisher = match self.publisher().await {
            Ok(p) => p,
            Err(e) => {
                let reason: Arc<str> = format!("{e:#}").into();
                return jobs
                    .iter()
                    .map(|_| Err(PublishError::Unavailable(Arc::clone(&reason))))
                    .collect();
            }
        };
        publisher
            .publish_encoded(jobs, lane)
            .await
            .into_iter()
            .map(|r| r.map_err(|e| PublishError::Refused(Arc::new(e))))
            .collect()
    }

    async fn check(&self) -> Result<(), PublishError> {
        self.publisher()
            .await
            .map(|_| ())
            .map_err(|e| PublishError::Unavailable(format!("{e:#}").into()))
    }

    async fn queue_depths(&self) -> Option<Result<Vec<QueueDepth>, String>> {
        Some(self.read_depths().await.map_err(|e| format!("{e:#}")))
    }

    async fn node(&self) -> Option<String> {
        let link = self.link.lock().await;
        link.as_ref()
            .filter(|l| l.connection.status().connected())
            .map(|l| self.nodes.label(l.node).to_string())
    }

    async fn republish(&self, from_queue: &str, body: &[u8]) -> Result<(), PublishError> {
        let publisher = self
            .publisher()
            .await
            .map_err(|e| PublishError::Unavailable(format!("{e:#}").into()))?;
        let refused = |e| PublishError::Refused(Arc::new(e));
        match skilleval_infra::messages::decode_job(body) {
            Ok(job) => {
                let lane = if from_queue == self.topology.samples_queue() {
                    Lane::Samples
                } else {
                    Lane::Ci
                };
                publisher.publish_job(&job, lane).await.map_err(refused)
            }
            // Not a job: back where it came from, as it was (the default exchange routes by
            // queue name).
            Err(_) => publisher
                .publish(topology::Outgoing {
                    exchange: "",
                    routing_key: from_queue,
                    body,
                    headers: FieldTable::default(),
                    message_id: None,
                    mandatory: true,
                })
                .await
                .map_err(refused),
        }
    }
}

impl BrokerJobSink {
    /// Passive declares of every queue, on a channel of its own (a failed one closes only it).
    async fn read_depths(&self) -> anyhow::Result<Vec<QueueDepth>> {
        self.publisher().await?;
        let channel = {
            let link = self.link.lock().await;
            link.as_ref()
                .context("no broker link")?
                .connection
                .create_channel()
                .await
                .context("opening a channel to read queue depths")?
        };
        let depths = self.topology.queue_depths(&channel).await;
        let _ = channel.close(200, "depths read".into()).await;
        Ok(depths?)
    }
}

/// What a consumer does with a delivery once its handler is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    Ack,
    /// Rejected without requeueing (the queue's dead-lettering, if any, applies).
    Drop,
    /// Back to the queue, for this or another coordinator to try again.
    Requeue,
}

/// Handles one delivery of a queue the coordinator consumes.
#[async_trait]
pub trait QueueHandler: Send + Sync {
    async fn handle(&self, body: &[u8], headers: Option<&FieldTable>) -> Settle;
}

/// Hands case events to the aggregator.
struct EventsHandler(RunAggregator);

#[async_trait]
impl QueueHandler for EventsHandler {
    async fn handle(&self, body: &[u8], _headers: Option<&FieldTable>) -> Settle {
        match CasesFinished::decode(body) {
            Ok(event) => {
                if let Err(e) = self.0.on_cases_finished(&event).await {
                    // The sweep catches up with this run; requeueing could spin on a bad row.
                    tracing::warn!(run_id = %event.run_id, error = ?e, "handling an event failed; the sweep will catch up");
                }
                Settle::Ack
            }
            Err(e) => {
                tracing::warn!(error = %e, "dropping an unparseable event");
                Settle::Drop
            }
        }
    }
}

/// Consumes case events until `shutdown`, handing each to the aggregator; reconnects with
/// backoff whenever the consumer stream ends or the connection fails.
pub async fn consume_events(
    settings: Settings,
    nodes: Arc<BrokerNodes>,
    aggregator: RunAggregator,
    shutdown: CancellationToken,
) {
    let queue = Topology::from_settings(&settings).coordinator_events_queue();
    consume(
        settings,
        nodes,
        queue,
        "skilleval-coordinator-events",
        EVENTS_PREFETCH,
        EventsHandler(aggregator),
        shutdown,
    )
    .await;
}

/// Consumes `queue` until `shutdown`, settling each delivery as `handler` says; reconnects
/// (to another node first, when the one it was on is lost) with backoff whenever the consumer
/// stream ends or the connection fails.
pub async fn consume(
    settings: Settings,
    nodes: Arc<BrokerNodes>,
    queue: String,
    connection_name: &'static str,
    prefetch: u16,
    handler: impl QueueHandler,
    shutdown: CancellationToken,
) {
    let topology = Topology::from_settings(&settings);
    let mut backoff = Backoff::reconnect();
    while !shutdown.is_cancelled() {
        let mut consumer = Consuming {
            settings: &settings,
            nodes: &nodes,
            topology: &topology,
            queue: &queue,
            connection_name,
            prefetch,
            consumed: false,
        };
        let outcome = consumer.once(&handler, &shutdown).await;
        if consumer.consumed {
            // It worked for a while: this is a new fault, not the same one again.
            backoff.reset();
        }
        match outcome {
            Ok(()) => return,
            Err(e) => {
                let wait = backoff.next_wait();
                tracing::warn!(%queue, error = ?e, retry_in_ms = wait.as_millis() as u64, "consumer stopped; reconnecting");
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
}

struct Consuming<'a> {
    settings: &'a Settings,
    nodes: &'a BrokerNodes,
    topology: &'a Topology,
    queue: &'a str,
    connection_name: &'static str,
    prefetch: u16,
    /// Set once the consumer was registered.
    consumed: bool,
}

impl Consuming<'_> {
    /// One connection's worth of consuming: `Ok` on shutdown, `Err` when the stream ends (the
    /// node it was on is reported lost).
    async fn once(
        &mut self,
        handler: &impl QueueHandler,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<()> {
        let queue = self.queue;
        let topology::Connected { connection, node } =
            topology::connect_any(self.settings, self.nodes, self.connection_name)
                .await
                .with_context(|| format!("connecting to RabbitMQ to consume `{queue}`"))?;
        let outcome = self.on(&connection, handler, shutdown).await;
        if outcome.is_err() {
            self.nodes.lost(node);
        }
        outcome
    }

    async fn on(
        &mut self,
        connection: &Connection,
        handler: &impl QueueHandler,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<()> {
        let queue = self.queue;
        let channel = connection
            .create_channel()
            .await
            .context("opening a consumer channel")?;
        self.topology
            .declare(&channel)
            .await
            .context("declaring the topology")?;
        channel
            .basic_qos(self.prefetch, BasicQosOptions::default())
            .await
            .context("setting the prefetch")?;
        let mut consumer = channel
            .basic_consume(
                ShortString::from(queue),
                ShortString::from(""),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .with_context(|| format!("consuming `{queue}`"))?;
        self.consumed = true;
        tracing::info!(%queue, node = self.nodes.current().unwrap_or("?"), "consuming");
        loop {
            let delivery = tokio::select! {
                () = shutdown.cancelled() => {
                    let _ = connection.close(200, "shutting down".into()).await;
                    return Ok(());
                }
                next = consumer.next() => next,
            };
            let delivery = match delivery {
                Some(Ok(d)) => d,
                Some(Err(e)) => {
                    return Err(e).with_context(|| format!("the consumer of `{queue}` failed"))
                }
                None => anyhow::bail!("the consumer stream of `{queue}` ended"),
            };
            let settle = handler
                .handle(&delivery.data, delivery.properties.headers().as_ref())
                .await;
            let settled = match settle {
                Settle::Ack => delivery.ack(BasicAckOptions::default()).await,
                Settle::Drop | Settle::Requeue => {
                    delivery
                        .nack(BasicNackOptions {
                            requeue: settle == Settle::Requeue,
                            ..BasicNackOptions::default()
                        })
                        .await
                }
            };
            settled.with_context(|| format!("settling a delivery of `{queue}`"))?;
        }
    }
}
