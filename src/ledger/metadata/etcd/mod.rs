//! etcd implementation of [`MetadataStore`], for nodes of a cluster (`metadata.url =
//! "etcd://host:port[,host:port…][/prefix]"`).
//!
//! Consensus stays etcd's: every method is one etcd transaction, or a loop of read, then a
//! transaction guarded by compares on what was read (mod revisions, versions), retried when
//! another writer got there first. That gives the contract's atomic steps without a lock
//! service, and etcd's raft log gives durability once a transaction returns.
//!
//! - Ids come from two counter keys advanced by compare-and-set, so they are unique and
//!   increase in creation order across every node sharing the store.
//! - A topic's deletion compares the mod revision of the whole range of its ledgers against the
//!   revision it read them at: a ledger created or changed meanwhile makes it retry.
//! - `ledger-topic` index keys of a deleted topic are removed after the deletion commits, in
//!   batches; a crash between leaves index keys that point at no record, which read as "no such
//!   ledger" (ledger ids are never reused).
//!
//! Key layout and record encoding: [`layout`] (ADR 0006). With several members, those that
//! do not answer are kept out of the client's balance ([`members`]).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, KeyValue, Txn, TxnOp,
    TxnOpResponse, TxnResponse,
};

use crate::config::EtcdUrl;

use super::{
    check_partition_change, CopyChange, EnsembleChange, LedgerId, LedgerRecord, LedgerState,
    LedgerTransition, MetadataError, MetadataStore, Placement, TopicId, TopicRecord,
};
use layout::{decode, decode_ledger, encode, encode_ledger, Keys, StoredTopic};

mod cas;
mod feed;
pub mod layout;
mod members;

use cas::{absent, exists, first_get_found, unchanged, TopicMust};

/// Keys read per request when listing a range.
const PAGE: i64 = 500;
/// Operations per transaction when cleaning up index keys (etcd's default limit is 128).
const CLEANUP_BATCH: usize = 100;
/// etcd-backed metadata store.
#[derive(Clone)]
pub struct EtcdMetadataStore {
    /// Invariant: connected to the members of one etcd cluster.
    client: Client,
    /// Invariant: every key this store reads or writes is under `keys`' prefix.
    keys: Keys,
    /// With more than one member: keeps `client`'s requests off members that do not answer
    /// (ends with the last clone of this store).
    _members: Option<Arc<members::MemberGuard>>,
}

impl std::fmt::Debug for EtcdMetadataStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdMetadataStore")
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

fn backend(op: &'static str) -> impl FnOnce(etcd_client::Error) -> MetadataError {
    move |e| MetadataError::Backend {
        op,
        source: Box::new(e),
    }
}

