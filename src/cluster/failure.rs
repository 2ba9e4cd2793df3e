//! Failure detection of peers: a node whose process is gone is noticed in about a second,
//! rather than when its session's lease runs out (`metadata.session_ttl`, 10 s by default).
//!
//! Every node probes each other registered node every `metadata.peer_probe_interval`: it opens
//! a TCP connection to the peer's bookie address and closes it. A refused connection says that
//! no process listens there (the kernel answered for a process that is gone); a timeout or an
//! unreachable network says nothing (a hung node, a partition) and is left to the lease.
//!
//! A prober's verdict that a peer is gone needs every address the peer advertises (bookie,
//! Pulsar) to refuse, in [`CONFIRMATIONS`] rounds [`CONFIRM_GAP`] apart. A verdict alone ends
//! nothing: a refusal can also come from a firewall rule (`REJECT`) on the prober's own path.
//! The prober records it ([`Membership::suspect`], an ephemeral key per prober), and the
//! session is ended ([`Membership::expel`]) only once a majority of the registered nodes
//! other than the peer hold the same verdict about the same registration. Its registration
//! and its topic ownerships then go at once, and its topics move exactly as when a lease
//! expires (lookups place them on live nodes, which fence and recover the open ledgers; idle
//! ones are taken over by `broker::orphans`). A prober withdraws its verdict when the peer
//! answers again.
//!
//! Invariants:
//! - Only a registration that is not draining is ever ended (a stopping node closes its
//!   listeners before it leaves, and hands its topics over itself).
//! - A registration is ended only at the version every probe of the verdict saw: a node that
//!   restarted and registered again meanwhile is never ended by a verdict about its
//!   predecessor.
//! - One node ends another's session only with a majority of the other nodes agreeing (in
//!   a cluster of two, the one other node is that majority).
//! - A wrong verdict (a live process refusing on both listeners to most nodes) ends its
//!   session while it still believes it live, until its next renewal (a third of the TTL):
//!   ledger fencing and ownership epochs stop its ledger writes, and the writer epoch stops
//!   its cursor and deduplication snapshot writes (`MetadataStore::save_cursor`).

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use crate::cluster::membership::{Membership, MembershipError, NodeRecord};

/// Rounds of refusals that make a verdict.
pub const CONFIRMATIONS: u32 = 2;
/// Time between the rounds of one verdict.
pub const CONFIRM_GAP: Duration = Duration::from_millis(150);
/// Longest wait for one connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// What one connection attempt showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// Something accepted the connection.
    Up,
    /// Refused: nothing listens there.
    Refused,
    /// No answer, or an error that proves nothing about the process.
    Unknown,
}

/// Opens and closes one connection to `addr`.
pub async fn probe(addr: &str) -> Probe {
    match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
        Ok(Ok(_)) => Probe::Up,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => Probe::Refused,
        Ok(Err(_)) | Err(_) => Probe::Unknown,
    }
}

/// The addresses of `node` that a process of it listens on, as this node reaches them (its
/// bookie by this node's listener name).
fn addresses(membership: &Membership, node: &NodeRecord) -> Vec<String> {
    let pulsar = node
        .broker_service_url
        .strip_prefix("pulsar://")
        .map(str::to_string);
    membership
        .bookie_address(node)
        .map(|b| b.addr)
        .into_iter()
        .chain(pulsar)
        .collect()
}

/// Whether every address of `node` refuses, in every round of a verdict.
async fn gone(membership: &Membership, node: &NodeRecord) -> bool {
    let addrs = addresses(membership, node);
    if addrs.is_empty() {
        return false;
    }
    for round in 0..CONFIRMATIONS {
        if round > 0 {
            tokio::time::sleep(CONFIRM_GAP).await;
        }
        for addr in &addrs {
            if probe(addr).await != Probe::Refused {
                return false;
            }
        }
    }
    true
}

/// Ends the sessions of peers whose processes are gone.
#[derive(Debug)]
pub struct PeerFailureDetector {
    membership: Arc<Membership>,
    /// Peers this node recorded a verdict about and has not withdrawn yet.
    suspected: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Invariant: non-zero (a zero interval is never started).
    interval: Duration,
}

