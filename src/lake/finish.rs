//! Finishing removals: the second step of retention (and of a deleted topic's removal from a
//! shared table), after a grace period.
//!
//! A removal's `delete` snapshot ([`super::expire`]) drops files from the table, but every older
//! snapshot still names them: a reader that planned its scan on one of those (our SQL, DuckDB,
//! Trino, PyIceberg; a long query, a time-travel read) reads them later. So the files stay in
//! storage for `lake.removed_file_grace` after the removal's commit; then the snapshots older
//! than the removal are expired and the files it removed that no remaining snapshot names are
//! deleted. A grace of zero finishes at once, in the removal's own pass.
//!
//! Invariants:
//! - A removal snapshot is one of ours: operation `delete` with the
//!   [`super::expire::EXPIRED_KEY`] summary key. It is *unfinished* while a snapshot older than
//!   it (by sequence number, which a table's commits raise whatever the writers' clocks) that
//!   heads no branch or tag remains.
//! - Finishing is decided from the table's metadata alone ([`plan`]): it expires only snapshots
//!   older than a removal whose grace has passed, and deletes only files such a removal
//!   dropped and no remaining snapshot references. It is idempotent: after a crash anywhere,
//!   the next finish does what is left (files of removals already expired are the orphan
//!   sweep's).
//! - Routine expiry ([`super::history`]) waits while a removal is unfinished and not yet ripe
//!   (else it could expire the removal's elders, a day old in an idle table, and the orphan
//!   sweep would take the files within the grace).
//! - Ripeness is judged by the removal's commit time (the committing node's clock) against
//!   this node's clock: clock skew between nodes shortens or lengthens the grace by as much.

use std::collections::BTreeSet;
use std::time::Duration;

use iceberg::spec::{ManifestStatus, Operation, TableMetadata};
use iceberg::table::Table;
use object_store::ObjectStoreExt;

use super::snapshots::{expire_snapshot_ids, ref_heads, EXPIRED_KEY};
use super::{orphans, Lake, LakeError};

/// What the metadata says of one snapshot, for [`plan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotFacts {
    /// Snapshot id.
    pub id: i64,
    /// Sequence number (order of commits).
    pub seq: i64,
    /// Commit time, ms since the epoch.
    pub ts_ms: i64,
    /// A removal of ours (see the module's invariants).
    pub removal: bool,
}

/// What one finish does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FinishPlan {
    /// Snapshots to expire: every one older than the newest ripe removal, except heads.
    pub expire: Vec<i64>,
    /// Removals whose dropped files may be deleted once `expire` is done (the newest ripe
    /// one and every older removal still in the table).
    pub removals: Vec<i64>,
    /// When the next removal left unfinished ripens, ms since the epoch.
    pub next_due_ms: Option<i64>,
}

/// Facts of `metadata`'s snapshots.
pub fn facts(metadata: &TableMetadata) -> Vec<SnapshotFacts> {
    metadata
        .snapshots()
        .map(|s| {
            let summary = s.summary();
            SnapshotFacts {
                id: s.snapshot_id(),
                seq: s.sequence_number(),
                ts_ms: s.timestamp_ms(),
                removal: summary.operation == Operation::Delete
                    && summary.additional_properties.contains_key(EXPIRED_KEY),
            }
        })
        .collect()
}

/// The finish of `snapshots` at `now_ms` with `grace_ms`; `heads` are never expired.
pub fn plan(
    snapshots: &[SnapshotFacts],
    heads: &BTreeSet<i64>,
    grace_ms: i64,
    now_ms: i64,
) -> FinishPlan {
    let has_elder = |r: &SnapshotFacts, left: &dyn Fn(&SnapshotFacts) -> bool| {
        snapshots
            .iter()
            .any(|s| s.seq < r.seq && !heads.contains(&s.id) && left(s))
    };
    let all = |_: &SnapshotFacts| true;
    let through = snapshots
        .iter()
        .filter(|r| r.removal && r.ts_ms.saturating_add(grace_ms) <= now_ms && has_elder(r, &all))
        .map(|r| r.seq)
        .max();
    let expire: Vec<i64> = match through {
        Some(seq) => snapshots
            .iter()
            .filter(|s| s.seq < seq && !heads.contains(&s.id))
            .map(|s| s.id)
            .collect(),
        None => Vec::new(),
    };
    let removals = match through {
        Some(seq) => snapshots
            .iter()
            .filter(|s| s.removal && s.seq <= seq)
            .map(|s| s.id)
            .collect(),
        None => Vec::new(),
    };
    // What the plan keeps: younger than the newest ripe removal, or a head.
    let remains =
        |s: &SnapshotFacts| through.is_none_or(|seq| s.seq >= seq) || heads.contains(&s.id);
    let next_due_ms = snapshots
        .iter()
        .filter(|r| r.removal && remains(r) && has_elder(r, &remains))
        .map(|r| r.ts_ms.saturating_add(grace_ms))
        .min();
    FinishPlan {
        expire,
        removals,
        next_due_ms,
    }
}

