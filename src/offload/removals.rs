//! A deleted topic's lake removal, made durable.
//!
//! Deleting a topic removes its log first and its lake data last: its table is dropped, or, in
//! a namespace's shared table, its rows are removed up to a bound (the store's last ledger id
//! read before the deletion began; a topic of the same name created later has higher ids). A
//! crash between the two, or a removal that kept losing commit races, left the rows behind
//! for good: the topic was gone, so nothing would ever remove them. Now the deletion records
//! its removal first (`lake/removal/{topic}/{nonce}` in the metadata store's record space, one
//! record per deletion) and forgets it once the lake part is done; every node's engine does
//! again the removals whose record outlived its deletion, at its first tick and then every
//! `lake.orphan_check_interval`.
//!
//! Invariants:
//! - A record is written before anything of its topic is deleted, and removed only after its
//!   lake removal succeeded, or when its deletion was refused with the topic still in place.
//!   Each deletion removes only its own record (the nonce), never another deletion's.
//! - A record is done again only when no topic of its name holds a ledger at or below its
//!   bound: a deletion still under way (on any node), or one that stopped half-way (a
//!   partition it could not delete), is never undercut. A topic of the name created since has
//!   only higher ledger ids: its rows are kept, and its own table is not dropped (its rows up
//!   to the bound are removed instead).
//! - The record names the table as it was at the deletion (layout included), so doing it again
//!   does not depend on the namespace's policies or even on the namespace still existing.
//! - Format: [`crate::versioned`] with [`FORMAT`]; a reader refuses other formats (ADR 0015).

use std::sync::Arc;
use std::time::Duration;

use iceberg::{NamespaceIdent, TableIdent};
use serde::{Deserialize, Serialize};

use super::{lock, Inner, OffloadEngine, OffloadError, REMOVAL_ATTEMPTS};
use crate::lake::expire::Live;
use crate::lake::{naming::TopicTable, Lake, LakeError};
use crate::ledger::metadata::MetadataStore;
use crate::ledger::{LedgerId, MetadataError};
use crate::naming::TopicName;

/// Format byte of a removal record.
pub const FORMAT: u8 = 1;
/// Where the records are kept (the metadata store's record space, beside tenancy's).
const PREFIX: &str = "lake/removal/";

/// A deleted topic's lake removal, as recorded before the deletion.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemovalRecord {
    /// The base topic deleted (all its partitions).
    pub topic: String,
    /// The store's last ledger id when the deletion began: rows of ledgers at or below it go.
    pub last_ledger: LedgerId,
    /// The table's namespace.
    pub namespace: Vec<String>,
    /// The table's name.
    pub table: String,
    /// In a shared table, the topic's `topic` column value; `None`: the topic's own table.
    pub shared_topic: Option<String>,
}

impl RemovalRecord {
    fn of(topic: &TopicName, table: &TopicTable, last_ledger: LedgerId) -> RemovalRecord {
        RemovalRecord {
            topic: topic.to_string(),
            last_ledger,
            namespace: table.ident.namespace().clone().inner(),
            table: table.ident.name().to_string(),
            shared_topic: table.topic.clone(),
        }
    }

    fn table(&self) -> Result<TopicTable, String> {
        let namespace = NamespaceIdent::from_vec(self.namespace.clone())
            .map_err(|e| format!("removal record of {}: {e}", self.topic))?;
        Ok(TopicTable {
            ident: TableIdent::new(namespace, self.table.clone()),
            topic: self.shared_topic.clone(),
        })
    }

    /// The stored form.
    pub fn encode(&self) -> Vec<u8> {
        crate::versioned::encode(FORMAT, self)
    }

    /// Reads the stored form.
    pub fn decode(bytes: &[u8]) -> Result<RemovalRecord, String> {
        crate::versioned::decode(FORMAT, "lake removal record", bytes)
    }
}

/// The key of one deletion's record of `topic`.
fn scope(topic: &TopicName) -> String {
    format!("{PREFIX}{topic}/{:016x}", rand::random::<u64>())
}

/// A recorded removal, as its deletion wrote it (to forget exactly that record).
#[derive(Debug)]
pub struct Recorded {
    scope: String,
    blob: Vec<u8>,
}

/// One topic deletion's hold on the lake: its table paused (a pass running now finishes
/// first) and read once, and its removal recorded. Made by [`OffloadEngine::begin_deletion`]
/// before anything of the topic is deleted; ended by [`OffloadEngine::finish_deletion`] or
/// [`OffloadEngine::deletion_refused`]. Dropping it un-pauses the table and leaves the record
/// (the engine does the removal later).
#[derive(Debug)]
pub struct Deletion {
    table: TopicTable,
    /// The store's last ledger id when the deletion began.
    last_ledger: LedgerId,
    /// `None` when deletions keep lake data, or once the record is forgotten.
    recorded: Option<Recorded>,
    _paused: tokio::sync::OwnedMutexGuard<()>,
}

