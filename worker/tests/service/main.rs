//! Service tests of the worker against the real PostgreSQL and RabbitMQ of this machine.
//! Each test has its own database and queue prefix (see [`helpers`]).

mod helpers;

mod acks;
mod consumer_timeout;
mod faults;
mod llm;
mod pipeline;
mod processes;
mod sampling;
mod sandbox;
mod schema;
mod tls;
