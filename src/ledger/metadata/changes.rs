//! Change feeds of policies blobs ([`super::MetadataStore::policy_changes`]): how the caches
//! of one process learn that another process sharing the store (a node of a cluster) changed
//! a namespace's policies, a tenant or a grant.
//!
//! Invariants (the contract every store with a feed passes, see `conformance`):
//! - Every write of a scope made after the feed was returned, through any handle on the
//!   store, is reported as a [`PolicyChange`] naming its scope, in the order the store
//!   applied them. Extra reports are allowed (a reader's own writes come back too).
//! - A feed never skips a change silently: when it cannot go on (its watch failed or was
//!   compacted away; in process, the reader fell [`FEED_BUFFER`] reports behind) it ends, and
//!   the reader drops everything it cached and asks for a new feed.

use tokio::sync::mpsc;

/// Reports a feed buffers for a slow reader (in process: before the feed ends; on etcd: before
/// the watch waits for the reader).
pub const FEED_BUFFER: usize = 1024;

/// One report of a feed: the blob stored under `scope` was written or removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyChange {
    /// The scope written (e.g. `namespace:public/default`).
    pub scope: String,
}

/// A stream of [`PolicyChange`]s; see the module docs for what it promises.
#[derive(Debug)]
pub struct PolicyChanges {
    /// Invariant: reports arrive in the store's order, without gaps, until the sender is
    /// dropped.
    reports: mpsc::Receiver<PolicyChange>,
}

impl PolicyChanges {
    /// A feed and the sender that fills it.
    pub(crate) fn channel() -> (mpsc::Sender<PolicyChange>, PolicyChanges) {
        let (tx, reports) = mpsc::channel(FEED_BUFFER);
        (tx, PolicyChanges { reports })
    }

    /// The next report; `None` once the feed ended (drop what was cached, ask for a new feed).
    pub async fn next(&mut self) -> Option<PolicyChange> {
        self.reports.recv().await
    }

    /// A report already waiting, without waiting for one; `Err(true)` once the feed ended.
    pub fn try_next(&mut self) -> Result<PolicyChange, bool> {
        self.reports.try_recv().map_err(|e| match e {
            mpsc::error::TryRecvError::Empty => false,
            mpsc::error::TryRecvError::Disconnected => true,
        })
    }
}

/// The feeds of an in-process store: each write is offered to every live feed; a feed whose
/// reader fell [`FEED_BUFFER`] reports behind is ended (so it never skips one silently).
#[derive(Debug, Default)]
pub(crate) struct Feeds(Vec<mpsc::Sender<PolicyChange>>);

impl Feeds {
    /// A new feed of every later write.
    pub(crate) fn open(&mut self) -> PolicyChanges {
        let (tx, feed) = PolicyChanges::channel();
        self.0.push(tx);
        feed
    }

    /// Reports a write of `scope` to every feed; drops the feeds that ended or fell behind.
    pub(crate) fn changed(&mut self, scope: &str) {
        self.0.retain(|tx| {
            tx.try_send(PolicyChange {
                scope: scope.to_string(),
            })
            .is_ok()
        });
    }
}
