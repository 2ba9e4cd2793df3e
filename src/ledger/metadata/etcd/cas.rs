//! Compare-and-set on etcd: the compares the store's transactions use, and the read-modify-
//! write of one ledger record under its mod revision.
//!
//! Invariant: a ledger record is only ever replaced by a transaction that compares its mod
//! revision with the one read; a lost race reads again.
//! Invariant: a write made as a topic's writer ([`EtcdMetadataStore::write_as_writer`]) commits
//! only in the same transaction as a compare showing the topic not fenced above that writer.

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse, TxnResponse};

use super::layout::{decode, decode_ledger, encode, encode_ledger};
use super::EtcdMetadataStore;
use crate::ledger::metadata::{LedgerId, LedgerRecord, MetadataError, TopicId};

fn get_response(op: &TxnOpResponse) -> Option<&etcd_client::GetResponse> {
    match op {
        TxnOpResponse::Get(r) => Some(r),
        _ => None,
    }
}

/// Whether the first operation of a failed transaction's `or_else` (a get) found its key.
pub(super) fn first_get_found(resp: &TxnResponse) -> bool {
    resp.op_responses()
        .first()
        .and_then(get_response)
        .is_some_and(|r| !r.kvs().is_empty())
}

/// The compare that holds while `key` has not changed since it was read at `mod_revision`
/// (0: it was absent).
pub(super) fn unchanged(key: impl Into<Vec<u8>>, mod_revision: i64) -> Compare {
    Compare::mod_revision(key, CompareOp::Equal, mod_revision)
}

pub(super) fn exists(key: impl Into<Vec<u8>>) -> Compare {
    Compare::version(key, CompareOp::Greater, 0)
}

pub(super) fn absent(key: impl Into<Vec<u8>>) -> Compare {
    Compare::version(key, CompareOp::Equal, 0)
}

/// The fence a failed transaction's `or_else` read at `index` (a get of the writers key):
/// the epoch (0: never fenced) and the key's mod revision (0: absent).
fn fence_read(resp: &TxnResponse, index: usize) -> Result<(u64, i64), MetadataError> {
    match resp
        .op_responses()
        .get(index)
        .and_then(get_response)
        .and_then(|r| r.kvs().first())
    {
        Some(kv) => Ok((decode("writer fence", kv.value())?, kv.mod_revision())),
        None => Ok((0, 0)),
    }
}

/// The first try's compare of a write as `epoch`'s writer: the writers key holds that epoch
/// (written by its own fence), with no read before.
pub(super) fn own_fence(writers_key: &str, epoch: u64) -> Compare {
    Compare::value(writers_key, CompareOp::Equal, encode(&epoch))
}

/// After a failed try whose `or_else` read the writers key at `index`: `Fenced` when a later
/// epoch than `epoch` fenced topic `topic_id`, else the next try's compare (the key unchanged
/// since that read).
pub(super) fn next_fence(
    resp: &TxnResponse,
    index: usize,
    topic_id: TopicId,
    epoch: u64,
    writers_key: &str,
) -> Result<Compare, MetadataError> {
    let (fenced_at, rev) = fence_read(resp, index)?;
    if epoch < fenced_at {
        return Err(MetadataError::Fenced {
            topic_id,
            epoch,
            fenced_at,
        });
    }
    Ok(unchanged(writers_key, rev))
}

/// What a write made as a topic's writer asks of its topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TopicMust {
    /// The topic record exists (else `TopicNotFound`).
    Exist,
    /// Nothing: a delete of something the topic's removal took already is done.
    Nothing,
}

/// Gets in one transaction of a batched read (etcd refuses transactions of more than its
/// `--max-txn-ops`, 128 by default).
const READ_BATCH: usize = 64;

impl EtcdMetadataStore {
    /// [`crate::ledger::MetadataStore::get_ledgers`]: per [`READ_BATCH`] ids, one transaction
    /// reading their topic index keys, then one reading their records.
    pub(super) async fn ledgers_by_id(
        &self,
        ids: &[LedgerId],
    ) -> Result<Vec<LedgerRecord>, MetadataError> {
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(READ_BATCH) {
            let index = chunk.iter().map(|id| self.keys.ledger_topic(*id)).collect();
            let mut keys = Vec::with_capacity(chunk.len());
            for (id, topic) in chunk.iter().zip(self.gets("find ledgers", index).await?) {
                if let Some(topic) = topic {
                    keys.push(self.keys.ledger(decode("ledger index", &topic)?, *id));
                }
            }
            for record in self.gets("get ledgers", keys).await?.into_iter().flatten() {
                out.push(decode_ledger(&record)?);
            }
        }
        out.sort_by_key(|l| l.id);
        Ok(out)
    }

