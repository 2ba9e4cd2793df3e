//! A watch-fed copy of a prefix of the coordination store (each key's decoded value with its
//! version), so that work that looks at every entry often reads memory instead of listing the
//! store each time. [`crate::cluster::membership::Membership`] keeps one of the registrations
//! (`nodes/…`): placement on every lookup, ensemble choice, bookie addresses and the failure
//! detector read it.
//!
//! Invariants:
//! - [`Roster::current`] is `None` until the first listing, and again from the moment a watch
//!   ends until the next listing succeeds: a reader then lists the store itself.
//! - While `Some`, the copy is the listing plus every watch event after it, in order (the
//!   coordination contract: nothing missed, nothing twice). An entry that cannot be decoded
//!   ends the copy, as it fails a listing. It is as fresh as the watch: on
//!   etcd, watches require a leader, so a member cut off from its leader ends them; a dead
//!   connection is found by the client's keep-alive (about 15 s).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::coord::{Watch, WatchEvent};

/// How long the roster waits before listing again after a failed listing.
const RELIST_PAUSE: Duration = Duration::from_millis(500);

/// A listing (key, decoded value, version) and a watch of every later change.
pub type Listing<R> = (Vec<(String, R, u64)>, Watch);

/// The entries as the last watch event left them.
#[derive(Debug)]
pub struct Roster<R> {
    /// By key: the value and its version. Invariant: above.
    current: Mutex<Option<BTreeMap<String, (R, u64)>>>,
    /// Turns after every change of `current` (made before the turn, so a subscriber woken by
    /// it reads the change).
    generation: tokio::sync::watch::Sender<u64>,
}

