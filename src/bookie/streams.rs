//! Ordered add streams: how a replicated ledger's writer sends entries to one replica bookie.
//!
//! One stream (a task owning one connection) per replica bookie carries the adds of every
//! ledger this node writes there, in the order [`AddStreams::add`] was called, pipelined: a
//! frame goes out at once, and answers come back in order.
//!
//! Invariants:
//! - Every add's `done` is called exactly once: `Ok` only for an `Added` answer naming its
//!   ledger and entry, in order. A refusal about the add's own ledger (its copy fenced, or
//!   the entry not the next one: [`ledger_refusal`]) fails that ledger on that replica (its
//!   later adds there are refused too; its writer sends that replica nothing more, and puts
//!   another bookie in its place or rolls, ADR 0016)
//!   and the stream goes on, so the other ledgers it carries (a takeover's recovery adds
//!   beside a writer's adds) keep their replica. Anything else (the bookie unavailable or not
//!   listed as a replica, a malformed or late answer, a lost connection) fails it and every add
//!   behind it on the stream, and the stream ends.
//! - A stream that ended is replaced by a new one (new connection) on the next add; the
//!   replica refuses an add that is not the next entry of its copy, so a ledger whose earlier
//!   entry failed can never get a gap there.
//! - The payload bytes queued or in flight to one bookie stay under [`MAX_BEHIND`]: an add
//!   past it fails at once (its ledger then sends that replica nothing more and replaces it or
//!   rolls to a new ensemble, which leaves the bookie out for [`QUARANTINE`]), so a slow replica cannot make
//!   the writer hold an unbounded backlog for it while the ack quorum keeps producers going.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::sync::mpsc;

use super::dial::{Conn, Dialer};
use crate::cluster::membership::Membership;
use crate::ledger::{AddDone, ReplicaAdd};
use crate::protocol::bookie::{
    decode_response, encode_request, BookieErrorCode, BookieRequest, BookieResponse,
};

/// Longest wait for the oldest unanswered add (connecting included).
pub const ADD_TIMEOUT: Duration = Duration::from_secs(10);
/// Payload bytes queued or in flight to one bookie at most.
pub const MAX_BEHIND: u64 = 64 << 20;

type Queued = (ReplicaAdd, AddDone);

/// An add sent and not answered yet.
struct Inflight {
    id: u64,
    ledger: u64,
    entry: u64,
    at: tokio::time::Instant,
    done: AddDone,
}

/// The add streams of this node, one per replica bookie.
#[derive(Debug)]
pub struct AddStreams {
    membership: Arc<Membership>,
    /// Invariant: a sender here belongs to a running stream task (it removes itself on exit).
    streams: Mutex<HashMap<String, mpsc::UnboundedSender<Queued>>>,
    /// When each bookie's last stream failed: new ensembles avoid it for [`QUARANTINE`]
    /// (a bookie that just failed would otherwise roll every next ledger at once, until its
    /// node's session expires).
    failed: Mutex<HashMap<String, std::time::Instant>>,
    /// Payload bytes queued or in flight per bookie. Invariant: the sum of the payloads of
    /// the adds to that bookie whose `done` has not been called yet.
    behind: Mutex<HashMap<String, Arc<AtomicU64>>>,
    /// How this node connects to other bookies ([`super::dial`]).
    dialer: Dialer,
}

/// Why a stream ends when its node stops (not a failure of the bookie).
const STOPPING: &str = "the node is stopping";