    /// The values of `keys` (`None`: absent), read in one transaction (one revision).
    async fn gets(
        &self,
        op: &'static str,
        keys: Vec<String>,
    ) -> Result<Vec<Option<Vec<u8>>>, MetadataError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let asked = keys.len();
        let gets: Vec<TxnOp> = keys.into_iter().map(|k| TxnOp::get(k, None)).collect();
        let resp = self.txn(op, Txn::new().and_then(gets)).await?;
        let responses = resp.op_responses();
        let answers: Vec<_> = responses.iter().map(get_response).collect();
        // Answers that are not one get's per key would read as "absent": refuse them.
        if answers.len() != asked || answers.iter().any(Option::is_none) {
            return Err(MetadataError::Corrupt(format!(
                "{op}: {} answers to {asked} gets",
                answers.iter().flatten().count()
            )));
        }
        Ok(answers
            .into_iter()
            .flatten()
            .map(|g| g.kvs().first().map(|kv| kv.value().to_vec()))
            .collect())
    }

    /// Applies `ops` in one transaction with the compare that `topic_id` is not fenced above
    /// `writer_epoch` (none without an epoch) and, with [`TopicMust::Exist`], that it exists.
    ///
    /// One round trip in the usual case: the first try compares the writers key's value with
    /// this writer's own epoch, which it wrote when it fenced the topic. Only when that compare
    /// fails does the answer (read in the same transaction) decide: `Fenced` below a later
    /// fence, else another try comparing the key's mod revision as read (fenced lower, or
    /// never).
    pub(super) async fn write_as_writer(
        &self,
        op: &'static str,
        topic_id: TopicId,
        writer_epoch: Option<u64>,
        topic: TopicMust,
        ops: Vec<TxnOp>,
    ) -> Result<(), MetadataError> {
        let topic_key = self.keys.topic_by_id(topic_id);
        let writers_key = self.keys.writers(topic_id);
        let mut fence = writer_epoch.map(|epoch| own_fence(&writers_key, epoch));
        loop {
            let mut compares = Vec::with_capacity(2);
            if topic == TopicMust::Exist {
                compares.push(exists(topic_key.clone()));
            }
            compares.extend(fence.clone());
            let txn = Txn::new().when(compares).and_then(ops.clone()).or_else([
                TxnOp::get(topic_key.clone(), None),
                TxnOp::get(writers_key.clone(), None),
            ]);
            let resp = self.txn(op, txn).await?;
            if resp.succeeded() {
                return Ok(());
            }
            if topic == TopicMust::Exist && !first_get_found(&resp) {
                return Err(MetadataError::TopicNotFound(topic_id));
            }
            let Some(epoch) = writer_epoch else {
                continue; // Only the topic compare can fail; it held at the read: retry.
            };
            fence = Some(next_fence(&resp, 1, topic_id, epoch, &writers_key)?);
        }
    }

    /// A ledger's record with its mod revision.
    pub(super) async fn ledger_with_revision(
        &self,
        id: LedgerId,
    ) -> Result<Option<(LedgerRecord, i64)>, MetadataError> {
        let Some(index) = self.get("find ledger", self.keys.ledger_topic(id)).await? else {
            return Ok(None);
        };
        let topic: TopicId = decode("ledger index", index.value())?;
        let Some(kv) = self.get("get ledger", self.keys.ledger(topic, id)).await? else {
            return Ok(None);
        };
        Ok(Some((decode_ledger(kv.value())?, kv.mod_revision())))
    }

    /// [`Self::update_ledger`], also refused with `Fenced` once a higher epoch than
    /// `writer_epoch` fenced the ledger's topic: the writers key is compared unchanged since it
    /// was read, in the same transaction.
    pub(super) async fn update_ledger_as_writer(
        &self,
        op: &'static str,
        id: LedgerId,
        writer_epoch: Option<u64>,
        change: impl Fn(&mut LedgerRecord) -> Result<(), MetadataError>,
    ) -> Result<LedgerRecord, MetadataError> {
        loop {
            let (mut ledger, revision) = self
                .ledger_with_revision(id)
                .await?
                .ok_or(MetadataError::LedgerNotFound(id))?;
            let key = self.keys.ledger(ledger.topic_id, id);
            let mut compares = vec![unchanged(key.clone(), revision)];
            if let Some(epoch) = writer_epoch {
                let (fenced_at, fence_revision) = self.fenced_at(ledger.topic_id).await?;
                if epoch < fenced_at {
                    return Err(MetadataError::Fenced {
                        topic_id: ledger.topic_id,
                        epoch,
                        fenced_at,
                    });
                }
                compares.push(unchanged(
                    self.keys.writers(ledger.topic_id),
                    fence_revision,
                ));
            }
            change(&mut ledger)?;
            let txn =
                Txn::new()
                    .when(compares)
                    .and_then([TxnOp::put(key, encode_ledger(&ledger), None)]);
            if self.txn(op, txn).await?.succeeded() {
                return Ok(ledger);
            }
        }
    }

    /// Changes ledger `id` by `change` and writes it back if nobody changed it meanwhile;
    /// reads again after a lost race. `change`'s refusal is returned as it is.
    pub(super) async fn update_ledger(
        &self,
        op: &'static str,
        id: LedgerId,
        change: impl Fn(&mut LedgerRecord) -> Result<(), MetadataError>,
    ) -> Result<LedgerRecord, MetadataError> {
        self.update_ledger_as_writer(op, id, None, change).await
    }
}
