//! Which tables an offload tick visits. The ledgers' states say where there is work — a
//! sealed ledger to offload, an offloaded one whose local copy waits for its deletion lag,
//! and, where retention is finite, deleted or expired ones — and a manual request names its
//! table: one query to the metadata store per tick, never a walk over every topic, so
//! millions of idle topics cost a tick nothing.
//!
//! Invariants:
//! - Every table that has a ledger in one of those states, or a pending request, is visited;
//!   a visited table is given all of its partitions (retention and status are per table).
//! - Topic names are learned by id only when a ledger names a topic id not seen before, and a
//!   table's partitions by listing its name prefix: never by listing every topic.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{lock, partition_index, Inner, OffloadError};
use crate::ledger::metadata::{MetadataStore, TopicId};
use crate::ledger::LedgerState;
use crate::naming::TopicName;

/// Tables to visit: base topic name → (base, its partitions' indexes and names).
pub(super) type Tables = BTreeMap<String, (TopicName, Vec<(i32, String)>)>;

/// What the scheduler knows of the topics that had work at its last tick: their names, and
/// the partitions of their tables. Invariant: holds only topics that had work then, so its
/// size follows the work, not the number of topics.
#[derive(Debug, Default)]
pub(super) struct TopicNames {
    by_id: HashMap<TopicId, String>,
    tables: BTreeMap<String, (TopicName, Vec<(i32, String)>)>,
}

impl Inner {
    /// The tables with work now. `first`: the scheduler's first tick (tables with expired
    /// ledgers, whose files may still be in them, are visited once whatever the policies).
    pub(super) async fn tables_with_work(
        &self,
        known: &mut TopicNames,
        first: bool,
    ) -> Result<Tables, OffloadError> {
        let meta = self.log.metadata();
        let mut states = vec![LedgerState::Sealed, LedgerState::Offloaded];
        if self.policies.any_finite_retention().await? {
            states.extend([LedgerState::Deleted, LedgerState::Expired]);
        } else if first {
            // Files of ledgers expired before a restart may still be in their tables.
            states.push(LedgerState::Expired);
        }
        let ids: BTreeSet<TopicId> = meta
            .ledgers_in_states(&states)
            .await?
            .iter()
            .map(|r| r.topic_id)
            .collect();
        let requested: BTreeSet<String> = lock(&self.tables)
            .iter()
            .filter(|(_, slot)| {
                let m = lock(&slot.manual);
                m.0 > m.1
            })
            .map(|(key, _)| key.clone())
            .collect();
        let unknown = ids.iter().any(|id| !known.by_id.contains_key(id))
            || requested.iter().any(|k| !known.tables.contains_key(k));
        if unknown {
            *known = learn(&*meta, known, &ids, &requested).await?;
        }
        let mut tables = Tables::new();
        for id in &ids {
            let Some(name) = known.by_id.get(id) else {
                continue; // deleted meanwhile
            };
            if let Ok(parsed) = name.parse::<TopicName>() {
                let key = parsed.base().to_string();
                if let Some(t) = known.tables.get(&key) {
                    tables.insert(key, t.clone());
                }
            }
        }
        for key in requested {
            if let Some(t) = known.tables.get(&key) {
                tables.insert(key, t.clone());
            }
        }
        Ok(tables)
    }
}

/// The names of topics `ids` and the partitions of their tables and of the `requested` ones.
/// What `before` knew is kept; a topic id it did not know is looked up by id, and the tables of
/// those topics and the requested ones it did not know are listed by their name prefix (a new
/// partition gets a new topic id, so a table's partitions are listed again when it appears).
/// Never a listing of every topic.
async fn learn(
    meta: &dyn MetadataStore,
    before: &TopicNames,
    ids: &BTreeSet<TopicId>,
    requested: &BTreeSet<String>,
) -> Result<TopicNames, OffloadError> {
    let mut known = TopicNames::default();
    let mut stale: BTreeSet<String> = requested
        .iter()
        .filter(|key| !before.tables.contains_key(*key))
        .cloned()
        .collect();
    let mut bases: BTreeSet<String> = requested.clone();
    for id in ids {
        let name = match before.by_id.get(id) {
            Some(name) => name.clone(),
            None => match meta.get_topic_by_id(*id).await? {
                Some(t) => t.name,
                None => continue, // deleted meanwhile
            },
        };
        let Ok(parsed) = name.parse::<TopicName>() else {
            continue;
        };
        if !parsed.persistent {
            continue;
        }
        let key = parsed.base().to_string();
        if !before.by_id.contains_key(id) {
            stale.insert(key.clone());
        }
        bases.insert(key);
        known.by_id.insert(*id, name);
    }
    for key in bases {
        if !stale.contains(&key) {
            if let Some(table) = before.tables.get(&key) {
                known.tables.insert(key, table.clone());
                continue;
            }
        }
        let mut partitions = Vec::new();
        let mut base = None;
        for t in meta.list_topics_under(&key).await? {
            let Ok(name) = t.name.parse::<TopicName>() else {
                continue;
            };
            if name.persistent && name.base().to_string() == key {
                partitions.push((partition_index(&name), t.name));
                base.get_or_insert_with(|| name.base());
            }
        }
        if let Some(base) = base {
            partitions.sort();
            known.tables.insert(key, (base, partitions));
        }
    }
    Ok(known)
}
