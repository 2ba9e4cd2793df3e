//! Retention without a lake (`lake.enabled = false`): no offload engine runs, so this task
//! applies the namespaces' retention policies to the log alone, every
//! `broker.retention_check_interval`, over the topics of the namespaces where retention is
//! finite (listed by name prefix: none with the default infinite retention). The rules are those of [`super::retention`]: consumed
//! ledgers beyond the time or size limit become `Expired` and their local files are deleted.
//!
//! Invariant: it runs only when no offload engine does (the engine applies retention on each
//! of its passes), so one partition's ledgers are never expired by two tasks at once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::retention::expire_ledgers;
use super::{partition_index, OffloadError};
use crate::ledger::Log;
use crate::naming::{NamespaceName, TopicName};
use crate::policies::{FiniteRetention, PolicyStore, RetentionPolicy};

/// The running task.
#[derive(Debug)]
pub struct LogRetention {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl LogRetention {
    /// Starts a pass every `interval` (the first one after `interval`).
    pub fn start(log: Arc<Log>, policies: Arc<PolicyStore>, interval: Duration) -> Self {
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut tick =
                tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stopped.cancelled() => return,
                    _ = tick.tick() => {}
                }
                if let Err(e) = pass(&log, &policies).await {
                    tracing::warn!(error = %e, "retention pass over the log failed");
                }
            }
        });
        LogRetention { stop, task }
    }

    /// Stops the task, waiting for a pass under way to finish (a ledger is expired whole).
    pub async fn shutdown(self) {
        self.stop.cancel();
        if let Err(e) = self.task.await {
            tracing::warn!(error = %e, "retention task ended abnormally");
        }
    }
}

/// One pass over the persistent topic partitions of the namespaces that limit retention. Returns
/// how many ledgers it expired. A partition that fails is logged and skipped, so it cannot
/// hold back the others.
pub async fn pass(log: &Log, policies: &PolicyStore) -> Result<usize, OffloadError> {
    let mut by_namespace: BTreeMap<NamespaceName, RetentionPolicy> = BTreeMap::new();
    let mut expired = 0;
    // Only the namespaces where retention is finite are listed: with the default (infinite)
    // retention a pass reads no topic at all, however many are stored.
    let prefixes = match policies.finite_retention().await? {
        FiniteRetention::Everywhere => vec!["persistent://".to_string()],
        FiniteRetention::In(namespaces) => namespaces
            .iter()
            .map(|ns| format!("persistent://{ns}/"))
            .collect(),
    };
    for prefix in prefixes {
        for t in log.metadata().list_topics_under(&prefix).await? {
            let Ok(name) = t.name.parse::<TopicName>() else {
                continue;
            };
            match partition(log, policies, &t.name, &name, &mut by_namespace).await {
                Ok(n) => expired += n,
                Err(e) => {
                    tracing::warn!(topic = %t.name, error = %e, "retention of a partition failed")
                }
            }
        }
    }
    Ok(expired)
}

/// Retention of the partition `topic` (parsed: `name`); `by_namespace` caches policies for
/// the pass.
async fn partition(
    log: &Log,
    policies: &PolicyStore,
    topic: &str,
    name: &TopicName,
    by_namespace: &mut BTreeMap<NamespaceName, RetentionPolicy>,
) -> Result<usize, OffloadError> {
    let policy = match by_namespace.get(&name.namespace) {
        Some(p) => *p,
        None => {
            let p = policies.effective(&name.namespace).await?.retention;
            by_namespace.insert(name.namespace.clone(), p);
            p
        }
    };
    if policy.is_infinite() {
        return Ok(0);
    }
    let Some(topic) = log.topic_view(topic).await? else {
        return Ok(0);
    };
    let done = expire_ledgers(log, &[(partition_index(name), topic)], &policy).await?;
    Ok(done.newly.len())
}
