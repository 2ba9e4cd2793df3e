//! In-memory [`MetadataStore`]: same contract as the SQLite store except durability (it lives as
//! long as the process). Used by tests and simulations that model crashes of the log while the
//! metadata store survives.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;

use super::changes::Feeds;
use super::{
    check_partition_change, CopyChange, EnsembleChange, LedgerId, LedgerRecord, LedgerState,
    LedgerTransition, MetadataError, MetadataStore, Placement, TopicId, TopicRecord,
};

/// In-memory metadata store.
#[derive(Debug, Default)]
pub struct MemoryMetadataStore {
    /// Invariant: ledger ids and topic ids are below the matching `next_*` counter.
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    next_topic_id: TopicId,
    next_ledger_id: LedgerId,
    topics: BTreeMap<TopicId, TopicRecord>,
    ledgers: BTreeMap<LedgerId, LedgerRecord>,
    cursors: BTreeMap<(TopicId, String), Vec<u8>>,
    partitioned: BTreeMap<String, u32>,
    policies: BTreeMap<String, Vec<u8>>,
    schemas: BTreeMap<String, Vec<Vec<u8>>>,
    /// Epoch each topic's writers are fenced at (absent: 0).
    fenced: BTreeMap<TopicId, u64>,
    /// Invariant: every policies write is offered to every feed, under the same lock.
    feeds: Feeds,
}

impl State {
    /// Applies `change` to ledger `id` whole, or not at all.
    fn update_ledger(
        &mut self,
        id: LedgerId,
        change: impl FnOnce(&mut LedgerRecord) -> Result<(), MetadataError>,
    ) -> Result<LedgerRecord, MetadataError> {
        let l = self
            .ledgers
            .get_mut(&id)
            .ok_or(MetadataError::LedgerNotFound(id))?;
        let mut next = l.clone();
        change(&mut next)?;
        *l = next.clone();
        Ok(next)
    }

    /// The topic exists and no writer above `writer_epoch` fenced it.
    fn writable(&self, topic_id: TopicId, writer_epoch: Option<u64>) -> Result<(), MetadataError> {
        if !self.topics.contains_key(&topic_id) {
            return Err(MetadataError::TopicNotFound(topic_id));
        }
        let fenced_at = self.fenced.get(&topic_id).copied().unwrap_or(0);
        match writer_epoch.filter(|e| *e < fenced_at) {
            Some(epoch) => Err(MetadataError::Fenced {
                topic_id,
                epoch,
                fenced_at,
            }),
            None => Ok(()),
        }
    }
}

impl MemoryMetadataStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-applied update: every method
        // computes first and mutates last, so the data behind a poisoned lock is consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl MemoryMetadataStore {
    /// Changes ledger `id` by `change`, all or nothing (under the store's lock).
    fn update_ledger(
        &self,
        id: LedgerId,
        change: impl FnOnce(&mut LedgerRecord) -> Result<(), MetadataError>,
    ) -> Result<LedgerRecord, MetadataError> {
        self.lock().update_ledger(id, change)
    }
}

#[async_trait]
impl MetadataStore for MemoryMetadataStore {
    async fn get_or_create_topic(
        &self,
        name: &str,
        now_ms: i64,
    ) -> Result<TopicRecord, MetadataError> {
        let mut s = self.lock();
        if let Some(t) = s.topics.values().find(|t| t.name == name) {
            return Ok(t.clone());
        }
        s.next_topic_id += 1;
        let t = TopicRecord {
            id: s.next_topic_id,
            name: name.to_string(),
            created_at_ms: now_ms,
        };
        s.topics.insert(t.id, t.clone());
        Ok(t)
    }

    async fn get_topic(&self, name: &str) -> Result<Option<TopicRecord>, MetadataError> {
        Ok(self
            .lock()
            .topics
            .values()
            .find(|t| t.name == name)
            .cloned())
    }

    async fn get_topic_by_id(&self, id: TopicId) -> Result<Option<TopicRecord>, MetadataError> {
        Ok(self.lock().topics.get(&id).cloned())
    }

    async fn list_topics(&self) -> Result<Vec<TopicRecord>, MetadataError> {
        Ok(self.lock().topics.values().cloned().collect())
    }

    async fn first_topic_from(&self, name: &str) -> Result<Option<TopicRecord>, MetadataError> {
        Ok(self
            .lock()
            .topics
            .values()
            .filter(|t| t.name.as_str() >= name)
            .min_by(|a, b| a.name.cmp(&b.name))
            .cloned())
    }