impl PeerFailureDetector {
    /// A detector for this node's peers, probing every `interval`; `None` when `interval` is 0.
    pub fn new(membership: Arc<Membership>, interval: Duration) -> Option<Arc<Self>> {
        (!interval.is_zero()).then(|| {
            Arc::new(PeerFailureDetector {
                membership,
                suspected: Default::default(),
                interval,
            })
        })
    }

    /// Probes until `stop`.
    pub fn start(self: &Arc<Self>, stop: CancellationToken) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        // Each pass reads the registrations from the followed copy rather than the store.
        self.membership.follow(stop.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(me.interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                let pass = tokio::select! {
                    _ = stop.cancelled() => return,
                    p = me.pass() => p,
                };
                if let Err(e) = pass {
                    tracing::debug!(error = %e, "probing the peers failed; next tick");
                }
            }
        })
    }

    /// Probes every peer once, at the same time; the ids of those whose sessions were ended.
    pub async fn pass(&self) -> Result<Vec<String>, MembershipError> {
        let me = self.membership.me().id.clone();
        let peers = self.membership.registrations().await?;
        let verdicts =
            peers
                .into_iter()
                .filter(|(node, _)| node.id != me && !node.draining)
                .map(|(node, version)| async move {
                    (gone(&self.membership, &node).await, node, version)
                });
        let mut ended = Vec::new();
        for (gone, node, version) in futures::future::join_all(verdicts).await {
            match self.act(gone, &node, version).await {
                Ok(true) => ended.push(node.id),
                Ok(false) => {}
                Err(e) => tracing::warn!(node = %node.id, error = %e,
                    "acting on a peer's probe failed; next pass"),
            }
        }
        Ok(ended)
    }

    /// Records or withdraws this node's verdict about `node`; ends its session once a majority
    /// of the other nodes holds the verdict. Whether this call ended it.
    async fn act(
        &self,
        gone: bool,
        node: &NodeRecord,
        version: u64,
    ) -> Result<bool, MembershipError> {
        if !gone {
            if lock(&self.suspected).contains(&node.id) {
                // Forgotten only once withdrawn: a vote left standing would count later.
                self.membership.unsuspect(&node.id).await?;
                lock(&self.suspected).remove(&node.id);
            }
            return Ok(false);
        }
        lock(&self.suspected).insert(node.id.clone());
        if !self.membership.suspect(&node.id, version).await? {
            tracing::info!(node = %node.id, "peer refuses connections; waiting for the other nodes to agree");
            return Ok(false);
        }
        let ended = self.membership.expel(&node.id, version).await?;
        if ended {
            crate::metrics::node().peer_sessions_ended.inc();
            tracing::warn!(
                node = %node.id,
                addresses = ?addresses(&self.membership, node),
                "peer gone: its addresses refuse connections and most nodes agree; its session is ended and its topics move now"
            );
        }
        // The verdict is spent either way (the registration it named is gone).
        match self.membership.unsuspect(&node.id).await {
            Ok(()) => drop(lock(&self.suspected).remove(&node.id)),
            Err(e) => {
                tracing::debug!(node = %node.id, error = %e, "withdrawing a spent verdict failed; next pass")
            }
        }
        Ok(ended)
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::membership::tests::record;
    use crate::coord::memory::MemoryCoordination;
    use crate::coord::{Coordination, SessionState};

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    /// A loopback address nothing listens on.
    fn closed_addr() -> Result<String, std::io::Error> {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        Ok(l.local_addr()?.to_string())
    }

    fn node(id: &str, bookie: String, pulsar: String) -> NodeRecord {
        NodeRecord {
            bookie_addr: Some(bookie),
            broker_service_url: format!("pulsar://{pulsar}"),
            ..record(id)
        }
    }

    #[tokio::test]
    async fn a_peer_refusing_on_every_address_is_expelled_and_a_listening_one_is_not() -> TestResult
    {
        refusing_peer_is_expelled(false).await
    }

    /// The same with the registrations read from the followed copy, as a running node does.
    #[tokio::test]
    async fn the_same_on_the_followed_copy_of_the_registrations() -> TestResult {
        refusing_peer_is_expelled(true).await
    }

    /// Waits (up to 2 s) until `m` reads `n` registrations from its followed copy.
    async fn following(m: &Membership, n: usize) -> TestResult {
        for _ in 0..200 {
            if m.is_following() && m.nodes().await?.len() == n {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Err("the copy does not follow the registrations".into())
    }

    async fn refusing_peer_is_expelled(follow: bool) -> TestResult {
        let coord = MemoryCoordination::new();
        let gone_coord = coord.new_session();
        let mut gone_state = gone_coord.session();
        let up_coord: Arc<dyn Coordination> = Arc::new(coord.new_session());
        let half_coord: Arc<dyn Coordination> = Arc::new(coord.new_session());
        let listening = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let up_addr = listening.local_addr()?.to_string();
        let me = Arc::new(Membership::join(Arc::new(coord), record("me:1"), Duration::ZERO).await?);
        let gone = node("gone:2", closed_addr()?, closed_addr()?);
        let up = node("up:3", up_addr.clone(), up_addr.clone());
        // Its bookie refuses but its broker answers: a live process.
        let half = node("half:4", closed_addr()?, up_addr);
        Membership::join(Arc::new(gone_coord), gone, Duration::ZERO).await?;
        let up = Arc::new(Membership::join(up_coord, up, Duration::ZERO).await?);
        let _half = Membership::join(half_coord, half, Duration::ZERO).await?;

        let stop = CancellationToken::new();
        if follow {
            me.follow(stop.clone());
            up.follow(stop.clone());
            following(&me, 4).await?;
            following(&up, 4).await?;
        }
        let interval = Duration::from_millis(100);
        let detector = PeerFailureDetector::new(me.clone(), interval)
            .ok_or("a non-zero interval makes a detector")?;
        let second = PeerFailureDetector::new(up, interval).ok_or("a detector")?;
        // One verdict of three possible voters (me, up, half) is no majority.
        assert!(detector.pass().await?.is_empty());
        assert_eq!(*gone_state.borrow_and_update(), SessionState::Live);
        // A second one is.
        assert_eq!(second.pass().await?, vec!["gone:2".to_string()]);
        if follow {
            // The copy drops the expelled node a moment later.
            following(&me, 3).await?;
        }
        let ids: Vec<String> = me.nodes().await?.into_iter().map(|n| n.id).collect();
        assert_eq!(ids, vec!["half:4", "me:1", "up:3"]);
        assert_eq!(*gone_state.borrow_and_update(), SessionState::Lost);
        assert!(detector.pass().await?.is_empty(), "nothing more to end");
        stop.cancel();
        drop(listening);
        Ok(())
    }

    #[tokio::test]
    async fn draining_peers_and_newer_registrations_are_left_alone() -> TestResult {
        let coord = MemoryCoordination::new();
        let peer: Arc<dyn Coordination> = Arc::new(coord.new_session());
        let me = Arc::new(Membership::join(Arc::new(coord), record("me:1"), Duration::ZERO).await?);
        let stopping = node("peer:2", closed_addr()?, closed_addr()?);
        let peer = Membership::join(peer, stopping, Duration::ZERO).await?;
        peer.drain().await?;
        let detector = PeerFailureDetector::new(me.clone(), Duration::from_millis(100))
            .ok_or("a non-zero interval makes a detector")?;
        assert!(
            detector.pass().await?.is_empty(),
            "a draining node is not probed"
        );
        // A verdict about an older registration ends nothing.
        let (record, version) = me
            .registrations()
            .await?
            .into_iter()
            .find(|(n, _)| n.id == "peer:2")
            .ok_or("registered")?;
        assert!(!me.expel(&record.id, version - 1).await?);
        assert!(me.expel(&record.id, version).await?);
        assert!(PeerFailureDetector::new(me, Duration::ZERO).is_none());
        Ok(())
    }
}
