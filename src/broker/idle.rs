//! Unloading idle topics (`broker.unload_idle_after`), and passing inactive ones on for
//! deletion (inactive-topic policies; the operations layer deletes them): a loaded topic partition whose owner saw
//! no producer, no consumer and no client command for the idle period asks to be unloaded;
//! the broker then unloads it the way a planned unload does — cursors and deduplication state
//! saved, open ledger sealed, ownership released — and the log forgets it, so an idle topic
//! keeps nothing in memory but its slot. The next lookup, producer or consumer loads it again
//! from the metadata store.
//!
//! A topic whose owner failed (a panic; the owner wound up its clients and subscriptions)
//! asks the same way and goes the same way, without the idle check and without saving its
//! deduplication snapshot (the next load folds it from the log).
//!
//! Nothing here walks the loaded topics: each owner keeps one timer while loaded and asks
//! through a queue when its period ran out.
//!
//! Invariants:
//! - A topic is unloaded only if its owner, asked under the topic's slot lock, finds it still
//!   idle (`UnloadIfIdle`); a client that arrived meanwhile keeps it loaded. The exception is
//!   a failed owner's topic, which has stopped already.
//! - A topic whose open ledger could not be sealed at an idle unload stays owned here and its
//!   log stays in memory (only this node can recover that ledger) until the seal tried again
//!   lands; then it is let go as if its unload had sealed it, unless it was loaded again
//!   meanwhile (its own unload lets it go then). A topic whose deletion failed is let go the
//!   same way. An admin unload or planned move gives the claim up at once (placement keeps
//!   the topic on this node, which holds the open ledger; a planned move's destination and
//!   this node both refuse it until the seal lands); its log goes the same way.

use std::sync::{Arc, Weak};

use tokio::sync::mpsc;

use super::owner::IdleAsk;
use super::{lock, Broker, BrokerTopic};
use crate::naming::TopicName;

/// What owners ask about themselves.
type Asked = (Weak<BrokerTopic>, IdleAsk);

/// The queue through which idle owners ask to be unloaded, and the one through which the
/// broker passes inactive topics on for deletion.
#[derive(Debug)]
pub(super) struct IdleQueue {
    /// Handed to each owner.
    pub ask: mpsc::UnboundedSender<Asked>,
    /// Taken by [`Broker::serve`]. Invariant: taken at most once.
    pub asked: std::sync::Mutex<Option<mpsc::UnboundedReceiver<Asked>>>,
    /// Inactive topics to delete.
    inactive: mpsc::UnboundedSender<TopicName>,
    /// Taken by the operations layer, which deletes them. Invariant: taken at most once.
    to_delete: std::sync::Mutex<Option<mpsc::UnboundedReceiver<TopicName>>>,
}

impl IdleQueue {
    pub(super) fn new() -> IdleQueue {
        let (ask, asked) = mpsc::unbounded_channel();
        let (inactive, to_delete) = mpsc::unbounded_channel();
        IdleQueue {
            ask,
            asked: std::sync::Mutex::new(Some(asked)),
            inactive,
            to_delete: std::sync::Mutex::new(Some(to_delete)),
        }
    }
}

impl Broker {
    /// What owners loaded from now on are told about unloading once idle.
    pub(super) fn idle_unload(&self) -> Option<super::owner::IdleUnload> {
        let after = self.config.unload_idle_after;
        Some(super::owner::IdleUnload {
            after: (!after.is_zero()).then_some(after),
            ask: self.idle.ask.clone(),
        })
    }

    /// The topics found inactive (their inactive-topic policy says to delete them), for the
    /// operations layer to delete (`None` once taken).
    pub fn take_inactive_topics(&self) -> Option<mpsc::UnboundedReceiver<TopicName>> {
        lock(&self.idle.to_delete).take()
    }

