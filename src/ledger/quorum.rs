//! The writer's side of a replicated ledger (ADR 0010): which of its bookies made which entries
//! durable, and when an entry has reached its ack quorum.
//!
//! The writer's own journal is one bookie of the ensemble; each replica gets every entry, in
//! order, over one connection ([`super::ReplicaSource::add`]). An entry is acknowledged to the
//! producer, and becomes visible to readers, once `ack_quorum` bookies made it durable.
//!
//! Invariants (under the state's lock):
//! - `durable[i]` only grows; bookie `i` holds entries `0..durable[i]` (each bookie confirms in
//!   order: the journal acknowledges in write order, a replica answers adds in order).
//! - `confirmed` is the `ack_quorum`-th largest of `durable`: entries `0..confirmed` are
//!   durable on at least `ack_quorum` bookies. It only grows, and every waiting receipt below
//!   it has been answered `Ok`.
//! - A failed replica gets no later entry of the ledger (its copy stays a dense prefix); once
//!   fewer than `ack_quorum` bookies are left, every waiting and later entry fails.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{oneshot, watch};

use super::error::AppendError;
use super::metadata::LedgerId;
use super::Position;

type Reply = oneshot::Sender<Result<Position, AppendError>>;

#[derive(Debug)]
struct State {
    /// Entries durable on each bookie: index 0 is this node's journal, then the replicas.
    durable: Vec<u64>,
    /// Replicas that failed (index as in `durable`; the journal never counts as failed here:
    /// a failed journal stops the whole node).
    failed: Vec<bool>,
    confirmed: u64,
    /// Receipts not answered yet, by entry id, ascending.
    waiting: VecDeque<(u64, Reply)>,
    /// Set once the quorum can no longer be reached.
    broken: Option<Arc<str>>,
}

/// The replication state of one open ledger this node writes.
#[derive(Debug)]
pub(crate) struct Quorum {
    ledger: LedgerId,
    /// The replicas' bookie ids (index `i` here is `i + 1` in the state's vectors).
    pub replicas: Vec<String>,
    ack_quorum: usize,
    state: Mutex<State>,
    /// Bumped whenever a bookie holds more, a replica fails or the quorum breaks, for
    /// [`Quorum::settled`] and [`Quorum::settled_complete`].
    progress: watch::Sender<u64>,
}

