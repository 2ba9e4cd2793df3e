//! Ledgers across bookies: what this log serves to other nodes, the seam through which it
//! reads the ledgers other nodes' bookies hold ([`ReplicaSource`]), and which node offloads a
//! striped ledger no bookie holds whole ([`Log::offloaded_here`]).
//!
//! A ledger's entries live on the bookie that wrote them until the offload engine has put them
//! in the lake. A node that reads a topic it does not own (SQL on any node) therefore reads the
//! owner's unoffloaded ledgers from the owner's bookie, over the bookie protocol
//! ([`crate::protocol::bookie`], served by [`crate::bookie`]).
//!
//! Invariants:
//! - A bookie serves only ledgers it holds and only entries it has confirmed (durable): an open
//!   ledger up to its last confirmed entry, a sealed one up to its sealed count.
//! - A read view of a topic another node writes fixes, when it is made, how many entries of
//!   each foreign open ledger it reads ([`Log::topic_to_read`]); it never reads past that.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use super::error::ReadError;
use super::metadata::{LedgerId, LedgerRecord, LedgerState};
use super::read::read_located;
use super::{Entry, Log, TopicLog};

/// Entries a bookie puts in one answer at most (besides the byte budget).
pub const MAX_ENTRIES_PER_ANSWER: u64 = 4096;

/// How far a bookie has confirmed a ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Confirmed {
    /// Entries `0..count` are durable on the bookie.
    pub count: u64,
    /// Whether the ledger is still being written.
    pub open: bool,
}

/// Reads ledgers held by other bookies. Contract:
/// - `read` returns entries `first..=last` in order, dense from `first`, possibly fewer than
///   asked when the bookie has confirmed fewer (never an entry the bookie has not confirmed);
///   [`ReadError::NoSuchEntry`] when it has not confirmed `first`.
/// - A bookie that is not a live member, holds no copy or cannot be reached gives
///   [`ReadError::Remote`]; bytes that fail the wire checksum are never returned.
#[async_trait::async_trait]
pub trait ReplicaSource: Send + Sync + fmt::Debug {
    /// Entries `first..=last` of `ledger` (of `topic`) from bookie `bookie`.
    async fn read(
        &self,
        bookie: &str,
        topic: &str,
        ledger: LedgerId,
        first: u64,
        last: u64,
    ) -> Result<Vec<Entry>, ReadError>;

    /// How far bookie `bookie` has confirmed `ledger` (of `topic`).
    async fn confirmed(
        &self,
        bookie: &str,
        topic: &str,
        ledger: LedgerId,
    ) -> Result<Confirmed, ReadError>;

    /// Sends one entry of a replicated ledger to replica `bookie`. Entries given for one
    /// bookie are delivered in call order over one connection; `done` is called exactly once:
    /// `Ok` once the entry is durable there, `Err` (why) when it may not be. After an `Err`,
    /// the caller sends that bookie nothing more of the ledger.
    fn add(&self, bookie: &str, add: ReplicaAdd, done: AddDone);

    /// Tells replica `bookie` that `ledger` was sealed with `count` entries; returns how many
    /// entries it kept.
    async fn sealed(
        &self,
        bookie: &str,
        topic: &str,
        ledger: LedgerId,
        count: u64,
    ) -> Result<u64, ReadError>;

    /// Up to `n` live bookies other than `except`, for a new ledger's ensemble (spread over
    /// calls).
    async fn choose(&self, except: &str, n: usize) -> Vec<String>;

    /// Fences replica `bookie`'s copy of open `ledger` (it refuses every later add) and
    /// returns what the copy durably holds.
    async fn fence(
        &self,
        bookie: &str,
        topic: &str,
        ledger: LedgerId,
    ) -> Result<FencedCopy, ReadError>;

    /// Whether `bookie` belongs to a live member.
    async fn is_live(&self, bookie: &str) -> bool;
}

/// What a fenced replica copy durably holds ([`ReplicaSource::fence`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FencedCopy {
    /// The segment of that bookie's journal holding the copy's first entry.
    pub first_segment: u32,
    /// Entries `0..seal.entry_count`, as a seal would record them (the last segment is the
    /// bookie's own).
    pub seal: super::metadata::SealInfo,
}

/// One entry for a replica ([`ReplicaSource::add`]).
#[derive(Debug, Clone)]
pub struct ReplicaAdd {
    /// Full topic (partition) name.
    pub topic: Arc<str>,
    /// Ledger id.
    pub ledger: LedgerId,
    /// Entry id.
    pub entry: u64,
    /// Publish time (ms since epoch).
    pub publish_time_ms: i64,
    /// The entry's bytes.
    pub payload: bytes::Bytes,
    /// A node taking the ledger over completes a fenced copy (see
    /// [`crate::protocol::bookie::BookieRequest::AddEntry`]).
    pub recovery: bool,
}

