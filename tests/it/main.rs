//! The integration test binary (one binary for all integration tests, to build and link once).
//!
//! Every test binds only to 127.0.0.1, works in its own temporary directory and stops every
//! process it starts, by PID.

mod common;
mod hostile_bytes;
mod ledger_corruption;
mod ledger_crash;
mod offload;
mod perf_cli;
mod pinned_commit;
mod pulsar_rs;
mod replay;
mod serve;
