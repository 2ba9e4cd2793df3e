//! What the removal (`super::expire`), its finish (`super::finish`) and routine expiry
//! (`super::history`) share about snapshots: the summary key that marks a removal, the
//! snapshots that head a ref, and expiring snapshots by id. A leaf: it imports none of them.

use std::collections::BTreeSet;

use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};

use super::{Lake, LakeError};

/// Snapshot-summary key listing the ledgers whose rows a retention snapshot removed.
pub const EXPIRED_KEY: &str = "ledgerlake.expired-ledgers";

/// Snapshots that head a branch or a tag (iceberg-rust has no public accessor for refs: they
/// are read from the metadata's JSON form).
pub(super) fn ref_heads(metadata: &iceberg::spec::TableMetadata) -> BTreeSet<i64> {
    serde_json::to_value(metadata)
        .ok()
        .and_then(|v| v.get("refs").cloned())
        .and_then(|r| r.as_object().cloned())
        .map(|refs| {
            refs.values()
                .filter_map(|r| r.get("snapshot-id").and_then(|id| id.as_i64()))
                .collect()
        })
        .unwrap_or_default()
}

/// Expires `ids` through iceberg's `expire_snapshots` (metadata only); nothing to do for none.
pub(super) async fn expire_snapshot_ids(
    lake: &Lake,
    table: Table,
    ids: Vec<i64>,
) -> Result<Table, LakeError> {
    if ids.is_empty() {
        return Ok(table);
    }
    let tx = Transaction::new(&table);
    let tx = tx
        .expire_snapshots()
        .expire_snapshot_ids(ids)
        .apply(tx)
        .map_err(LakeError::iceberg("expiring snapshots"))?;
    lake.commit(tx, &table)
        .await
        .map_err(LakeError::iceberg("committing snapshot expiry"))
}