/// Called once with the outcome of a [`ReplicaSource::add`].
pub type AddDone = Box<dyn FnOnce(Result<(), String>) + Send>;

impl Log {
    /// Lets this log read other bookies' ledgers (set once, when the node has joined its
    /// cluster; later calls are ignored).
    pub fn set_replica_source(&self, source: Arc<dyn ReplicaSource>) {
        let _ = self.shared.remote.set(source);
    }

    /// Serves entries `first..=last` of `ledger` of `topic` to another node: those this log
    /// holds and has confirmed, up to about `max_bytes` of payload (at least one entry).
    pub async fn serve_read(
        &self,
        topic: &str,
        ledger: LedgerId,
        first: u64,
        last: u64,
        max_bytes: u64,
    ) -> Result<Vec<Entry>, ReadError> {
        // Bounds the index copied per answer (the client asks again for the rest).
        let last = last.min(first.saturating_add(MAX_ENTRIES_PER_ANSWER - 1));
        let located = match self.open_ledger(topic, ledger).await {
            Some(open) => {
                let located = open.locate_range(first, last);
                if located.is_empty() {
                    return Err(ReadError::NoSuchEntry {
                        ledger,
                        entry: first,
                        available: open.confirmed(),
                    });
                }
                located
            }
            None => {
                let index = self.held_index(ledger).await?;
                if first >= index.len() as u64 {
                    return Err(ReadError::NoSuchEntry {
                        ledger,
                        entry: first,
                        available: index.len() as u64,
                    });
                }
                let end = last.saturating_add(1).min(index.len() as u64);
                index[first as usize..end as usize].to_vec()
            }
        };
        let mut bytes = 0u64;
        let budget = located
            .iter()
            .take_while(|at| {
                let fits = bytes == 0 || bytes + u64::from(at.len) <= max_bytes;
                bytes += u64::from(at.len);
                fits
            })
            .count();
        read_located(&self.shared, ledger, first, located[..budget].to_vec()).await
    }

    /// How far this log has confirmed `ledger` of `topic`, for another node.
    pub async fn serve_confirmed(
        &self,
        topic: &str,
        ledger: LedgerId,
    ) -> Result<Confirmed, ReadError> {
        if let Some(open) = self.open_ledger(topic, ledger).await {
            return Ok(Confirmed {
                count: open.confirmed(),
                open: true,
            });
        }
        let index = self.held_index(ledger).await?;
        Ok(Confirmed {
            count: index.len() as u64,
            open: false,
        })
    }

    /// The open ledger `ledger` of the loaded topic `topic`, if this log is writing it.
    async fn open_ledger(
        &self,
        topic: &str,
        ledger: LedgerId,
    ) -> Option<Arc<super::open_ledger::OpenLedger>> {
        if let Some(copy) = self.shared.replicas.open(ledger) {
            return Some(copy);
        }
        let t = self.topics.lock().await.get(topic).cloned()?;
        t.open_view(ledger)
    }

    /// The index of a sealed ledger this log holds; [`ReadError::Remote`] naming this bookie
    /// when it holds no copy (never had one, or deleted it after offload).
    async fn held_index(
        &self,
        ledger: LedgerId,
    ) -> Result<Arc<[super::index::IndexEntry]>, ReadError> {
        let record = self
            .shared
            .meta
            .get_ledger(ledger)
            .await
            .map_err(|e| self.not_held(ledger, &e.to_string()))?;
        match record {
            Some(r)
                if self.shared.holds(&r)
                    && matches!(r.state, LedgerState::Sealed | LedgerState::Offloaded) =>
            {
                self.shared.held_sealed_index(&r).await
            }
            _ => Err(self.not_held(ledger, "not held")),
        }
    }

    fn not_held(&self, ledger: LedgerId, why: &str) -> ReadError {
        tracing::debug!(
            ledger,
            why,
            "refused a read of a ledger this bookie does not hold"
        );
        ReadError::Remote {
            ledger,
            bookie: self.shared.bookie.clone(),
        }
    }

    /// [`Log::partitions_of`] for reading every partition as it is now, wherever it is written
    /// ([`Log::topic_to_read`]).
    pub async fn partitions_to_read(
        &self,
        base: &crate::naming::TopicName,
    ) -> Result<Vec<(i32, TopicLog)>, ReadError> {
        let mut out = Vec::new();
        for (index, name) in self.partition_names(base).await? {
            out.push((index, self.topic_to_read(&name).await?));
        }
        Ok(out)
    }

