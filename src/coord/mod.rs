//! The coordination seam: what the nodes of a cluster agree on through an external consensus
//! engine (etcd, as Pulsar uses ZooKeeper or etcd). ledgerlake never runs a consensus protocol
//! of its own; membership, ownership and fencing are built on these few primitives.
//!
//! # Contract (every implementation passes `conformance`)
//! - **Versions.** Every write gets a version from one counter of the whole store, strictly
//!   increasing across all keys (etcd: the revision). A key's version is the version of its last
//!   write. [`Coordination::list`] returns the store version it read at, which is at least the
//!   version of every key it returned.
//! - **Compare-and-set.** [`Coordination::put`] and [`Coordination::delete`] apply only when
//!   their [`Expect`] holds at the moment of the write; otherwise they fail with
//!   [`CoordError::Conflict`] and change nothing. Of concurrent writers expecting the same
//!   version, exactly one wins.
//! - **Sessions.** Each handle has one session (etcd: a lease kept alive by the handle). Keys
//!   written as ephemeral belong to it and disappear for every reader when it ends: at once on
//!   [`Coordination::close`], and within its time-to-live when the handle stops renewing it
//!   (a crash, a partition). [`Coordination::session`] turns [`SessionState::Lost`] *before*
//!   the time-to-live can have run out on the server, so a node that cannot renew stops acting
//!   on what its ephemeral keys claim before anyone else may claim it.
//! - **Watches.** [`Coordination::watch`] delivers, in version order, every change under a
//!   prefix with a version above the one given (so `list` then `watch(list's version)` misses
//!   nothing and repeats nothing). When the store can no longer deliver the changes in order
//!   (history compacted, connection lost, a reader too slow), the watch ends: [`Watch::next`]
//!   returns `None` and the reader lists again.
//! - **Ending another session.** [`Coordination::end_session_of`] ends the session owning an
//!   ephemeral key at once, as if its time-to-live had run out: all its ephemeral keys go for
//!   every reader, and that session turns [`SessionState::Lost`] no later than its next
//!   renewal (etcd: a third of its time-to-live). This reverses the usual order (lost before
//!   the keys go) on purpose: it is for a session whose process is known to be gone, and what
//!   its keys claimed must be fenced by other means (epochs, ledger fencing) should it not be.
//!
//! Keys are `/`-separated paths relative to the root a handle was made with.

use std::fmt;

use async_trait::async_trait;
use tokio::sync::{mpsc, watch};

pub mod etcd;
pub mod memory;

#[cfg(test)]
mod conformance;
#[cfg(test)]
pub(crate) mod test_etcd;

/// A value with the version of its last write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned {
    /// The stored bytes.
    pub value: Vec<u8>,
    /// Version of the last write (never 0).
    pub version: u64,
}

/// The precondition of a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Write whatever is there.
    Any,
    /// The key must not exist.
    Absent,
    /// The key must exist with exactly this version.
    Version(u64),
}

/// One change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// `key` was written.
    Put {
        /// Key, relative to the handle's root.
        key: String,
        /// New value.
        value: Vec<u8>,
        /// Version of this write.
        version: u64,
    },
    /// `key` was deleted (or its session ended).
    Delete {
        /// Key, relative to the handle's root.
        key: String,
        /// Version of the deletion.
        version: u64,
    },
}

/// State of a handle's session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionState {
    /// Renewed in time: ephemeral keys of this session stand.
    Live,
    /// Not renewed in time: its ephemeral keys are gone or about to go. Never live again.
    Lost,
    /// Ended by [`Coordination::close`].
    Closed,
}

/// Ends a live session in state `to` (`Lost` or `Closed`); a session that already ended keeps
/// its state (the contract: never changes again).
pub(crate) fn end_session(state: &watch::Sender<SessionState>, to: SessionState) {
    state.send_if_modified(|s| {
        let live = *s == SessionState::Live;
        if live {
            *s = to;
        }
        live
    });
}

/// Errors of the coordination store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CoordError {
    /// The precondition of a write did not hold.
    #[error("{key}: expected {expected:?}, found version {found:?}")]
    Conflict {
        /// Key written.
        key: String,
        /// The precondition.
        expected: Expect,
        /// The version found (`None`: absent).
        found: Option<u64>,
    },
    /// An ephemeral write after the session ended.
    #[error("the coordination session is {0:?}")]
    SessionEnded(SessionState),
    /// The backend failed.
    #[error("coordination {op} failed: {source}")]
    Backend {
        /// Operation name.
        op: &'static str,
        /// Backend error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Changes a watch buffers for a slow reader before it ends the watch.
pub const WATCH_BUFFER: usize = 4096;

/// A stream of changes under one prefix.
#[derive(Debug)]
pub struct Watch {
    /// Invariant: events arrive in version order, without gaps, until the sender is dropped.
    events: mpsc::Receiver<WatchEvent>,
}

impl Watch {
    /// A watch fed by `events`.
    pub(crate) fn new(events: mpsc::Receiver<WatchEvent>) -> Self {
        Watch { events }
    }

    /// The next change; `None` once the watch ended (list again to go on).
    pub async fn next(&mut self) -> Option<WatchEvent> {
        self.events.recv().await
    }
}

/// The coordination seam. See the module docs for the contract.
#[async_trait]
pub trait Coordination: Send + Sync + fmt::Debug + 'static {
    /// One key.
    async fn get(&self, key: &str) -> Result<Option<Versioned>, CoordError>;

    /// Every key starting with `prefix`, ascending, with the store version read at.
    async fn list(&self, prefix: &str) -> Result<(Vec<(String, Versioned)>, u64), CoordError>;

    /// Writes `value` under `key` if `expect` holds; the new version. An `ephemeral` key
    /// belongs to this handle's session.
    async fn put(
        &self,
        key: &str,
        value: &[u8],
        expect: Expect,
        ephemeral: bool,
    ) -> Result<u64, CoordError>;

    /// Deletes `key` if `expect` holds; whether it existed.
    async fn delete(&self, key: &str, expect: Expect) -> Result<bool, CoordError>;

    /// Changes under `prefix` with a version above `after`.
    async fn watch(&self, prefix: &str, after: u64) -> Result<Watch, CoordError>;

    /// The session's state, as it changes.
    fn session(&self) -> watch::Receiver<SessionState>;

    /// Ends the session: its ephemeral keys disappear at once.
    async fn close(&self) -> Result<(), CoordError>;

    /// Ends the session owning the ephemeral key `key`, if `expect` holds for it (see the
    /// module docs); whether a session was ended (`false`: the key is absent or durable).
    async fn end_session_of(&self, key: &str, expect: Expect) -> Result<bool, CoordError>;

    /// Whether versions keep increasing across restarts of every process using the store (a
    /// shared server's revisions do; an in-process store starts again at 1). Only then can a
    /// version fence writers in a persistent store.
    fn versions_outlive_processes(&self) -> bool {
        false
    }
}
