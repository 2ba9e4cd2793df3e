//! In-process [`Coordination`]: the same contract as etcd within one process, for a single
//! node (which has no one to coordinate with) and for tests. Handles made by
//! [`MemoryCoordination::new_session`] share one store, as the nodes of a cluster share etcd.
//! The last [`HISTORY`] changes are kept for watches that start in the past.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::sync::{mpsc, watch};

use super::{
    end_session, CoordError, Coordination, Expect, SessionState, Versioned, Watch, WatchEvent,
    WATCH_BUFFER,
};

/// Changes kept for watches that start in the past.
pub const HISTORY: usize = 10_000;

#[derive(Debug)]
struct Entry {
    value: Vec<u8>,
    version: u64,
    /// The session owning an ephemeral key.
    session: Option<u64>,
}

#[derive(Debug, Default)]
struct Store {
    /// Invariant: the version of the last write; every entry's version is at most this.
    version: u64,
    next_session: u64,
    keys: BTreeMap<String, Entry>,
    /// Invariant: the last changes in version order, at most [`HISTORY`].
    history: VecDeque<WatchEvent>,
    watchers: Vec<(String, mpsc::Sender<WatchEvent>)>,
    /// Invariant: the state of every handle made on this store, by session id.
    sessions: std::collections::HashMap<u64, Arc<watch::Sender<SessionState>>>,
}

fn key_of(event: &WatchEvent) -> &str {
    match event {
        WatchEvent::Put { key, .. } | WatchEvent::Delete { key, .. } => key,
    }
}

fn version_of(event: &WatchEvent) -> u64 {
    match event {
        WatchEvent::Put { version, .. } | WatchEvent::Delete { version, .. } => *version,
    }
}

impl Store {
    fn record(&mut self, event: WatchEvent) {
        // A watcher that is gone or too slow is dropped: its reader sees the end and lists
        // again.
        self.watchers.retain(|(prefix, tx)| {
            !key_of(&event).starts_with(prefix.as_str()) || tx.try_send(event.clone()).is_ok()
        });
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(event);
    }

    fn check(&self, key: &str, expect: Expect) -> Result<(), CoordError> {
        let found = self.keys.get(key).map(|e| e.version);
        let holds = match expect {
            Expect::Any => true,
            Expect::Absent => found.is_none(),
            Expect::Version(v) => found == Some(v),
        };
        if holds {
            Ok(())
        } else {
            Err(CoordError::Conflict {
                key: key.to_string(),
                expected: expect,
                found,
            })
        }
    }

    /// Removes every ephemeral key of `session`.
    fn end(&mut self, session: u64) {
        let owned: Vec<String> = self
            .keys
            .iter()
            .filter(|(_, e)| e.session == Some(session))
            .map(|(k, _)| k.clone())
            .collect();
        for key in owned {
            self.remove(&key);
        }
    }

    fn remove(&mut self, key: &str) {
        if self.keys.remove(key).is_some() {
            self.version += 1;
            let event = WatchEvent::Delete {
                key: key.to_string(),
                version: self.version,
            };
            self.record(event);
        }
    }
}

/// One handle (one session) on an in-process coordination store.
#[derive(Debug)]
pub struct MemoryCoordination {
    /// Invariant: shared by every handle of the same store.
    store: Arc<Mutex<Store>>,
    session: u64,
    /// Invariant: `Live` until `close` (then `Closed`) or another handle ends this session
    /// (then `Lost`); never changes again after that. Registered in the store.
    state: Arc<watch::Sender<SessionState>>,
}

impl Default for MemoryCoordination {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryCoordination {
    /// A new, empty store and a first handle on it.
    pub fn new() -> Self {
        Self::on(Arc::new(Mutex::new(Store::default())))
    }

    fn on(store: Arc<Mutex<Store>>) -> Self {
        let state = Arc::new(watch::channel(SessionState::Live).0);
        let session = {
            let mut s = lock(&store);
            s.next_session += 1;
            let session = s.next_session;
            s.sessions.insert(session, state.clone());
            session
        };
        MemoryCoordination {
            store,
            session,
            state,
        }
    }

    /// Another handle, with a session of its own, on the same store.
    pub fn new_session(&self) -> Self {
        Self::on(self.store.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        lock(&self.store)
    }
}

fn lock(store: &Mutex<Store>) -> std::sync::MutexGuard<'_, Store> {
    // Every method checks first and mutates last, so a poisoned lock guards consistent data.
    store.lock().unwrap_or_else(|p| p.into_inner())
}

#[async_trait]
impl Coordination for MemoryCoordination {
    async fn get(&self, key: &str) -> Result<Option<Versioned>, CoordError> {
        Ok(self.lock().keys.get(key).map(|e| Versioned {
            value: e.value.clone(),
            version: e.version,
        }))
    }

    async fn list(&self, prefix: &str) -> Result<(Vec<(String, Versioned)>, u64), CoordError> {
        let s = self.lock();
        let items = s
            .keys
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, e)| {
                let v = Versioned {
                    value: e.value.clone(),
                    version: e.version,
                };
                (k.clone(), v)
            })
            .collect();
        Ok((items, s.version))
    }

    async fn put(
        &self,
        key: &str,
        value: &[u8],
        expect: Expect,
        ephemeral: bool,
    ) -> Result<u64, CoordError> {
        let state = *self.state.borrow();
        if ephemeral && state != SessionState::Live {
            return Err(CoordError::SessionEnded(state));
        }
        let mut s = self.lock();
        s.check(key, expect)?;
        s.version += 1;
        let version = s.version;
        let entry = Entry {
            value: value.to_vec(),
            version,
            session: ephemeral.then_some(self.session),
        };
        s.keys.insert(key.to_string(), entry);
        s.record(WatchEvent::Put {
            key: key.to_string(),
            value: value.to_vec(),
            version,
        });
        Ok(version)
    }

    async fn delete(&self, key: &str, expect: Expect) -> Result<bool, CoordError> {
        let mut s = self.lock();
        s.check(key, expect)?;
        let existed = s.keys.contains_key(key);
        s.remove(key);
        Ok(existed)
    }

    async fn watch(&self, prefix: &str, after: u64) -> Result<Watch, CoordError> {
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        let mut s = self.lock();
        let oldest_kept = s.history.front().map_or(s.version + 1, version_of);
        // Changes after `after` that fell out of the history cannot be replayed: end at once.
        if after + 1 < oldest_kept && after < s.version {
            return Ok(Watch::new(rx));
        }
        for event in s.history.iter().filter(|e| version_of(e) > after) {
            if key_of(event).starts_with(prefix) && tx.try_send(event.clone()).is_err() {
                return Ok(Watch::new(rx));
            }
        }
        s.watchers.push((prefix.to_string(), tx));
        Ok(Watch::new(rx))
    }

    fn session(&self) -> watch::Receiver<SessionState> {
        self.state.subscribe()
    }

    async fn close(&self) -> Result<(), CoordError> {
        end_session(&self.state, SessionState::Closed);
        self.lock().end(self.session);
        Ok(())
    }

    async fn end_session_of(&self, key: &str, expect: Expect) -> Result<bool, CoordError> {
        let mut s = self.lock();
        s.check(key, expect)?;
        let Some(session) = s.keys.get(key).and_then(|e| e.session) else {
            return Ok(false);
        };
        if let Some(state) = s.sessions.get(&session) {
            end_session(state, SessionState::Lost);
        }
        s.end(session);
        Ok(true)
    }
}
