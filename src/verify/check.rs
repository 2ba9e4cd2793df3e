//! The check of one ledger's rows in the lake: against the rows its entries make in the local
//! log (`lake::rows::entry_rows`) while the log still holds them, otherwise against what the
//! rows themselves and the ledger's record say must be there (every entry `0..entry_count`;
//! one row `-1`, or one row per message `0..batch_size` of a batch).
//!
//! Pure and synchronous: the caller has read both tiers.

use std::collections::BTreeSet;

use super::report::{Finding, Tier, TopicReport};

/// One lake row of a ledger (the ledger and partition are the caller's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct LakeRow {
    /// Entry id.
    pub entry: u64,
    /// Batch index (-1: the entry is one row).
    pub batch_index: i32,
    /// The entry's recorded batch size (0: not a batch).
    pub batch_size: i32,
    /// Index of the data file holding it, in the caller's file list.
    pub file: u32,
    /// CRC32C of its payload (`--deep` only; `None` for a NULL payload or when not read).
    pub crc: Option<u32>,
}

/// The rows of each entry of a ledger as the local log holds them: (batch index, payload CRC).
pub(super) type LocalRows = [Vec<(i32, Option<u32>)>];

/// What is known of one ledger.
#[derive(Debug)]
pub(super) struct LedgerFacts<'a> {
    /// Partition index.
    pub partition: i32,
    /// Ledger id.
    pub ledger: u64,
    /// Entries `0..entry_count` exist.
    pub entry_count: u64,
    /// Whether the lake must hold the ledger; it must hold none of it otherwise.
    pub in_lake: bool,
    /// Each entry's rows as the log holds them, when it still does and all were read.
    pub local: Option<&'a LocalRows>,
    /// Whether the lake rows carry payload checksums (`--deep`) to compare with the log's.
    pub deep: bool,
}

/// Checks `rows` (the lake's rows of the ledger, any order) against `facts`, adding what is
/// wrong to `report`; `files` names the data files rows point at. Payload checksums are
/// compared when both sides carry them.
pub(super) fn check_ledger(
    facts: &LedgerFacts<'_>,
    rows: &mut [LakeRow],
    files: &[String],
    report: &mut TopicReport,
) {
    let (partition, ledger) = (facts.partition, facts.ledger);
    if !facts.in_lake {
        if !rows.is_empty() {
            report.add(Finding::Unexpected {
                partition,
                ledger,
                rows: rows.len() as u64,
                detail: "rows of a ledger the table has not committed (above its watermark)".into(),
            });
        }
        return;
    }
    rows.sort_unstable();
    let mut gap: Option<(u64, u64)> = None;
    let mut at = 0;
    for entry in 0..facts.entry_count {
        let start = at;
        while at < rows.len() && rows[at].entry == entry {
            at += 1;
        }
        let here = &rows[start..at];
        let local = facts.local.and_then(|l| l.get(entry as usize));
        let expected_empty = local.is_some_and(|l| l.is_empty());
        if here.is_empty() && !expected_empty {
            gap = Some(gap.map_or((entry, entry), |(first, _)| (first, entry)));
            continue;
        }
        flush_gap(&mut gap, partition, ledger, report);
        check_entry(facts, entry, here, local, files, report);
    }
    flush_gap(&mut gap, partition, ledger, report);
    if at < rows.len() {
        report.add(Finding::Unexpected {
            partition,
            ledger,
            rows: (rows.len() - at) as u64,
            detail: format!(
                "rows of entries past the ledger's end ({} entries)",
                facts.entry_count
            ),
        });
    }
}

fn flush_gap(gap: &mut Option<(u64, u64)>, partition: i32, ledger: u64, report: &mut TopicReport) {
    if let Some((first_entry, last_entry)) = gap.take() {
        report.add(Finding::Gap {
            tier: Tier::Lake,
            partition,
            ledger,
            first_entry,
            last_entry,
            batch_indexes: Vec::new(),
        });
    }
}

