//! `verify`: whether a topic's messages are held exactly once across its tiers.
//!
//! For each partition of a topic it compares the entries the local log holds (read, every one),
//! the rows the lake holds (every data file of the table's current snapshot, read), and what
//! the records say: each ledger's state and entry count, the table's watermark and the ranges
//! its snapshots' summaries recorded. It reports every gap and duplicate with its ids, every
//! missing or unreadable data file with its path, and every disagreement between the records.
//! With `deep`, payload checksums of messages both tiers hold are compared too.
//!
//! What "exactly once" means here is what replay and SQL rely on:
//! - a ledger the table committed (at or below its watermark, or recorded `offloaded` or
//!   `deleted`) has every message of entries `0..entry_count` in the lake once: one row `-1`
//!   for an entry that is one row, one per message of a batch (`lake::rows::entry_rows`);
//! - a ledger not committed has no row in the lake;
//! - a ledger whose local copy exists (`open`, `sealed`, `offloaded`) has every entry readable;
//! - rows of `expired` ledgers may remain (retention removes whole files only), never others.
//!
//! The caller holds the table's offload off while this runs (`ops`), so the files and the
//! lake records it reads do not change under it; the open ledger is read up to its confirmed
//! end. The log's own retention is not held off: a ledger it removes meanwhile is skipped.
//! Entries are read from the segments, never from the tail cache, so the disk is what is
//! checked.

use std::collections::{HashMap, HashSet};

use crate::lake::rows::entry_rows;
use crate::lake::{LakeError, LakeHandle};
use crate::ledger::{LedgerState, Log, MetadataError, ReadError, TopicLog};
use crate::naming::TopicName;

mod check;
mod lake_side;
pub mod report;

use check::LedgerFacts;
pub use report::{Finding, PartitionSummary, Tier, TopicReport};

/// Entries read from the log at once.
const ENTRIES_AT_ONCE: u64 = 512;

/// Why a topic could not be verified (what is wrong with its data is a [`Finding`] instead).
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// Neither the log nor the lake knows the topic.
    #[error("Topic {0} not found")]
    NotFound(String),
    /// The metadata store failed.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    /// The table or its metadata could not be read.
    #[error("reading the lake: {0}")]
    Lake(LakeError),
}

/// Verifies `topic` (every partition of a partitioned topic); `lake` is `None` when the
/// service has no lake.
pub async fn verify_topic(
    log: &Log,
    lake: Option<&LakeHandle>,
    topic: &TopicName,
    deep: bool,
) -> Result<TopicReport, VerifyError> {
    let base = topic.base();
    let mut view = match lake {
        Some(h) => lake_side::read(h, &base, deep).await?,
        None => lake_side::LakeView::default(),
    };
    let partitions = log.partitions_of(&base).await?;
    if partitions.is_empty() && view.table.is_none() {
        return Err(VerifyError::NotFound(base.to_string()));
    }
    let mut report = TopicReport {
        topic: base.to_string(),
        table: view.table.clone(),
        snapshot_id: view.snapshot_id,
        deep,
        files_read: view.files.len() as u64,
        bytes_read: view.bytes_read,
        ..TopicReport::default()
    };
    for f in std::mem::take(&mut view.findings) {
        report.add(f);
    }
    let rows = std::mem::take(&mut view.rows);
    let mut pass = Pass {
        view: &view,
        has_lake: lake.is_some(),
        rows,
        known: HashSet::new(),
        counts: HashMap::new(),
        report,
    };
    for (partition, topic_log) in &partitions {
        pass.partition(log, *partition, topic_log).await?;
    }
    let Pass {
        rows,
        known,
        counts,
        mut report,
        ..
    } = pass;
    for ((partition, ledger), left) in rows {
        if !known.contains(&(partition, ledger)) {
            report.add(Finding::Unexpected {
                partition,
                ledger,
                rows: left.len() as u64,
                detail: "rows of a ledger the log does not know".into(),
            });
        }
    }
    check_ranges(&view, &known, &counts, &mut report);
    Ok(report)
}

/// One topic's check, partition after partition.
struct Pass<'a> {
    /// The table as read before any partition is checked (its rows moved to `rows`).
    view: &'a lake_side::LakeView,
    /// Whether the service has a lake (without one, no ledger is expected there).
    has_lake: bool,
    /// Invariant: the lake's rows of every (partition, ledger) not checked yet; a ledger's
    /// rows are taken out when it is checked, so what is left at the end belongs to no ledger
    /// the log lists.
    rows: HashMap<(i32, u64), Vec<check::LakeRow>>,
    /// Invariant: every ledger of the partitions checked so far, expired ones included.
    known: HashSet<(i32, u64)>,
    /// Invariant: the entry count of each ledger in `known` that is not expired.
    counts: HashMap<(i32, u64), u64>,
    report: TopicReport,
}

