//! Rollover by age (`ledger.rollover_age`), driven by deadlines rather than by a scan: a
//! ledger's age counts from its first entry, so that append queues the topic's deadline (a
//! ledger opened ahead of its first entry queues one when it opens: if no entry comes, it is
//! discarded at that age, as it would otherwise pin the journal's segments), and one task per
//! log ([`run`], spawned by the log on its task tracker) sleeps until the earliest deadline and
//! hands the due topics, several at once, to `TopicLog::at_age_deadline`. An idle topic costs
//! the task nothing; before, a ticker walked every topic the log had loaded every
//! min(age / 4, 5 s).
//!
//! This module knows nothing of topics: a deadline holds an [`AgeToken`] of any `T`.
//!
//! Invariants:
//! - A topic has at most one deadline queued (its writer's `age_armed` flag, set and cleared
//!   under its writer lock), so the queue holds at most one deadline per topic loaded within
//!   the last rollover age, whatever the ledger churn.
//! - Every open ledger is covered: its opening and its first entry queued a deadline, or
//!   found one queued; a deadline that comes early for the ledger now open queues the ledger's
//!   own. (A seal that fails is tried again in the background, as a roll's failed seal is:
//!   `ledger::topic::sealing`.)
//! - The topic judges the deadline again under its locks: a ledger sealed or replaced
//!   meanwhile is left alone.
//! - Deadlines hold a topic's [`AgeToken`] weakly: a topic dropped meanwhile keeps only the
//!   token's few bytes in the queue until its deadline, and is skipped then (one the log forgot
//!   but someone still holds has no open ledger, and the deadline does nothing).
//! - Deadlines are on the runtime's clock; a ledger's age is measured on the system's
//!   monotonic clock and turned into the time left when queued.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What a topic's deadlines point at: a small allocation owned by the topic, so a deadline
/// outliving its topic does not keep the topic's own allocation.
#[derive(Debug)]
pub(crate) struct AgeToken<T>(Weak<T>);

impl<T> AgeToken<T> {
    pub(crate) fn new(topic: Weak<T>) -> AgeToken<T> {
        AgeToken(topic)
    }
}

/// When a topic's open ledger is due to be sealed for its age.
#[derive(Debug)]
pub(crate) struct Deadline<T> {
    at: Instant,
    topic: Weak<AgeToken<T>>,
}

impl<T> PartialEq for Deadline<T> {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}

impl<T> Eq for Deadline<T> {}

impl<T> PartialOrd for Deadline<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl<T> Ord for Deadline<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.at.cmp(&other.at)
    }
}

/// The queue of age deadlines, one per log.
#[derive(Debug)]
pub(crate) struct Aging<T> {
    tx: mpsc::UnboundedSender<Deadline<T>>,
    /// Taken by the task ([`run`]). Invariant: taken at most once.
    rx: Mutex<Option<mpsc::UnboundedReceiver<Deadline<T>>>>,
}

impl<T> Aging<T> {
    pub(crate) fn new() -> Aging<T> {
        let (tx, rx) = mpsc::unbounded_channel();
        Aging {
            tx,
            rx: Mutex::new(Some(rx)),
        }
    }

    /// Queues the deadline of a ledger opened (or given its first entry) at `opened_at`: `age`
    /// later. Returns whether a deadline was queued: not when it lies beyond what a clock can
    /// hold (such a ledger never ages), nor once the log stopped. Call under the topic's writer
    /// lock, and set `age_armed` to the result.
    pub(crate) fn queue(
        &self,
        topic: &Arc<AgeToken<T>>,
        opened_at: std::time::Instant,
        age: Duration,
    ) -> bool {
        let left = age.saturating_sub(opened_at.elapsed());
        match Instant::now().checked_add(left) {
            Some(at) => self
                .tx
                .send(Deadline {
                    at,
                    topic: Arc::downgrade(topic),
                })
                .is_ok(),
            None => false,
        }
    }

    /// The deadlines, for [`run`] (`None` once taken).
    pub(crate) fn take(&self) -> Option<mpsc::UnboundedReceiver<Deadline<T>>> {
        self.rx.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// Most topics handed to `due` at once: their seals share the journal's barriers and the
/// store's group commits, and a burst of deadlines (many topics written in one second) does
/// not take one seal's time per topic.
const AT_ONCE: usize = 16;

/// Hands the topics whose deadlines came to `due`, up to [`AT_ONCE`] at a time (a seal is a
/// journal barrier, an index file and a store update), until `stop`.
pub(crate) async fn run<T, F, Fut>(
    mut queued: mpsc::UnboundedReceiver<Deadline<T>>,
    stop: CancellationToken,
    due: F,
) where
    F: Fn(Arc<T>) -> Fut,
    Fut: Future<Output = ()>,
{
    let mut heap: BinaryHeap<Reverse<Deadline<T>>> = BinaryHeap::new();
    loop {
        let next = heap.peek().map(|Reverse(d)| d.at);
        tokio::select! {
            _ = stop.cancelled() => return,
            d = queued.recv() => match d {
                Some(d) => heap.push(Reverse(d)),
                None => return,
            },
            () = sleep_until(next), if next.is_some() => {
                let now = Instant::now();
                let mut ripe = Vec::new();
                while heap.peek().is_some_and(|Reverse(d)| d.at <= now) {
                    let Some(Reverse(d)) = heap.pop() else { break };
                    ripe.push(d.topic);
                }
                // A topic dropped meanwhile is skipped; none is started once the log stops.
                futures::stream::iter(ripe)
                    .filter_map(|t| std::future::ready(t.upgrade().and_then(|t| t.0.upgrade())))
                    .take_until(stop.cancelled())
                    .for_each_concurrent(AT_ONCE, &due)
                    .await;
                if stop.is_cancelled() {
                    return;
                }
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
