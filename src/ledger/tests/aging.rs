//! Rollover by age: the deadline queue of `ledger/aging.rs`, seen through the log.

use std::sync::Arc;

use super::super::metadata::memory::MemoryMetadataStore;
use super::super::*;
use super::{small_config, TestResult};
use crate::config::LedgerConfig;
use bytes::Bytes;

#[tokio::test]
async fn aged_ledgers_are_sealed_by_the_ticker() -> TestResult {
    let dir = tempfile::tempdir()?;
    let config = LedgerConfig {
        rollover_age: std::time::Duration::from_millis(200),
        ..small_config()
    };
    let log = Log::open(dir.path(), config, Arc::new(MemoryMetadataStore::new())).await?;
    let t = log.topic("idle").await?;
    t.append(0, Bytes::from_static(b"x"))
        .await?
        .durable()
        .await?;
    for _ in 0..100 {
        if t.ledgers().iter().all(|l| l.state == LedgerState::Sealed) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(t.ledgers().len(), 1);
    assert_eq!(t.ledgers()[0].state, LedgerState::Sealed);
    // The next ledger has a deadline of its own, counted from its first entry.
    t.append(1, Bytes::from_static(b"y"))
        .await?
        .durable()
        .await?;
    for _ in 0..100 {
        if t.ledgers().len() == 2 && t.ledgers().iter().all(|l| l.state == LedgerState::Sealed) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let states: Vec<LedgerState> = t.ledgers().iter().map(|l| l.state).collect();
    assert_eq!(states, [LedgerState::Sealed, LedgerState::Sealed]);
    log.shutdown().await?;
    Ok(())
}

/// A ledger rolled by its entry count leaves the topic's age deadline queued for the next
/// one, which comes early for it: that ledger is sealed at its own age, not at the first's.
#[tokio::test]
async fn a_ledger_rolled_early_leaves_its_deadline_to_the_next() -> TestResult {
    let age = std::time::Duration::from_secs(2);
    let dir = tempfile::tempdir()?;
    let config = LedgerConfig {
        rollover_age: age,
        rollover_entries: 2,
        ..small_config()
    };
    let log = Log::open(dir.path(), config, Arc::new(MemoryMetadataStore::new())).await?;
    let t = log.topic("rolled").await?;
    let first = std::time::Instant::now();
    for _ in 0..2 {
        t.append(0, Bytes::from_static(b"x"))
            .await?
            .durable()
            .await?;
    }
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    // The third entry rolls to a second ledger, which ages from it.
    let rolled = std::time::Instant::now();
    let third = t
        .append(0, Bytes::from_static(b"y"))
        .await?
        .durable()
        .await?;
    let states = |t: &TopicLog| t.ledgers().iter().map(|l| l.state).collect::<Vec<_>>();
    // Between the first ledger's age and the second's (about 0.5 s from each).
    let midway = first + age + (rolled - first) / 2;
    tokio::time::sleep(midway.saturating_duration_since(std::time::Instant::now())).await;
    assert_eq!(states(&t), [LedgerState::Sealed, LedgerState::Open]);
    for _ in 0..150 {
        if states(&t) == [LedgerState::Sealed, LedgerState::Sealed] {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(states(&t), [LedgerState::Sealed, LedgerState::Sealed]);
    assert_eq!(t.ledgers()[1].id, third.ledger);
    log.shutdown().await?;
    Ok(())
}