/// The first key after every key starting with `prefix` (etcd's range end for a prefix).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl EtcdMetadataStore {
    /// Connects to the etcd cluster named by `url` (`etcd://host:port[,…][/prefix]`).
    pub async fn connect(url: &str) -> Result<Self, MetadataError> {
        let parsed = EtcdUrl::parse(url).map_err(|e| MetadataError::Backend {
            op: "parse etcd url",
            source: e.into(),
        })?;
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(Duration::from_secs(15))
            // A member that hangs (its connections stay open) fails the requests waiting on it
            // within 4 s, rather than 15 (they are retried on the others: `members`).
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
            // A member cut off from its leader refuses requests and ends its watches instead
            // of serving what it had (a watch on it would go quiet and never end).
            .with_require_leader(true);
        let client = Client::connect(&parsed.endpoints, Some(options.clone()))
            .await
            .map_err(backend("connect to etcd"))?;
        let guard = members::guard(&client, &parsed.endpoints, &options)
            .await
            .map_err(backend("connect to each etcd member"))?;
        let store = EtcdMetadataStore {
            _members: guard.map(Arc::new),
            ..Self::with_client(client, &parsed.prefix)
        };
        // Fail at start, not at the first topic, when etcd is not there.
        store
            .client
            .kv_client()
            .get(store.keys.topic_ids(), None)
            .await
            .map_err(backend("reach etcd"))?;
        Ok(store)
    }

    /// A store over an existing client, under `prefix`.
    pub fn with_client(client: Client, prefix: &str) -> Self {
        EtcdMetadataStore {
            client,
            keys: Keys::new(prefix),
            _members: None,
        }
    }

    /// The prefix of every key of this store.
    pub fn prefix(&self) -> &str {
        self.keys.prefix()
    }

    /// The client, for other users of the same etcd cluster.
    pub fn client(&self) -> &Client {
        &self.client
    }

    async fn get(
        &self,
        op: &'static str,
        key: impl Into<Vec<u8>>,
    ) -> Result<Option<KeyValue>, MetadataError> {
        let mut resp = self
            .client
            .kv_client()
            .get(key, None)
            .await
            .map_err(backend(op))?;
        Ok(resp.take_kvs().into_iter().next())
    }

    async fn txn(&self, op: &'static str, txn: Txn) -> Result<TxnResponse, MetadataError> {
        self.client.kv_client().txn(txn).await.map_err(backend(op))
    }

    /// Every key in `[start, end)` at one revision, in key order, read in pages; with the
    /// revision read at.
    async fn range(
        &self,
        op: &'static str,
        start: impl Into<Vec<u8>>,
        end: Vec<u8>,
    ) -> Result<(Vec<KeyValue>, i64), MetadataError> {
        let mut kv = self.client.kv_client();
        let mut from = start.into();
        let mut out = Vec::new();
        let mut revision = 0;
        loop {
            let mut options = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
            if revision > 0 {
                options = options.with_revision(revision);
            }
            let mut resp = kv.get(from, Some(options)).await.map_err(backend(op))?;
            if revision == 0 {
                revision = resp.header().map(|h| h.revision()).unwrap_or(0);
            }
            let more = resp.more();
            let page = resp.take_kvs();
            let Some(last) = page.last() else {
                return Ok((out, revision));
            };
            from = last.key().to_vec();
            from.push(0);
            out.extend(page);
            if !more {
                return Ok((out, revision));
            }
        }
    }

    async fn range_prefix(
        &self,
        op: &'static str,
        prefix: impl Into<Vec<u8>>,
    ) -> Result<(Vec<KeyValue>, i64), MetadataError> {
        let prefix = prefix.into();
        let end = prefix_end(&prefix);
        self.range(op, prefix, end).await
    }

    /// A counter's next value and its mod revision (0: absent).
    /// The epoch `topic`'s writers are fenced at (0: never) and its key's mod revision.
    pub(super) async fn fenced_at(&self, topic: TopicId) -> Result<(u64, i64), MetadataError> {
        Ok(
            match self
                .get("read writer fence", self.keys.writers(topic))
                .await?
            {
                Some(kv) => (decode("writer fence", kv.value())?, kv.mod_revision()),
                None => (0, 0),
            },
        )
    }

    async fn counter(&self, key: &str) -> Result<(u64, i64), MetadataError> {
        Ok(match self.get("read id counter", key).await? {
            Some(kv) => (decode("id counter", kv.value())?, kv.mod_revision()),
            None => (1, 0),
        })
    }

    /// Removes the `ledger-topic` index keys of a deleted topic's ledgers.
    async fn drop_ledger_index(&self, ledgers: &[LedgerId]) -> Result<(), MetadataError> {
        for chunk in ledgers.chunks(CLEANUP_BATCH) {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|id| TxnOp::delete(self.keys.ledger_topic(*id), None))
                .collect();
            self.txn("drop ledger index", Txn::new().and_then(ops))
                .await?;
        }
        Ok(())
    }
}

#[async_trait]
impl MetadataStore for EtcdMetadataStore {
    async fn get_or_create_topic(
        &self,
        name: &str,
        now_ms: i64,
    ) -> Result<TopicRecord, MetadataError> {
        let name_key = self.keys.topic_by_name(name);
        loop {
            if let Some(kv) = self.get("find topic", name_key.clone()).await? {
                return Ok(decode::<StoredTopic>("topic record", kv.value())?.into());
            }
            let counter_key = self.keys.topic_ids();
            let (id, seen) = self.counter(&counter_key).await?;
            let record = TopicRecord {
                id,
                name: name.to_string(),
                created_at_ms: now_ms,
            };
            let value = encode(&StoredTopic::from(&record));
            let txn = Txn::new()
                .when([
                    absent(name_key.clone()),
                    unchanged(counter_key.clone(), seen),
                ])
                .and_then([
                    TxnOp::put(counter_key, encode(&(id + 1)), None),
                    TxnOp::put(name_key.clone(), value.clone(), None),
                    TxnOp::put(self.keys.topic_by_id(id), value, None),
                ]);
            if self.txn("create topic", txn).await?.succeeded() {
                return Ok(record);
            }
        }
    }

