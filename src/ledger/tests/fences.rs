//! A fence a recovering owner set on this bookie outlives a restart (ADR 0014): the old
//! writer's adds stay refused, a copy or not, until the ledger is sealed; then the fence files
//! go.

use std::sync::Arc;

use bytes::Bytes;

use super::super::metadata::memory::MemoryMetadataStore;
use super::super::metadata::{LedgerTransition, Placement, SealInfo};
use super::super::*;
use super::{small_config, TestResult};

fn fence_files(dir: &std::path::Path) -> std::io::Result<usize> {
    let mut n = 0;
    for e in std::fs::read_dir(dir.join("replicas"))? {
        n += usize::from(e?.path().extension().is_some_and(|x| x == "fence"));
    }
    Ok(n)
}

fn sealed_at(n: u64) -> SealInfo {
    SealInfo {
        entry_count: n,
        size_bytes: n,
        min_publish_ms: None,
        max_publish_ms: None,
        last_segment: 0,
        checksum: 0,
    }
}

type Added = tokio::sync::oneshot::Receiver<Result<Position, AppendError>>;

async fn add(log: &Log, ledger: u64, entry: u64, recovery: bool) -> Result<Added, ReplicaAddError> {
    log.replica_add(ledger, entry, 0, Bytes::from("e"), recovery)
        .await
}

#[tokio::test]
async fn a_fence_outlives_a_restart_until_the_ledger_is_sealed() -> TestResult {
    let dir = tempfile::tempdir()?;
    let meta: Arc<dyn MetadataStore> = Arc::new(MemoryMetadataStore::new());
    let log = Log::open(dir.path(), small_config(), meta.clone()).await?;
    let replicas = vec![log.bookie_id().to_string()];
    let placement = Placement {
        bookie: "a-writer-elsewhere",
        replicas: &replicas,
        ack_quorum: 2,
        write_quorum: 2,
        stripe_width: 0,
    };
    let topic = meta
        .get_or_create_topic("persistent://t/n/fenced", 0)
        .await?;
    let copied = meta
        .create_ledger_placed(topic.id, 0, placement, 0, None)
        .await?
        .id;
    let uncopied = meta
        .create_ledger_placed(topic.id, 0, placement, 0, None)
        .await?
        .id;
    for entry in 0..3 {
        add(&log, copied, entry, false).await?.await??;
    }
    assert_eq!(log.replica_fence(copied).await?.seal.entry_count, 3);
    assert_eq!(log.replica_fence(uncopied).await?.seal.entry_count, 0);
    assert_eq!(fence_files(dir.path())?, 2);
    log.shutdown().await?;
    drop(log);

    // Restarted: the old writer's next add is refused on the copy it had, and no copy of the
    // other ledger is begun; a recovering owner's adds still complete the copy.
    let log = Log::open(dir.path(), small_config(), meta.clone()).await?;
    let refused = |r: Result<_, ReplicaAddError>| matches!(r, Err(ReplicaAddError::Fenced(_)));
    assert!(refused(add(&log, copied, 3, false).await));
    assert!(refused(add(&log, uncopied, 0, false).await));
    add(&log, copied, 3, true).await?.await??;
    // While the store holds the ledgers open, collection keeps the fences.
    log.collect_replicas().await?;
    assert_eq!(fence_files(dir.path())?, 2);

    // Sealed in the store: collection seals the copy and the fence files go; the copy, sealed,
    // and the store refuse the old writer from then on.
    for (ledger, count) in [(copied, 4), (uncopied, 0)] {
        meta.transition_ledger(ledger, LedgerTransition::Seal(sealed_at(count)), 1)
            .await?;
    }
    log.collect_replicas().await?;
    assert_eq!(fence_files(dir.path())?, 0);
    log.shutdown().await?;
    drop(log);
    let log = Log::open(dir.path(), small_config(), meta.clone()).await?;
    assert!(matches!(
        add(&log, copied, 4, false).await,
        Err(ReplicaAddError::OutOfOrder { .. })
    ));
    assert!(matches!(
        add(&log, uncopied, 0, false).await,
        Err(ReplicaAddError::NotReplica(_))
    ));
    log.shutdown().await?;
    Ok(())
}
