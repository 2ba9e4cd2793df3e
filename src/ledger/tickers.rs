//! The log's background work: the volume check that refuses appends before the disk is full,
//! the periodic check of replica copies against the store, and the task that seals open
//! ledgers at their age deadlines ([`super::aging`]). Each runs until the log stops.

use super::{aging, replicas, Log, TopicLog, REPLICA_COLLECTION};

impl Log {
    /// Hands topics to [`TopicLog::at_age_deadline`] as their age deadlines come
    /// ([`aging`]), until the log stops.
    pub(super) fn spawn_age_ticker(&self) {
        let Some(queued) = self.shared.aging.take() else {
            return;
        };
        // On the tracker: shutdown waits for the seals under way before the journal stops.
        self.shared
            .tasks
            .spawn(aging::run(queued, self.stop.clone(), |inner| async move {
                let t = TopicLog { inner };
                if let Err(e) = t.at_age_deadline().await {
                    tracing::warn!(topic = %t.name(), error = %e, "age rollover failed");
                }
            }));
    }

    /// Every [`REPLICA_COLLECTION`], drops the replica copies the store no longer lists for
    /// a live ledger, seals those sealed meanwhile and removes fence files no longer needed
    /// ([`Log::collect_replicas`]); a bookie holding no copy and no fence file does nothing.
    pub(super) fn spawn_replica_collector(&self) {
        let shared = self.shared.clone();
        let stop = self.stop.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(REPLICA_COLLECTION);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                if shared.replicas.ledgers().is_empty() && shared.replicas.fence_files.is_empty() {
                    continue;
                }
                if let Err(e) = replicas::collect(&shared).await {
                    tracing::warn!(error = %e, "collecting replica copies failed");
                }
            }
        });
    }

    /// Checks the log's volume and size every `ledger.disk_check_interval` (the first check
    /// at once), so that appends are refused before the disk is full and admitted again after.
    pub(super) fn spawn_disk_ticker(&self) {
        let shared = self.shared.clone();
        let stop = self.stop.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(shared.config.disk_check_interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let s = shared.clone();
                match tokio::task::spawn_blocking(move || s.disk.check()).await {
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "checking the log's disk space failed")
                    }
                    Ok(Ok(_)) => {}
                    Err(e) => tracing::error!(error = %e, "checking the log's disk space panicked"),
                }
            }
        });
    }
}
