//! Removing expired messages from a table (retention).
//!
//! Retention expires whole ledgers (`crate::offload::retention`). Here, the table follows: a
//! `delete` snapshot drops every data file that can only hold rows of expired ledgers, the
//! snapshots that still reference those files are expired, and the files are deleted.
//!
//! - **Which files.** A file goes when its `ledger_id` lower/upper bounds exist and no ledger
//!   of the topic that is still live (not expired) lies between them. This holds whoever wrote
//!   the file (our offload, or an outside engine that rewrote the table), because it reads the
//!   ids in the file's statistics, not our file names. A file that also holds rows of a live
//!   ledger stays until that ledger expires too: retention keeps *at least* what the policy
//!   asks, never less, like Pulsar (which deletes whole ledgers).
//! - **The commit.** iceberg-rust 0.10.1 has no commit that removes files, so this module
//!   writes the new manifests (kept entries `EXISTING`, removed ones `DELETED`) and the
//!   manifest list with iceberg's public writers, and commits the snapshot (add it, point
//!   `main` at it, if `main` is still where it was) through [`super::catalog_commit`]: a
//!   compare-and-set of a SQL catalog's metadata pointer, or the REST protocol's commit. The
//!   new snapshot carries the table's watermark like every snapshot of ours.
//! - **Then**, once `lake.removed_file_grace` has passed, the snapshots older than the
//!   removal are expired and the files it dropped are deleted ([`super::finish`]): readers
//!   that planned on an older snapshot keep their files meanwhile. With a grace of zero the
//!   removal finishes at once; otherwise the caller finishes it later (the returned outcome
//!   says when), and every later removal of the table finishes what has ripened.
//!
//! The caller holds the table's writer slot, so no offload commit of this node races with
//! this one; a commit by another node (a shared table's other topics) or an outside engine
//! makes the commit fail with a conflict and nothing changes (the caller may build the
//! removal again on the new version).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use iceberg::spec::{
    DataContentType, DataFile, FormatVersion, ManifestContentType, ManifestFile,
    ManifestListWriter, ManifestWriterBuilder, Operation, PrimitiveLiteral, Snapshot,
    SnapshotReference, SnapshotRetention, Summary, MAIN_BRANCH,
};
use iceberg::table::Table;
use iceberg::{TableRequirement, TableUpdate};

use super::commit::WATERMARK_KEY;
use super::{Lake, LakeError};
use crate::ledger::LedgerId;

pub use super::snapshots::EXPIRED_KEY;

/// What one removal did.
#[derive(Debug, Clone, Default)]
pub struct RemovalOutcome {
    /// The `delete` snapshot, `None` when no file qualified.
    pub snapshot_id: Option<i64>,
    /// Data files dropped from the table.
    pub files_removed: Vec<String>,
    /// Rows in them.
    pub rows_removed: u64,
    /// Snapshots expired afterwards.
    pub snapshots_expired: usize,
    /// Removed files deleted from storage.
    pub files_deleted: usize,
    /// When a removal of the table left unfinished (its grace not yet passed, or its finish
    /// failed) should be finished, ms since the epoch.
    pub finish_due_ms: Option<i64>,
}

