//! The broker's periodic work, every `broker.cursor_persist_interval`, driven by what changed
//! rather than by how many topics are loaded:
//! - **policy changes** are not polled: the operations layer applies each change to the
//!   loaded topics it can concern (its [`Reach`]) when it is made ([`Broker::apply_policies`]),
//!   and so does its follower of other nodes' changes (`ops/follow.rs`); a topic gets the
//!   policies in force when it loads;
//! - **backlog quotas and message TTL** depend on time, so the topics with such a limit in
//!   force are checked again each tick (with those whose policies could not be read last time);
//! - **deduplication snapshots** are saved for the topics that appended since the last tick;
//! - **measures**: the topics that changed are sampled until they are quiet again
//!   ([`super::activity`]), on a blocking thread; hot partitions are evaluated among them.
//!
//! An idle loaded topic is in none of these sets, so it costs the tick nothing; a pass over
//! every loaded topic each second had held a worker for tens of milliseconds at 10,000 topics
//! and set the publish p99 (benches/RESULTS.md, issue 22).
//!
//! Invariants:
//! - Passes that put policies in force run one at a time (`Broker::apply_lock`): of two
//!   passes over one topic, the one that read the policies later is the one that stays. A
//!   topic loading while a pass starts is not in the pass; its load applies the policies
//!   again once it is in the index (`Broker::policy_passes`).
//! - `Broker::policy_checks` holds every loaded topic with a backlog limit in force or whose
//!   last policy read failed; it may briefly hold unloaded ones (dropped at the next tick).

use std::collections::HashMap;
use std::sync::Arc;

use super::activity::{Watch, Watched};
use super::{lock, measure, Broker, BrokerTopic};
use crate::policies::Reach;