impl Deletion {
    /// The store's last ledger id when the deletion began: every ledger the deleted topics
    /// had is at or below it, and only rows of those ledgers are removed.
    pub fn last_ledger(&self) -> LedgerId {
        self.last_ledger
    }
}

impl OffloadEngine {
    /// Begins deleting `base` (all its partitions): pauses its table, reads the bound (the
    /// store's last ledger id), and records the lake removal before anything is deleted.
    pub async fn begin_deletion(&self, base: &TopicName) -> Result<Deletion, OffloadError> {
        let inner = &self.inner;
        let (table, paused) = inner.paused_table(base).await?;
        // Read before anything is deleted: see `Operations::delete_all`.
        let last_ledger = inner.log.metadata().last_ledger_id().await?;
        let mut deletion = Deletion {
            table,
            last_ledger,
            recorded: None,
            _paused: paused,
        };
        if !inner.config.drop_table_on_topic_delete {
            return Ok(deletion);
        }
        let recorded = Recorded {
            scope: scope(base),
            blob: RemovalRecord::of(base, &deletion.table, last_ledger).encode(),
        };
        inner
            .log
            .metadata()
            .set_policies(&recorded.scope, Some(&recorded.blob))
            .await?;
        deletion.recorded = Some(recorded);
        Ok(deletion)
    }

    /// The deletion was refused with its first topic still in place: nothing is to be removed,
    /// and its record is forgotten.
    pub async fn deletion_refused(&self, mut deletion: Deletion) {
        self.forget(deletion.recorded.take()).await;
    }

    /// After `base`'s topics were deleted: drops its lake table and deletes the table's files
    /// when `lake.drop_table_on_topic_delete` is on (in a namespace's shared table, or when a
    /// topic of the name was made anew meanwhile, removes its rows up to the bound instead: the
    /// new topic's ledgers are above it, and another node may have offloaded them already),
    /// forgets its offload status (unless the name has a topic again), then its record.
    /// Returns whether anything was dropped or removed. On failure the record stays; so it
    /// does, with nothing removed, while a topic of the name that the deletion did not cover
    /// still holds a ledger at or below the bound (the engine does the removal once none
    /// does, as for a recorded removal found later). A topic made anew after the check here
    /// and before the removal still loses the table (a narrow window, left).
    pub async fn finish_deletion(
        &self,
        base: &TopicName,
        mut deletion: Deletion,
    ) -> Result<bool, OffloadError> {
        if !self.inner.config.drop_table_on_topic_delete {
            lock(&self.inner.tables).remove(&base.to_string());
            return Ok(false);
        }
        let last_ledger = deletion.last_ledger;
        let again = match redo_state(&*self.inner.log.metadata(), base, last_ledger).await? {
            Redo::Due { again } => again,
            Redo::NotYet => {
                tracing::warn!(topic = %base, last_ledger,
                    "a topic of the deleted name still holds older ledgers: its lake removal waits");
                return Ok(false);
            }
        };
        if !again {
            lock(&self.inner.tables).remove(&base.to_string());
        }
        let inner = self.inner.clone();
        let table = deletion.table.clone();
        let removed = self
            .on_lake(async move {
                let grace = inner.config.removed_file_grace;
                remove_deleted(
                    &inner.lake,
                    &table,
                    last_ledger,
                    again,
                    grace,
                    &inner.finish_tx,
                )
                .await
            })
            .await??;
        self.forget(deletion.recorded.take()).await;
        Ok(removed)
    }

    /// Forgets `recorded`. A failure is logged: the record stays, and the engine finds the
    /// removal done (or does it again).
    async fn forget(&self, recorded: Option<Recorded>) {
        if let Some(r) = recorded {
            if let Err(e) = self.inner.log.metadata().set_policies(&r.scope, None).await {
                tracing::warn!(record = %r.scope, error = %e,
                    "could not forget a lake removal record; it is done again later");
            }
        }
    }
}