/// One entry's rows `here` (sorted, possibly empty when the log holds no row for it either).
fn check_entry(
    facts: &LedgerFacts<'_>,
    entry: u64,
    here: &[LakeRow],
    local: Option<&Vec<(i32, Option<u32>)>>,
    files: &[String],
    report: &mut TopicReport,
) {
    let (partition, ledger) = (facts.partition, facts.ledger);
    // One row per batch index; repeats are duplicates.
    let mut present: Vec<LakeRow> = Vec::with_capacity(here.len());
    for run in here.chunk_by(|a, b| a.batch_index == b.batch_index) {
        if run.len() > 1 {
            let files: BTreeSet<String> = run
                .iter()
                .filter_map(|r| files.get(r.file as usize).cloned())
                .collect();
            report.add(Finding::Duplicate {
                partition,
                ledger,
                entry,
                batch_index: run[0].batch_index,
                copies: run.len() as u32,
                files: files.into_iter().collect(),
            });
        }
        present.push(run[0]);
    }
    let expected: Vec<(i32, Option<u32>)> = match local {
        Some(l) => l.clone(),
        None if present.iter().any(|r| r.batch_index < 0) => vec![(-1, None)],
        None => {
            let size = present.iter().map(|r| r.batch_size).max().unwrap_or(0);
            (0..size).map(|i| (i, None)).collect()
        }
    };
    let missing: Vec<i32> = expected
        .iter()
        .map(|(i, _)| *i)
        .filter(|i| !present.iter().any(|r| r.batch_index == *i))
        .collect();
    if !missing.is_empty() {
        report.add(Finding::Gap {
            tier: Tier::Lake,
            partition,
            ledger,
            first_entry: entry,
            last_entry: entry,
            batch_indexes: missing,
        });
    }
    let extra = present
        .iter()
        .filter(|r| !expected.iter().any(|(i, _)| *i == r.batch_index))
        .count();
    if extra > 0 {
        report.add(Finding::Unexpected {
            partition,
            ledger,
            rows: extra as u64,
            detail: format!("entry {entry}: batch indexes the entry does not have"),
        });
    }
    if local.is_some() && facts.deep {
        for (index, crc) in &expected {
            let row = present.iter().find(|r| r.batch_index == *index);
            if let Some(row) = row.filter(|r| r.crc != *crc) {
                report.add(Finding::PayloadMismatch {
                    partition,
                    ledger,
                    entry,
                    batch_index: row.batch_index,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(entry: u64, batch_index: i32, batch_size: i32, file: u32) -> LakeRow {
        LakeRow {
            entry,
            batch_index,
            batch_size,
            file,
            crc: None,
        }
    }

    fn facts(entry_count: u64, local: Option<&LocalRows>) -> LedgerFacts<'_> {
        LedgerFacts {
            partition: 0,
            ledger: 7,
            entry_count,
            in_lake: true,
            local,
            deep: true,
        }
    }

    fn run(f: &LedgerFacts<'_>, rows: &mut [LakeRow]) -> Vec<Finding> {
        let mut report = TopicReport::default();
        let files = vec!["a.parquet".to_string(), "b.parquet".to_string()];
        check_ledger(f, rows, &files, &mut report);
        report.findings
    }

    #[test]
    fn a_complete_ledger_passes_in_any_row_order() {
        let mut rows = vec![row(1, -1, 0, 0), row(0, 1, 2, 0), row(0, 0, 2, 1)];
        assert_eq!(run(&facts(2, None), &mut rows), vec![]);
    }

    #[test]
    fn missing_entries_coalesce_into_ranges_and_missing_messages_are_named() {
        let mut rows = vec![row(0, -1, 0, 0), row(3, 0, 3, 0), row(3, 2, 3, 0)];
        let found = run(&facts(5, None), &mut rows);
        assert_eq!(
            found,
            vec![
                Finding::Gap {
                    tier: Tier::Lake,
                    partition: 0,
                    ledger: 7,
                    first_entry: 1,
                    last_entry: 2,
                    batch_indexes: vec![],
                },
                Finding::Gap {
                    tier: Tier::Lake,
                    partition: 0,
                    ledger: 7,
                    first_entry: 3,
                    last_entry: 3,
                    batch_indexes: vec![1],
                },
                Finding::Gap {
                    tier: Tier::Lake,
                    partition: 0,
                    ledger: 7,
                    first_entry: 4,
                    last_entry: 4,
                    batch_indexes: vec![],
                },
            ]
        );
    }

    #[test]
    fn duplicates_name_their_files_and_rows_past_the_end_are_unexpected() {
        let mut rows = vec![row(0, -1, 0, 0), row(0, -1, 0, 1), row(1, -1, 0, 0)];
        let found = run(&facts(1, None), &mut rows);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            matches!(&found[0], Finding::Duplicate { entry: 0, copies: 2, files, .. }
            if files == &["a.parquet".to_string(), "b.parquet".to_string()])
        );
        assert!(matches!(&found[1], Finding::Unexpected { rows: 1, .. }));
    }

    #[test]
    fn the_local_log_decides_when_present_and_payloads_are_compared() {
        let local: Vec<Vec<(i32, Option<u32>)>> = vec![
            vec![(0, Some(10)), (1, Some(11))],
            vec![], // an empty batch: no row in either tier
            vec![(-1, Some(30))],
        ];
        let mut rows = vec![
            LakeRow {
                crc: Some(10),
                ..row(0, 0, 2, 0)
            },
            LakeRow {
                crc: Some(99),
                ..row(0, 1, 2, 0)
            },
            LakeRow {
                crc: Some(30),
                ..row(2, -1, 0, 0)
            },
        ];
        let found = run(&facts(3, Some(&local)), &mut rows);
        assert_eq!(
            found,
            vec![Finding::PayloadMismatch {
                partition: 0,
                ledger: 7,
                entry: 0,
                batch_index: 1,
            }]
        );
        // A payload the lake holds as NULL differs from one the log holds.
        let mut rows = vec![
            LakeRow {
                crc: Some(10),
                ..row(0, 0, 2, 0)
            },
            LakeRow {
                crc: Some(11),
                ..row(0, 1, 2, 0)
            },
            LakeRow {
                crc: None,
                ..row(2, -1, 0, 0)
            },
        ];
        let found = run(&facts(3, Some(&local)), &mut rows);
        assert!(
            matches!(&found[..], [Finding::PayloadMismatch { entry: 2, .. }]),
            "{found:?}"
        );
        // A batch the lake holds as one row is both a gap and unexpected rows.
        let mut rows = vec![row(0, -1, 0, 0), row(2, -1, 0, 0)];
        let found = run(&facts(3, Some(&local)), &mut rows);
        assert!(
            matches!(&found[0], Finding::Gap { batch_indexes, .. } if batch_indexes == &[0, 1])
        );
        assert!(matches!(&found[1], Finding::Unexpected { rows: 1, .. }));
    }

    #[test]
    fn a_ledger_not_committed_must_have_no_rows() {
        let f = LedgerFacts {
            in_lake: false,
            ..facts(2, None)
        };
        assert_eq!(run(&f, &mut []), vec![]);
        let found = run(&f, &mut [row(0, -1, 0, 0)]);
        assert!(matches!(&found[0], Finding::Unexpected { rows: 1, .. }));
    }
}
