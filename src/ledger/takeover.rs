//! What the node about to own a topic reads of it (its record and ledgers once after its
//! fence: which bookie holds it, whether its view is current), and taking over the open
//! ledger of a writer that is gone (ADR 0010), as BookKeeper's ledger recovery does: the node
//! that now owns the topic fences the ledger on its replicas, decides once where the ledger
//! ends, and seals it there.
//!
//! Invariants:
//! - Fencing comes first: a fenced replica refuses every later add, so the old writer (if it
//!   still runs, cut off) can no longer reach its ack quorum on this ledger.
//! - The ledger ends at the longest copy among at least `ensemble − ack_quorum + 1` fenced
//!   replicas. Every acknowledged entry was durable on `ack_quorum` bookies, the writer's
//!   included, so at least one of those replicas holds it: no acknowledged entry is lost.
//! - The seal lists only bookies holding every entry up to that end (the longest copy first,
//!   as the ledger's bookie); the decision is recorded once, by a compare-and-set on the
//!   ledger's state, so every reader sees the same ledger.
//! - A striped ledger (ADR 0017) is decided per write set instead ([`striped`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::metadata::{LedgerRecord, LedgerState, LedgerTransition, MetadataError, PlacedSeal};
use super::replica::{FencedCopy, ReplicaSource};
use super::{now_ms, Log, TopicLog, TopicState};

mod striped;

/// Answers once an entry added to a copy is durable there.
type Durable = tokio::sync::oneshot::Receiver<Result<super::Position, super::AppendError>>;

/// Payload bytes read from the longest copy per request while completing a shorter one.
const COPY_BUDGET: u64 = 4 << 20;

/// Why an open ledger of another writer could not be taken over.
#[derive(Debug, thiserror::Error)]
pub enum TakeoverError {
    /// The ledger has no replica: only its writer's node can recover it.
    #[error(
        "ledger {ledger} is written by bookie {bookie}, which is not live, and has no replica: \
         the topic waits for that node"
    )]
    Unreplicated {
        /// Ledger id.
        ledger: u64,
        /// Its writer's bookie.
        bookie: String,
    },
    /// Too few replicas answered the fence to know where the ledger ends.
    #[error(
        "ledger {ledger}: {answered} of its {replicas} bookies answered the fence, {needed} \
         are needed to recover it ({why})"
    )]
    TooFewAnswers {
        /// Ledger id.
        ledger: u64,
        /// Bookies that answered.
        answered: usize,
        /// Bookies it has (the writer's included).
        replicas: usize,
        /// Answers needed.
        needed: usize,
        /// The first refusal seen.
        why: String,
    },
    /// A striped ledger's entries below its end could not be read (ADR 0017).
    #[error("ledger {ledger}: its entries could not be read to complete its copies: {why}")]
    Unreadable {
        /// Ledger id.
        ledger: u64,
        /// What failed.
        why: String,
    },
    /// A fenced copy of a striped ledger (ADR 0017) could not be completed: it may be the only
    /// answered copy holding some acknowledged entries, so nothing is sealed (the takeover is
    /// tried again; entries a copy holds already are not sent again).
    #[error("ledger {ledger}: the fenced copy on bookie {bookie} could not be completed: {why}")]
    Incomplete {
        /// Ledger id.
        ledger: u64,
        /// The bookie of that copy.
        bookie: String,
        /// What failed.
        why: String,
    },
    /// This node's own copy of a striped ledger it wrote before restarting (ADR 0017) could
    /// not be completed.
    #[error("ledger {ledger}: this node's own copy could not be completed: {why}")]
    WriterCopy {
        /// Ledger id.
        ledger: u64,
        /// What failed.
        why: String,
    },
    /// This node reads no other bookie (not part of a cluster).
    #[error("ledger {0} is written by another bookie and this node reaches no other bookie")]
    NoCluster(u64),
    /// The store failed or refused.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
}

impl From<super::ReadError> for TakeoverError {
    fn from(e: super::ReadError) -> Self {
        match e {
            super::ReadError::Metadata(m) => TakeoverError::Metadata(m),
            other => TakeoverError::Metadata(MetadataError::Backend {
                op: "take over",
                source: Box::new(other),
            }),
        }
    }
}

/// Whether a ledger can be taken over without its writer: some replica holds each of its
/// acknowledged entries (an ack quorum of 1 needs only the writer's own copy).
pub(crate) fn recoverable(ledger: &LedgerRecord) -> bool {
    !ledger.replicas.is_empty() && ledger.ack_quorum >= 2
}