impl<R: Clone + Send + 'static> Roster<R> {
    /// A roster following what `list_and_watch` lists and watches until `stop`; `decode` reads
    /// a watched value (an unreadable one ends the copy until a listing succeeds).
    pub fn start<F, Fut, E>(
        list_and_watch: F,
        decode: fn(&[u8]) -> Result<R, E>,
        stop: CancellationToken,
    ) -> Arc<Self>
    where
        F: Fn() -> Fut + Send + 'static,
        Fut: Future<Output = Result<Listing<R>, E>> + Send,
        E: std::fmt::Display + Send + 'static,
    {
        let roster = Arc::new(Roster {
            current: Mutex::new(None),
            generation: tokio::sync::watch::Sender::new(0),
        });
        let r = roster.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = r.follow(list_and_watch, decode) => {}
            }
            r.set(None);
        });
        roster
    }

    /// Every entry with its version in key order, `None` while the roster does not follow the
    /// store (a caller lists the store itself).
    pub fn current(&self) -> Option<Vec<(R, u64)>> {
        let current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        current.as_ref().map(|m| m.values().cloned().collect())
    }

    /// Whether the copy follows the store now ([`Self::current`] is `Some`), without copying it.
    pub fn is_following(&self) -> bool {
        self.current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// Wakes after each change of the copy (a listing, a watch event, the watch's end).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generation.subscribe()
    }

    fn set(&self, to: Option<BTreeMap<String, (R, u64)>>) {
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = to;
        self.generation.send_modify(|g| *g += 1);
    }

    async fn follow<F, Fut, E>(&self, list_and_watch: F, decode: fn(&[u8]) -> Result<R, E>)
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<Listing<R>, E>>,
        E: std::fmt::Display,
    {
        loop {
            let (listed, mut watch) = match list_and_watch().await {
                Ok(w) => w,
                Err(e) => {
                    tracing::debug!(error = %e, "listing for the roster failed; again soon");
                    tokio::time::sleep(RELIST_PAUSE).await;
                    continue;
                }
            };
            let mut copy: BTreeMap<String, (R, u64)> = listed
                .into_iter()
                .map(|(key, value, version)| (key, (value, version)))
                .collect();
            self.set(Some(copy.clone()));
            let watched = std::time::Instant::now();
            while let Some(event) = watch.next().await {
                match event {
                    WatchEvent::Put {
                        key,
                        value,
                        version,
                    } => match decode(&value) {
                        Ok(value) => drop(copy.insert(key, (value, version))),
                        Err(e) => {
                            // As a listing would: no copy, rather than one without the entry
                            // (readers list, and fail, until it is readable).
                            tracing::warn!(%key, error = %e, "an unreadable entry; relisting");
                            break;
                        }
                    },
                    WatchEvent::Delete { key, .. } => drop(copy.remove(&key)),
                }
                self.set(Some(copy.clone()));
            }
            // The watch ended (or brought an unreadable entry): nothing may rely on the copy
            // until the store is listed again (after a pause when it ended at once, so a
            // failing watch does not spin).
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
    use crate::coord::memory::MemoryCoordination;
    use crate::coord::{Coordination, Expect};

    fn text(bytes: &[u8]) -> Result<String, String> {
        String::from_utf8(bytes.to_vec()).map_err(|e| e.to_string())
    }

    /// Waits (up to 2 s) until `roster` holds `want`.
    async fn settled(roster: &Roster<String>, want: &[(&str, u64)]) -> Result<(), String> {
        let want: Vec<(String, u64)> = want.iter().map(|(v, n)| (v.to_string(), *n)).collect();
        for _ in 0..200 {
            if roster.current().as_ref() == Some(&want) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Err(format!("roster {:?}, wanted {want:?}", roster.current()))
    }

    #[tokio::test]
    async fn a_roster_is_the_listing_plus_every_change_until_stopped(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let coord = Arc::new(MemoryCoordination::new());
        let one = coord.put("p/a", b"one", Expect::Absent, false).await?;
        coord
            .put("q/x", b"elsewhere", Expect::Absent, false)
            .await?;
        let c = coord.clone();
        let list_and_watch = move || {
            let c = c.clone();
            async move {
                let (items, at) = c.list("p/").await.map_err(|e| e.to_string())?;
                let listed = items
                    .into_iter()
                    .map(|(k, v)| Ok((k, text(&v.value)?, v.version)))
                    .collect::<Result<Vec<_>, String>>()?;
                let watch = c.watch("p/", at).await.map_err(|e| e.to_string())?;
                Ok::<_, String>((listed, watch))
            }
        };
        let stop = CancellationToken::new();
        let roster = Roster::start(list_and_watch, text, stop.clone());
        settled(&roster, &[("one", one)]).await?;
        let mut changes = roster.subscribe();
        changes.mark_unchanged();
        let b = coord.put("p/b", b"two", Expect::Absent, false).await?;
        // A subscriber woken by the change reads it.
        tokio::time::timeout(Duration::from_secs(2), changes.changed()).await??;
        assert_eq!(roster.current().map(|c| c.len()), Some(2));
        settled(&roster, &[("one", one), ("two", b)]).await?;
        let a = coord.put("p/a", b"one again", Expect::Any, false).await?;
        settled(&roster, &[("one again", a), ("two", b)]).await?;
        // An unreadable value ends the copy, as it fails a listing, until it is readable again.
        coord.put("p/a", &[0xff], Expect::Any, false).await?;
        gone(&roster).await?;
        let a = coord.put("p/a", b"one", Expect::Any, false).await?;
        settled(&roster, &[("one", a), ("two", b)]).await?;
        // A deleted key leaves it.
        assert!(coord.delete("p/b", Expect::Any).await?);
        settled(&roster, &[("one", a)]).await?;
        stop.cancel();
        Ok(gone(&roster).await?)
    }

    /// Waits (up to 2 s) until `roster` answers `None`.
    async fn gone(roster: &Roster<String>) -> Result<(), String> {
        for _ in 0..200 {
            if roster.current().is_none() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Err(format!("the roster still answers {:?}", roster.current()))
    }
}