/// When the first unfinished removal of `metadata` ripens (ms since the epoch; it may have
/// already): `None` when every removal is finished. Cheap enough for every commit: refs are
/// read (which serialises the metadata) only when some removal has an elder at all.
pub fn due(metadata: &TableMetadata, grace: Duration) -> Option<i64> {
    let snapshots = facts(metadata);
    if !snapshots.iter().any(|s| s.removal) {
        return None;
    }
    let grace = grace_ms(grace);
    plan(&snapshots, &BTreeSet::new(), grace, i64::MIN).next_due_ms?;
    plan(&snapshots, &ref_heads(metadata), grace, i64::MIN).next_due_ms
}

fn grace_ms(grace: Duration) -> i64 {
    i64::try_from(grace.as_millis()).unwrap_or(i64::MAX)
}

/// What one finish did.
#[derive(Debug, Clone, Default)]
pub struct Finished {
    /// Snapshots expired.
    pub snapshots_expired: usize,
    /// Removed files deleted from storage.
    pub files_deleted: usize,
    /// When the next removal left unfinished ripens, ms since the epoch.
    pub next_due_ms: Option<i64>,
}

/// Finishes the removals of `table` whose grace has passed at `now_ms`: expires the snapshots
/// older than the newest of them and deletes the files they dropped that no remaining snapshot
/// references. Returns the table as it is afterwards.
pub async fn finish_removals(
    lake: &Lake,
    table: Table,
    grace: Duration,
    now_ms: i64,
) -> Result<(Table, Finished), LakeError> {
    let snapshots = facts(table.metadata());
    if !snapshots.iter().any(|s| s.removal) {
        return Ok((table, Finished::default()));
    }
    let heads = ref_heads(table.metadata());
    let plan = plan(&snapshots, &heads, grace_ms(grace), now_ms);
    let mut done = Finished {
        next_due_ms: plan.next_due_ms,
        ..Finished::default()
    };
    if plan.expire.is_empty() {
        return Ok((table, done));
    }
    let removed = dropped_files(&table, &plan.removals).await?;
    let table = expire_snapshot_ids(lake, table, plan.expire.clone()).await?;
    done.snapshots_expired = plan.expire.len();
    crate::failpoint::hit("retention.before_file_delete");
    done.files_deleted = delete_unreferenced(lake, &table, &removed).await?;
    tracing::info!(table = %table.identifier(), snapshots_expired = done.snapshots_expired,
        files_deleted = done.files_deleted, "finished retention removals after their grace");
    Ok((table, done))
}

/// The data files that the removal snapshots `removals` dropped (their own manifests' `DELETED`
/// entries).
async fn dropped_files(table: &Table, removals: &[i64]) -> Result<Vec<String>, LakeError> {
    let mut removed = Vec::new();
    for id in removals {
        let Some(snapshot) = table.metadata().snapshot_by_id(*id) else {
            continue;
        };
        let list = super::inspect::manifest_list(table, snapshot).await?;
        for mf in list
            .entries()
            .iter()
            .filter(|mf| mf.added_snapshot_id == *id)
        {
            let manifest = mf
                .load_manifest(table.file_io())
                .await
                .map_err(LakeError::iceberg("reading a manifest"))?;
            removed.extend(
                manifest
                    .entries()
                    .iter()
                    .filter(|e| e.status() == ManifestStatus::Deleted)
                    .map(|e| e.data_file().file_path().to_string()),
            );
        }
    }
    Ok(removed)
}