    /// A view of topic `name` for reading it as it is now (SQL, verification): the loaded log
    /// when this node writes the topic; otherwise one made from the metadata store, in which
    /// the open ledgers other bookies write count the entries those bookies confirmed just now.
    /// Such a view is not cached: the next call sees newer entries. A foreign open ledger
    /// whose bookie cannot be asked fails the call ([`ReadError::Remote`]): a read view never
    /// leaves out entries that were acknowledged.
    pub async fn topic_to_read(&self, name: &str) -> Result<TopicLog, ReadError> {
        let cached = self.topics.lock().await.get(name).cloned();
        if let Some(t) = &cached {
            if t.is_writing() {
                return Ok(t.clone());
            }
        }
        let Some(topic) = self.shared.meta.get_topic(name).await? else {
            return Ok(self.topic(name).await?);
        };
        let records = self.shared.meta.topic_ledgers(topic.id).await?;
        let foreign_open: Vec<(LedgerId, String)> = records
            .iter()
            .filter(|r| r.state == LedgerState::Open && !self.shared.writes(r))
            .map(|r| (r.id, r.bookie.clone()))
            .collect();
        if let Some(t) = cached {
            if foreign_open.is_empty() && t.id() == topic.id && !t.is_stale_reader(&records) {
                return Ok(t);
            }
        }
        let mut counts = HashMap::new();
        for (ledger, bookie) in foreign_open {
            let Some(remote) = self.shared.remote.get() else {
                return Err(ReadError::Remote { ledger, bookie });
            };
            counts.insert(ledger, remote.confirmed(&bookie, name, ledger).await?.count);
        }
        Ok(TopicLog::reader(
            self.shared.clone(),
            topic.id,
            topic.name,
            records,
            counts,
        ))
    }
}

impl TopicLog {
    /// Whether `ledger` reached the lake after this view was made; the view then takes the
    /// store's record, so that a replay goes to the lake for it (another node offloaded it,
    /// and this view would otherwise learn so only at its next offload pass).
    async fn offloaded_since(&self, ledger: LedgerId) -> bool {
        match self.inner.shared.meta.get_ledger(ledger).await {
            Ok(Some(r)) if matches!(r.state, LedgerState::Offloaded | LedgerState::Deleted) => {
                self.set_record(r);
                true
            }
            _ => false,
        }
    }

    /// Entries `first..=last` of a ledger another bookie holds, read from that bookie and
    /// clipped to what this view reads of it. When no bookie the view lists can serve it, the
    /// view is refreshed from the store once (autorecovery may have moved the copies).
    pub(super) async fn read_foreign(
        &self,
        ledger: LedgerId,
        first: u64,
        last: u64,
    ) -> Result<Vec<Entry>, ReadError> {
        match self.read_listed(ledger, first, last).await {
            Err(e @ ReadError::Remote { .. }) => {
                if self.copies_moved(ledger).await {
                    self.read_listed(ledger, first, last).await
                } else {
                    Err(e)
                }
            }
            other => other,
        }
    }

    /// Whether the store lists other bookies for sealed `ledger` than this view does; if so the
    /// view takes the store's record.
    async fn copies_moved(&self, ledger: LedgerId) -> bool {
        let Ok(Some(r)) = self.inner.shared.meta.get_ledger(ledger).await else {
            return false;
        };
        let listed = self.foreign(ledger).map(|(b, _)| b);
        let moved = r.state == LedgerState::Sealed
            && listed.is_some_and(|b| !b.iter().map(String::as_str).eq(r.bookies()));
        if moved {
            self.set_record(r);
        }
        moved
    }