impl Log {
    /// Topic `name`'s record and ledgers as the store has them now (two reads; `None`: no
    /// such topic). The owner-to-be reads them once after its fence and judges the takeover,
    /// the holder and its view against that one reading.
    pub async fn topic_state(&self, name: &str) -> Result<TopicState, MetadataError> {
        let Some(topic) = self.shared.meta.get_topic(name).await? else {
            return Ok(None);
        };
        let ledgers = self.shared.meta.topic_ledgers(topic.id).await?;
        Ok(Some((topic, ledgers)))
    }

    /// The log of topic `name` for the node about to own it: like [`Log::topic`], but a
    /// view that only ever read and no longer matches the metadata store (another node wrote,
    /// sealed or offloaded ledgers of the topic meanwhile) is replaced by a fresh one. Readers
    /// still holding the old view keep reading what it knew.
    pub async fn topic_to_own(&self, name: &str) -> Result<TopicLog, MetadataError> {
        if !self.topics.lock().await.contains_key(name) {
            return self.topic(name).await;
        }
        let state = self.topic_state(name).await?;
        self.topic_to_own_in(name, &state).await
    }

    /// [`Log::topic_to_own`], with the view judged against `state` (read by the caller with
    /// [`Log::topic_state`]).
    pub async fn topic_to_own_in(
        &self,
        name: &str,
        state: &TopicState,
    ) -> Result<TopicLog, MetadataError> {
        let cached = self.topics.lock().await.get(name).cloned();
        if let Some(t) = cached {
            // Another topic of the name (deleted and made again), or none: a fresh view.
            let current = state.as_ref().filter(|(topic, _)| topic.id == t.id());
            if current.is_some_and(|(_, records)| !t.is_stale_reader(records)) {
                return Ok(t);
            }
            let mut topics = self.topics.lock().await;
            if topics
                .get(name)
                .is_some_and(|c| Arc::ptr_eq(&c.inner, &t.inner))
            {
                topics.remove(name);
                self.unlist(&t);
                tracing::debug!(topic = name, "replaced a stale view of the topic");
            }
        }
        self.topic(name).await
    }

    /// The bookie writing topic `name`'s open ledger: `None` when it has none. Only that
    /// bookie's node may own the topic (its open ledger is recovered there); sealed ledgers
    /// are read from any node ([`super::replica`]). Ledgers from before bookie ids are this log's.
    pub async fn holder(&self, name: &str) -> Result<Option<String>, MetadataError> {
        Ok(self
            .topic_state(name)
            .await?
            .and_then(|(_, ledgers)| self.holder_in(&ledgers)))
    }

    /// [`Log::holder`] among `ledgers` (a topic's, as read).
    pub fn holder_in(&self, ledgers: &[LedgerRecord]) -> Option<String> {
        ledgers
            .iter()
            .rev()
            .find(|l| l.state == LedgerState::Open)
            .map(|l| {
                if self.shared.writes(l) {
                    self.shared.bookie.clone()
                } else {
                    l.bookie.clone()
                }
            })
    }

    /// The bookie whose node must serve topic `name` (see [`Log::holder`]), except that a
    /// replicated open ledger whose writer is not live pins nothing: whichever node owns the
    /// topic next takes it over ([`Log::take_over_open_ledgers`]).
    pub async fn pinning_holder(&self, name: &str) -> Result<Option<String>, MetadataError> {
        let Some((_, ledgers)) = self.topic_state(name).await? else {
            return Ok(None);
        };
        let Some(holder) = self.holder_in(&ledgers) else {
            return Ok(None);
        };
        let Some(remote) = self.shared.remote.get() else {
            return Ok(Some(holder));
        };
        if holder == self.shared.bookie || remote.is_live(&holder).await {
            return Ok(Some(holder));
        }
        let replicated = ledgers
            .iter()
            .filter(|l| l.state == LedgerState::Open && !self.shared.writes(l))
            .all(recoverable);
        Ok((!replicated).then_some(holder))
    }

    /// Takes over every open ledger of topic `name` that a bookie which is not live writes:
    /// fences, recovers and seals each. The caller owns the topic (and fenced its writers'
    /// ledger creation at its epoch). Returns the ledgers taken over.
    pub async fn take_over_open_ledgers(
        &self,
        name: &str,
    ) -> Result<Vec<LedgerRecord>, TakeoverError> {
        let state = self.topic_state(name).await?;
        self.take_over_open_ledgers_in(name, &state).await
    }

