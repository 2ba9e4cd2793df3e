//! Writing sealed ledgers into a table and committing them exactly once.
//!
//! Protocol (one writer per table, enforced by the offload engine):
//! 1. Read the table's watermark (table property `ledgerlake.watermark`: partition index →
//!    highest ledger id committed; in a namespace's shared table the key is
//!    `<topic>:<partition index>`). Ledgers at or below it are already in the table: they are
//!    reported as `already_committed` and not written again.
//! 2. Write the remaining ledgers' rows to new data files named
//!    `<first ledger>-<last ledger>-<attempt id>-<n>.parquet` (never reused: the attempt id is
//!    random per attempt).
//! 3. Reload the table; if the watermark of a partition this attempt writes moved, abandon
//!    the attempt (delete its files). Other keys may move (other topics of a namespace's
//!    shared table, written by other nodes): the new watermark is the reloaded one with this
//!    attempt's keys raised.
//! 4. One transaction: fast-append the files with snapshot properties (`ledgerlake.watermark`,
//!    `ledgerlake.ranges` with this commit's exact entry ranges, `ledgerlake.attempt`), and set
//!    the table property `ledgerlake.watermark`. The property survives snapshot expiry and
//!    commits by outside engines (they keep table properties). The transaction commits to
//!    exactly the version reloaded in step 3 or not at all ([`Lake::commit`]): the watermark it
//!    sets is computed from that version.
//!
//! A crash before step 4 leaves only unreferenced files (deleted by [`super::orphans`]); a
//! crash after it is found at step 1 of the next attempt. A commit that fails is cleaned up
//! only when it provably did not apply (a conflict); when its outcome is unknown (the catalog
//! database failed mid-commit) its files are left to the orphan sweep, which deletes them only
//! if no snapshot references them. Per partition, ledgers are committed
//! in id order, so "at or below the watermark" is exactly "committed".

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};

use super::pinned::outcome_unknown;
pub use super::write::{
    parquet_properties, ByTopic, LedgerSlice, Progress, WriteOptions, ROW_GROUP_BYTES,
};
use super::{write, Lake, LakeError};
use crate::ledger::LedgerId;

/// Table property and snapshot-summary key of the watermark.
pub const WATERMARK_KEY: &str = "ledgerlake.watermark";
/// Snapshot-summary key of a commit's exact ranges.
pub const RANGES_KEY: &str = "ledgerlake.ranges";
/// Snapshot-summary key of the attempt id.
pub const ATTEMPT_KEY: &str = "ledgerlake.attempt";

/// Watermark key ([`watermark_key`]) → highest ledger id committed.
pub type Watermark = BTreeMap<String, LedgerId>;

/// The watermark key of a topic partition: its index in a topic's own table,
/// `<topic>:<index>` in a namespace's shared table. Ranges start with the same key.
pub fn watermark_key(topic: Option<&str>, partition: i32) -> String {
    match topic {
        Some(t) => format!("{t}:{partition}"),
        None => partition.to_string(),
    }
}

/// A shared table's topic as `ledgerlake.ranges` (comma separated) names it: `%` and `,`
/// escaped as `%25` and `%2C` (a topic's local name may contain both).
pub fn range_topic(topic: &str) -> String {
    topic.replace('%', "%25").replace(',', "%2C")
}

/// The topic (shared tables) and partition of a watermark key; `None` when malformed.
pub fn parse_watermark_key(key: &str) -> Option<(Option<&str>, i32)> {
    match key.rsplit_once(':') {
        Some((topic, p)) => Some((Some(topic), p.parse().ok()?)),
        None => Some((None, key.parse().ok()?)),
    }
}

/// What a commit did.
#[derive(Debug, Clone, Default)]
pub struct CommitOutcome {
    /// New snapshot id (`None` when nothing needed committing).
    pub snapshot_id: Option<i64>,
    /// Ledgers written and committed by this call.
    pub committed: Vec<LedgerId>,
    /// Ledgers found already committed (an earlier attempt crashed after its commit).
    pub already_committed: Vec<LedgerId>,
    /// Rows written.
    pub rows: u64,
    /// Data files written.
    pub files: usize,
    /// Bytes of Parquet written.
    pub file_bytes: u64,
    /// Rows whose payload did not decode against the topic schema.
    pub bad_payloads: u64,
    /// In a shared table: rows and bad payloads per topic.
    pub by_topic: ByTopic,
}

/// Reads the watermark of a table.
pub fn read_watermark(table: &Table) -> Result<Watermark, LakeError> {
    match table.metadata().properties().get(WATERMARK_KEY) {
        None => Ok(Watermark::new()),
        Some(json) => serde_json::from_str::<Watermark>(json)
            .map_err(|e| e.to_string())
            .and_then(
                |m| match m.keys().find(|k| parse_watermark_key(k).is_none()) {
                    Some(bad) => Err(format!("key '{bad}' is not [<topic>:]<partition>")),
                    None => Ok(m),
                },
            )
            .map_err(|reason| LakeError::Table {
                table: table.identifier().to_string(),
                reason: format!("invalid {WATERMARK_KEY}: {reason}"),
            }),
    }
}

fn watermark_json(w: &Watermark) -> String {
    serde_json::to_string(w).unwrap_or_default()
}

fn slice_key(s: &LedgerSlice) -> String {
    watermark_key(s.topic.as_deref(), s.partition)
}

fn committed(w: &Watermark, s: &LedgerSlice) -> bool {
    w.get(&slice_key(s)).is_some_and(|hw| s.ledger <= *hw)
}