    async fn get_topic(&self, name: &str) -> Result<Option<TopicRecord>, MetadataError> {
        match self
            .get("find topic", self.keys.topic_by_name(name))
            .await?
        {
            Some(kv) => Ok(Some(
                decode::<StoredTopic>("topic record", kv.value())?.into(),
            )),
            None => Ok(None),
        }
    }

    async fn get_topic_by_id(&self, id: TopicId) -> Result<Option<TopicRecord>, MetadataError> {
        match self.get("find topic", self.keys.topic_by_id(id)).await? {
            Some(kv) => Ok(Some(
                decode::<StoredTopic>("topic record", kv.value())?.into(),
            )),
            None => Ok(None),
        }
    }

    async fn list_topics(&self) -> Result<Vec<TopicRecord>, MetadataError> {
        let (kvs, _) = self
            .range_prefix("list topics", self.keys.topics_by_id())
            .await?;
        kvs.iter()
            .map(|kv| Ok(decode::<StoredTopic>("topic record", kv.value())?.into()))
            .collect()
    }

    async fn first_topic_from(&self, name: &str) -> Result<Option<TopicRecord>, MetadataError> {
        let all = self.keys.topic_by_name("");
        let options = GetOptions::new()
            .with_range(prefix_end(all.as_bytes()))
            .with_limit(1);
        let mut resp = self
            .client
            .kv_client()
            .get(self.keys.topic_by_name(name), Some(options))
            .await
            .map_err(backend("find topic"))?;
        match resp.take_kvs().first() {
            Some(kv) => Ok(Some(
                decode::<StoredTopic>("topic record", kv.value())?.into(),
            )),
            None => Ok(None),
        }
    }

    async fn list_topics_under(&self, prefix: &str) -> Result<Vec<TopicRecord>, MetadataError> {
        let (kvs, _) = self
            .range_prefix("list topics", self.keys.topic_by_name(prefix))
            .await?;
        kvs.iter()
            .map(|kv| Ok(decode::<StoredTopic>("topic record", kv.value())?.into()))
            .collect()
    }

    async fn delete_topic(&self, name: &str) -> Result<bool, MetadataError> {
        let name_key = self.keys.topic_by_name(name);
        let schemas = self.keys.topic_schemas(name);
        let partitioned = self.keys.partitioned(name);
        loop {
            let topic = self.get("find topic", name_key.clone()).await?;
            let mut compares = vec![unchanged(
                name_key.clone(),
                topic.as_ref().map_or(0, |kv| kv.mod_revision()),
            )];
            let mut ops = vec![
                TxnOp::delete(schemas.clone(), Some(DeleteOptions::new().with_prefix())),
                TxnOp::delete(partitioned.clone(), None),
            ];
            let mut ledgers = Vec::new();
            if let Some(kv) = &topic {
                let record: StoredTopic = decode("topic record", kv.value())?;
                let prefix = self.keys.topic_ledgers(record.id);
                let (kvs, revision) = self
                    .range_prefix("list topic ledgers", prefix.clone())
                    .await?;
                for kv in &kvs {
                    let ledger = decode_ledger(kv.value())?;
                    if !matches!(ledger.state, LedgerState::Deleted | LedgerState::Expired) {
                        let live = kvs.len();
                        return Err(MetadataError::Conflict(format!(
                            "topic {name} still has ledgers that are not deleted ({live} ledgers)"
                        )));
                    }
                    ledgers.push(ledger.id);
                }
                // No ledger of the topic was created or changed since they were read.
                compares.push(
                    Compare::mod_revision(prefix.clone(), CompareOp::Less, revision + 1)
                        .with_prefix(),
                );
                ops.extend([
                    TxnOp::delete(name_key.clone(), None),
                    TxnOp::delete(self.keys.topic_by_id(record.id), None),
                    TxnOp::delete(prefix, Some(DeleteOptions::new().with_prefix())),
                    TxnOp::delete(self.keys.writers(record.id), None),
                    TxnOp::delete(
                        self.keys.topic_cursors(record.id),
                        Some(DeleteOptions::new().with_prefix()),
                    ),
                ]);
            }
            let resp = self
                .txn("delete topic", Txn::new().when(compares).and_then(ops))
                .await?;
            if !resp.succeeded() {
                continue;
            }
            let removed_other = resp.op_responses().iter().take(2).any(|r| match r {
                TxnOpResponse::Delete(d) => d.deleted() > 0,
                _ => false,
            });
            self.drop_ledger_index(&ledgers).await?;
            return Ok(topic.is_some() || removed_other);
        }
    }