/// The ledgers a removal keeps, and so which files it may drop.
#[derive(Debug, Clone, Copy)]
pub enum Live<'a> {
    /// A topic's own table: every file, against the live ledgers of the topic's partitions.
    Table(&'a BTreeSet<LedgerId>),
    /// A namespace's shared table: only the files of these topics (their `identity(topic)`
    /// partition value), each against its own topic's live ledgers (ledger ids of different
    /// topics interleave, so one topic's live ledger must not keep another's file).
    Topics(&'a BTreeMap<String, BTreeSet<LedgerId>>),
    /// A namespace's shared table, for deleted topics: the files of these topics whose every
    /// ledger is at or below the topic's bound (the store's last ledger id, read before the
    /// topic was deleted). A later topic of the same name has only higher ledger ids (one
    /// counter for the whole store), so its files stay.
    DeletedThrough(&'a BTreeMap<String, LedgerId>),
    /// A deleted topic's own table that a topic of the same name uses again: the files whose
    /// every ledger is at or below the bound (the new topic's ledgers are all above it).
    TableThrough(LedgerId),
}

/// Whether `file` can only hold rows of ledgers `live` does not keep.
fn doomed(file: &DataFile, ledger_field: i32, live: Live<'_>) -> bool {
    match live {
        Live::Table(ledgers) => removable(file, ledger_field, ledgers),
        Live::Topics(topics) => super::schema::partition_topic(file.partition())
            .and_then(|t| topics.get(t))
            .is_some_and(|ledgers| removable(file, ledger_field, ledgers)),
        Live::DeletedThrough(topics) => super::schema::partition_topic(file.partition())
            .and_then(|t| topics.get(t))
            .is_some_and(|last| {
                ledger_bounds(file, ledger_field).is_some_and(|(_, hi)| hi <= *last)
            }),
        Live::TableThrough(last) => {
            ledger_bounds(file, ledger_field).is_some_and(|(_, hi)| hi <= last)
        }
    }
}

/// The lowest and highest ledger id of `file`'s rows, from its column bounds.
fn ledger_bounds(file: &DataFile, ledger_field: i32) -> Option<(u64, u64)> {
    let bound = |d: Option<&iceberg::spec::Datum>| match d.map(|d| d.literal()) {
        Some(PrimitiveLiteral::Long(v)) => u64::try_from(*v).ok(),
        _ => None,
    };
    match (
        bound(file.lower_bounds().get(&ledger_field)),
        bound(file.upper_bounds().get(&ledger_field)),
    ) {
        (Some(lo), Some(hi)) if lo <= hi => Some((lo, hi)),
        _ => None,
    }
}

/// Whether `file` can only hold rows of ledgers not in `live`.
fn removable(file: &DataFile, ledger_field: i32, live: &BTreeSet<LedgerId>) -> bool {
    ledger_bounds(file, ledger_field).is_some_and(|(lo, hi)| live.range(lo..=hi).next().is_none())
}

fn iceberg_err(op: &str) -> impl FnOnce(iceberg::Error) -> LakeError + '_ {
    move |e| LakeError::iceberg(op)(e)
}

/// Drops from `table` the data files holding only rows of ledgers that `live` does not keep
/// (every ledger of the topic's partitions that is not expired; per topic in a shared table,
/// whose other topics' files are not touched), then finishes the removals of the table whose
/// `grace` has passed (this one too when the grace is zero). `expired` is recorded in the
/// snapshot summary.
pub async fn remove_expired(
    lake: &Lake,
    table: Table,
    live: Live<'_>,
    expired: &[LedgerId],
    grace: Duration,
) -> Result<(Table, RemovalOutcome), LakeError> {
    let removable = |file: &DataFile, field: i32, live: Live<'_>| doomed(file, field, live);
    let mut outcome = RemovalOutcome::default();
    let metadata = table.metadata();
    let Some(current) = metadata.current_snapshot() else {
        return Ok((table, outcome));
    };
    if metadata.format_version() != FormatVersion::V2 {
        return Err(LakeError::Table {
            table: table.identifier().to_string(),
            reason: format!(
                "retention supports format-version 2 tables, this one is {:?}",
                metadata.format_version()
            ),
        });
    }
    let Some(ledger_field) = metadata
        .current_schema()
        .field_by_name("ledger_id")
        .map(|f| f.id)
    else {
        return Err(LakeError::Table {
            table: table.identifier().to_string(),
            reason: "no ledger_id column".into(),
        });
    };
    let io = table.file_io();
    let list = super::inspect::manifest_list(&table, current).await?;

    let snapshot_id = new_snapshot_id(&table);
    let sequence_number = metadata.next_sequence_number();
    let location = metadata.location().trim_end_matches('/').to_string();
    let attempt = super::commit::attempt_id();
    let mut manifests: Vec<ManifestFile> = Vec::new();
    let mut written: Vec<String> = Vec::new();
    for (n, mf) in list.entries().iter().enumerate() {
        if mf.content != ManifestContentType::Data {
            manifests.push(mf.clone());
            continue;
        }
        let manifest = mf
            .load_manifest(io)
            .await
            .map_err(iceberg_err("reading a manifest"))?;
        let doomed = manifest.entries().iter().any(|e| {
            e.is_alive()
                && e.content_type() == DataContentType::Data
                && removable(e.data_file(), ledger_field, live)
        });
        if !doomed {
            manifests.push(mf.clone());
            continue;
        }
        let spec = metadata
            .partition_spec_by_id(mf.partition_spec_id)
            .ok_or_else(|| LakeError::Table {
                table: table.identifier().to_string(),
                reason: format!("unknown partition spec {}", mf.partition_spec_id),
            })?;
        let path = format!("{location}/metadata/{attempt}-m{n}.avro");
        let output = io
            .new_output(&path)
            .map_err(iceberg_err("creating a manifest"))?;
        written.push(path);
        let mut writer = ManifestWriterBuilder::new(
            output,
            Some(snapshot_id),
            metadata.current_schema().clone(),
            (**spec).clone(),
        )
        .build_v2_data();
        for e in manifest.entries().iter().filter(|e| e.is_alive()) {
            let (Some(added_in), Some(seq)) = (e.snapshot_id(), e.sequence_number()) else {
                return Err(LakeError::Table {
                    table: table.identifier().to_string(),
                    reason: format!(
                        "manifest entry without snapshot or sequence number in {}",
                        mf.manifest_path
                    ),
                });
            };
            let file = e.data_file().clone();
            if removable(&file, ledger_field, live) {
                outcome.rows_removed += file.record_count();
                outcome.files_removed.push(file.file_path().to_string());
                writer
                    .add_delete_file(file, seq, e.file_sequence_number)
                    .map_err(iceberg_err("writing a manifest"))?;
            } else {
                writer
                    .add_existing_file(file, added_in, seq, e.file_sequence_number)
                    .map_err(iceberg_err("writing a manifest"))?;
            }
        }
        manifests.push(
            writer
                .write_manifest_file()
                .await
                .map_err(iceberg_err("writing a manifest"))?,
        );
    }
    if outcome.files_removed.is_empty() {
        // Nothing to remove; earlier removals may be ripe. A failure there is this call's
        // only when nothing else was asked (it is logged, and tried again by the finisher).
        return Ok(finish(
            lake,
            table,
            outcome,
            grace,
            "finishing earlier retention removals failed",
        )
        .await);
    }

    let result = commit_removal(
        lake,
        &table,
        snapshot_id,
        sequence_number,
        manifests,
        &mut written,
        &outcome,
        expired,
    )
    .await;
    if let Err(e) = result {
        // A commit whose outcome is unknown may have landed: the table would then name these
        // files. They are deleted only when the commit provably did not apply, or was never
        // tried (the orphan sweep takes what is left).
        let may_have_landed = matches!(e, LakeError::Commit { .. }) && !e.is_commit_conflict();
        if !may_have_landed {
            for path in &written {
                let _ = io.delete(path).await;
            }
        }
        return Err(e);
    }
    outcome.snapshot_id = Some(snapshot_id);
    // The removal is committed: what follows frees storage, and a failure there is logged,
    // not returned (the rows are gone either way); a later removal or finish does it.
    let table = match reload(lake, &table).await {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(table = %table.identifier(), error = %e,
                "removed files committed, but the table could not be read again");
            outcome.finish_due_ms = Some(chrono::Utc::now().timestamp_millis());
            return Ok((table, outcome));
        }
    };
    Ok(finish(
        lake,
        table,
        outcome,
        grace,
        "removed files committed, but finishing the removal failed",
    )
    .await)
}