/// A random id for one attempt.
pub fn attempt_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// Writes `slices` (sealed ledgers of one table, ascending per partition) into `table` and
/// commits them, following the protocol in the module docs.
pub async fn write_and_commit(
    lake: &Lake,
    table: Table,
    slices: Vec<LedgerSlice>,
    options: &WriteOptions,
    progress: &Arc<Progress>,
) -> Result<(Table, CommitOutcome), LakeError> {
    let ident = table.identifier().clone();
    let watermark = read_watermark(&table)?;
    let (done, todo): (Vec<LedgerSlice>, Vec<LedgerSlice>) =
        slices.into_iter().partition(|s| committed(&watermark, s));
    let mut outcome = CommitOutcome {
        already_committed: done.iter().map(|s| s.ledger).collect(),
        ..Default::default()
    };
    if todo.is_empty() {
        return Ok((table, outcome));
    }
    let attempt = attempt_id();
    let first = todo.iter().map(|s| s.ledger).min().unwrap_or_default();
    let last = todo.iter().map(|s| s.ledger).max().unwrap_or_default();
    let write_started = std::time::Instant::now();
    let mut files =
        match write::write_files(&table, &todo, options, progress, &attempt, (first, last)).await {
            Ok(f) => f,
            Err((e, written)) => {
                delete_files(&table, &written).await;
                return Err(e);
            }
        };
    crate::failpoint::hit("offload.before_commit");
    let commit_started = std::time::Instant::now();

    let fresh = lake
        .load_table(&ident)
        .await?
        .ok_or_else(|| LakeError::Table {
            table: ident.to_string(),
            reason: "disappeared during offload".into(),
        })?;
    let locations: Vec<String> = files
        .data_files
        .iter()
        .map(|f| f.file_path().to_string())
        .collect();
    let now = read_watermark(&fresh)?;
    if todo
        .iter()
        .map(slice_key)
        .any(|k| now.get(&k) != watermark.get(&k))
    {
        delete_files(&fresh, &locations).await;
        return Err(LakeError::Table {
            table: ident.to_string(),
            reason: "another writer committed the same partitions during this offload".into(),
        });
    }
    let mut next = now;
    let mut ranges = Vec::new();
    for s in &todo {
        let key = slice_key(s);
        if s.entry_count > 0 {
            let topic = s.topic.as_deref().map(range_topic);
            let range_key = watermark_key(topic.as_deref(), s.partition);
            ranges.push(format!("{range_key}:{}:0-{}", s.ledger, s.entry_count - 1));
        }
        let hw = next.entry(key).or_insert(0);
        *hw = (*hw).max(s.ledger);
    }
    let wm = watermark_json(&next);
    let summary = HashMap::from([
        (WATERMARK_KEY.to_string(), wm.clone()),
        (RANGES_KEY.to_string(), ranges.join(",")),
        (ATTEMPT_KEY.to_string(), attempt.clone()),
    ]);
    outcome.files = files.data_files.len();
    outcome.file_bytes = files
        .data_files
        .iter()
        .map(|f| f.file_size_in_bytes())
        .sum();
    outcome.rows = files.rows;
    outcome.bad_payloads = files.bad_payloads;
    outcome.by_topic = std::mem::take(&mut files.by_topic);
    let commit = async {
        let tx = Transaction::new(&fresh);
        let tx = tx
            .update_table_properties()
            .set(WATERMARK_KEY.to_string(), wm)
            .apply(tx)?;
        let tx = tx
            .fast_append()
            .with_check_duplicate(false)
            .add_data_files(files.data_files)
            .set_snapshot_properties(summary)
            .apply(tx)?;
        crate::failpoint::pause("lake.before_catalog_commit", &ident.to_string()).await;
        lake.commit(tx, &fresh).await
    };
    let committed_table = match commit.await {
        Ok(t) => t,
        Err(e) => {
            if !outcome_unknown(&e) {
                delete_files(&fresh, &locations).await;
            }
            return Err(LakeError::iceberg(format!("committing to {ident}"))(e));
        }
    };
    crate::failpoint::hit("offload.after_commit");
    tracing::debug!(table = %ident, files = outcome.files, rows = outcome.rows,
        write_ms = (commit_started - write_started).as_millis() as u64,
        commit_ms = commit_started.elapsed().as_millis() as u64, "offload committed");
    outcome.snapshot_id = committed_table.metadata().current_snapshot_id();
    outcome.committed = todo.iter().map(|s| s.ledger).collect();
    Ok((committed_table, outcome))
}

async fn delete_files(table: &Table, locations: &[String]) {
    for l in locations {
        if let Err(e) = table.file_io().delete(l).await {
            tracing::warn!(file = %l, error = %e, "could not delete an uncommitted data file; orphan cleanup will");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn watermark_keys_of_both_layouts() {
        assert_eq!(watermark_key(None, -1), "-1");
        assert_eq!(watermark_key(None, 3), "3");
        assert_eq!(watermark_key(Some("a:b"), 2), "a:b:2");
        assert_eq!(parse_watermark_key("a:b:2"), Some((Some("a:b"), 2)));
        assert_eq!(parse_watermark_key("-1"), Some((None, -1)));
        assert_eq!(parse_watermark_key("x"), None);
        assert_eq!(parse_watermark_key("x:"), None);
        assert_eq!(range_topic("a,b%2C"), "a%2Cb%252C");
    }

    proptest! {
        #[test]
        fn watermark_keys_round_trip(topic in proptest::option::of("[a-zA-Z0-9_.=:-]{1,20}"), p in -1i32..10_000) {
            let key = watermark_key(topic.as_deref(), p);
            prop_assert_eq!(parse_watermark_key(&key), Some((topic.as_deref(), p)));
        }
    }
}