impl Broker {
    /// Runs the periodic work until the broker stops.
    pub(super) fn spawn_tick(self: &Arc<Self>) {
        let broker = self.clone();
        self.tasks.spawn(async move {
            let mut tick = tokio::time::interval(broker.config.cursor_persist_interval);
            let mut watched = Watched::default();
            loop {
                tokio::select! {
                    _ = broker.stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                broker.recheck_policies().await;
                let touched = broker.touched();
                for t in &touched {
                    if t.may_deduplicate() {
                        t.save_dedup_snapshot().await;
                    }
                }
                // Sampling is CPU only (atomics, small locks) but grows with the topics
                // that take traffic (10,000 busy partitions: milliseconds); off the async
                // workers it cannot hold up the SENDs they serve.
                let b = broker.clone();
                match tokio::task::spawn_blocking(move || {
                    b.sample_measures(&mut watched, touched);
                    watched
                })
                .await
                {
                    Ok(w) => watched = w,
                    Err(e) => {
                        tracing::error!(error = %e, "sampling the measures panicked");
                        watched = Watched::default();
                    }
                }
            }
        });
    }

    /// Hands every loaded topic's owner that one of `reach` covers and whose policies changed
    /// the policies now in force (enabling deduplication folds its state in the owner;
    /// disabling drops it and forgets its snapshot), and those with backlog limits their
    /// periodic check; puts those topics' publish limits in force. Called by the operations
    /// layer after each policy change, with the topics the change can concern.
    pub async fn apply_policies(&self, reach: &[Reach]) {
        let _one_pass = self.apply_lock.lock().await;
        self.policy_passes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let everything = reach.contains(&Reach::All);
        for t in self.loaded_topics() {
            if everything || reach.iter().any(|r| r.covers(&t.name)) {
                self.apply_policies_to(&t).await;
            }
        }
    }

    /// [`Self::apply_policies`] for one topic; keeps `policy_checks` up to date.
    pub(super) async fn apply_policies_to(&self, t: &Arc<BrokerTopic>) {
        let recheck = match self.policies_of(&t.name).await {
            Ok(policies) => {
                let timed = !policies.backlog.is_empty();
                if t.needs_policies(&policies) {
                    t.set_policies(policies).await;
                }
                timed
            }
            // The policies in force stay until they can be read; the next tick tries again.
            Err(e) => {
                tracing::warn!(topic = %t.name, error = %e, "reading policies failed");
                true
            }
        };
        self.apply_throttle(t).await;
        self.note_policy_check(t, recheck);
    }

    /// Puts `t` in the set of topics the tick checks again (or takes it out).
    pub(super) fn note_policy_check(&self, t: &Arc<BrokerTopic>, recheck: bool) {
        let key = t.measures.marker.key.clone();
        let mut checks = lock(&self.policy_checks);
        if recheck {
            checks.insert(key, t.clone());
        } else if checks.get(&key).is_some_and(|c| Arc::ptr_eq(c, t)) {
            checks.remove(&key);
        }
    }

    /// Checks again the topics with backlog limits in force (and retries failed reads).
    async fn recheck_policies(&self) {
        let _one_pass = self.apply_lock.lock().await;
        let due: Vec<Arc<BrokerTopic>> = {
            let mut checks = lock(&self.policy_checks);
            checks.retain(|_, t| !t.owner.is_closed());
            checks.values().cloned().collect()
        };
        for t in due {
            self.apply_policies_to(&t).await;
        }
    }

    /// The loaded topics that changed since the last call.
    fn touched(&self) -> Vec<Arc<BrokerTopic>> {
        let markers = self.activity.take();
        let index = lock(&self.loaded_index);
        markers
            .iter()
            .filter_map(|m| index.get(&*m.key).cloned())
            .collect()
    }

    /// Samples the rates of the topics that changed (at once) and of those still watched (when
    /// their meters' next step comes), feeds their lag windows and flags hot partitions among
    /// them; stops watching the quiet ones and those unloaded meanwhile.
    fn sample_measures(&self, watched: &mut Watched, touched: Vec<Arc<BrokerTopic>>) {
        if !self.measures.enabled {
            return;
        }
        for t in touched {
            let key = t.measures.marker.key.clone();
            match watched.get_mut(&key) {
                Some(w) if Arc::ptr_eq(&w.topic, &t) => w.next_ms = 0,
                _ => {
                    let base = (t.partition >= 0).then(|| Arc::from(t.name.base().to_string()));
                    watched.insert(
                        key,
                        Watch {
                            topic: t,
                            base,
                            next_ms: 0,
                        },
                    );
                }
            }
        }
        let now = crate::metrics::meter::mono_ms();
        let mut due: Vec<Arc<str>> = Vec::new();
        // Every tick, so that an unloaded topic's memory is not held for a step. A topic's
        // owner has stopped once it is unloaded, deleted or handed over, so one atomic read
        // tells; no look-up in the loaded index, under the broker's lock, per watched topic.
        watched.retain(|key, w| {
            let loaded = !w.topic.owner.is_closed();
            if loaded && w.next_ms <= now {
                due.push(key.clone());
            }
            loaded
        });
        let mut bases: HashMap<Arc<str>, Vec<Arc<BrokerTopic>>> = HashMap::new();
        for key in &due {
            if let Some(w) = watched.get_mut(key) {
                w.next_ms = measure::sample(&w.topic);
                if let Some(b) = &w.base {
                    bases.entry(b.clone()).or_default();
                }
            }
        }
        // A partitioned topic's shares are judged over all its watched partitions, sampled now
        // or not (an unwatched partition counts as taking no traffic).
        if !bases.is_empty() {
            for w in watched.values() {
                if let Some(parts) = w.base.as_ref().and_then(|b| bases.get_mut(b)) {
                    parts.push(w.topic.clone());
                }
            }
            for (_, parts) in bases {
                measure::evaluate_partitions(&parts);
            }
        }
        for key in due {
            if watched
                .get(&key)
                .is_some_and(|w| measure::is_quiet(&w.topic))
            {
                watched.remove(&key);
            }
        }
        crate::memory::shrink_sparse(watched);
        crate::metrics::node()
            .topics_watched
            .set(watched.len() as i64);
    }
}