    async fn list_topics_under(&self, prefix: &str) -> Result<Vec<TopicRecord>, MetadataError> {
        let mut out: Vec<TopicRecord> = self
            .lock()
            .topics
            .values()
            .filter(|t| t.name.starts_with(prefix))
            .cloned()
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn delete_topic(&self, name: &str) -> Result<bool, MetadataError> {
        let mut s = self.lock();
        let id = s.topics.values().find(|t| t.name == name).map(|t| t.id);
        if let Some(id) = id {
            let live = s
                .ledgers
                .values()
                .filter(|l| {
                    l.topic_id == id
                        && !matches!(l.state, LedgerState::Deleted | LedgerState::Expired)
                })
                .count();
            if live > 0 {
                return Err(MetadataError::Conflict(format!(
                    "topic {name} still has {live} ledgers that are not deleted"
                )));
            }
            s.ledgers.retain(|_, l| l.topic_id != id);
            s.cursors.retain(|(t, _), _| *t != id);
            s.topics.remove(&id);
            s.fenced.remove(&id);
        }
        let schemas = s.schemas.remove(name).is_some();
        let partitioned = s.partitioned.remove(name).is_some();
        Ok(id.is_some() || schemas || partitioned)
    }

    async fn create_ledger_placed(
        &self,
        topic_id: TopicId,
        first_segment: u32,
        placement: Placement<'_>,
        now_ms: i64,
        writer_epoch: Option<u64>,
    ) -> Result<LedgerRecord, MetadataError> {
        let mut s = self.lock();
        s.writable(topic_id, writer_epoch)?;
        s.next_ledger_id += 1;
        let l = LedgerRecord {
            id: s.next_ledger_id,
            topic_id,
            state: LedgerState::Open,
            first_segment,
            seal: None,
            created_at_ms: now_ms,
            state_changed_at_ms: now_ms,
            offload_ref: None,
            bookie: placement.bookie.to_string(),
            replicas: placement.replicas.to_vec(),
            ack_quorum: placement.ack_quorum,
            write_quorum: placement.write_quorum,
            stripe_width: placement.stripe_width,
        };
        s.ledgers.insert(l.id, l.clone());
        Ok(l)
    }

    async fn fence_writers(&self, topic_id: TopicId, epoch: u64) -> Result<(), MetadataError> {
        let mut s = self.lock();
        if !s.topics.contains_key(&topic_id) {
            return Err(MetadataError::TopicNotFound(topic_id));
        }
        let fenced_at = s.fenced.entry(topic_id).or_insert(0);
        if *fenced_at > epoch {
            return Err(MetadataError::Fenced {
                topic_id,
                epoch,
                fenced_at: *fenced_at,
            });
        }
        *fenced_at = epoch;
        Ok(())
    }

    async fn get_ledger(&self, id: LedgerId) -> Result<Option<LedgerRecord>, MetadataError> {
        Ok(self.lock().ledgers.get(&id).cloned())
    }

    async fn topic_ledgers(&self, topic_id: TopicId) -> Result<Vec<LedgerRecord>, MetadataError> {
        Ok(self
            .lock()
            .ledgers
            .values()
            .filter(|l| l.topic_id == topic_id)
            .cloned()
            .collect())
    }

    async fn ledgers_in_states(
        &self,
        states: &[LedgerState],
    ) -> Result<Vec<LedgerRecord>, MetadataError> {
        Ok(self
            .lock()
            .ledgers
            .values()
            .filter(|l| states.contains(&l.state))
            .cloned()
            .collect())
    }

    async fn transition_ledger(
        &self,
        id: LedgerId,
        transition: LedgerTransition,
        now_ms: i64,
    ) -> Result<LedgerRecord, MetadataError> {
        self.update_ledger(id, |l| transition.apply(l, now_ms))
    }

    async fn move_ledger_copies(
        &self,
        id: LedgerId,
        change: &CopyChange,
    ) -> Result<LedgerRecord, MetadataError> {
        self.update_ledger(id, |l| change.apply(l))
    }

    async fn change_ensemble(
        &self,
        id: LedgerId,
        change: &EnsembleChange,
        writer_epoch: Option<u64>,
    ) -> Result<LedgerRecord, MetadataError> {
        let mut s = self.lock();
        let topic_id = s
            .ledgers
            .get(&id)
            .ok_or(MetadataError::LedgerNotFound(id))?
            .topic_id;
        s.writable(topic_id, writer_epoch)?;
        s.update_ledger(id, |l| change.apply(l))
    }

    async fn save_cursor(
        &self,
        topic_id: TopicId,
        subscription: &str,
        state: &[u8],
        _now_ms: i64,
        writer_epoch: Option<u64>,
    ) -> Result<(), MetadataError> {
        let mut s = self.lock();
        s.writable(topic_id, writer_epoch)?;
        s.cursors
            .insert((topic_id, subscription.to_string()), state.to_vec());
        Ok(())
    }

    async fn topic_cursors(
        &self,
        topic_id: TopicId,
    ) -> Result<Vec<(String, Vec<u8>)>, MetadataError> {
        Ok(self
            .lock()
            .cursors
            .iter()
            .filter(|((t, _), _)| *t == topic_id)
            .map(|((_, name), state)| (name.clone(), state.clone()))
            .collect())
    }

    async fn delete_cursor(
        &self,
        topic_id: TopicId,
        subscription: &str,
        writer_epoch: Option<u64>,
    ) -> Result<(), MetadataError> {
        let mut s = self.lock();
        match s.writable(topic_id, writer_epoch) {
            Ok(()) | Err(MetadataError::TopicNotFound(_)) => {}
            Err(e) => return Err(e),
        }
        s.cursors.remove(&(topic_id, subscription.to_string()));
        Ok(())
    }

    async fn set_partitions(
        &self,
        name: &str,
        partitions: u32,
        update: bool,
    ) -> Result<(), MetadataError> {
        let mut s = self.lock();
        check_partition_change(name, s.partitioned.get(name).copied(), partitions, update)?;
        s.partitioned.insert(name.to_string(), partitions);
        Ok(())
    }

    async fn list_partitioned_topics(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, u32)>, MetadataError> {
        Ok(self
            .lock()
            .partitioned
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), *v))
            .collect())
    }

    async fn last_ledger_id(&self) -> Result<LedgerId, MetadataError> {
        Ok(self.lock().next_ledger_id)
    }

    async fn get_partitions(&self, name: &str) -> Result<Option<u32>, MetadataError> {
        Ok(self.lock().partitioned.get(name).copied())
    }

    async fn add_schema(
        &self,
        topic: &str,
        version: u64,
        schema: &[u8],
    ) -> Result<(), MetadataError> {
        let mut s = self.lock();
        let versions = s.schemas.entry(topic.to_string()).or_default();
        if versions.len() as u64 != version {
            return Err(MetadataError::Conflict(format!(
                "{topic}: schema version {version} is not the next one ({})",
                versions.len()
            )));
        }
        versions.push(schema.to_vec());
        Ok(())
    }

    async fn schemas(&self, topic: &str) -> Result<Vec<(u64, Vec<u8>)>, MetadataError> {
        Ok(self
            .lock()
            .schemas
            .get(topic)
            .map(|v| {
                v.iter()
                    .cloned()
                    .enumerate()
                    .map(|(i, b)| (i as u64, b))
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn get_policies(&self, scope: &str) -> Result<Option<Vec<u8>>, MetadataError> {
        Ok(self.lock().policies.get(scope).cloned())
    }

    async fn set_policies(
        &self,
        scope: &str,
        policies: Option<&[u8]>,
    ) -> Result<(), MetadataError> {
        let mut s = self.lock();
        match policies {
            Some(p) => s.policies.insert(scope.to_string(), p.to_vec()),
            None => s.policies.remove(scope),
        };
        s.feeds.changed(scope);
        Ok(())
    }

    async fn create_policies(&self, scope: &str, policies: &[u8]) -> Result<bool, MetadataError> {
        let mut s = self.lock();
        if s.policies.contains_key(scope) {
            return Ok(false);
        }
        s.policies.insert(scope.to_string(), policies.to_vec());
        s.feeds.changed(scope);
        Ok(true)
    }

    async fn replace_policies(
        &self,
        scope: &str,
        expect: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool, MetadataError> {
        let mut s = self.lock();
        if s.policies.get(scope).map(Vec::as_slice) != expect {
            return Ok(false);
        }
        match new {
            Some(p) => s.policies.insert(scope.to_string(), p.to_vec()),
            None => s.policies.remove(scope),
        };
        s.feeds.changed(scope);
        Ok(true)
    }

    /// Handles sharing one in-memory store stand for the processes of a cluster in tests, so
    /// this store reports its writes like a shared one.
    async fn policy_changes(&self) -> Result<Option<super::PolicyChanges>, MetadataError> {
        Ok(Some(self.lock().feeds.open()))
    }

    async fn list_policies(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, MetadataError> {
        Ok(self
            .lock()
            .policies
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
}