/// How long a bookie whose stream failed is left out of new ensembles.
pub const QUARANTINE: Duration = Duration::from_secs(30);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl AddStreams {
    /// Streams resolving bookies through `membership`.
    pub fn new(membership: Arc<Membership>, dialer: Dialer) -> Arc<AddStreams> {
        Arc::new(AddStreams {
            membership,
            dialer,
            streams: Mutex::new(HashMap::new()),
            failed: Mutex::new(HashMap::new()),
            behind: Mutex::new(HashMap::new()),
        })
    }

    /// Queues `add` for `bookie` behind the adds queued before it.
    pub fn add(self: &Arc<Self>, bookie: &str, add: ReplicaAdd, done: AddDone) {
        let Some(done) = self.admit(bookie, &add, done) else {
            return;
        };
        let mut streams = lock(&self.streams);
        let mut queued = (add, done);
        if let Some(tx) = streams.get(bookie) {
            match tx.send(queued) {
                Ok(()) => return,
                Err(mpsc::error::SendError(back)) => queued = back,
            }
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = tx.send(queued);
        streams.insert(bookie.to_string(), tx.clone());
        let me = self.clone();
        let bookie = bookie.to_string();
        tokio::spawn(async move {
            let why = me.run(&bookie, rx).await;
            if why == STOPPING {
                return;
            }
            tracing::warn!(bookie, why, "a replica add stream ended");
            {
                let mut failed = lock(&me.failed);
                failed.retain(|_, at| at.elapsed() < QUARANTINE);
                failed.insert(bookie.clone(), std::time::Instant::now());
            }
            let mut streams = lock(&me.streams);
            if streams.get(&bookie).is_some_and(|t| t.same_channel(&tx)) {
                streams.remove(&bookie);
            }
        });
    }

    /// Counts `add` against `bookie`'s backlog, or fails it at once when that would pass
    /// [`MAX_BEHIND`]; the `done` to hand on, which uncounts it.
    fn admit(&self, bookie: &str, add: &ReplicaAdd, done: AddDone) -> Option<AddDone> {
        let len = add.payload.len() as u64;
        let behind = {
            let mut all = lock(&self.behind);
            match all.get(bookie) {
                Some(b) => b.clone(),
                None => all.entry(bookie.to_string()).or_default().clone(),
            }
        };
        let before = behind.fetch_add(len, Ordering::SeqCst);
        if before > 0 && before + len > MAX_BEHIND {
            behind.fetch_sub(len, Ordering::SeqCst);
            lock(&self.failed).insert(bookie.to_string(), std::time::Instant::now());
            done(Err(format!(
                "bookie {bookie} is {before} bytes behind (more than {MAX_BEHIND}): too slow for \
                 this ledger"
            )));
            return None;
        }
        Some(Box::new(move |outcome| {
            behind.fetch_sub(len, Ordering::SeqCst);
            done(outcome);
        }))
    }

    /// Whether `bookie`'s stream failed within the last [`QUARANTINE`].
    pub fn quarantined(&self, bookie: &str) -> bool {
        lock(&self.failed)
            .get(bookie)
            .is_some_and(|at| at.elapsed() < QUARANTINE)
    }

    /// Runs one stream until it fails; fails what it holds and what is queued; returns why.
    async fn run(&self, bookie: &str, mut rx: mpsc::UnboundedReceiver<Queued>) -> String {
        let mut inflight: VecDeque<Inflight> = VecDeque::new();
        let why = match self.connect(bookie).await {
            Ok(conn) => stream(conn, &mut rx, &mut inflight).await,
            Err(why) => why,
        };
        rx.close();
        for sent in inflight.drain(..) {
            (sent.done)(Err(why.clone()));
        }
        while let Ok((_, done)) = rx.try_recv() {
            done(Err(why.clone()));
        }
        why
    }

    async fn connect(&self, bookie: &str) -> Result<Conn, String> {
        let addr = tokio::time::timeout(ADD_TIMEOUT, self.membership.find_bookie(bookie))
            .await
            .map_err(|_| "listing the members timed out".to_string())?
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("bookie {bookie} is not a live member with a bookie address"))?;
        self.dialer
            .dial(&addr, ADD_TIMEOUT)
            .await
            .map_err(|e| e.to_string())
    }
}

