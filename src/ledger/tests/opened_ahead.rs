//! Ledgers opened ahead of their first entry (at a producer's registration): they take that
//! entry and age from it, or are discarded unused, also by recovery after a crash.

use std::sync::Arc;

use super::super::metadata::memory::MemoryMetadataStore;
use super::super::*;
use super::{payload, read_all, small_config, TestResult};
use crate::config::LedgerConfig;
use bytes::Bytes;

/// A ledger opened ahead of its first entry (a producer registered) takes that entry; closed
/// without one, it is discarded (sealed empty and deleted, no index file, nothing to offload),
/// and a reopened log agrees with what the topic showed.
#[tokio::test]
async fn a_ledger_opened_ahead_takes_the_first_entry_or_is_discarded() -> TestResult {
    let dir = tempfile::tempdir()?;
    let meta: Arc<dyn MetadataStore> = Arc::new(MemoryMetadataStore::new());
    let log = Log::open(dir.path(), small_config(), meta.clone()).await?;
    let t = log.topic("t").await?;
    t.open_ledger().await?;
    t.open_ledger().await?;
    let first = t.ledgers();
    assert_eq!(first.len(), 1, "a second call opens nothing more");
    assert_eq!(first[0].state, LedgerState::Open);
    let pos = t.append(7, payload(0, 0, 40)).await?.durable().await?;
    assert_eq!(
        pos,
        Position::new(first[0].id, 0),
        "the open ledger takes it"
    );
    let sealed = t.seal_current().await?.ok_or("the used ledger is sealed")?;
    assert_eq!(sealed.id, first[0].id);

    t.open_ledger().await?;
    let unused = t.ledgers().last().map(|l| l.id).ok_or("no ledger")?;
    assert!(unused > sealed.id);
    assert!(
        t.seal_current().await?.is_none(),
        "nothing with entries to seal"
    );
    let record = meta.get_ledger(unused).await?.ok_or("record kept")?;
    assert_eq!(record.state, LedgerState::Deleted);
    assert_eq!(record.seal.map(|s| s.entry_count), Some(0));
    let index_dir = dir.path().join("index");
    assert!(!index::index_path(&index_dir, unused).exists());
    assert!(index::index_path(&index_dir, sealed.id).exists());
    let seen = |t: &TopicLog| -> Vec<(LedgerId, LedgerState, u64)> {
        t.ledgers()
            .iter()
            .map(|l| (l.id, l.state, l.entry_count))
            .collect()
    };
    let before = seen(&t);
    let got: Vec<Bytes> = read_all(&t).await?.into_iter().map(|e| e.payload).collect();
    assert_eq!(got, vec![payload(0, 0, 40)]);
    log.shutdown().await?;
    drop((t, log));

    let log = Log::open(dir.path(), small_config(), meta.clone()).await?;
    assert_eq!(
        log.recovery_report().sealed_ledgers,
        0,
        "nothing was left open"
    );
    let t = log.topic("t").await?;
    assert_eq!(seen(&t), before);
    let got: Vec<Bytes> = read_all(&t).await?.into_iter().map(|e| e.payload).collect();
    assert_eq!(got, vec![payload(0, 0, 40)]);
    log.shutdown().await?;
    Ok(())
}

/// A ledger opened ahead ages from its first entry, not from its creation: a producer that
/// waits less than the rollover age before sending does not get a one-entry ledger; one
/// opened ahead that gets no entry within the age is discarded (it would pin the journal's
/// segments), and the next entry opens a new one.
#[tokio::test]
async fn a_ledger_opened_ahead_ages_from_its_first_entry() -> TestResult {
    let dir = tempfile::tempdir()?;
    let meta: Arc<dyn MetadataStore> = Arc::new(MemoryMetadataStore::new());
    let config = LedgerConfig {
        rollover_age: std::time::Duration::from_millis(1000),
        ..small_config()
    };
    let log = Log::open(dir.path(), config, meta).await?;
    let t = log.topic("t").await?;
    t.open_ledger().await?;
    let ahead = t.ledgers()[0].id;
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    let a = t.append(1, payload(0, 1, 10)).await?.durable().await?;
    // Past the age counted from the opening, not from the first entry: no roll.
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    let b = t.append(2, payload(0, 2, 10)).await?.durable().await?;
    assert_eq!(
        (a.ledger, b.ledger),
        (ahead, ahead),
        "both entries share the ledger opened ahead"
    );
    assert_eq!((a.entry, b.entry), (0, 1));
    // Sealed at its age from the first entry; the next one opened ahead gets no entry and is
    // discarded at its own age.
    for _ in 0..150 {
        if t.ledgers()[0].state == LedgerState::Sealed {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    t.open_ledger().await?;
    let idle = t.ledgers().last().map(|l| l.id);
    assert_ne!(idle, Some(ahead));
    for _ in 0..150 {
        let states: Vec<_> = t.ledgers().iter().map(|l| (l.id, l.state)).collect();
        if states.iter().all(|(_, s)| *s != LedgerState::Open) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let states: Vec<_> = t.ledgers().iter().map(|l| (l.id, l.state)).collect();
    assert_eq!(states[0], (ahead, LedgerState::Sealed), "{states:?}");
    assert!(
        states
            .iter()
            .all(|(id, s)| *s != LedgerState::Open
                && (Some(*id) != idle || *s == LedgerState::Deleted)),
        "the idle ledger opened ahead is discarded: {states:?}"
    );
    let c = t.append(3, payload(0, 3, 10)).await?.durable().await?;
    assert!(Some(c.ledger) != idle && c.ledger > ahead);
    log.shutdown().await?;
    Ok(())
}

/// A crash leaves many ledgers open, a third of them opened ahead and still empty: recovery
/// seals the ones with entries (more than it closes at once) and discards the empty ones,
/// without index files.
#[tokio::test]
async fn recovery_seals_many_open_ledgers_and_discards_the_empty_ones() -> TestResult {
    let dir = tempfile::tempdir()?;
    let meta: Arc<dyn MetadataStore> = Arc::new(MemoryMetadataStore::new());
    let log = Log::open(dir.path(), small_config(), meta.clone()).await?;
    let mut topics = Vec::new();
    for i in 0..150usize {
        let t = log.topic(&format!("t{i}")).await?;
        t.open_ledger().await?;
        if i % 3 != 0 {
            t.append(i as i64, payload(i, 0, 30))
                .await?
                .durable()
                .await?;
        }
        topics.push(t);
    }
    drop(topics);
    drop(log); // no shutdown: every ledger stays open, as after a crash

    let log = Log::open(dir.path(), small_config(), meta.clone()).await?;
    assert_eq!(log.recovery_report().sealed_ledgers, 150);
    assert_eq!(log.recovery_report().recovered_entries, 100);
    let index_dir = dir.path().join("index");
    for i in 0..150usize {
        let t = log.topic(&format!("t{i}")).await?;
        let ledgers = t.ledgers();
        let [l] = &ledgers[..] else {
            return Err(format!("t{i}: not one ledger: {:?}", t.ledgers()).into());
        };
        let file = index::index_path(&index_dir, l.id).exists();
        if i % 3 == 0 {
            assert_eq!(
                (l.state, l.entry_count, file),
                (LedgerState::Deleted, 0, false)
            );
        } else {
            assert_eq!(
                (l.state, l.entry_count, file),
                (LedgerState::Sealed, 1, true)
            );
            let got: Vec<Bytes> = read_all(&t).await?.into_iter().map(|e| e.payload).collect();
            assert_eq!(got, vec![payload(i, 0, 30)]);
        }
    }
    log.shutdown().await?;
    Ok(())
}
