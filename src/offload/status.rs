//! What the offload engine reports about a table: the status of its offload passes (Pulsar's
//! `OffloadProcessStatus` plus lag and progress) and the `lake` object of topic stats.

use serde::Serialize;

use super::{MessageIdJson, OffloadState};

/// Offload status of a table (Pulsar's `OffloadProcessStatus` plus ledgerlake's details).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OffloadStatus {
    /// NOT_RUN / RUNNING / SUCCESS / ERROR.
    pub status: OffloadState,
    /// Last error ("" when none).
    pub last_error: String,
    /// First message not yet in the lake (`None`: everything is).
    pub first_unoffloaded_message: Option<MessageIdJson>,
    /// Last message committed to the lake.
    pub last_offloaded_message: Option<MessageIdJson>,
    /// Bytes in the log not yet in the lake (open ledger included).
    pub offload_lag_bytes: u64,
    /// Age of the oldest message not yet in the lake.
    pub offload_lag_seconds: f64,
    /// Passes completed.
    pub runs: u64,
    /// Highest manual-request ticket whose pass has finished.
    pub completed_request: u64,
    /// A manual request has not finished yet.
    pub request_pending: bool,
    /// Entries read by the current (or last) pass.
    pub progress_entries: u64,
    /// Payload bytes read by the current (or last) pass.
    pub progress_bytes: u64,
    /// Ledgers committed since start.
    pub committed_ledgers: u64,
    /// Rows committed since start.
    pub committed_rows: u64,
    /// Rows whose payload did not decode against the topic schema, since start.
    pub bad_payloads: u64,
    /// Snapshot of the last commit.
    pub last_snapshot_id: Option<i64>,
    /// Retention: ledgers expired since start, and the table files and rows removed for them.
    pub retention: RetentionStats,
}

/// What retention removed since start.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RetentionStats {
    /// Ledgers expired (log and lake).
    pub expired_ledgers: u64,
    /// Data files removed from the table.
    pub removed_files: u64,
    /// Rows in them.
    pub removed_rows: u64,
    /// The last retention snapshot.
    pub last_snapshot_id: Option<i64>,
    /// Why the last removal from the table failed ("" when it did not); retried on the next
    /// pass. Offload itself is not affected.
    pub last_error: String,
}

/// The `lake` object in topic stats.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LakeStats {
    /// Catalog name.
    pub catalog: String,
    /// Full Iceberg identifier, dot-joined (`tenant.namespace.table`).
    pub table: String,
    /// Namespace levels.
    pub namespace: Vec<String>,
    /// Table name.
    pub table_name: String,
    /// Whether the table exists yet (it is created by the first offload).
    pub table_exists: bool,
    /// Table location.
    pub location: Option<String>,
    /// Current snapshot.
    pub snapshot_id: Option<i64>,
    /// Last message committed to the lake.
    pub last_offloaded_message_id: Option<MessageIdJson>,
    /// Bytes not yet in the lake.
    pub offload_lag_bytes: u64,
    /// Age of the oldest message not yet in the lake.
    pub offload_lag_seconds: f64,
    /// Offload status.
    pub status: OffloadState,
    /// Last error.
    pub last_error: String,
    /// Rows flagged with a decode error since start.
    pub bad_payloads: u64,
}