/// Sends queued adds and matches answers until something fails; returns why.
async fn stream(
    mut conn: Conn,
    rx: &mut mpsc::UnboundedReceiver<Queued>,
    inflight: &mut VecDeque<Inflight>,
) -> String {
    let mut next_id = 1u64;
    loop {
        // The oldest unanswered add bounds the wait.
        let deadline = tokio::time::sleep_until(
            inflight
                .front()
                .map_or_else(tokio::time::Instant::now, |s| s.at)
                + ADD_TIMEOUT,
        );
        tokio::select! {
            queued = rx.recv() => {
                let Some((add, done)) = queued else { return STOPPING.into() };
                let (ledger, entry) = (add.ledger, add.entry);
                let req = BookieRequest::AddEntry {
                    topic: add.topic.to_string(),
                    ledger,
                    entry,
                    publish_time_ms: add.publish_time_ms,
                    payload: add.payload,
                    recovery: add.recovery,
                };
                let oldest = inflight.front().map_or_else(tokio::time::Instant::now, |s| s.at);
                inflight.push_back(Inflight {
                    id: next_id,
                    ledger,
                    entry,
                    at: tokio::time::Instant::now(),
                    done,
                });
                // A bookie that stops reading must not hold the stream past the deadline.
                match tokio::time::timeout_at(oldest + ADD_TIMEOUT, conn.send(encode_request(next_id, &req))).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return format!("sending: {e}"),
                    Err(_) => return format!("sending: no progress within {ADD_TIMEOUT:?}"),
                }
                next_id += 1;
            }
            frame = conn.next(), if !inflight.is_empty() => {
                let frame = match frame {
                    None => return "connection closed".into(),
                    Some(Err(e)) => return format!("reading: {e}"),
                    Some(Ok(f)) => f.freeze(),
                };
                let Some(Inflight { id, ledger, entry, done, .. }) = inflight.pop_front() else {
                    return "an answer nobody asked for".into();
                };
                match decode_response(frame) {
                    Ok((got, BookieResponse::Added { ledger: l, entry: e }))
                        if got == id && l == ledger && e == entry => done(Ok(())),
                    Ok((got, BookieResponse::Error { code, message, .. })) if got == id => {
                        let why = format!("refused entry {ledger}:{entry}: {message}");
                        done(Err(why.clone()));
                        if !ledger_refusal(code) {
                            return why;
                        }
                    }
                    Ok(_) => {
                        done(Err("unexpected answer".into()));
                        return format!("unexpected answer to entry {ledger}:{entry}");
                    }
                    Err(e) => {
                        done(Err(e.to_string()));
                        return e.to_string();
                    }
                }
            }
            _ = deadline, if !inflight.is_empty() => {
                return format!("no answer within {ADD_TIMEOUT:?}");
            }
        }
    }
}

