//! Reads of a sealed striped ledger (ADR 0017) that its writer's bookie cannot serve: each
//! replica serves the entries of its stripe, and the range is merged from their answers.
//!
//! Invariants:
//! - Entries come back dense from `first`, in order; an entry no replica serves ends the read
//!   with an error, never with a range that skips it.
//! - An entry is taken only from a replica whose stripe holds it (an answer with any other is
//!   ignored, as a bookie answering out of order is).

use std::collections::BTreeMap;

use super::error::ReadError;
use super::metadata::LedgerRecord;
use super::replica::ReplicaSource;
use super::Entry;

/// Entries `first..=last` of striped `record` (of `topic`), merged from its replicas.
pub(super) async fn read_merged(
    remote: &dyn ReplicaSource,
    topic: &str,
    record: &LedgerRecord,
    first: u64,
    last: u64,
) -> Result<Vec<Entry>, ReadError> {
    let stripes = record.stripes();
    let mut out = Vec::new();
    let mut held: BTreeMap<u64, Entry> = BTreeMap::new();
    let mut next = first;
    while next <= last {
        let from = next;
        let reads = record
            .replicas
            .iter()
            .enumerate()
            .map(|(place, bookie)| async move {
                let got = remote.read(bookie, topic, record.id, from, last).await;
                (place, bookie, got)
            });
        for (place, bookie, got) in futures::future::join_all(reads).await {
            let got = match got {
                Ok(got) => got,
                Err(e) => {
                    tracing::debug!(ledger = record.id, bookie, error = %e,
                        "a replica did not serve its stripe");
                    continue;
                }
            };
            let stripe = stripes.stripe(place);
            let fits = |e: &Entry| {
                let id = e.position.entry;
                e.position.ledger == record.id && (from..=last).contains(&id) && stripe.holds(id)
            };
            if !got.iter().all(fits) {
                tracing::warn!(
                    ledger = record.id,
                    bookie,
                    "a replica answered with entries outside its stripe"
                );
                continue;
            }
            for e in got {
                held.entry(e.position.entry).or_insert(e);
            }
        }
        while let Some(e) = held.remove(&next) {
            out.push(e);
            next += 1;
        }
        if next == from {
            return Err(ReadError::Remote {
                ledger: record.id,
                bookie: record.replicas.join(","),
            });
        }
    }
    Ok(out)
}
