//! What `verify` reports: per topic, what was read and every finding, as JSON for the admin
//! API and `ledgerlake verify --json`.
//!
//! Invariant: a report with no finding means every check passed for the ledgers and files it
//! counts; `findings_dropped` counts findings beyond [`MAX_FINDINGS`] that were not kept.

use serde::{Deserialize, Serialize};

/// Findings kept per topic (the rest are counted in `findings_dropped`).
pub const MAX_FINDINGS: usize = 1_000;

/// The tier a finding is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// The local log.
    Log,
    /// The lake table.
    Lake,
}

/// One thing wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Finding {
    /// Messages of entries `first_entry..=last_entry` that `tier` should hold and does not
    /// (only the listed `batch_indexes` of one entry, when given).
    Gap {
        /// Where the messages are missing.
        tier: Tier,
        /// Partition index (-1: not partitioned).
        partition: i32,
        /// Ledger id.
        ledger: u64,
        /// First entry missing.
        first_entry: u64,
        /// Last entry missing.
        last_entry: u64,
        /// The missing messages of a batch entry (empty: whole entries).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        batch_indexes: Vec<i32>,
    },
    /// A message the lake holds more than once.
    Duplicate {
        /// Partition index.
        partition: i32,
        /// Ledger id.
        ledger: u64,
        /// Entry id.
        entry: u64,
        /// Batch index (-1: the entry is one row).
        batch_index: i32,
        /// How many rows hold it.
        copies: u32,
        /// The data files holding them.
        files: Vec<String>,
    },
    /// Rows the lake holds that the topic does not have.
    Unexpected {
        /// Partition index.
        partition: i32,
        /// Ledger id.
        ledger: u64,
        /// Rows.
        rows: u64,
        /// Why they should not be there.
        detail: String,
    },
    /// A message both tiers hold with different payloads (`--deep`).
    PayloadMismatch {
        /// Partition index.
        partition: i32,
        /// Ledger id.
        ledger: u64,
        /// Entry id.
        entry: u64,
        /// Batch index.
        batch_index: i32,
    },
    /// A data file the table's current snapshot lists that is not in the store.
    MissingFile {
        /// Its location.
        path: String,
        /// The store's answer.
        detail: String,
    },
    /// A data file that cannot be read.
    UnreadableFile {
        /// Its location.
        path: String,
        /// Why.
        detail: String,
    },
    /// Entries of the local log that cannot be read.
    UnreadableEntries {
        /// Partition index.
        partition: i32,
        /// Ledger id.
        ledger: u64,
        /// First entry of the range that failed.
        first_entry: u64,
        /// Last entry of the range that failed.
        last_entry: u64,
        /// The log's error.
        detail: String,
    },
    /// The records disagree: a ledger's state against the table's watermark, a snapshot's
    /// recorded range against the ledger, or a table holding delete files.
    Inconsistent {
        /// Partition index, when about one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        partition: Option<i32>,
        /// Ledger id, when about one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ledger: Option<u64>,
        /// What disagrees.
        detail: String,
    },
}

/// What was checked in one partition.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionSummary {
    /// Partition index (-1: not partitioned).
    pub partition: i32,
    /// Ledgers checked (expired ones are not).
    pub ledgers: u64,
    /// Ledgers removed by retention (their rows may stay in the lake until its files go).
    pub ledgers_expired: u64,
    /// Entries read from the local log.
    pub entries_read: u64,
    /// Messages those entries hold.
    pub messages_local: u64,
    /// Rows of this partition in the lake.
    pub rows_lake: u64,
    /// The table's watermark for this partition (highest ledger committed).
    pub watermark: Option<u64>,
}

/// The outcome of verifying one topic (all partitions of a partitioned topic).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicReport {
    /// The topic (its base name).
    pub topic: String,
    /// The lake table, when it exists.
    pub table: Option<String>,
    /// The snapshot read.
    pub snapshot_id: Option<i64>,
    /// Whether payloads were compared.
    pub deep: bool,
    /// Data files read.
    pub files_read: u64,
    /// Bytes of them.
    pub bytes_read: u64,
    /// Per partition.
    pub partitions: Vec<PartitionSummary>,
    /// Everything wrong, up to [`MAX_FINDINGS`].
    pub findings: Vec<Finding>,
    /// Findings beyond [`MAX_FINDINGS`].
    pub findings_dropped: u64,
}

impl TopicReport {
    /// Whether every check passed.
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty() && self.findings_dropped == 0
    }

    /// Adds a finding (or counts it, past [`MAX_FINDINGS`]).
    pub fn add(&mut self, finding: Finding) {
        if self.findings.len() < MAX_FINDINGS {
            self.findings.push(finding);
        } else {
            self.findings_dropped += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn findings_round_trip_as_tagged_json() {
        let mut r = TopicReport {
            topic: "persistent://public/default/t".into(),
            ..TopicReport::default()
        };
        assert!(r.is_clean());
        r.add(Finding::Gap {
            tier: Tier::Lake,
            partition: -1,
            ledger: 3,
            first_entry: 4,
            last_entry: 9,
            batch_indexes: vec![],
        });
        let json = serde_json::to_value(&r).unwrap_or_default();
        assert_eq!(json["findings"][0]["kind"], "gap");
        assert_eq!(json["findings"][0]["tier"], "lake");
        assert!(json["findings"][0].get("batch_indexes").is_none());
        let back: TopicReport = serde_json::from_value(json).unwrap_or_default();
        assert_eq!(back, r);
        assert!(!back.is_clean());
    }

    #[test]
    fn findings_past_the_cap_are_counted() {
        let mut r = TopicReport::default();
        for i in 0..(MAX_FINDINGS as u64 + 5) {
            r.add(Finding::Inconsistent {
                partition: None,
                ledger: Some(i),
                detail: String::new(),
            });
        }
        assert_eq!(r.findings.len(), MAX_FINDINGS);
        assert_eq!(r.findings_dropped, 5);
    }
}