/// Whether a bookie's refusal of an add is about that add's ledger alone (its copy is fenced,
/// or the entry is not the next one), not about the bookie or the connection. `NotHeld` (the
/// store does not list the bookie for an open ledger) is not: a writer records the ensemble
/// before its first add, so a bookie saying it of every ledger is wrong itself (another
/// store), and is left out of new ensembles like a failed one.
fn ledger_refusal(code: BookieErrorCode) -> bool {
    code == BookieErrorCode::BadRequest
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::membership::{tests::record, NodeRecord};
    use crate::coord::memory::MemoryCoordination;
    use crate::coord::Coordination;

    /// A replica that accepts the connection and never reads: the writer's backlog for it
    /// stops at `MAX_BEHIND`, and the bookie is left out of new ensembles.
    #[tokio::test]
    async fn a_replica_that_falls_behind_fails_its_adds_instead_of_holding_them(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let held = tokio::spawn(async move { listener.accept().await.map(|(s, _)| s) });
        let coord = MemoryCoordination::new();
        let slow_session: Arc<dyn Coordination> = Arc::new(coord.new_session());
        let slow = NodeRecord {
            bookie: "slow".into(),
            bookie_addr: Some(addr),
            ..record("slow:1")
        };
        let _slow = Membership::join(slow_session, slow, Duration::ZERO).await?;
        let me = Arc::new(Membership::join(Arc::new(coord), record("me:1"), Duration::ZERO).await?);
        let streams = AddStreams::new(me, Dialer::default());
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mib = bytes::Bytes::from(vec![7u8; 1 << 20]);
        let n = (MAX_BEHIND >> 20) + 8;
        for entry in 0..n {
            let add = ReplicaAdd {
                topic: Arc::from("persistent://t/n/slow"),
                ledger: 1,
                entry,
                publish_time_ms: 0,
                payload: mib.clone(),
                recovery: false,
            };
            let tx = tx.clone();
            streams.add("slow", add, Box::new(move |r| drop(tx.send((entry, r)))));
        }
        // The adds past the limit failed at once, each saying why; none before it did.
        let mut failed = Vec::new();
        while let Ok((entry, outcome)) = rx.try_recv() {
            let why = outcome
                .err()
                .ok_or("an add succeeded on a replica that never answers")?;
            assert!(why.contains("behind"), "{why}");
            failed.push(entry);
        }
        let first = MAX_BEHIND >> 20;
        assert_eq!(failed, (first..n).collect::<Vec<_>>());
        assert!(streams.quarantined("slow"));
        held.abort();
        Ok(())
    }

    /// A refusal about one ledger (its copy fenced) fails that add alone: the other ledger's
    /// adds on the same stream go through, and the bookie is not left out of new ensembles.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_ledger_refused_by_a_replica_costs_the_other_ledgers_nothing(
    ) -> Result<(), Box<dyn std::error::Error>> {
        use crate::ledger::metadata::memory::MemoryMetadataStore;
        use crate::ledger::metadata::Placement;
        use crate::ledger::MetadataStore;
        let dir = tempfile::tempdir()?;
        let meta: Arc<dyn MetadataStore> = Arc::new(MemoryMetadataStore::new());
        let log =
            Arc::new(crate::ledger::Log::open(dir.path(), Default::default(), meta.clone()).await?);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let stop = tokio_util::sync::CancellationToken::new();
        super::super::serve(listener, log.clone(), None, None, stop.clone());
        let replicas = vec![log.bookie_id().to_string()];
        let placement = Placement {
            bookie: "me",
            replicas: &replicas,
            ack_quorum: 2,
            write_quorum: 2,
            stripe_width: 0,
        };
        let topic = meta.get_or_create_topic("persistent://t/n/two", 0).await?;
        let fenced = meta
            .create_ledger_placed(topic.id, 0, placement, 0, None)
            .await?
            .id;
        let going = meta
            .create_ledger_placed(topic.id, 0, placement, 0, None)
            .await?
            .id;
        log.replica_fence(fenced).await?;

        let coord = MemoryCoordination::new();
        let replica = NodeRecord {
            bookie: log.bookie_id().to_string(),
            bookie_addr: Some(addr),
            ..record("replica:1")
        };
        let session: Arc<dyn Coordination> = Arc::new(coord.new_session());
        let _replica = Membership::join(session, replica, Duration::ZERO).await?;
        let me = Arc::new(Membership::join(Arc::new(coord), record("me:1"), Duration::ZERO).await?);
        let streams = AddStreams::new(me, Dialer::default());
        let (tx, mut rx) = mpsc::unbounded_channel();
        for (ledger, entry) in [(going, 0), (fenced, 0), (going, 1), (going, 2)] {
            let add = ReplicaAdd {
                topic: Arc::from("persistent://t/n/two"),
                ledger,
                entry,
                publish_time_ms: 0,
                payload: bytes::Bytes::from_static(b"e"),
                recovery: false,
            };
            let tx = tx.clone();
            let done = Box::new(move |r: Result<(), String>| {
                let _ = tx.send((ledger, entry, r.is_ok()));
            });
            streams.add(log.bookie_id(), add, done);
        }
        let mut outcomes = Vec::new();
        for _ in 0..4 {
            let got = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await?;
            outcomes.push(got.ok_or("every add is answered")?);
        }
        assert_eq!(
            outcomes,
            vec![
                (going, 0, true),
                (fenced, 0, false),
                (going, 1, true),
                (going, 2, true)
            ]
        );
        assert!(!streams.quarantined(log.bookie_id()));
        stop.cancel();
        log.shutdown().await?;
        Ok(())
    }
}
