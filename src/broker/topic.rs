//! The owner of one topic partition: its log, its producers, its subscriptions and its
//! deduplication state, and the one path by which its producers' SENDs become appends
//! ([`BrokerTopic::publish`]). Rate limits, quotas, metrics and ownership by another node attach
//! here.
//!
//! Invariants:
//! - Every append of a producer's message goes through [`BrokerTopic::publish`], which takes
//!   the deduplication verdict and appends in one step for that producer's SEND.
//! - At most one producer registry entry when any producer is exclusive.
//! - Deduplication state exists exactly while deduplication is on for the topic.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::dedup::{self, Verdict};
use super::subscription::SubscriptionHandle;
use super::BrokerError;
use crate::ledger::cursor::DEDUP_SNAPSHOT;
use crate::ledger::{AppendError, AppendReceipt, TopicLog};
use crate::naming::TopicName;

/// A topic partition as the broker sees it.
#[derive(Debug)]
pub struct BrokerTopic {
    /// Full name.
    pub name: TopicName,
    /// Partition index, -1 when the topic is not partitioned.
    pub partition: i32,
    /// Its log.
    pub log: TopicLog,
    /// Producers by name. Invariant: at most one entry when any producer is exclusive.
    pub(crate) producers: Mutex<HashMap<String, ProducerSlot>>,
    /// Subscriptions by name.
    pub(crate) subscriptions: tokio::sync::Mutex<HashMap<String, SubscriptionHandle>>,
    /// Deduplication while enabled (topic, namespace or broker setting): live state and the
    /// persisted snapshot. Invariant: `Some` only while enabled; dropped (and its snapshot
    /// deleted) when disabled, so re-enabling rebuilds it from the log.
    pub(crate) dedup: std::sync::RwLock<Option<Arc<DedupParts>>>,
    /// The lake table replay reads for ranges deleted locally (`None`: lake disabled).
    pub(crate) lake: Option<crate::replay::TopicLake>,
    /// Set once the topic is being deleted (under the producers' lock). Invariant: no producer
    /// registers and no subscription is created after it is set.
    pub(crate) deleted: std::sync::atomic::AtomicBool,
}

impl BrokerTopic {
    /// Whether the topic is being (or was) deleted: a client holding it must load it anew.
    pub(crate) fn is_deleted(&self) -> bool {
        self.deleted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A producer connected to a topic.
#[derive(Debug, Clone)]
pub(crate) struct ProducerSlot {
    /// Its connection.
    pub conn: u64,
    /// Its id on that connection.
    pub producer_id: u64,
    /// Exclusive access mode.
    pub exclusive: bool,
    /// Its connection's outbound queue (for a broker-initiated CLOSE_PRODUCER).
    pub out: tokio::sync::mpsc::Sender<crate::protocol::command::Outbound>,
}

/// Deduplication state of one topic partition.
#[derive(Debug)]
pub(crate) struct DedupParts {
    /// Consulted on every SEND.
    pub live: Mutex<dedup::DedupState>,
    /// What is persisted.
    pub snapshot: tokio::sync::Mutex<dedup::DedupSnapshot>,
}

impl DedupParts {
    /// Folds the state from the snapshot and the entries after it, whichever tier holds them.
    pub(crate) async fn load(
        log: &TopicLog,
        lake: Option<&crate::replay::TopicLake>,
    ) -> Result<DedupParts, BrokerError> {
        let snapshot = dedup::DedupSnapshot::load(log.clone(), lake.cloned())
            .await
            .map_err(|e| {
                BrokerError::Storage(format!("deduplication state of {}: {e}", log.name()))
            })?;
        Ok(DedupParts {
            live: Mutex::new(dedup::DedupState::from_snapshot(&snapshot)),
            snapshot: tokio::sync::Mutex::new(snapshot),
        })
    }
}

impl BrokerTopic {
    /// The deduplication state, when deduplication is on for this topic.
    pub(crate) fn dedup(&self) -> Option<Arc<DedupParts>> {
        self.dedup.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Saves the deduplication snapshot if entries were appended since the last one.
    pub(crate) async fn save_dedup_snapshot(&self) {
        let Some(parts) = self.dedup() else {
            return;
        };
        let mut snap = parts.snapshot.lock().await;
        match snap.snapshot().await {
            Ok(Some(blob)) => {
                if let Err(e) = self.log.save_cursor(DEDUP_SNAPSHOT, &blob).await {
                    tracing::error!(topic = %self.name, error = %e, "saving dedup snapshot failed");
                }
            }
            Ok(None) => {}
            Err(e) => tracing::error!(topic = %self.name, error = %e, "dedup snapshot failed"),
        }
    }
}

/// What became of one SEND.
pub(crate) enum Published {
    /// Appended: the receipt resolves when it is durable.
    Appended(Result<AppendReceipt, AppendError>),
    /// Already persisted (deduplication): acknowledge without appending.
    Duplicate,
    /// The original is still in flight: the client must retry.
    InFlight,
}

impl BrokerTopic {
    /// Publishes one SEND of producer `producer` whose highest sequence id is `highest`: the
    /// deduplication verdict (when on), then the append. Awaiting the append is the log's
    /// backpressure.
    pub(crate) async fn publish(
        &self,
        producer: &str,
        highest: i64,
        publish_time_ms: i64,
        entry: Bytes,
    ) -> Published {
        if let Some(parts) = self.dedup() {
            let verdict = parts
                .live
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .check(producer, highest);
            match verdict {
                Verdict::New => {}
                Verdict::Duplicate => return Published::Duplicate,
                Verdict::Unknown => return Published::InFlight,
            }
        }
        Published::Appended(self.log.append(publish_time_ms, entry).await)
    }

    /// Records the outcome of an append of `producer` (deduplication: persisted, or forgotten
    /// so a retry is not refused as in flight).
    pub(crate) fn published(&self, producer: &str, highest: i64, durable: bool) {
        if let Some(parts) = self.dedup() {
            let mut live = parts.live.lock().unwrap_or_else(|e| e.into_inner());
            if durable {
                live.persisted(producer, highest);
            } else {
                live.failed(producer);
            }
        }
    }

    /// The `last_sequence_id` PRODUCER_SUCCESS reports for `producer` (-1 without
    /// deduplication).
    pub(crate) fn last_sequence_id(&self, producer: &str) -> i64 {
        self.dedup().map_or(-1, |parts| {
            parts
                .live
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .last_sequence_id(producer)
        })
    }
}
