//! Rollover by age (`ledger.rollover_age`), driven by deadlines rather than by a scan: a
//! ledger's age counts from its first entry, so that append queues the ledger's deadline, and
//! one task per log sleeps until the earliest deadline and seals the ledgers that are due. An
//! idle topic costs the task nothing; before, a ticker walked every topic the log had loaded a
//! few times per rollover age.
//!
//! Invariants:
//! - Every open ledger holding an entry has had its deadline queued by the append of its first
//!   entry (under the topic's writer lock, so never twice for one ledger).
//! - The task judges a due topic again ([`super::TopicLog::seal_if_aged`]): a deadline is a
//!   hint, a ledger sealed or replaced meanwhile is left alone (its successor queued its own).
//! - Deadlines hold topics weakly: a topic the log forgot is skipped when its deadline comes.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::topic::TopicInner;
use super::{Log, TopicLog};

/// When a topic's open ledger is due to be sealed for its age.
#[derive(Debug)]
struct Deadline {
    at: Instant,
    topic: Weak<TopicInner>,
}

impl PartialEq for Deadline {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}

impl Eq for Deadline {}

impl PartialOrd for Deadline {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Deadline {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.at.cmp(&other.at)
    }
}

/// The queue of age deadlines, one per log.
#[derive(Debug)]
pub(crate) struct Aging {
    tx: mpsc::UnboundedSender<Deadline>,
    /// Taken by the task ([`Log::spawn_age_ticker`]). Invariant: taken at most once.
    rx: Mutex<Option<mpsc::UnboundedReceiver<Deadline>>>,
}

impl Aging {
    pub(crate) fn new() -> Aging {
        let (tx, rx) = mpsc::unbounded_channel();
        Aging {
            tx,
            rx: Mutex::new(Some(rx)),
        }
    }

    /// Queues `topic`'s open ledger to be sealed once `age` has passed (call when its first
    /// entry is appended).
    pub(crate) fn first_entry(&self, topic: &Arc<TopicInner>, age: std::time::Duration) {
        let _ = self.tx.send(Deadline {
            at: Instant::now() + age,
            topic: Arc::downgrade(topic),
        });
    }
}

impl Log {
    /// Seals open ledgers as their age deadlines come, until the log stops.
    pub(super) fn spawn_age_ticker(&self) {
        let Some(mut queued) = self
            .shared
            .aging
            .rx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        else {
            return;
        };
        let stop = self.stop.clone();
        tokio::spawn(async move {
            let mut due: BinaryHeap<Reverse<Deadline>> = BinaryHeap::new();
            loop {
                let next = due.peek().map(|Reverse(d)| d.at);
                tokio::select! {
                    _ = stop.cancelled() => return,
                    d = queued.recv() => match d {
                        Some(d) => due.push(Reverse(d)),
                        None => return,
                    },
                    () = sleep_until(next), if next.is_some() => {
                        let now = Instant::now();
                        while due.peek().is_some_and(|Reverse(d)| d.at <= now) {
                            let Some(Reverse(d)) = due.pop() else { break };
                            let Some(inner) = d.topic.upgrade() else { continue };
                            let t = TopicLog { inner };
                            if let Err(e) = t.seal_if_aged().await {
                                tracing::warn!(topic = %t.name(), error = %e, "age rollover failed");
                            }
                        }
                    }
                }
            }
        });
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
