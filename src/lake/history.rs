//! Routine snapshot expiry. Every offload commit adds a snapshot, and every metadata file
//! lists all snapshots, so without expiry a busy table (up to a commit a second) would carry
//! millions of them and rewrite them all at each commit.
//!
//! After an offload commit, snapshots older than the table's
//! `history.expire.max-snapshot-age-ms` are expired through iceberg's `expire_snapshots`, which
//! keeps the newest `history.expire.min-snapshots-to-keep` (Iceberg's default 1) and every head
//! of a branch or tag. When the table does not set the age, ours is 1 day rather than Iceberg's 5
//! days (sized for batch writers). Users change either property with any Iceberg engine.
//!
//! Invariants:
//! - Metadata only: an append snapshot removes no file, so nothing is deleted here (files
//!   dropped by retention's `delete` snapshots are retention's to delete, leftovers the orphan
//!   sweep's). Manifests of expired snapshots stay in `metadata/`.
//! - Exactly-once is unaffected: every snapshot of ours carries the table's whole watermark.
//! - At most one expiry commit per [`MIN_EXPIRABLE`] offload commits, so expiry adds little to
//!   the catalog's load.

use std::collections::BTreeSet;

use iceberg::spec::TableMetadata;
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};

use super::{snapshots, Lake, LakeError};

/// Table property: snapshots older than this many milliseconds expire.
pub const MAX_AGE_PROPERTY: &str = "history.expire.max-snapshot-age-ms";
/// Table property: the newest snapshots always kept.
pub const MIN_KEEP_PROPERTY: &str = "history.expire.min-snapshots-to-keep";
/// Age used when the table does not set [`MAX_AGE_PROPERTY`]: 1 day.
pub const DEFAULT_MAX_AGE_MS: i64 = 24 * 60 * 60 * 1000;
/// Table property: `false` forbids expiry (and every other garbage collection).
pub const GC_ENABLED_PROPERTY: &str = "gc.enabled";
/// Expiry waits until this many snapshots can go.
pub const MIN_EXPIRABLE: usize = 8;

fn property<T: std::str::FromStr>(metadata: &TableMetadata, key: &str) -> Option<T> {
    metadata.properties().get(key).and_then(|v| v.parse().ok())
}

/// The snapshots, as `(id, timestamp ms)`, that expire at `now_ms` in the simple case (one
/// branch, no per-branch settings): older than `max_age_ms`, not among the newest `min_keep`,
/// not a head.
pub fn expiring(
    snapshots: &[(i64, i64)],
    heads: &BTreeSet<i64>,
    max_age_ms: i64,
    min_keep: usize,
    now_ms: i64,
) -> Vec<i64> {
    let mut by_age = snapshots.to_vec();
    by_age.sort_by_key(|(_, ts)| std::cmp::Reverse(*ts));
    let cutoff = now_ms.saturating_sub(max_age_ms);
    by_age
        .into_iter()
        .skip(min_keep.max(1))
        .filter(|(id, ts)| *ts < cutoff && !heads.contains(id))
        .map(|(id, _)| id)
        .collect()
}

/// Expires `table`'s old snapshots when at least [`MIN_EXPIRABLE`] qualify; returns the table
/// and how many went.
///
/// [`expiring`] only decides whether to run. Which snapshots go is iceberg's choice, by age
/// (the cutoff below, or a branch's own `max-snapshot-age-ms`) and count
/// (`min-snapshots-to-keep`, or a branch's own), along each branch's ancestry.
pub async fn expire_old_snapshots(
    lake: &Lake,
    table: Table,
    now_ms: i64,
) -> Result<(Table, usize), LakeError> {
    let metadata = table.metadata();
    if metadata
        .properties()
        .get(GC_ENABLED_PROPERTY)
        .is_some_and(|v| v.eq_ignore_ascii_case("false"))
    {
        return Ok((table, 0)); // iceberg refuses expiry on such tables
    }
    let max_age = property(metadata, MAX_AGE_PROPERTY).unwrap_or(DEFAULT_MAX_AGE_MS);
    let min_keep = property(metadata, MIN_KEEP_PROPERTY).unwrap_or(1usize);
    let snapshots: Vec<(i64, i64)> = metadata
        .snapshots()
        .map(|s| (s.snapshot_id(), s.timestamp_ms()))
        .collect();
    // Heads can only lower the count, and reading them serialises the whole metadata: count
    // without them first, so most commits stop here cheaply.
    let current: BTreeSet<i64> = metadata.current_snapshot_id().into_iter().collect();
    if expiring(&snapshots, &current, max_age, min_keep, now_ms).len() < MIN_EXPIRABLE {
        return Ok((table, 0));
    }
    let mut heads = snapshots::ref_heads(metadata);
    heads.extend(current);
    if expiring(&snapshots, &heads, max_age, min_keep, now_ms).len() < MIN_EXPIRABLE {
        return Ok((table, 0));
    }
    let before = snapshots.len();
    let tx = Transaction::new(&table);
    let tx = tx
        .expire_snapshots()
        .expire_older_than_ms(now_ms.saturating_sub(max_age))
        .apply(tx)
        .map_err(LakeError::iceberg("expiring old snapshots"))?;
    crate::failpoint::hit("history.before_commit");
    let table = lake
        .commit(tx, &table)
        .await
        .map_err(LakeError::iceberg("committing snapshot expiry"))?;
    crate::failpoint::hit("history.after_commit");
    let after = table.metadata().snapshots().count();
    Ok((table, before.saturating_sub(after)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: i64 = 3_600_000;

    #[test]
    fn old_snapshots_expire_but_the_newest_and_heads_stay() {
        let now = 100 * H;
        // Ids 1..=6, one an hour, the newest at `now`.
        let snaps: Vec<(i64, i64)> = (1..=6).map(|i| (i, now - (6 - i) * H)).collect();
        let none = BTreeSet::new();
        // Older than 2 h: ids 1, 2, 3 (5, 4 and 3 hours old).
        assert_eq!(expiring(&snaps, &none, 2 * H + 1, 1, now), vec![3, 2, 1]);
        // The newest 5 are kept whatever their age.
        assert_eq!(expiring(&snaps, &none, 0, 5, now), vec![1]);
        // A head of a branch or tag stays.
        let heads: BTreeSet<i64> = [2].into();
        assert_eq!(expiring(&snaps, &heads, 2 * H + 1, 1, now), vec![3, 1]);
        // min_keep 0 still keeps the current snapshot.
        assert_eq!(expiring(&snaps, &none, 0, 0, now).len(), 5);
        // Nothing is old enough.
        assert!(expiring(&snaps, &none, 10 * H, 1, now).is_empty());
    }
}