/// Finishes what has ripened ([`super::finish`]) and records it in `outcome`. A failure is
/// logged as `failed` and leaves the finish due now (the finisher tries again): the removal
/// itself stands either way.
async fn finish(
    lake: &Lake,
    table: Table,
    mut outcome: RemovalOutcome,
    grace: Duration,
    failed: &str,
) -> (Table, RemovalOutcome) {
    let now = chrono::Utc::now().timestamp_millis();
    match super::finish::finish_removals(lake, table.clone(), grace, now).await {
        Ok((table, done)) => {
            outcome.snapshots_expired = done.snapshots_expired;
            outcome.files_deleted = done.files_deleted;
            outcome.finish_due_ms = done.next_due_ms;
            (table, outcome)
        }
        Err(e) => {
            tracing::warn!(table = %table.identifier(), error = %e, "{failed}");
            outcome.finish_due_ms = Some(now);
            (table, outcome)
        }
    }
}

/// Writes the manifest list of the `delete` snapshot and commits it. Every file written is
/// added to `written` (for cleanup on failure).
#[allow(clippy::too_many_arguments)]
async fn commit_removal(
    lake: &Lake,
    table: &Table,
    snapshot_id: i64,
    sequence_number: i64,
    manifests: Vec<ManifestFile>,
    written: &mut Vec<String>,
    outcome: &RemovalOutcome,
    expired: &[LedgerId],
) -> Result<(), LakeError> {
    let metadata = table.metadata();
    let io = table.file_io();
    let location = metadata.location().trim_end_matches('/');
    let parent = metadata.current_snapshot();
    let list_path = format!(
        "{location}/metadata/snap-{snapshot_id}-0-{}.avro",
        super::commit::attempt_id()
    );
    let list_out = io
        .new_output(&list_path)
        .map_err(iceberg_err("creating a manifest list"))?;
    written.push(list_path.clone());
    let mut list = ManifestListWriter::v2(
        list_out
            .writer()
            .await
            .map_err(iceberg_err("creating a manifest list"))?,
        snapshot_id,
        parent.map(|p| p.snapshot_id()),
        sequence_number,
    );
    list.add_manifests(manifests.into_iter())
        .map_err(iceberg_err("writing a manifest list"))?;
    list.close()
        .await
        .map_err(iceberg_err("writing a manifest list"))?;

    let previous: &HashMap<String, String> = match parent {
        Some(p) => &p.summary().additional_properties,
        None => &HashMap::new(),
    };
    let mut props = HashMap::new();
    if let Some(w) = metadata
        .properties()
        .get(WATERMARK_KEY)
        .or_else(|| previous.get(WATERMARK_KEY))
    {
        props.insert(WATERMARK_KEY.to_string(), w.clone());
    }
    props.insert(
        EXPIRED_KEY.to_string(),
        expired
            .iter()
            .map(|l| l.to_string())
            .collect::<Vec<_>>()
            .join(","),
    );
    let removed_files = outcome.files_removed.len() as u64;
    props.insert("deleted-data-files".into(), removed_files.to_string());
    props.insert("deleted-records".into(), outcome.rows_removed.to_string());
    for (key, minus) in [
        ("total-data-files", removed_files),
        ("total-records", outcome.rows_removed),
    ] {
        if let Some(total) = previous.get(key).and_then(|v| v.parse::<u64>().ok()) {
            props.insert(key.into(), total.saturating_sub(minus).to_string());
        }
    }
    let snapshot = Snapshot::builder()
        .with_snapshot_id(snapshot_id)
        .with_parent_snapshot_id(parent.map(|p| p.snapshot_id()))
        .with_sequence_number(sequence_number)
        .with_timestamp_ms(chrono::Utc::now().timestamp_millis())
        .with_manifest_list(list_path)
        .with_schema_id(metadata.current_schema_id())
        .with_summary(Summary {
            operation: Operation::Delete,
            additional_properties: props,
        })
        .build();
    let requirements = vec![
        TableRequirement::UuidMatch {
            uuid: metadata.uuid(),
        },
        TableRequirement::RefSnapshotIdMatch {
            r#ref: MAIN_BRANCH.to_string(),
            snapshot_id: parent.map(|p| p.snapshot_id()),
        },
    ];
    let updates = vec![
        TableUpdate::AddSnapshot { snapshot },
        TableUpdate::SetSnapshotRef {
            ref_name: MAIN_BRANCH.to_string(),
            reference: SnapshotReference::new(
                snapshot_id,
                SnapshotRetention::branch(None, None, None),
            ),
        },
    ];
    crate::failpoint::hit("retention.before_commit");
    crate::failpoint::pause(
        "retention.before_catalog_commit",
        &table.identifier().to_string(),
    )
    .await;
    lake.committer()
        .commit(table, requirements, updates)
        .await
        .map_err(|source| LakeError::Commit {
            table: table.identifier().to_string(),
            source: Box::new(source),
        })?;
    crate::failpoint::hit("retention.after_commit");
    Ok(())
}