    /// [`Log::take_over_open_ledgers`] of the open ledgers in `state` (read by the caller
    /// after its fence, with [`Log::topic_state`]).
    pub async fn take_over_open_ledgers_in(
        &self,
        name: &str,
        state: &TopicState,
    ) -> Result<Vec<LedgerRecord>, TakeoverError> {
        let Some((_, ledgers)) = state else {
            return Ok(Vec::new());
        };
        let mut done = Vec::new();
        let view = self.topic(name).await?;
        for r in ledgers {
            if r.state != LedgerState::Open {
                continue;
            }
            let remote = self.shared.remote.get().cloned();
            let left_open = if self.shared.writes(r) {
                // This bookie's own, left open by a crash (recovery kept it as a copy); not
                // the ledger its loaded view writes now.
                !r.replicas.is_empty() && view.open_view(r.id).is_none()
            } else {
                let Some(remote) = &remote else {
                    return Err(TakeoverError::NoCluster(r.id));
                };
                !remote.is_live(&r.bookie).await
            };
            // Another writer's unreplicated ledger is its alone: the topic waits for that node.
            if !left_open || (!self.shared.writes(r) && !recoverable(r)) {
                continue;
            }
            let remote = remote.ok_or(TakeoverError::NoCluster(r.id))?;
            done.push(self.take_over(&remote, name, r).await?);
        }
        Ok(done)
    }

    /// Fences, recovers and seals `ledger` of topic `name`.
    async fn take_over(
        &self,
        remote: &Arc<dyn ReplicaSource>,
        name: &str,
        ledger: &LedgerRecord,
    ) -> Result<LedgerRecord, TakeoverError> {
        let record = if ledger.is_striped() {
            self.take_over_striped(remote, name, ledger).await?
        } else {
            self.take_over_whole(remote, name, ledger).await?
        };
        self.transitions.fetch_add(1, Ordering::SeqCst);
        if let Some(t) = self.loaded_topic(record.topic_id) {
            t.set_record(record.clone());
        }
        let entries = record.seal.map_or(0, |s| s.entry_count);
        tracing::warn!(topic = name, ledger = ledger.id, writer = %ledger.bookie,
            entries, bookie = %record.bookie, replicas = ?record.replicas,
            "took over the open ledger of a writer that is gone");
        Ok(record)
    }

    /// [`Log::take_over`] of a ledger whose copies are whole.
    async fn take_over_whole(
        &self,
        remote: &Arc<dyn ReplicaSource>,
        name: &str,
        ledger: &LedgerRecord,
    ) -> Result<LedgerRecord, TakeoverError> {
        if !recoverable(ledger) && !self.shared.writes(ledger) {
            return Err(TakeoverError::Unreplicated {
                ledger: ledger.id,
                bookie: ledger.bookie.clone(),
            });
        }
        // Every bookie of the ensemble is asked, the writer's too (it answers when it is this
        // node, restarted; a writer that is gone does not).
        let ensemble = ledger.replicas.len() + 1;
        let needed = (ensemble + 1).saturating_sub(usize::from(ledger.ack_quorum.max(1)));
        let mut answers: Vec<(String, FencedCopy)> = Vec::new();
        let mut why = String::new();
        // The writer's own word does not count unless it is this node, restarted (a writer
        // that is gone cannot answer, and one cut off must not vouch for itself).
        let asked = ledger
            .bookies()
            .enumerate()
            .filter(|(i, b)| *i > 0 || *b == self.shared.bookie)
            .map(|(_, b)| b);
        let fences = asked.map(|b| async move {
            let fenced = if *b == self.shared.bookie {
                self.replica_fence(ledger.id).await
            } else {
                remote.fence(b, name, ledger.id).await
            };
            (b.to_string(), fenced)
        });
        for (bookie, fenced) in futures::future::join_all(fences).await {
            match fenced {
                Ok(copy) => answers.push((bookie, copy)),
                Err(e) if why.is_empty() => why = format!("{bookie}: {e}"),
                Err(_) => {}
            }
        }
        if answers.len() < needed {
            return Err(TakeoverError::TooFewAnswers {
                ledger: ledger.id,
                answered: answers.len(),
                replicas: ensemble,
                needed,
                why,
            });
        }
        // The longest copy first: it becomes the ledger's bookie.
        answers.sort_by_key(|(_, c)| std::cmp::Reverse(c.seal.entry_count));
        let (best, copy) = answers[0].clone();
        let count = copy.seal.entry_count;
        let meta = &self.shared.meta;
        let record = if count == 0 {
            meta.transition_ledger(ledger.id, LedgerTransition::Seal(copy.seal), now_ms())
                .await?;
            meta.transition_ledger(ledger.id, LedgerTransition::Delete, now_ms())
                .await?
        } else {
            // Shorter copies are completed from the longest, so the ledger keeps as many
            // copies as answered; one that cannot be completed is left out.
            let mut holders = vec![best.clone()];
            for (bookie, c) in &answers[1..] {
                match self
                    .complete_copy(
                        remote,
                        name,
                        ledger.id,
                        (&best, bookie),
                        c.seal.entry_count,
                        count,
                    )
                    .await
                {
                    Ok(()) => holders.push(bookie.clone()),
                    Err(why) => tracing::warn!(
                        ledger = ledger.id,
                        bookie,
                        why,
                        "could not complete a fenced copy; the ledger is under-replicated"
                    ),
                }
            }
            // Placement and seal in one compare-and-set on the ledger's state.
            let seal = LedgerTransition::SealPlaced(Box::new(PlacedSeal {
                seal: copy.seal,
                bookie: best.clone(),
                replicas: holders[1..].to_vec(),
                first_segment: copy.first_segment,
            }));
            let record = meta.transition_ledger(ledger.id, seal, now_ms()).await?;
            self.tell_sealed(remote, name, ledger.id, count, &holders)
                .await;
            record
        };
        Ok(record)
    }