    async fn read_listed(
        &self,
        ledger: LedgerId,
        first: u64,
        last: u64,
    ) -> Result<Vec<Entry>, ReadError> {
        let Some((bookies, count)) = self.foreign(ledger) else {
            return Err(ReadError::UnknownLedger {
                topic: self.name().to_string(),
                ledger,
            });
        };
        if first >= count {
            return Err(ReadError::NoSuchEntry {
                ledger,
                entry: first,
                available: count,
            });
        }
        let last = last.min(count - 1);
        let Some(remote) = self.inner.shared.remote.get() else {
            return Err(ReadError::Remote {
                ledger,
                bookie: bookies.join(","),
            });
        };
        if let Some(record) = self.sealed_striped(ledger) {
            return self.read_striped(&**remote, &record, first, last).await;
        }
        let mut out = Vec::with_capacity((last - first + 1).min(4096) as usize);
        let mut next = first;
        // The bookie read from; the next one holding a copy takes over when it cannot serve.
        let mut at = 0;
        while next <= last {
            let bookie = &bookies[at];
            let got = match remote.read(bookie, self.name(), ledger, next, last).await {
                Ok(got) => got,
                Err(ReadError::Remote { .. }) if at + 1 < bookies.len() => {
                    at += 1;
                    continue;
                }
                Err(ReadError::Remote { .. }) if self.offloaded_since(ledger).await => {
                    // The bookies dropped their copies after the offload: the lake has it.
                    return Err(ReadError::Deleted(ledger));
                }
                Err(e) => return Err(e),
            };
            if got.is_empty() {
                return Err(ReadError::NoSuchEntry {
                    ledger,
                    entry: next,
                    available: next,
                });
            }
            for e in got {
                if e.position != super::Position::new(ledger, next) || next > last {
                    tracing::warn!(ledger, bookie, got = %e.position, expected = next,
                        "a bookie answered with entries out of order");
                    return Err(ReadError::Remote {
                        ledger,
                        bookie: bookie.clone(),
                    });
                }
                next += 1;
                out.push(e);
            }
        }
        Ok(out)
    }

    /// Entries `first..=last` of sealed striped `record` (ADR 0017), which this node does not
    /// hold whole: from its writer's bookie, which holds every entry, for as long as it serves
    /// them in order; the rest (no whole copy, the bookie unreachable, an empty or
    /// out-of-order answer) merged from the replicas' stripes. The lake has a ledger offloaded
    /// meanwhile ([`ReadError::Deleted`]).
    async fn read_striped(
        &self,
        remote: &dyn ReplicaSource,
        record: &LedgerRecord,
        first: u64,
        last: u64,
    ) -> Result<Vec<Entry>, ReadError> {
        let (ledger, writer) = (record.id, record.bookie.as_str());
        let mut out = Vec::with_capacity((last - first + 1).min(4096) as usize);
        let mut next = first;
        while next <= last && writer != super::metadata::VACANT {
            let got = match remote.read(writer, self.name(), ledger, next, last).await {
                Ok(got) => got,
                Err(e) => {
                    tracing::debug!(ledger, bookie = writer, error = %e,
                        "a striped ledger's writer cannot serve it: merging the stripes");
                    break;
                }
            };
            let in_order = got
                .iter()
                .zip(next..=last)
                .all(|(e, at)| e.position == super::Position::new(ledger, at));
            if got.is_empty() || !in_order || got.len() as u64 > last - next + 1 {
                tracing::warn!(
                    ledger,
                    bookie = writer,
                    next,
                    served = got.len(),
                    "a striped ledger's writer answered out of order: merging the stripes"
                );
                break;
            }
            next += got.len() as u64;
            out.extend(got);
        }
        if next <= last {
            match read_merged(remote, self.name(), record, next, last).await {
                Ok(rest) => out.extend(rest),
                Err(_) if self.offloaded_since(ledger).await => {
                    return Err(ReadError::Deleted(ledger))
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }
}

impl Log {
    /// The ledgers of `records` this node offloads, and deletes after the offload: those it
    /// wrote, and each striped ledger that no bookie holds whole (ADR 0017: its writer's
    /// place vacant) whose first live replica is this bookie (it reads the ledger merged from
    /// the stripes). Nodes that disagree about who is live may both offload one: the lake's
    /// commit and the store's transition let one land.
    pub async fn offloaded_here(&self, records: &[LedgerRecord]) -> HashSet<LedgerId> {
        let shared = &self.shared;
        let mut out = HashSet::new();
        for r in records {
            if shared.writes(r) {
                out.insert(r.id);
                continue;
            }
            let Some(remote) = shared
                .remote
                .get()
                .filter(|_| r.bookie == super::metadata::VACANT)
            else {
                continue;
            };
            for b in r.bookies() {
                if b == shared.bookie {
                    out.insert(r.id);
                    break;
                }
                if remote.is_live(b).await {
                    break;
                }
            }
        }
        out
    }
}

/// Reads of a sealed striped ledger (ADR 0017) that its writer's bookie cannot serve: each
/// replica serves the entries of its stripe, and the range is merged from their answers.
/// Entries come back dense from `first`, in order; an entry no replica serves ends the read
/// with an error, never with a range that skips it; an entry is taken only from a replica
/// whose stripe holds it (an answer with any other is ignored, as a bookie answering out of
/// order is).
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
            .filter(|(_, bookie)| *bookie != super::metadata::VACANT)
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
