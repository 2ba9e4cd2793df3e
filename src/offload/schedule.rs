//! Which tables an offload tick visits. The ledgers' states say where there is work — a
//! sealed ledger to offload, an offloaded one whose local copy waits for its deletion lag,
//! and, where retention is finite, deleted or expired ones — and a manual request names its
//! table: one query to the metadata store per tick, never a walk over every topic, so
//! millions of idle topics cost a tick nothing.
//!
//! Deleted and expired ledgers stay in their states (the lake holds them), so listing them
//! costs as much as there are topics that ever had one. They are listed only for retention,
//! and only once any namespace's retention is finite: at the first tick, every
//! `broker.retention_check_interval` (Pulsar's `retentionCheckIntervalInSeconds`), and at
//! once when the set of namespaces with a finite retention changes; a table they bring is
//! visited only if its namespace's retention may be finite. Sealed and offloaded ledgers
//! are listed every tick, and a pass applies retention to every table it visits, so new
//! data meets a size limit at once. At the first tick, every table with an expired ledger is
//! given one pass that loads it (files of expired ledgers may have outlived a crash or a
//! failed removal; nothing durable says which tables are clean), so a start costs one table
//! load per such table.
//!
//! Invariants:
//! - Every table that has a sealed or offloaded ledger, or a pending request, is visited;
//!   one with deleted or expired ledgers in a namespace whose retention may be finite is
//!   visited at least every retention check interval; a visited table is given all of its
//!   partitions (retention and status are per table).
//! - Topic names are learned by id only when a ledger names a topic id not seen before, and a
//!   table's partitions by listing its name prefix: never by listing every topic.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use super::{lock, partition_index, Inner, OffloadError};
use crate::ledger::metadata::{MetadataStore, TopicId};
use crate::ledger::LedgerState;
use crate::naming::TopicName;
use crate::policies::FiniteRetention;

/// When the scheduler last listed the ledgers only retention acts on (deleted, expired), and
/// where retention was finite then.
#[derive(Debug, Default)]
pub(super) struct RetentionListing {
    /// Invariant: `None` until the first listing.
    at: Option<Instant>,
    /// Where retention was finite at the last tick (`None`: no tick yet).
    finite: Option<FiniteRetention>,
}

impl RetentionListing {
    /// Whether this tick lists deleted and expired ledgers, given where retention is finite
    /// now and how often retention is checked.
    fn due(&self, finite: &FiniteRetention, every: Duration) -> bool {
        let changed = self.finite.as_ref() != Some(finite);
        finite.anywhere() && (changed || self.at.is_none_or(|t| t.elapsed() >= every))
    }

    /// Records a tick whose listing succeeded (`listed`: it held deleted and expired ledgers).
    /// A tick that failed records nothing, so the next one is due as this one was.
    fn done(&mut self, finite: FiniteRetention, listed: bool) {
        if listed {
            self.at = Some(Instant::now());
        }
        self.finite = Some(finite);
    }

    /// Whether a table of namespace `ns` brought only by deleted or expired ledgers is
    /// visited: its retention may be finite.
    fn may_expire(&self, ns: &str) -> bool {
        self.finite.as_ref().is_some_and(|f| f.may_cover(ns))
    }
}

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
        retention: &mut RetentionListing,
        first: bool,
    ) -> Result<Tables, OffloadError> {
        let meta = self.log.metadata();
        let mut states = vec![LedgerState::Sealed, LedgerState::Offloaded];
        let finite = self.policies.finite_retention().await?;
        let for_retention = retention.due(&finite, self.retention_every);
        if for_retention {
            states.extend([LedgerState::Deleted, LedgerState::Expired]);
        } else if first {
            // Files of ledgers expired before a restart may still be in their tables.
            states.push(LedgerState::Expired);
        }
        let records = meta.ledgers_in_states(&states).await?;
        // Topics visited whatever their namespace's retention: those with data to move, and
        // at the first tick those with expired ledgers (their files may still be in their
        // tables). The others came for retention only.
        let always: BTreeSet<TopicId> = records
            .iter()
            .filter(|r| match r.state {
                LedgerState::Sealed | LedgerState::Offloaded => true,
                LedgerState::Expired => first,
                _ => false,
            })
            .map(|r| r.topic_id)
            .collect();
        let ids: BTreeSet<TopicId> = records.iter().map(|r| r.topic_id).collect();
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
        // Recorded only once the tick can no longer fail: a failed one stays due.
        retention.done(finite, for_retention);
        let mut tables = Tables::new();
        for id in &ids {
            let Some(name) = known.by_id.get(id) else {
                continue; // deleted meanwhile
            };
            if let Ok(parsed) = name.parse::<TopicName>() {
                if for_retention
                    && !always.contains(id)
                    && !retention.may_expire(&parsed.namespace.to_string())
                {
                    continue; // its namespace keeps everything
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn only(namespaces: &[&str]) -> FiniteRetention {
        FiniteRetention::In(namespaces.iter().map(|n| n.to_string()).collect())
    }

    /// One tick: whether it lists, then its success recorded.
    fn tick(r: &mut RetentionListing, finite: FiniteRetention, every: Duration) -> bool {
        let due = r.due(&finite, every);
        r.done(finite, due);
        due
    }

    #[test]
    fn deleted_ledgers_are_listed_when_retention_is_due_or_its_reach_changes() {
        let hour = Duration::from_secs(3600);
        let mut r = RetentionListing::default();
        // Infinite everywhere: never.
        assert!(!tick(&mut r, only(&[]), hour));
        assert!(!tick(&mut r, only(&[]), hour));
        // Finite somewhere: at once, then not again within the interval.
        assert!(tick(&mut r, only(&["public/a"]), hour));
        assert!(!tick(&mut r, only(&["public/a"]), hour));
        assert!(r.may_expire("public/a") && !r.may_expire("public/b"));
        // Its reach changed: at once.
        assert!(tick(&mut r, only(&["public/a", "public/b"]), hour));
        assert!(tick(&mut r, FiniteRetention::Everywhere, hour));
        assert!(r.may_expire("any/ns"));
        assert!(!tick(&mut r, FiniteRetention::Everywhere, hour));
        // A tick whose listing failed records nothing: the next is due as it was.
        assert!(r.due(&only(&["public/c"]), hour));
        assert!(r.due(&only(&["public/c"]), hour));
        // The interval passed.
        assert!(tick(&mut r, FiniteRetention::Everywhere, Duration::ZERO));
    }
}