/// A snapshot id not used by the table (positive, random like iceberg's own).
fn new_snapshot_id(table: &Table) -> i64 {
    loop {
        let id = (rand::random::<u64>() >> 1) as i64;
        if id != 0 && table.metadata().snapshot_by_id(id).is_none() {
            return id;
        }
    }
}

async fn reload(lake: &Lake, table: &Table) -> Result<Table, LakeError> {
    lake.load_table(table.identifier())
        .await?
        .ok_or_else(|| LakeError::Table {
            table: table.identifier().to_string(),
            reason: "disappeared during retention".into(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use iceberg::spec::{DataFileBuilder, DataFileFormat, Datum, Struct};

    fn file(lo: Option<i64>, hi: Option<i64>) -> DataFile {
        file_in(lo, hi, Struct::empty())
    }

    fn file_in(lo: Option<i64>, hi: Option<i64>, partition: Struct) -> DataFile {
        let mut lower = HashMap::new();
        let mut upper = HashMap::new();
        if let Some(v) = lo {
            lower.insert(1, Datum::long(v));
        }
        if let Some(v) = hi {
            upper.insert(1, Datum::long(v));
        }
        DataFileBuilder::default()
            .content(DataContentType::Data)
            .file_path("f.parquet".into())
            .file_format(DataFileFormat::Parquet)
            .partition(partition)
            .record_count(1)
            .file_size_in_bytes(1)
            .lower_bounds(lower)
            .upper_bounds(upper)
            .build()
            .expect("a valid data file")
    }

    #[test]
    fn a_file_goes_only_when_no_live_ledger_lies_within_its_bounds() {
        let live: BTreeSet<LedgerId> = [5, 9].into_iter().collect();
        assert!(removable(&file(Some(1), Some(4)), 1, &live));
        assert!(removable(&file(Some(6), Some(8)), 1, &live));
        assert!(!removable(&file(Some(4), Some(5)), 1, &live));
        assert!(!removable(&file(Some(1), Some(20)), 1, &live));
        assert!(!removable(&file(Some(9), Some(9)), 1, &live));
        // Without statistics nothing is known: keep.
        assert!(!removable(&file(None, Some(4)), 1, &live));
        assert!(!removable(&file(Some(1), None), 1, &live));
        // Bounds of another column do not count.
        assert!(!removable(&file(Some(1), Some(4)), 2, &live));
    }

    #[test]
    fn a_shared_table_removal_weighs_each_file_against_its_own_topic() {
        // Topic a keeps ledger 7, topic b keeps nothing; ledger ids interleave between topics.
        let topics: BTreeMap<String, BTreeSet<LedgerId>> = [
            ("a".to_string(), [7].into_iter().collect()),
            ("b".to_string(), BTreeSet::new()),
        ]
        .into_iter()
        .collect();
        let live = Live::Topics(&topics);
        let topic = |t: &str| Struct::from_iter([Some(iceberg::spec::Literal::string(t))]);
        assert!(!doomed(&file_in(Some(1), Some(9), topic("a")), 1, live));
        assert!(doomed(&file_in(Some(1), Some(6), topic("a")), 1, live));
        // b's file spans a's live ledger 7: only b's own ledgers count.
        assert!(doomed(&file_in(Some(1), Some(9), topic("b")), 1, live));
        // Files of topics outside the removal, or without a topic value, stay.
        assert!(!doomed(&file_in(Some(1), Some(4), topic("c")), 1, live));
        assert!(!doomed(&file(Some(1), Some(4)), 1, live));
        assert!(doomed(
            &file_in(Some(1), Some(4), topic("c")),
            1,
            Live::Table(&BTreeSet::new())
        ));
    }

    #[test]
    fn a_deleted_topic_loses_only_the_files_of_its_own_ledgers() {
        // Topic a was deleted with ledgers up to 10; a later topic a has ledgers from 12.
        let through: BTreeMap<String, LedgerId> = [("a".to_string(), 10)].into_iter().collect();
        let live = Live::DeletedThrough(&through);
        let topic = |t: &str| Struct::from_iter([Some(iceberg::spec::Literal::string(t))]);
        assert!(doomed(&file_in(Some(1), Some(10), topic("a")), 1, live));
        assert!(doomed(&file_in(Some(3), Some(3), topic("a")), 1, live));
        assert!(
            !doomed(&file_in(Some(12), Some(14), topic("a")), 1, live),
            "the later topic's"
        );
        assert!(
            !doomed(&file_in(Some(9), Some(12), topic("a")), 1, live),
            "spans both: kept"
        );
        assert!(
            !doomed(&file_in(Some(1), None, topic("a")), 1, live),
            "no statistics: kept"
        );
        assert!(
            !doomed(&file_in(Some(1), Some(4), topic("b")), 1, live),
            "another topic's"
        );
        // A topic's own table, used again by a topic of the same name from ledger 12.
        let again = Live::TableThrough(10);
        assert!(doomed(&file(Some(1), Some(10)), 1, again));
        assert!(
            !doomed(&file(Some(9), Some(12)), 1, again),
            "spans both: kept"
        );
        assert!(
            !doomed(&file(Some(12), Some(14)), 1, again),
            "the new topic's"
        );
        assert!(
            !doomed(&file(None, Some(4)), 1, again),
            "no statistics: kept"
        );
    }
}