/// Removes the deleted topic's data from `table`: drops its own table (unless `keep_table`: a
/// topic of the name exists again, and only its rows up to `last_ledger` go), or removes its
/// rows up to `last_ledger` from the shared table, building the removal again when it loses a
/// commit race. Returns whether anything was dropped or removed; removals to finish after
/// their grace are sent to `finish`.
pub(super) async fn remove_deleted(
    lake: &Lake,
    table: &TopicTable,
    last_ledger: LedgerId,
    keep_table: bool,
    grace: Duration,
    finish: &tokio::sync::mpsc::UnboundedSender<(TableIdent, i64)>,
) -> Result<bool, LakeError> {
    let through =
        std::collections::BTreeMap::from([(table.topic.clone().unwrap_or_default(), last_ledger)]);
    let live = match &table.topic {
        None if !keep_table => return lake.drop_table(&table.ident).await,
        None => Live::TableThrough(last_ledger),
        Some(_) => Live::DeletedThrough(&through),
    };
    // The other topics of a shared table go on committing (on other nodes): a removal that
    // lost the race is built again on the new version.
    let mut backoff = Duration::from_millis(100);
    let mut attempts = 1;
    loop {
        let Some(t) = lake.load_table(&table.ident).await? else {
            return Ok(false);
        };
        match crate::lake::expire::remove_expired(lake, t, live, &[], grace).await {
            Ok((_, outcome)) => {
                if let Some(due) = outcome.finish_due_ms {
                    let _ = finish.send((table.ident.clone(), due));
                }
                return Ok(outcome.snapshot_id.is_some());
            }
            Err(e) if e.is_commit_conflict() && attempts < REMOVAL_ATTEMPTS => {
                tracing::info!(table = %table.ident, attempts, error = %e,
                    "a deleted topic's removal lost a commit race; building it again");
                tokio::time::sleep(backoff).await;
                backoff *= 2;
                attempts += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// What doing a recorded removal again found.
#[derive(Debug, PartialEq, Eq)]
enum Redo {
    /// No topic of the name holds a ledger at or below the bound; `again`: one of the name
    /// exists (created since).
    Due { again: bool },
    /// A topic of the name still holds a ledger at or below the bound: its deletion is under
    /// way or stopped half-way.
    NotYet,
}

impl Inner {
    /// Does again every recorded removal whose deletion is over (see the module's invariants).
    /// Returns how many were done.
    pub(super) async fn redo_removals(self: &Arc<Self>) -> Result<usize, OffloadError> {
        if !self.config.drop_table_on_topic_delete {
            return Ok(0);
        }
        let meta = self.log.metadata();
        let mut done = 0;
        for (key, blob) in meta.list_policies(PREFIX).await? {
            if self.stop.is_cancelled() {
                break;
            }
            let record = match RemovalRecord::decode(&blob) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(record = %key, error = %e, "unreadable lake removal record");
                    continue;
                }
            };
            let Ok(topic) = record.topic.parse::<TopicName>() else {
                tracing::warn!(record = %key, "lake removal record of an unreadable topic name");
                continue;
            };
            let table = match record.table() {
                Ok(t) => t,
                Err(e) => {
                    tracing::warn!(record = %key, error = %e, "lake removal record of an unreadable table");
                    continue;
                }
            };
            // Judged under the table's writer lock (a deletion of this node holds it until
            // its lake part is done), and on the record as it is now.
            let writer = self.writer(&table.ident);
            let _writing = writer.lock().await;
            // A store error skips this record only (the next round tries it again).
            let current = match meta.get_policies(&key).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(record = %key, error = %e, "reading a lake removal record failed");
                    continue;
                }
            };
            if current.as_deref() != Some(&blob[..]) {
                continue; // done meanwhile
            }
            let again = match redo_state(&*meta, &topic, record.last_ledger).await {
                Ok(Redo::NotYet) => continue,
                Ok(Redo::Due { again }) => again,
                Err(e) => {
                    tracing::warn!(topic = %topic, error = %e,
                        "reading the topics of a recorded lake removal failed");
                    continue;
                }
            };
            let grace = self.config.removed_file_grace;
            match remove_deleted(
                &self.lake,
                &table,
                record.last_ledger,
                again,
                grace,
                &self.finish_tx,
            )
            .await
            {
                Ok(_) => {
                    if let Err(e) = meta.set_policies(&key, None).await {
                        tracing::warn!(record = %key, error = %e,
                            "could not forget a done lake removal record; it is done again later");
                    }
                    done += 1;
                    tracing::info!(topic = %topic, table = %table.ident,
                        last_ledger = record.last_ledger,
                        "finished the lake removal of a deleted topic");
                }
                Err(e) => tracing::warn!(topic = %topic, error = %e,
                    "the lake removal of a deleted topic failed again; it stays recorded"),
            }
            if !again {
                lock(&self.tables).remove(&topic.to_string());
            }
        }
        Ok(done)
    }
}