impl Quorum {
    pub fn new(ledger: LedgerId, replicas: Vec<String>, ack_quorum: u8) -> Quorum {
        let n = replicas.len() + 1;
        Quorum {
            ledger,
            replicas,
            ack_quorum: usize::from(ack_quorum).clamp(1, n),
            state: Mutex::new(State {
                durable: vec![0; n],
                failed: vec![false; n],
                confirmed: 0,
                waiting: VecDeque::new(),
                broken: None,
            }),
            progress: watch::channel(0).0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for entry `entry` (registered in id order, before it is sent anywhere).
    pub fn register(&self, entry: u64, reply: Reply) {
        let mut s = self.lock();
        match &s.broken {
            Some(why) => {
                let _ = reply.send(Err(self.error(why)));
            }
            None => s.waiting.push_back((entry, reply)),
        }
    }

    /// Whether replica `i` (0-based among the replicas) still gets entries.
    pub fn sends_to(&self, i: usize) -> bool {
        !self.lock().failed[i + 1]
    }

    /// Whether a replica failed: the ledger should roll so that the next entries get a
    /// complete ensemble.
    pub fn degraded(&self) -> bool {
        let s = self.lock();
        s.broken.is_some() || s.failed.iter().any(|f| *f)
    }

    /// The journal made entries `0..=entry` durable. Returns the new confirmed count, if it
    /// moved.
    pub fn local_durable(&self, entry: u64) -> Option<u64> {
        self.durable_on(0, entry)
    }

    /// Replica `i` made entries `0..=entry` durable.
    pub fn replica_durable(&self, i: usize, entry: u64) -> Option<u64> {
        self.durable_on(i + 1, entry)
    }

    fn durable_on(&self, bookie: usize, entry: u64) -> Option<u64> {
        let (grew, confirmed) = self.record_durable(bookie, entry);
        if grew {
            self.progress.send_modify(|p| *p += 1);
        }
        confirmed
    }

    /// Records that `bookie` holds entries `0..=entry`: whether that is news, and the new
    /// confirmed count if it grew (its receipts sent).
    fn record_durable(&self, bookie: usize, entry: u64) -> (bool, Option<u64>) {
        let mut s = self.lock();
        let grew = s.durable[bookie] < entry + 1;
        if grew {
            s.durable[bookie] = entry + 1;
        }
        // Broken, the ledger ends where it was: entries failed to their producers stay
        // unconfirmed, however many bookies hold them later.
        if s.broken.is_some() {
            return (grew, None);
        }
        let mut counts = s.durable.clone();
        counts.sort_unstable_by(|a, b| b.cmp(a));
        let q = counts[self.ack_quorum - 1];
        if q <= s.confirmed {
            return (grew, None);
        }
        s.confirmed = q;
        while s.waiting.front().is_some_and(|(e, _)| *e < q) {
            if let Some((e, reply)) = s.waiting.pop_front() {
                let _ = reply.send(Ok(Position::new(self.ledger, e)));
            }
        }
        (grew, Some(q))
    }

    /// Replica `i` failed: it gets nothing more of this ledger. When too few bookies are left
    /// for the ack quorum, every entry not confirmed yet fails.
    pub fn replica_failed(&self, i: usize, why: &str) {
        let mut s = self.lock();
        if s.failed[i + 1] {
            return;
        }
        s.failed[i + 1] = true;
        tracing::warn!(ledger = self.ledger, bookie = %self.replicas[i], why,
            "a replica of the ledger failed; the ledger rolls to a new ensemble");
        let left = s.failed.iter().filter(|f| !**f).count();
        drop(s);
        self.progress.send_modify(|p| *p += 1);
        if left < self.ack_quorum {
            self.break_with(
                format!(
                    "{left} of its bookies are left, fewer than its ack quorum of {} ({} \
                     failed: {why})",
                    self.ack_quorum, self.replicas[i]
                )
                .into(),
            );
        }
    }

    /// This node's journal failed (fail-stop): entries not confirmed yet fail, and so does
    /// every later one.
    pub fn journal_failed(&self, why: &str) {
        self.break_with(format!("the writer's journal failed: {why}").into());
    }

    fn break_with(&self, why: Arc<str>) {
        let mut s = self.lock();
        if s.broken.is_some() {
            return;
        }
        for (_, reply) in s.waiting.drain(..) {
            let _ = reply.send(Err(self.error(&why)));
        }
        s.broken = Some(why);
        drop(s);
        self.progress.send_modify(|p| *p += 1);
    }

    fn error(&self, why: &Arc<str>) -> AppendError {
        AppendError::Quorum {
            ledger: self.ledger,
            why: why.clone(),
        }
    }

    /// [`Quorum::settled`], then up to `grace` more until every replica that did not fail
    /// holds every confirmed entry (their answers may still be on the way): a seal lists every
    /// complete copy, and a replica only slow to answer is not left out for autorecovery to
    /// copy again.
    pub async fn settled_complete(
        &self,
        submitted: u64,
        grace: std::time::Duration,
    ) -> (u64, Vec<String>) {
        let (count, _) = self.settled(submitted).await;
        let mut progress = self.progress.subscribe();
        let caught_up = async {
            loop {
                {
                    let s = self.lock();
                    let behind = (1..s.durable.len()).any(|i| !s.failed[i] && s.durable[i] < count);
                    if s.broken.is_some() || !behind {
                        return;
                    }
                }
                if progress.changed().await.is_err() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(grace, caught_up).await;
        self.settled(submitted).await
    }

    /// Waits until every entry below `submitted` is confirmed or failed; returns the entries
    /// confirmed and the replicas that hold all of them.
    pub async fn settled(&self, submitted: u64) -> (u64, Vec<String>) {
        let mut progress = self.progress.subscribe();
        loop {
            {
                let s = self.lock();
                if s.confirmed >= submitted || s.broken.is_some() {
                    let count = s.confirmed.min(submitted);
                    let complete = self
                        .replicas
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| s.durable[i + 1] >= count)
                        .map(|(_, b)| b.clone())
                        .collect();
                    return (count, complete);
                }
            }
            if progress.changed().await.is_err() {
                return (self.lock().confirmed.min(submitted), Vec::new());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply() -> (Reply, oneshot::Receiver<Result<Position, AppendError>>) {
        oneshot::channel()
    }

    #[test]
    fn an_entry_is_confirmed_once_its_ack_quorum_holds_it() {
        let q = Quorum::new(7, vec!["b".into(), "c".into()], 2);
        let (t0, mut r0) = reply();
        let (t1, mut r1) = reply();
        q.register(0, t0);
        q.register(1, t1);
        assert_eq!(q.local_durable(1), None, "one bookie of a quorum of two");
        assert!(r0.try_recv().is_err());
        assert_eq!(q.replica_durable(1, 0), Some(1));
        assert_eq!(
            r0.try_recv().ok().and_then(Result::ok),
            Some(Position::new(7, 0))
        );
        assert!(r1.try_recv().is_err(), "entry 1 is on one bookie only");
        assert_eq!(q.replica_durable(0, 1), Some(2));
        assert_eq!(
            r1.try_recv().ok().and_then(Result::ok),
            Some(Position::new(7, 1))
        );
    }

    #[test]
    fn losing_one_of_three_keeps_a_quorum_of_two_and_losing_two_fails_the_rest() {
        let q = Quorum::new(1, vec!["b".into(), "c".into()], 2);
        let (t0, mut r0) = reply();
        q.register(0, t0);
        q.replica_failed(0, "connection reset");
        assert!(q.degraded() && !q.sends_to(0) && q.sends_to(1));
        q.local_durable(0);
        q.replica_durable(1, 0);
        assert!(matches!(r0.try_recv(), Ok(Ok(_))));
        let (t1, mut r1) = reply();
        q.register(1, t1);
        q.local_durable(1);
        q.replica_failed(1, "timed out");
        assert!(matches!(r1.try_recv(), Ok(Err(AppendError::Quorum { .. }))));
        let (t2, mut r2) = reply();
        q.register(2, t2);
        assert!(matches!(r2.try_recv(), Ok(Err(AppendError::Quorum { .. }))));
    }

    #[test]
    fn a_broken_quorum_confirms_nothing_more() {
        let q = Quorum::new(1, vec!["b".into(), "c".into()], 3);
        let (t0, mut r0) = reply();
        q.register(0, t0);
        q.replica_durable(0, 0);
        q.replica_durable(1, 0);
        q.replica_failed(0, "timed out");
        assert!(matches!(r0.try_recv(), Ok(Err(AppendError::Quorum { .. }))));
        assert_eq!(
            q.local_durable(0),
            None,
            "entry 0 failed; it is never confirmed"
        );
    }

    #[tokio::test]
    async fn settling_names_the_replicas_holding_every_confirmed_entry() {
        let q = Quorum::new(1, vec!["b".into(), "c".into()], 2);
        for e in 0..3 {
            q.register(e, reply().0);
        }
        q.local_durable(2);
        q.replica_durable(0, 2);
        q.replica_durable(1, 0);
        q.replica_failed(1, "gone");
        assert_eq!(q.settled(3).await, (3, vec!["b".to_string()]));
    }

    #[tokio::test]
    async fn a_seal_waits_a_grace_for_a_replica_only_slow_to_answer() {
        let q = std::sync::Arc::new(Quorum::new(1, vec!["b".into(), "c".into()], 2));
        for e in 0..3 {
            q.register(e, reply().0);
        }
        q.local_durable(2);
        q.replica_durable(0, 2);
        q.replica_durable(1, 1);
        // C's answer for the last entry arrives within the grace: C is complete.
        let late = q.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            late.replica_durable(1, 2);
        });
        let (count, complete) = q
            .settled_complete(3, std::time::Duration::from_secs(10))
            .await;
        assert_eq!(
            (count, complete),
            (3, vec!["b".to_string(), "c".to_string()])
        );
        // One that never answers is left out once the grace is over.
        let q = Quorum::new(2, vec!["b".into(), "c".into()], 2);
        q.register(0, reply().0);
        q.local_durable(0);
        q.replica_durable(0, 0);
        let (count, complete) = q
            .settled_complete(1, std::time::Duration::from_millis(50))
            .await;
        assert_eq!((count, complete), (1, vec!["b".to_string()]));
    }
}