    /// Copies entries `from..to` of `ledger` from bookie `source` to the fenced copy on
    /// `target` (recovery adds, which a fenced copy accepts), and waits until they are
    /// durable there.
    async fn complete_copy(
        &self,
        remote: &Arc<dyn ReplicaSource>,
        name: &str,
        ledger: u64,
        (source, target): (&str, &str),
        from: u64,
        to: u64,
    ) -> Result<(), String> {
        let topic: Arc<str> = Arc::from(name);
        let mut next = from;
        let mut pending = Vec::new();
        while next < to {
            let entries = if source == self.shared.bookie {
                self.serve_read(name, ledger, next, to - 1, COPY_BUDGET)
                    .await
            } else {
                remote.read(source, name, ledger, next, to - 1).await
            }
            .map_err(|e| format!("reading entries from {source}: {e}"))?;
            if entries.is_empty() {
                return Err(format!("{source} has no entry {next}"));
            }
            for e in entries {
                let entry = e.position.entry;
                pending.push(self.recovery_add(remote, &topic, ledger, target, e).await?);
                next = entry + 1;
            }
        }
        for rx in pending {
            match rx.await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(e.to_string()),
                Err(_) => return Err("the add was dropped".into()),
            }
        }
        Ok(())
    }

    /// Sends entry `e` of `ledger` to the fenced copy on `target` as a recovery add (which a
    /// fenced copy accepts); the receiver answers once it is durable there.
    async fn recovery_add(
        &self,
        remote: &Arc<dyn ReplicaSource>,
        topic: &Arc<str>,
        ledger: u64,
        target: &str,
        e: super::Entry,
    ) -> Result<Durable, String> {
        let entry = e.position.entry;
        if target == self.shared.bookie {
            return self
                .replica_add(ledger, entry, e.publish_time_ms, e.payload, true)
                .await
                .map_err(|e| e.to_string());
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        let add = super::replica::ReplicaAdd {
            topic: topic.clone(),
            ledger,
            entry,
            publish_time_ms: e.publish_time_ms,
            payload: e.payload,
            recovery: true,
        };
        remote.add(
            target,
            add,
            Box::new(move |done| {
                let _ = tx.send(done.map(|()| super::Position::new(ledger, entry)).map_err(
                    |why| super::AppendError::Quorum {
                        ledger,
                        why: why.into(),
                    },
                ));
            }),
        );
        Ok(rx)
    }

    /// Lets the bookies holding a recovered ledger write its index now (each also learns it
    /// from the store on its next check).
    async fn tell_sealed(
        &self,
        remote: &Arc<dyn ReplicaSource>,
        name: &str,
        ledger: u64,
        count: u64,
        holders: &[String],
    ) {
        for b in holders {
            let sealed = if *b == self.shared.bookie {
                self.replica_seal(ledger, count).await
            } else {
                remote.sealed(b, name, ledger, count).await
            };
            if let Err(e) = sealed {
                tracing::warn!(ledger, bookie = %b, error = %e,
                    "telling a bookie its recovered copy is sealed failed");
            }
        }
    }
}