    async fn create_ledger_placed(
        &self,
        topic_id: TopicId,
        first_segment: u32,
        placement: Placement<'_>,
        now_ms: i64,
        writer_epoch: Option<u64>,
    ) -> Result<LedgerRecord, MetadataError> {
        let topic_key = self.keys.topic_by_id(topic_id);
        let writers_key = self.keys.writers(topic_id);
        let counter_key = self.keys.ledger_ids();
        // As `write_as_writer`: the first try compares the writers key with this writer's own
        // epoch (written by its fence), with no read before; a failed compare's answer says
        // whether a later fence refuses it, else the next try compares the revision read.
        let mut fence = writer_epoch.map(|epoch| cas::own_fence(&writers_key, epoch));
        loop {
            let mut compares = vec![exists(topic_key.clone())];
            compares.extend(fence.clone());
            let (id, seen) = self.counter(&counter_key).await?;
            compares.push(unchanged(counter_key.clone(), seen));
            let record = LedgerRecord {
                id,
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
            let txn = Txn::new()
                .when(compares)
                .and_then([
                    TxnOp::put(counter_key.clone(), encode(&(id + 1)), None),
                    TxnOp::put(self.keys.ledger(topic_id, id), encode_ledger(&record), None),
                    TxnOp::put(self.keys.ledger_topic(id), encode(&topic_id), None),
                ])
                .or_else([
                    TxnOp::get(topic_key.clone(), None),
                    TxnOp::get(writers_key.clone(), None),
                ]);
            let resp = self.txn("create ledger", txn).await?;
            if resp.succeeded() {
                return Ok(record);
            }
            if !first_get_found(&resp) {
                return Err(MetadataError::TopicNotFound(topic_id));
            }
            // The counter moved, or the fence is not this writer's: which one, the answer read
            // says (a counter that moved is read again by the next try).
            if let Some(epoch) = writer_epoch {
                fence = Some(cas::next_fence(&resp, 1, topic_id, epoch, &writers_key)?);
            }
        }
    }

    async fn fence_writers(&self, topic_id: TopicId, epoch: u64) -> Result<(), MetadataError> {
        let topic_key = self.keys.topic_by_id(topic_id);
        let writers_key = self.keys.writers(topic_id);
        loop {
            let (fenced_at, rev) = self.fenced_at(topic_id).await?;
            if fenced_at > epoch {
                return Err(MetadataError::Fenced {
                    topic_id,
                    epoch,
                    fenced_at,
                });
            }
            if fenced_at == epoch && rev != 0 {
                return Ok(());
            }
            let txn = Txn::new()
                .when([
                    exists(topic_key.clone()),
                    unchanged(writers_key.clone(), rev),
                ])
                .and_then([TxnOp::put(writers_key.clone(), encode(&epoch), None)])
                .or_else([TxnOp::get(topic_key.clone(), None)]);
            let resp = self.txn("fence writers", txn).await?;
            if resp.succeeded() {
                return Ok(());
            }
            if !first_get_found(&resp) {
                return Err(MetadataError::TopicNotFound(topic_id));
            }
        }
    }

    async fn get_ledger(&self, id: LedgerId) -> Result<Option<LedgerRecord>, MetadataError> {
        Ok(self.ledger_with_revision(id).await?.map(|(l, _)| l))
    }

    async fn get_ledgers(&self, ids: &[LedgerId]) -> Result<Vec<LedgerRecord>, MetadataError> {
        self.ledgers_by_id(ids).await
    }

    async fn topic_ledgers(&self, topic_id: TopicId) -> Result<Vec<LedgerRecord>, MetadataError> {
        let (kvs, _) = self
            .range_prefix("list topic ledgers", self.keys.topic_ledgers(topic_id))
            .await?;
        kvs.iter().map(|kv| decode_ledger(kv.value())).collect()
    }

    async fn ledgers_in_states(
        &self,
        states: &[LedgerState],
    ) -> Result<Vec<LedgerRecord>, MetadataError> {
        if states.is_empty() {
            return Ok(Vec::new());
        }
        // A scan of every ledger record: background work asks rarely (issue 22 makes it
        // driven by changes instead).
        let (kvs, _) = self
            .range_prefix("list ledgers by state", self.keys.all_ledgers())
            .await?;
        let mut out = Vec::new();
        for kv in &kvs {
            let ledger = decode_ledger(kv.value())?;
            if states.contains(&ledger.state) {
                out.push(ledger);
            }
        }
        out.sort_by_key(|l| l.id);
        Ok(out)
    }

    async fn transition_ledger(
        &self,
        id: LedgerId,
        transition: LedgerTransition,
        now_ms: i64,
    ) -> Result<LedgerRecord, MetadataError> {
        self.update_ledger("transition ledger", id, |l| transition.apply(l, now_ms))
            .await
    }

    async fn move_ledger_copies(
        &self,
        id: LedgerId,
        change: &CopyChange,
    ) -> Result<LedgerRecord, MetadataError> {
        self.update_ledger("move ledger copies", id, |l| change.apply(l))
            .await
    }

    async fn change_ensemble(
        &self,
        id: LedgerId,
        change: &EnsembleChange,
        writer_epoch: Option<u64>,
    ) -> Result<LedgerRecord, MetadataError> {
        self.update_ledger_as_writer("change ensemble", id, writer_epoch, |l| change.apply(l))
            .await
    }

    async fn save_cursor(
        &self,
        topic_id: TopicId,
        subscription: &str,
        state: &[u8],
        _now_ms: i64,
        writer_epoch: Option<u64>,
    ) -> Result<(), MetadataError> {
        let put = TxnOp::put(
            self.keys.cursor(topic_id, subscription),
            state.to_vec(),
            None,
        );
        self.write_as_writer(
            "save cursor",
            topic_id,
            writer_epoch,
            TopicMust::Exist,
            vec![put],
        )
        .await
    }

    async fn topic_cursors(
        &self,
        topic_id: TopicId,
    ) -> Result<Vec<(String, Vec<u8>)>, MetadataError> {
        let prefix = self.keys.topic_cursors(topic_id);
        let (kvs, _) = self.range_prefix("list cursors", prefix.clone()).await?;
        kvs.into_iter()
            .map(|kv| {
                let (key, value) = kv.into_key_value();
                let name = String::from_utf8(key[prefix.len()..].to_vec())
                    .map_err(|_| MetadataError::Corrupt("cursor name is not UTF-8".into()))?;
                Ok((name, value))
            })
            .collect()
    }

    async fn delete_cursor(
        &self,
        topic_id: TopicId,
        subscription: &str,
        writer_epoch: Option<u64>,
    ) -> Result<(), MetadataError> {
        let delete = TxnOp::delete(self.keys.cursor(topic_id, subscription), None);
        self.write_as_writer(
            "delete cursor",
            topic_id,
            writer_epoch,
            TopicMust::Nothing,
            vec![delete],
        )
        .await
    }

    async fn set_partitions(
        &self,
        name: &str,
        partitions: u32,
        update: bool,
    ) -> Result<(), MetadataError> {
        let key = self.keys.partitioned(name);
        loop {
            let current = self.get("read partitions", key.clone()).await?;
            let existing = match &current {
                Some(kv) => Some(decode::<u32>("partition count", kv.value())?),
                None => None,
            };
            check_partition_change(name, existing, partitions, update)?;
            let revision = current.as_ref().map_or(0, |kv| kv.mod_revision());
            let txn = Txn::new()
                .when([unchanged(key.clone(), revision)])
                .and_then([TxnOp::put(key.clone(), encode(&partitions), None)]);
            if self.txn("set partitions", txn).await?.succeeded() {
                return Ok(());
            }
        }
    }

    async fn last_ledger_id(&self) -> Result<LedgerId, MetadataError> {
        // The counter holds the next id to hand out (absent: 1).
        let (next, _) = self.counter(&self.keys.ledger_ids()).await?;
        Ok(next.saturating_sub(1))
    }

    async fn get_partitions(&self, name: &str) -> Result<Option<u32>, MetadataError> {
        match self
            .get("read partitions", self.keys.partitioned(name))
            .await?
        {
            Some(kv) => Ok(Some(decode("partition count", kv.value())?)),
            None => Ok(None),
        }
    }

    async fn list_partitioned_topics(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, u32)>, MetadataError> {
        let offset = self.keys.partitioned_name_offset();
        let (kvs, _) = self
            .range_prefix("list partitioned topics", self.keys.partitioned(prefix))
            .await?;
        kvs.iter()
            .map(|kv| {
                let name = String::from_utf8(kv.key()[offset..].to_vec()).map_err(|_| {
                    MetadataError::Corrupt("partitioned topic name is not UTF-8".into())
                })?;
                Ok((name, decode("partition count", kv.value())?))
            })
            .collect()
    }

    async fn add_schema(
        &self,
        topic: &str,
        version: u64,
        schema: &[u8],
    ) -> Result<(), MetadataError> {
        let key = self.keys.schema(topic, version);
        let mut compares = vec![absent(key.clone())];
        if let Some(previous) = version.checked_sub(1) {
            compares.push(exists(self.keys.schema(topic, previous)));
        }
        let txn = Txn::new()
            .when(compares)
            .and_then([TxnOp::put(key, schema.to_vec(), None)]);
        if self.txn("add schema", txn).await?.succeeded() {
            Ok(())
        } else {
            Err(MetadataError::Conflict(format!(
                "{topic}: schema version {version} exists or is not the next one"
            )))
        }
    }

    async fn schemas(&self, topic: &str) -> Result<Vec<(u64, Vec<u8>)>, MetadataError> {
        let (kvs, _) = self
            .range_prefix("list schemas", self.keys.topic_schemas(topic))
            .await?;
        kvs.into_iter()
            .map(|kv| {
                let version = layout::schema_version_of(kv.key())?;
                Ok((version, kv.into_key_value().1))
            })
            .collect()
    }

    async fn get_policies(&self, scope: &str) -> Result<Option<Vec<u8>>, MetadataError> {
        Ok(self
            .get("read policies", self.keys.policies(scope))
            .await?
            .map(|kv| kv.into_key_value().1))
    }

    async fn set_policies(
        &self,
        scope: &str,
        policies: Option<&[u8]>,
    ) -> Result<(), MetadataError> {
        let mut kv = self.client.kv_client();
        let key = self.keys.policies(scope);
        match policies {
            Some(blob) => kv
                .put(key, blob.to_vec(), None)
                .await
                .map(drop)
                .map_err(backend("set policies")),
            None => kv
                .delete(key, None)
                .await
                .map(drop)
                .map_err(backend("remove policies")),
        }
    }

    async fn create_policies(&self, scope: &str, policies: &[u8]) -> Result<bool, MetadataError> {
        let key = self.keys.policies(scope);
        let txn = Txn::new().when([absent(key.clone())]).and_then([TxnOp::put(
            key,
            policies.to_vec(),
            None,
        )]);
        Ok(self.txn("create policies", txn).await?.succeeded())
    }

    async fn replace_policies(
        &self,
        scope: &str,
        expect: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool, MetadataError> {
        let key = self.keys.policies(scope);
        let when = match expect {
            Some(old) => Compare::value(key.clone(), CompareOp::Equal, old.to_vec()),
            None => absent(key.clone()),
        };
        let write = match new {
            Some(p) => TxnOp::put(key, p.to_vec(), None),
            None => TxnOp::delete(key, None),
        };
        let txn = Txn::new().when([when]).and_then([write]);
        Ok(self.txn("replace policies", txn).await?.succeeded())
    }

    async fn policy_changes(&self) -> Result<Option<super::PolicyChanges>, MetadataError> {
        self.watch_policies().await.map(Some)
    }

    async fn list_policies(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, MetadataError> {
        let offset = self.keys.policies_scope_offset();
        let (kvs, _) = self
            .range_prefix("list policies", self.keys.policies(prefix))
            .await?;
        kvs.into_iter()
            .map(|kv| {
                let (key, value) = kv.into_key_value();
                let scope = String::from_utf8(key[offset..].to_vec())
                    .map_err(|_| MetadataError::Corrupt("policies scope is not UTF-8".into()))?;
                Ok((scope, value))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends_are_the_next_key() {
        assert_eq!(prefix_end(b"a/"), b"a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b""), vec![0]);
    }
}
