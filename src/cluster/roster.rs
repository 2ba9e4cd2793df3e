//! A watch-fed copy of the registrations (`nodes/…` with their versions), so that work that
//! looks at every peer often — the failure detector, every probe interval — reads memory
//! instead of listing the coordination store each time.
//!
//! Invariants:
//! - [`Roster::current`] is `None` until the first listing, and again from the moment a watch
//!   ends until the next listing succeeds: a reader then lists the store itself.
//! - While `Some`, the copy is the listing plus every watch event after it, in order (the
//!   coordination contract: nothing missed, nothing twice). It is as fresh as the watch: on
//!   etcd, watches require a leader, so a member cut off from its leader ends them; a dead
//!   connection is found by the client's keep-alive (about 15 s). A stale copy costs
//!   detection, never a wrong expel: an expel compares the registration's version.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::membership::{Membership, NodeRecord};
use crate::coord::WatchEvent;

/// How long the roster waits before listing again after a failed listing.
const RELIST_PAUSE: Duration = Duration::from_millis(500);

/// The registrations as the last watch event left them.
#[derive(Debug, Default)]
pub struct Roster {
    /// By key: the record and its registration's version. Invariant: above.
    current: Mutex<Option<BTreeMap<String, (NodeRecord, u64)>>>,
}

impl Roster {
    /// A roster following `membership` until `stop`.
    pub fn start(membership: Arc<Membership>, stop: CancellationToken) -> Arc<Roster> {
        let roster = Arc::new(Roster::default());
        let r = roster.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = r.follow(&membership) => {}
            }
            r.set(None);
        });
        roster
    }

    /// Every registration with its version, `None` while the roster does not follow the
    /// store (a caller lists the store itself).
    pub fn current(&self) -> Option<Vec<(NodeRecord, u64)>> {
        let current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        current.as_ref().map(|m| m.values().cloned().collect())
    }

    fn set(&self, to: Option<BTreeMap<String, (NodeRecord, u64)>>) {
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = to;
    }

    async fn follow(&self, membership: &Membership) {
        loop {
            let (listed, mut watch) = match membership.watch().await {
                Ok(w) => w,
                Err(e) => {
                    tracing::debug!(error = %e, "listing the registrations failed; again soon");
                    tokio::time::sleep(RELIST_PAUSE).await;
                    continue;
                }
            };
            let mut copy: BTreeMap<String, (NodeRecord, u64)> = listed
                .into_iter()
                .map(|(key, node, version)| (key, (node, version)))
                .collect();
            self.set(Some(copy.clone()));
            let watched = std::time::Instant::now();
            while let Some(event) = watch.next().await {
                match event {
                    WatchEvent::Put {
                        key,
                        value,
                        version,
                    } => match NodeRecord::decode(&value) {
                        Ok(node) => drop(copy.insert(key, (node, version))),
                        Err(e) => {
                            tracing::warn!(%key, error = %e, "an unreadable registration");
                            drop(copy.remove(&key));
                        }
                    },
                    WatchEvent::Delete { key, .. } => drop(copy.remove(&key)),
                }
                self.set(Some(copy.clone()));
            }
            // The watch ended: nothing may rely on the copy until the store is listed again
            // (after a pause when it ended at once, so a failing watch does not spin).
            self.set(None);
            if watched.elapsed() < Duration::from_secs(1) {
                tokio::time::sleep(RELIST_PAUSE).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::membership::tests::record;
    use crate::coord::memory::MemoryCoordination;
    use crate::coord::Coordination;

    /// (id, draining) of each registration the roster holds.
    fn ids(r: &Roster) -> Option<Vec<(String, bool)>> {
        r.current()
            .map(|v| v.into_iter().map(|(n, _)| (n.id, n.draining)).collect())
    }

    /// Waits (up to 2 s) until the roster holds `want`.
    async fn settled(roster: &Roster, want: &[(&str, bool)]) -> Result<(), String> {
        let want: Vec<(String, bool)> = want.iter().map(|(i, d)| (i.to_string(), *d)).collect();
        for _ in 0..200 {
            if ids(roster).as_ref() == Some(&want) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Err(format!("roster {:?}, wanted {want:?}", ids(roster)))
    }

    #[tokio::test]
    async fn the_roster_follows_joins_changes_and_leaves() -> Result<(), Box<dyn std::error::Error>>
    {
        let coord = MemoryCoordination::new();
        let session = || -> Arc<dyn Coordination> { Arc::new(coord.new_session()) };
        let me = Arc::new(Membership::join(session(), record("a:1"), Duration::ZERO).await?);
        let stop = CancellationToken::new();
        let roster = Roster::start(me.clone(), stop.clone());
        settled(&roster, &[("a:1", false)]).await?;
        let b = Membership::join(session(), record("b:2"), Duration::ZERO).await?;
        settled(&roster, &[("a:1", false), ("b:2", false)]).await?;
        b.drain().await?;
        settled(&roster, &[("a:1", false), ("b:2", true)]).await?;
        // The versions are the registrations' own (an expel at them must match).
        let listed = me.registrations().await?;
        let mut copied = roster.current().ok_or("following")?;
        copied.sort_by(|x, y| x.0.id.cmp(&y.0.id));
        assert_eq!(copied, listed);
        b.leave().await?;
        settled(&roster, &[("a:1", false)]).await?;
        stop.cancel();
        for _ in 0..200 {
            if roster.current().is_none() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Err("a stopped roster still answers".into())
    }
}