impl Pass<'_> {
    /// Checks one partition's ledgers and adds its summary to the report.
    async fn partition(
        &mut self,
        log: &Log,
        partition: i32,
        topic_log: &TopicLog,
    ) -> Result<(), VerifyError> {
        let mut summary = PartitionSummary {
            partition,
            watermark: self.view.watermark.get(&partition).copied(),
            ..PartitionSummary::default()
        };
        for r in log.metadata().topic_ledgers(topic_log.id()).await? {
            if r.state == LedgerState::Expired {
                summary.ledgers_expired += 1;
                self.known.insert((partition, r.id));
            }
        }
        for info in topic_log.ledgers() {
            self.known.insert((partition, info.id));
            self.counts.insert((partition, info.id), info.entry_count);
            summary.ledgers += 1;
            let committed = summary.watermark.is_some_and(|w| info.id <= w);
            let recorded = matches!(info.state, LedgerState::Offloaded | LedgerState::Deleted);
            // An empty ledger (recovery found none of its entries: a crash right after it was
            // created) is deleted without an offload; nothing of it belongs in the lake.
            let empty = info.entry_count == 0;
            if self.has_lake && recorded && !committed && !empty {
                self.report.add(Finding::Inconsistent {
                    partition: Some(partition),
                    ledger: Some(info.id),
                    detail: format!(
                        "the ledger is {} but the table's watermark ({:?}) does not cover it",
                        info.state, summary.watermark
                    ),
                });
            }
            let local = match info.state {
                LedgerState::Open | LedgerState::Sealed | LedgerState::Offloaded => {
                    let at = (partition, info.id, info.entry_count);
                    read_local(topic_log, at, &mut summary, &mut self.report).await
                }
                _ => None,
            };
            let mut ledger_rows = self.rows.remove(&(partition, info.id)).unwrap_or_default();
            summary.rows_lake += ledger_rows.len() as u64;
            if !self.has_lake {
                continue;
            }
            let facts = LedgerFacts {
                partition,
                ledger: info.id,
                entry_count: info.entry_count,
                in_lake: committed || recorded,
                local: local.as_deref(),
                deep: self.view.deep,
            };
            check::check_ledger(&facts, &mut ledger_rows, &self.view.files, &mut self.report);
        }
        self.report.partitions.push(summary);
        Ok(())
    }
}

/// Every entry of a ledger's local copy, read, as the rows each makes; `None` when some could
/// not be read (reported) or the copy went meanwhile.
async fn read_local(
    topic_log: &TopicLog,
    (partition, ledger, count): (i32, u64, u64),
    summary: &mut PartitionSummary,
    report: &mut TopicReport,
) -> Option<Vec<Vec<(i32, Option<u32>)>>> {
    let mut out: Vec<Vec<(i32, Option<u32>)>> = Vec::with_capacity(count as usize);
    let mut complete = true;
    let mut first = 0;
    while first < count {
        let last = (first + ENTRIES_AT_ONCE - 1).min(count - 1);
        let unreadable = |detail: String| Finding::UnreadableEntries {
            partition,
            ledger,
            first_entry: first,
            last_entry: last,
            detail,
        };
        match topic_log.read_entries_stored(ledger, first, last).await {
            Ok(entries) => {
                let n = entries.len() as u64;
                summary.entries_read += n;
                let decoded = tokio::task::spawn_blocking(move || {
                    entries.iter().map(entry_rows).collect::<Vec<_>>()
                })
                .await;
                match decoded {
                    Ok(rows) => {
                        summary.messages_local += rows.iter().map(|r| r.len() as u64).sum::<u64>();
                        out.extend(rows);
                    }
                    Err(e) => {
                        report.add(unreadable(format!("decoding: {e}")));
                        complete = false;
                    }
                }
                if n < last - first + 1 {
                    report.add(Finding::Gap {
                        tier: Tier::Log,
                        partition,
                        ledger,
                        first_entry: first + n,
                        last_entry: count - 1,
                        batch_indexes: Vec::new(),
                    });
                    return None;
                }
            }
            // The local copy went meanwhile (deleted after offload, or expired by the log's
            // retention, which runs apart from the table's offload): nothing to compare.
            Err(ReadError::Deleted(_) | ReadError::UnknownLedger { .. }) => return None,
            Err(e) => {
                report.add(unreadable(e.to_string()));
                complete = false;
            }
        }
        first = last + 1;
    }
    complete.then_some(out)
}

/// The ranges the table's snapshots recorded against the ledgers: each names a ledger the log
/// knows, with its entry count, and no ledger was committed twice.
fn check_ranges(
    view: &lake_side::LakeView,
    known: &HashSet<(i32, u64)>,
    counts: &HashMap<(i32, u64), u64>,
    report: &mut TopicReport,
) {
    let mut committed_by: HashMap<(i32, u64), i64> = HashMap::new();
    for r in &view.ranges {
        let key = (r.partition, r.ledger);
        let mut inconsistent = |detail: String| {
            report.add(Finding::Inconsistent {
                partition: Some(r.partition),
                ledger: Some(r.ledger),
                detail,
            })
        };
        match counts.get(&key) {
            Some(&n) if n != r.last_entry + 1 => inconsistent(format!(
                "snapshot {} recorded entries 0-{} of the ledger, which has {n}",
                r.snapshot_id, r.last_entry
            )),
            None if !known.contains(&key) => inconsistent(format!(
                "snapshot {} recorded a ledger the log does not know",
                r.snapshot_id
            )),
            _ => {}
        }
        if let Some(earlier) = committed_by.insert(key, r.snapshot_id) {
            if earlier != r.snapshot_id {
                inconsistent(format!(
                    "committed twice, by snapshots {earlier} and {}",
                    r.snapshot_id
                ));
            }
        }
    }
}