/// Deletes those of `files` that no snapshot of `table` references any more.
async fn delete_unreferenced(
    lake: &Lake,
    table: &Table,
    files: &[String],
) -> Result<usize, LakeError> {
    if files.is_empty() {
        return Ok(0);
    }
    let referenced = orphans::referenced_files(table).await?.referenced;
    let mut deleted = 0;
    for file in files.iter().filter(|f| !referenced.contains(*f)) {
        let Some(path) = lake.object_path(file) else {
            continue;
        };
        match lake.store().delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => deleted += 1,
            Err(e) => return Err(LakeError::store(format!("deleting expired file {file}"))(e)),
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1000;

    fn snap(id: i64, ts_ms: i64, removal: bool) -> SnapshotFacts {
        SnapshotFacts {
            id,
            seq: id,
            ts_ms,
            removal,
        }
    }

    #[test]
    fn a_removal_is_finished_only_after_its_grace() {
        // Appends 1, 2; removal 3 at 10 s; append 4.
        let snaps = [
            snap(1, 0, false),
            snap(2, 5 * S, false),
            snap(3, 10 * S, true),
            snap(4, 12 * S, false),
        ];
        let heads: BTreeSet<i64> = [4].into();
        let early = plan(&snaps, &heads, 60 * S, 30 * S);
        assert!(early.expire.is_empty() && early.removals.is_empty());
        assert_eq!(early.next_due_ms, Some(70 * S));
        let ripe = plan(&snaps, &heads, 60 * S, 70 * S);
        assert_eq!(ripe.expire, vec![1, 2]);
        assert_eq!(ripe.removals, vec![3]);
        assert_eq!(ripe.next_due_ms, None);
        // A grace of zero finishes at once.
        assert_eq!(plan(&snaps, &heads, 0, 10 * S).expire, vec![1, 2]);
    }

    #[test]
    fn the_newest_ripe_removal_takes_older_removals_with_it() {
        let snaps = [
            snap(1, 0, false),
            snap(2, 10 * S, true),
            snap(3, 20 * S, false),
            snap(4, 30 * S, true),
            snap(5, 90 * S, true),
        ];
        let heads: BTreeSet<i64> = [5].into();
        let p = plan(&snaps, &heads, 60 * S, 95 * S);
        assert_eq!(p.expire, vec![1, 2, 3]);
        assert_eq!(p.removals, vec![2, 4]);
        // Removal 5 still has an elder (4): due at its own grace's end.
        assert_eq!(p.next_due_ms, Some(150 * S));
    }

    #[test]
    fn heads_stay_and_a_removal_without_elders_is_done() {
        // Snapshot 1 heads a tag: kept, and does not make removal 2 unfinished.
        let snaps = [snap(1, 0, false), snap(2, 10 * S, true)];
        let heads: BTreeSet<i64> = [1, 2].into();
        assert_eq!(plan(&snaps, &heads, 0, 100 * S), FinishPlan::default());
        // Only a removal, nothing older: nothing to do, nothing due.
        let alone = [snap(7, 0, true)];
        assert_eq!(plan(&alone, &[7].into(), 0, S), FinishPlan::default());
        // No removal at all.
        let appends = [snap(1, 0, false), snap(2, S, false)];
        assert_eq!(plan(&appends, &[2].into(), 0, 5 * S), FinishPlan::default());
    }

    #[test]
    fn order_is_by_sequence_number_not_by_clock() {
        // Removal 3 was committed by a node whose clock is behind: snapshot 2 (seq 2) is still
        // older, whatever its timestamp.
        let snaps = [
            SnapshotFacts {
                id: 10,
                seq: 1,
                ts_ms: 50 * S,
                removal: false,
            },
            SnapshotFacts {
                id: 20,
                seq: 2,
                ts_ms: 60 * S,
                removal: false,
            },
            SnapshotFacts {
                id: 30,
                seq: 3,
                ts_ms: 40 * S,
                removal: true,
            },
        ];
        let p = plan(&snaps, &[30].into(), 10 * S, 55 * S);
        assert_eq!(p.expire, vec![10, 20]);
    }
}