    /// Unloads the topics that ask for it until the broker stops.
    pub(super) fn spawn_idle_unloader(self: &Arc<Self>) {
        let Some(mut asked) = lock(&self.idle.asked).take() else {
            return;
        };
        let broker = self.clone();
        self.tasks.spawn(async move {
            // Memory freed by unloads goes back to the system once they settle: a little
            // after the last one, at most once per `memory::MIN_INTERVAL`.
            let mut last_release = tokio::time::Instant::now();
            let mut release_at: Option<tokio::time::Instant> = None;
            loop {
                let topic = tokio::select! {
                    _ = broker.stop.cancelled() => return,
                    () = super::subscription::sleep_until(release_at), if release_at.is_some() => {
                        release_at = None;
                        last_release = tokio::time::Instant::now();
                        crate::memory::release().await;
                        continue;
                    }
                    next = asked.recv() => match next {
                        Some(t) => t,
                        None => return,
                    },
                };
                let (topic, what) = topic;
                let Some(topic) = topic.upgrade() else {
                    continue;
                };
                if what == IdleAsk::Delete {
                    let _ = broker.idle.inactive.send(topic.name.clone());
                    continue;
                }
                if broker.unload_idle(topic, what).await {
                    let settle = tokio::time::Instant::now() + RELEASE_SETTLE;
                    release_at = Some(settle.max(last_release + crate::memory::MIN_INTERVAL));
                }
            }
        });
    }

    /// Unloads `topic` if it is still the loaded one of its name and, when `why` is
    /// [`IdleAsk::Unload`], still idle; whether it did. A topic whose owner failed
    /// ([`IdleAsk::Failed`]) stopped already, its clients closed: it goes as an idle one
    /// does.
    async fn unload_idle(self: &Arc<Self>, topic: Arc<BrokerTopic>, why: IdleAsk) -> bool {
        let key = topic.name.to_string();
        let slot = self.slot(&key);
        let mut loaded = slot.0.lock().await;
        if !loaded.as_ref().is_some_and(|t| Arc::ptr_eq(t, &topic)) {
            return false;
        }
        if why == IdleAsk::Unload {
            topic.save_dedup_snapshot().await;
            if !topic.unload_if_idle().await {
                return false;
            }
        }
        *loaded = None;
        self.forget_loaded(&topic);
        if let Err(e) = topic.log.seal_current().await {
            tracing::warn!(topic = %key, why = ?why, error = %e,
                "sealing an unloaded topic's ledger failed; it stays owned here until it is sealed");
        }
        if topic.log.is_writing() {
            // An open ledger (a seal tried again, a rollover's still running) keeps the topic
            // here (it loads again from this node's log) until it is closed.
            self.let_go_once_sealed(key, topic.log.clone(), why == IdleAsk::Unload);
            return true;
        }
        self.let_go(&key, &topic.log).await;
        if why == IdleAsk::Unload {
            crate::metrics::node().topics_unloaded_idle.inc();
        }
        tracing::debug!(topic = %key, why = ?why, "unloaded a topic that asked");
        true
    }
}

impl Broker {
    /// Releases the ownership of unloaded topic `key` and has the log forget `log`, its log.
    async fn let_go(&self, key: &str, log: &crate::ledger::TopicLog) {
        if let Err(e) = self.ownership.release(key).await {
            tracing::warn!(topic = %key, error = %e, "releasing an unloaded topic failed");
        }
        self.log.forget(log).await;
    }

    /// For an unloaded topic whose open ledger could not be sealed, or whose deletion failed:
    /// once no close of its ledgers is being tried again, lets the topic go as an unload
    /// would (`idle`: counted as an idle unload) if it is still unloaded, no ledger of it is
    /// open, and `log` is still the log in memory for it (else another unload or load took
    /// over: its ownership is not this task's to release; a claim given up already is no
    /// longer here to release, after an admin unload). One whose close failed for good
    /// stays here until the next start. The task ends then, or when the broker or the log
    /// stops (at once when nothing is being tried again).
    pub(super) fn let_go_once_sealed(
        self: &Arc<Self>,
        key: String,
        log: crate::ledger::TopicLog,
        idle: bool,
    ) {
        let broker = self.clone();
        self.tasks.spawn(async move {
            let ended = tokio::select! {
                _ = broker.stop.cancelled() => false,
                ended = log.retries_ended() => ended,
            };
            if !ended {
                return;
            }
            let slot = broker.slot(&key);
            let loaded = slot.0.lock().await;
            if loaded.is_some() || log.is_writing() || !broker.log.forget(&log).await {
                return;
            }
            if let Err(e) = broker.ownership.release(&key).await {
                tracing::warn!(topic = %key, error = %e, "releasing an unloaded topic failed");
            }
            if idle {
                crate::metrics::node().topics_unloaded_idle.inc();
            }
            tracing::info!(topic = %key, "let go of a topic once no seal of it was tried again");
        });
    }
}

/// How long after the last idle unload freed memory is handed back.
const RELEASE_SETTLE: std::time::Duration = std::time::Duration::from_secs(2);
