//! Following what other nodes change: the namespace and topic policies, tenants, namespaces,
//! grants and resource groups this node caches ([`crate::cached`]) are forgotten when the
//! metadata store's policies feed reports another node wrote them, and the broker puts the
//! policies now in force on its loaded topics, as it does after a change made here.
//!
//! Invariants:
//! - A record cached while a feed runs was loaded after the feed started and is forgotten
//!   when the feed reports a later change of it (the generation of [`crate::cached`] keeps a
//!   load overtaken by that report from being cached).
//! - Only changes that can alter a topic's policies in force (namespace and topic policies,
//!   resource groups) make the broker visit loaded topics, once per burst, and only those the
//!   burst's changes can concern (their [`Reach`]); this node's own changes come back too and
//!   cost a second visit of those topics.
//! - A feed that ends (etcd unreachable, the watch compacted away) is asked for again; until a
//!   new one runs, the caches keep serving what they hold (the node goes on serving its topics
//!   with the policies it knows), and everything is forgotten once it runs.
//! - A store with no feed (SQLite, one process) needs no follower: this node makes every
//!   change itself.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::Operations;
use crate::broker::Broker;
use crate::ledger::metadata::{PolicyChange, PolicyChanges};
use crate::ledger::MetadataStore;
use crate::policies::{PolicyStore, Reach};
use crate::tenancy::Tenancy;

/// First wait before asking again for a feed that could not start or ended at once; doubles up
/// to [`MAX_RETRY`].
const RETRY: Duration = Duration::from_secs(1);
/// Longest wait between attempts to start a feed; a feed that ran this long is asked for again
/// at once.
const MAX_RETRY: Duration = Duration::from_secs(10);

/// What the follower keeps true.
struct Follower {
    meta: Arc<dyn MetadataStore>,
    policies: Arc<PolicyStore>,
    tenancy: Arc<Tenancy>,
    broker: Arc<Broker>,
}

impl Operations {
    /// Follows the metadata store's policies feed until `stop` (see the module docs); returns
    /// at once on a store without one.
    pub fn follow_policy_changes(&self, stop: CancellationToken) {
        let follower = Follower {
            meta: self.log.metadata(),
            policies: self.policies.clone(),
            tenancy: self.tenancy.clone(),
            broker: self.broker.clone(),
        };
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = follower.run() => {}
            }
        });
    }
}

impl Follower {
    /// Starts feeds one after another, for as long as the store gives them.
    async fn run(&self) {
        let mut wait = RETRY;
        loop {
            let started = Instant::now();
            match self.meta.policy_changes().await {
                Ok(Some(mut feed)) => {
                    // Anything cached before the feed started may predate a change it will
                    // not report.
                    self.policies.forget_all();
                    self.tenancy.forget_all();
                    self.broker.apply_policies(&[Reach::All]).await;
                    self.follow(&mut feed).await;
                    tracing::info!("the policies feed ended; caches start over with a new one");
                }
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot follow other nodes' policy changes");
                }
            }
            // A feed that ran a while earns a prompt restart; one that failed or ended at once
            // waits longer each time (no loop of watches, forgetting and passes).
            if started.elapsed() >= MAX_RETRY {
                wait = RETRY;
                continue;
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(MAX_RETRY);
        }
    }

    /// Forgets what `feed` reports until it ends; the broker applies each burst of changes
    /// that can change a topic's policies once, to the topics the burst can concern.
    async fn follow(&self, feed: &mut PolicyChanges) {
        while let Some(change) = feed.next().await {
            let mut reach = Vec::new();
            self.forget(&change, &mut reach);
            while let Ok(change) = feed.try_next() {
                self.forget(&change, &mut reach);
            }
            if !reach.is_empty() {
                self.broker.apply_policies(&reach).await;
            }
        }
    }

    /// Forgets `change`'s scope; adds to `reach` the topics whose policies in force it can
    /// change (grants, tenants and clusters are read on each use instead: none).
    fn forget(&self, change: &PolicyChange, reach: &mut Vec<Reach>) {
        tracing::debug!(scope = %change.scope, "policies changed in the store");
        let changed = [
            self.policies.forget(&change.scope),
            self.tenancy.forget(&change.scope),
        ];
        for r in changed.into_iter().flatten() {
            if !reach.contains(&r) {
                reach.push(r);
            }
        }
    }
}
