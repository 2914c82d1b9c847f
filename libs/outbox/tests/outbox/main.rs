//! The outbox against a real PostgreSQL and a real Apache Kafka, one test binary
//! (one link of the crate and its dependencies) with a module per area.

mod cluster;
mod common;
mod consumer;
mod crash;
mod dead_letters;
mod handover;
mod health;
mod relay;