/// Whether `topic`'s recorded removal (bound `last_ledger`) may be done now.
async fn redo_state(
    meta: &dyn MetadataStore,
    topic: &TopicName,
    last_ledger: LedgerId,
) -> Result<Redo, MetadataError> {
    for t in topics_of(meta, topic).await? {
        if meta
            .topic_ledgers(t.id)
            .await?
            .iter()
            .any(|l| l.id <= last_ledger)
        {
            return Ok(Redo::NotYet);
        }
    }
    // Listed again: a topic listed above but deleted before its ledgers were read (it showed
    // none) is not one that exists again.
    let again = !topics_of(meta, topic).await?.is_empty();
    Ok(Redo::Due { again })
}

/// The topics of the name `topic` (itself or its partitions) the store lists.
async fn topics_of(
    meta: &dyn MetadataStore,
    topic: &TopicName,
) -> Result<Vec<crate::ledger::metadata::TopicRecord>, MetadataError> {
    let base = topic.to_string();
    let mut all = meta.list_topics_under(&base).await?;
    // Another topic whose name starts alike is not one of them.
    all.retain(|t| {
        t.name
            .parse::<TopicName>()
            .is_ok_and(|n| n.base().to_string() == base)
    });
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn records_round_trip(
            topic in "[a-z/:-]{1,40}",
            last_ledger in any::<u64>(),
            namespace in proptest::collection::vec("[a-z]{1,8}", 1..3),
            table in "[a-z_]{1,12}",
            shared_topic in proptest::option::of("[a-z-]{1,12}"),
        ) {
            let record = RemovalRecord { topic, last_ledger, namespace, table, shared_topic };
            let bytes = record.encode();
            prop_assert_eq!(bytes[0], FORMAT);
            prop_assert_eq!(RemovalRecord::decode(&bytes), Ok(record));
            let mut other = bytes.clone();
            other[0] = FORMAT + 1;
            prop_assert!(RemovalRecord::decode(&other).is_err());
        }
    }

    #[tokio::test]
    async fn a_removal_waits_until_no_topic_of_the_name_holds_a_ledger_under_its_bound() {
        use crate::ledger::metadata::memory::MemoryMetadataStore;
        let meta = MemoryMetadataStore::new();
        let base: TopicName = "persistent://t/ns/x".parse().expect("a topic name");
        let ledger_of = |name: &'static str| {
            let meta = &meta;
            async move {
                let t = meta.get_or_create_topic(name, 0).await.expect("a topic");
                meta.create_ledger(t.id, 0, "b", 0, None)
                    .await
                    .expect("a ledger")
                    .id
            }
        };
        // A topic whose name only starts alike does not count.
        ledger_of("persistent://t/ns/xy").await;
        assert_eq!(
            redo_state(&meta, &base, 100).await.expect("read"),
            Redo::Due { again: false }
        );
        // A partition still holding a ledger under the bound: its deletion is not over.
        let first = ledger_of("persistent://t/ns/x-partition-1").await;
        assert_eq!(
            redo_state(&meta, &base, first).await.expect("read"),
            Redo::NotYet
        );
        // Its ledgers are all above the bound: a topic of the name created since.
        assert_eq!(
            redo_state(&meta, &base, first - 1).await.expect("read"),
            Redo::Due { again: true }
        );
        // A topic of the name without any ledger yet is one created since too.
        let other: TopicName = "persistent://t/ns/y".parse().expect("a topic name");
        assert_eq!(
            redo_state(&meta, &other, 100).await.expect("read"),
            Redo::Due { again: false }
        );
        meta.get_or_create_topic("persistent://t/ns/y", 0)
            .await
            .expect("a topic");
        assert_eq!(
            redo_state(&meta, &other, 100).await.expect("read"),
            Redo::Due { again: true }
        );
    }

    #[test]
    fn a_record_names_its_table_and_layout() {
        let topic: TopicName = "persistent://acme/ns/orders".parse().expect("a topic name");
        let shared = TopicTable::of(&topic, crate::config::LakeTableLayout::Shared);
        let record = RemovalRecord::of(&topic, &shared, 42);
        let (one, two) = (scope(&topic), scope(&topic));
        assert!(
            one.starts_with("lake/removal/persistent://acme/ns/orders/"),
            "{one}"
        );
        assert_ne!(one, two, "one record per deletion");
        let back = record.table().expect("a table");
        assert_eq!(back.ident, shared.ident);
        assert_eq!(back.topic.as_deref(), Some("orders"));
        let own = TopicTable::of(&topic, crate::config::LakeTableLayout::PerTopic);
        let back = RemovalRecord::of(&topic, &own, 42)
            .table()
            .expect("a table");
        assert_eq!(back.ident, own.ident);
        assert_eq!(back.topic, None);
    }
}
