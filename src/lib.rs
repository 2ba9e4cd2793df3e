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
//!                                     │ owns topics via cluster/ (membership, ownership,
//!                                     │ failure detection) ──► coord; takes over the idle
//!                                     │ topics of dead writers (broker/orphans)
//!                                     │ positions           ▲ sealed ledgers
//!                                     ▼                     │
//!  psql / HTTP ──► sql/ ──────────► replay/ ─── log or lake ┤
//!                                     │                     │
//!                                     └──► lake/ ◄── offload/ (policy, scheduler, watermark)
//!                                      (Iceberg; LakeHandle owns the runtime hop)
//!  other nodes ◄──► bookie/ (node-to-node reads and replicated adds; protocol/bookie frames)
//!                   ──► ledger (serves its ledgers and replica copies; reads others' and sends
//!                   entries to replicas through ledger::ReplicaSource), cluster (addresses);
//!                   autorecovery copies under-replicated sealed ledgers here; with
//!                   authentication on, connections say hello with a superuser token (auth)
//!  HTTP ──► admin/ ──► ops/ (use cases) ──► broker, ledger, offload, policies, tenancy, sql,
//!                                            verify/ (log ⇄ lake, every id) ──► ledger, lake
//!  every surface ──► auth (Access: Authenticator + Authorizer ◄── tenancy's authorizer)
//!  leaves used by all: naming, schema, config, failpoint, telemetry, tls, metrics, coord,
//!  versioned ([format byte][JSON] records), cached (records cache of policies and tenancy)
//!  (metadata store and coordination: SQLite or in process on one node, etcd in a cluster)
//! ```
//!
//! Imports flow one way: `naming` ← every layer; `protocol` ← `broker`; `broker` → `ledger`,
//! `replay`; `replay` → `ledger`, `lake`; `offload` → `ledger`, `lake`; `sql` → `replay`,
//! `lake`, `ledger`; `tenancy` → `auth`, `ledger`; `broker` → `tenancy`; `ops` → `broker`,
//! `ledger`, `offload`, `policies`, `tenancy`, `sql`, `verify`, `cluster`; `verify` → `ledger`,
//! `lake`; `broker` → `cluster`; `cluster` → `coord`; `bookie` → `ledger`, `protocol`,
//! `cluster`, `auth`, `tls` (the service hands the log a `bookie` client as its `ReplicaSource`);
//! `admin` → `ops`.
//! `lake` → `ledger`, `policies` (which table holds a topic: `lakeTableLayout`).
//! The lake imports neither the broker nor the offload engine.
//!
//! Modules:
//! - [`naming`]: topic and namespace names, the schema-version codec (the leaf).
//! - [`config`]: the typed configuration tree and its layered loading.
//! - [`versioned`]: the `[format byte][JSON]` encoding of small persisted records.
//! - [`cluster`]: what a node knows of the others, over [`coord`]: membership (the live nodes
//!   read from a watch-fed roster), topic ownership (one owner per partition with an epoch;
//!   LOOKUP places and redirects by it), and failure detection (a peer whose listeners refuse
//!   has its session ended at once).
//! - [`coord`]: the coordination seam a cluster's nodes agree through (compare-and-set,
//!   sessions with ephemeral keys, watches), on etcd or in process; no consensus of our own.
//! - [`ledger`]: the durable segmented log (journal with group commit, segments, indexes,
//!   recovery, cursors, metadata store seam); only the topics the broker has loaded stay in
//!   its memory, background work reads uncached views.
//! - [`protocol`]: the Pulsar binary protocol (generated types, framing, typed commands) and
//!   the node-to-node bookie protocol's frames.
//! - [`bookie`]: the `--bookie-addr` listener serving this node's ledgers to the other nodes
//!   and storing the entries their replicated ledgers send here, the client reading theirs
//!   and streaming this node's entries to its ledgers' replicas, and autorecovery (sealed
//!   ledgers short of their write quorum copied here from the bookies still holding them);
//!   plain TCP or TLS (`server.bookie_tls`), peers reached by named listeners (ADR 0013).
//! - [`broker`]: the Pulsar-protocol broker (topic slots, one owner task per loaded topic
//!   partition, connections with one handler per command and a bounded outbound queue whose
//!   writability dispatchers respect ([`broker::outbox`]), subscriptions, deduplication, the
//!   `ServerError` mapping; idle topics unloaded so that only active ones cost memory).
//! - [`replay`]: the one reader of positions: entries from the local log or the lake, for
//!   subscriptions, the deduplication fold and the SQL tail.
//! - [`lake`]: Iceberg tables of topics: catalog, storage, layout, rows, the exactly-once commit
//!   protocol (every commit pinned to the table version it was built on, [`lake::Lake::commit`]),
//!   orphan cleanup and the lake runtime hop ([`lake::LakeHandle`]).
//! - [`offload`]: the engine that moves sealed ledgers into the lake by namespace policy.
//! - [`policies`]: namespace and topic policies (stored, cached, with configured defaults).
//! - [`tenancy`]: tenants, namespaces, clusters and permissions (stored, cached), and the
//!   authorizer that applies Pulsar's rules with them.
//! - `cached`: the generation-guarded record cache of both; in a cluster the operations
//!   layer forgets what the metadata store's policies feed reports another node changed
//!   (`ops/follow.rs`).
//! - [`schema`]: the schema registry (versions, compatibility).
//! - [`auth`]: who is asking and whether they may ([`auth::Access`]), for every surface.
//! - [`sql`]: DataFusion over each topic (lake snapshot + live tail at one seam), read-only,
//!   for PostgreSQL clients, HTTP `POST /sql` and `ledgerlake sql`; queries run on their own
//!   low-priority threads, sessions and cancels on another runtime.
//! - [`ops`]: the operations layer the admin API calls.
//! - [`verify`]: whether a topic's messages are held exactly once across log and lake (every
//!   id read in both tiers, against the ledgers' records, the watermark and the snapshots'
//!   recorded ranges), for `ledgerlake verify`.
//! - [`admin`]: the HTTP surface (health, `/metrics`, admin API, `POST /sql`).
//! - [`memory`]: handing freed memory back to the system (how: the binary's choice).
//! - [`metrics`]: meters and Pulsar-style histograms the broker records into, ledgerlake's
//!   node-wide families, and the Prometheus text of a scrape (a leaf).
//! - [`service`]: wiring of a running service and its ordered shutdown.
//! - [`failpoint`]: named crash and stall points for tests (debug builds only).
//! - [`cli`]: the `ledgerlake` command line.
//! - [`perf`]: load generators behind `ledgerlake perf`.
//! - [`telemetry`]: logging setup.
//! - [`tls`]: rustls server configuration from PEM files and TLS listeners (handshakes off the
//!   accept loop) for `pulsar+ssl://`, `https://`, PostgreSQL SSL and the bookie listener,
//!   and the client configuration nodes dial TLS bookies with.
//!
//! # Errors
//! Each module has its own `thiserror` enums (one per operation where callers act differently);
//! `anyhow` appears only in `main.rs` and [`cli`]. Errors map to a wire surface in one place per
//! surface.
#![forbid(unsafe_code)]

pub mod admin;
pub mod auth;
pub mod bookie;
pub mod broker;
pub(crate) mod cached;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod coord;
pub mod dir_lock;
pub mod failpoint;
pub mod lake;
pub mod ledger;
pub mod memory;
pub mod metrics;
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
pub mod tenancy;
pub mod tls;
pub mod verify;
pub mod versioned;
