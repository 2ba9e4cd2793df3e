//! Compare-and-set on etcd: the compares the store's transactions use, and the read-modify-
//! write of one ledger record under its mod revision.
//!
//! Invariant: a ledger record is only ever replaced by a transaction that compares its mod
//! revision with the one read; a lost race reads again.

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse, TxnResponse};

use super::layout::{decode, decode_ledger, encode_ledger};
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

impl EtcdMetadataStore {
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

    /// Changes ledger `id` by `change` and writes it back if nobody changed it meanwhile;
    /// reads again after a lost race. `change`'s refusal is returned as it is.
    pub(super) async fn update_ledger(
        &self,
        op: &'static str,
        id: LedgerId,
        change: impl Fn(&mut LedgerRecord) -> Result<(), MetadataError>,
    ) -> Result<LedgerRecord, MetadataError> {
        loop {
            let (mut ledger, revision) = self
                .ledger_with_revision(id)
                .await?
                .ok_or(MetadataError::LedgerNotFound(id))?;
            change(&mut ledger)?;
            let key = self.keys.ledger(ledger.topic_id, id);
            let txn = Txn::new()
                .when([unchanged(key.clone(), revision)])
                .and_then([TxnOp::put(key, encode_ledger(&ledger), None)]);
            if self.txn(op, txn).await?.succeeded() {
                return Ok(ledger);
            }
        }
    }
}
