//! # ledgerlake
//!
//! A single-binary streaming service for infinite-retention topics: Pulsar clients produce and
//! consume through a built-in broker, every message is written durably to a built-in segmented
//! log, sealed ledgers are offloaded to Apache Iceberg tables, and SQL reads lake and live tail
//! together.
//!
//! # Architecture map
//!
//! ```text
//!  Pulsar clients ──► protocol/ ──► broker/ ──append──► ledger/ (journal + segments + index)
//!                                     │  ▲                  │ sealed ledgers
//!                                     │  └──── replay/ ◄────┤
//!                                     │          ▲          ▼
//!  psql / HTTP / CLI ──► sql/ ────────┘          └──── lake/ ◄── offload/
//!                                                   (Iceberg on S3 or local disk)
//!  admin/ (HTTP: health, admin API)   config/ (typed, layered)   cli/ (clap)   telemetry
//! ```
//!
//! Modules present today:
//! - [`config`]: the typed configuration tree and its layered loading.
//! - [`ledger`]: the durable segmented log (journal with group commit, segments, indexes,
//!   recovery, metadata store seam).
//! - [`admin`]: the HTTP surface (health, topic partitions, offload and stats, namespace
//!   offload policies).
//! - [`lake`]: Iceberg tables of topics: catalog, warehouse storage, layout, rows, the
//!   exactly-once commit protocol and orphan cleanup.
//! - [`offload`]: the engine that moves sealed ledgers into the lake by namespace policy.
//! - [`policies`]: namespace policies (stored, cached, with configured defaults).
//! - [`replay`]: entries by position from the local log or the lake (consumers of offloaded
//!   ranges), with read-ahead budgets and its own runtime.
//! - [`failpoint`]: named crash points for tests (debug builds only).
//! - [`cli`]: the `ledgerlake` command line.
//! - [`perf`]: load generators behind `ledgerlake perf`.
//! - [`protocol`]: the Pulsar binary protocol (generated types, framing).
//! - [`service`]: wiring of a running service and its ordered shutdown.
//! - [`telemetry`]: logging setup.
//! - [`sql`]: DataFusion over each topic (lake snapshot + live tail at one seam), read-only,
//!   for PostgreSQL clients, HTTP `POST /sql` and `ledgerlake sql`.
//!
//! - [`broker`]: the Pulsar-protocol broker (topics, producers, subscriptions, cursors, schemas).
//!
//! # Errors
//! Each module has its own `thiserror` enums (one per operation where callers act differently);
//! `anyhow` appears only in `main.rs` and [`cli`]. Errors map to a wire surface in one place per
//! surface.
#![forbid(unsafe_code)]

pub mod admin;
pub mod auth;
pub mod broker;
pub mod cli;
pub mod config;
pub mod failpoint;
pub mod lake;
pub mod ledger;
pub mod naming;
pub mod offload;
pub mod ops;
pub mod perf;
pub mod policies;
pub mod protocol;
pub mod replay;
pub mod schema;
pub mod service;
pub mod sql;
pub mod telemetry;
