//! Integration tests of the coordinator against the real PostgreSQL and RabbitMQ: one test
//! binary, one module per area. Every test gets its own database (random name, dropped WITH
//! (FORCE) at the end) and its own queue prefix (queues and exchanges deleted at the end).

// Tests may unwrap: a failure is the test failing.
#![allow(clippy::unwrap_used)]

mod aggregate;
mod blind;
mod browser;
mod budget;
mod cache_deletion;
mod cache_sweep;
mod collisions;
mod collisions_agent;
mod deploy;
mod e2e;
mod e2e_agent;
mod e2e_llm;
mod editor;
mod gate;
mod helpers;
mod lifecycle;
mod lists;
mod matrix;
mod migrate;
mod monitoring;
mod nul;
mod openapi;
mod otlp;
mod packages;
mod parked;
mod publish;
mod reports;
mod rescore;
mod risk;
mod runs;
mod sampling;
mod sequence;
mod skill_creator;
mod submit;
mod tenancy;
mod tls;
mod ui;
mod upload;
mod variants;
mod versions;
mod webhooks;
mod zod;
