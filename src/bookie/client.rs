//! The client side of the bookie protocol: reads ledgers other nodes' bookies hold, for this
//! node's log ([`ReplicaSource`]).
//!
//! A bookie id is resolved to the bookie address its node advertises in its membership record
//! (read from the membership's followed copy of the registrations, [`Membership::follow`]).
//! Connections are pooled per address; a request takes one (or dials), and puts it back only
//! after a complete, well-formed answer with the request's id.
//!
//! Invariant: an answer that fails to decode, carries another request id or does not arrive
//! within [`REQUEST_TIMEOUT`] is never used, and its connection is dropped.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};

use crate::cluster::membership::{BookieAddr, Membership, NodeRecord};
use crate::ledger::metadata::SealInfo;
use crate::ledger::{
    AddDone, Confirmed, Entry, FencedCopy, LedgerId, Position, ReadError, ReplicaAdd, ReplicaSource,
};
use crate::protocol::bookie::{
    decode_response, encode_request, BookieErrorCode, BookieRequest, BookieResponse, READ_BUDGET,
};

/// Longest wait for one answer (connecting included).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle connections kept per bookie.
const IDLE_PER_BOOKIE: usize = 4;

use super::dial::{Conn, Dialer};

/// Why a call to a bookie failed (mapped to [`ReadError`] in [`BookieClient::failed`]).
#[derive(Debug, thiserror::Error)]
enum CallError {
    #[error("bookie {0} is not a live member or advertises no bookie address")]
    Unknown(String),
    #[error("bookie at {addr}: {why}")]
    Transport { addr: String, why: String },
}

/// Reads other bookies' ledgers.
#[derive(Debug)]
pub struct BookieClient {
    membership: Arc<Membership>,
    /// By dial address. Invariant: every connection here answered its last request completely.
    idle: Mutex<HashMap<BookieAddr, Vec<Conn>>>,
    next_id: AtomicU64,
    /// The ordered add streams to replica bookies.
    streams: Arc<super::streams::AddStreams>,
    /// Turns with every ensemble chosen, so new ledgers spread over the bookies.
    spread: AtomicU64,
    /// How this node connects to other bookies ([`super::dial`]).
    dialer: Dialer,
    /// When peers were last reported left out of ensembles because this node cannot open
    /// their bookie (a warning at most once a minute).
    unreachable_warned: Mutex<Option<Instant>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl BookieClient {
    /// A client resolving bookies through `membership`, connecting to them with `dialer`.
    pub fn new(membership: Arc<Membership>, dialer: Dialer) -> BookieClient {
        BookieClient {
            streams: super::streams::AddStreams::new(membership.clone(), dialer.clone()),
            dialer,
            unreachable_warned: Mutex::new(None),
            spread: AtomicU64::new(0),
            membership,
            idle: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
        }
    }

    /// Says (once a minute) which peers new ledgers leave out: their replicas go to fewer
    /// bookies than the cluster has.
    fn warn_unreachable(&self, peers: &[NodeRecord]) {
        let mut last = lock(&self.unreachable_warned);
        if last.is_some_and(|at| at.elapsed() < Duration::from_secs(60)) {
            return;
        }
        *last = Some(Instant::now());
        let nodes: Vec<&str> = peers.iter().map(|p| p.id.as_str()).collect();
        tracing::warn!(
            ?nodes,
            "peers left out of new ledgers' ensembles: this node cannot open their bookie \
             listener (a plaintext one while server.bookie_tls is on, or a TLS one without \
             server.bookie_tls_trust_certs_file); ledgers are replicated to fewer bookies"
        );
    }

    async fn resolve(&self, bookie: &str) -> Result<BookieAddr, CallError> {
        self.membership
            .find_bookie(bookie)
            .await
            .map_err(|e| CallError::Transport {
                addr: "membership".into(),
                why: e.to_string(),
            })?
            .ok_or_else(|| CallError::Unknown(bookie.to_string()))
    }

    /// Sends `req` to `bookie` and waits for its answer; a pooled connection that fails is
    /// replaced by a fresh one once.
    async fn call(&self, bookie: &str, req: &BookieRequest) -> Result<BookieResponse, CallError> {
        let peer = self.resolve(bookie).await?;
        let pooled = lock(&self.idle).get_mut(&peer).and_then(Vec::pop);
        if let Some(conn) = pooled {
            if let Ok(resp) = self.exchange(conn, &peer, req).await {
                return Ok(resp);
            }
        }
        let conn = self
            .dialer
            .dial(&peer, REQUEST_TIMEOUT)
            .await
            .map_err(|e| transport(&peer.addr, &e.to_string()))?;
        self.exchange(conn, &peer, req).await
    }

    async fn exchange(
        &self,
        mut conn: Conn,
        peer: &BookieAddr,
        req: &BookieRequest,
    ) -> Result<BookieResponse, CallError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let addr = peer.addr.as_str();
        let round = async {
            conn.send(encode_request(id, req))
                .await
                .map_err(|e| transport(addr, &e.to_string()))?;
            let frame = conn
                .next()
                .await
                .ok_or_else(|| transport(addr, "connection closed"))?
                .map_err(|e| transport(addr, &e.to_string()))?;
            let (got, resp) =
                decode_response(frame.freeze()).map_err(|e| transport(addr, &e.to_string()))?;
            if got != id {
                return Err(transport(
                    addr,
                    &format!("answer to request {got}, not {id}"),
                ));
            }
            Ok(resp)
        };
        let resp = tokio::time::timeout(REQUEST_TIMEOUT, round)
            .await
            .map_err(|_| transport(addr, "no answer in time"))??;
        let mut idle = lock(&self.idle);
        let pool = idle.entry(peer.clone()).or_default();
        if pool.len() < IDLE_PER_BOOKIE {
            pool.push(conn);
        }
        Ok(resp)
    }

    /// The one mapping of bookie answers and call failures to the log's read errors.
    fn failed(bookie: &str, ledger: LedgerId, first: u64, why: Failure) -> ReadError {
        let remote = || ReadError::Remote {
            ledger,
            bookie: bookie.to_string(),
        };
        match why {
            Failure::Call(e) => {
                tracing::warn!(bookie, ledger, error = %e, "reading from another bookie failed");
                remote()
            }
            Failure::Refused {
                code: BookieErrorCode::NoSuchEntry,
                available,
                ..
            } => ReadError::NoSuchEntry {
                ledger,
                entry: first,
                available,
            },
            Failure::Refused {
                code: BookieErrorCode::Corrupt,
                message,
                ..
            } => ReadError::Corrupt {
                ledger,
                entry: first,
                path: PathBuf::from(format!("bookie {bookie}")),
                offset: 0,
                reason: message,
            },
            Failure::Refused { code, message, .. } => {
                tracing::warn!(
                    bookie,
                    ledger,
                    ?code,
                    message,
                    "another bookie refused a read"
                );
                remote()
            }
            Failure::Unexpected => {
                tracing::warn!(bookie, ledger, "another bookie answered the wrong kind");
                remote()
            }
        }
    }
}

/// Why a read from another bookie gave no data.
enum Failure {
    Call(CallError),
    Refused {
        code: BookieErrorCode,
        available: u64,
        message: String,
    },
    Unexpected,
}

impl From<BookieResponse> for Failure {
    fn from(resp: BookieResponse) -> Failure {
        match resp {
            BookieResponse::Error {
                code,
                available,
                message,
            } => Failure::Refused {
                code,
                available,
                message,
            },
            _ => Failure::Unexpected,
        }
    }
}

fn transport(addr: &str, why: &str) -> CallError {
    CallError::Transport {
        addr: addr.to_string(),
        why: why.to_string(),
    }
}

#[async_trait::async_trait]
impl ReplicaSource for BookieClient {
    async fn read(
        &self,
        bookie: &str,
        topic: &str,
        ledger: LedgerId,
        first: u64,
        last: u64,
    ) -> Result<Vec<Entry>, ReadError> {
        let req = BookieRequest::ReadEntries {
            topic: topic.to_string(),
            ledger,
            first,
            last,
            max_bytes: READ_BUDGET,
        };
        match self.call(bookie, &req).await {
            Ok(BookieResponse::Entries(entries)) => Ok(entries
                .into_iter()
                .map(|e| Entry {
                    position: Position::new(ledger, e.entry),
                    publish_time_ms: e.publish_time_ms,
                    payload: e.payload,
                })
                .collect()),
            Ok(other) => Err(Self::failed(bookie, ledger, first, other.into())),
            Err(e) => Err(Self::failed(bookie, ledger, first, Failure::Call(e))),
        }
    }

    async fn confirmed(
        &self,
        bookie: &str,
        topic: &str,
        ledger: LedgerId,
    ) -> Result<Confirmed, ReadError> {
        let req = BookieRequest::LastConfirmed {
            topic: topic.to_string(),
            ledger,
        };
        match self.call(bookie, &req).await {
            Ok(BookieResponse::LastConfirmed { count, open }) => Ok(Confirmed { count, open }),
            Ok(other) => Err(Self::failed(bookie, ledger, 0, other.into())),
            Err(e) => Err(Self::failed(bookie, ledger, 0, Failure::Call(e))),
        }
    }

    fn add(&self, bookie: &str, add: ReplicaAdd, done: AddDone) {
        self.streams.add(bookie, add, done);
    }

    async fn sealed(
        &self,
        bookie: &str,
        topic: &str,
        ledger: LedgerId,
        count: u64,
    ) -> Result<u64, ReadError> {
        let req = BookieRequest::Sealed {
            topic: topic.to_string(),
            ledger,
            count,
        };
        match self.call(bookie, &req).await {
            Ok(BookieResponse::LastConfirmed { count, .. }) => Ok(count),
            Ok(other) => Err(Self::failed(bookie, ledger, count, other.into())),
            Err(e) => Err(Self::failed(bookie, ledger, count, Failure::Call(e))),
        }
    }

    async fn fence(
        &self,
        bookie: &str,
        topic: &str,
        ledger: LedgerId,
    ) -> Result<FencedCopy, ReadError> {
        let req = BookieRequest::Fence {
            topic: topic.to_string(),
            ledger,
        };
        match self.call(bookie, &req).await {
            Ok(BookieResponse::Fenced(c)) => Ok(FencedCopy {
                first_segment: c.first_segment,
                seal: SealInfo {
                    entry_count: c.entry_count,
                    size_bytes: c.size_bytes,
                    min_publish_ms: c.min_publish_ms,
                    max_publish_ms: c.max_publish_ms,
                    last_segment: c.last_segment,
                    checksum: c.checksum,
                },
            }),
            Ok(other) => Err(Self::failed(bookie, ledger, 0, other.into())),
            Err(e) => Err(Self::failed(bookie, ledger, 0, Failure::Call(e))),
        }
    }

    async fn is_live(&self, bookie: &str) -> bool {
        match self.membership.nodes().await {
            Ok(nodes) => nodes.iter().any(|n| n.bookie == bookie),
            // Unknown: treated as live, so nothing is taken over on a failed listing.
            Err(_) => true,
        }
    }

    async fn choose(&self, except: &str, n: usize) -> Vec<String> {
        let nodes = match self.membership.nodes().await {
            Ok(nodes) => nodes,
            Err(e) => {
                tracing::warn!(error = %e, "listing the members for an ensemble failed");
                return Vec::new();
            }
        };
        // Only bookies this node can open (TLS peers need trusted authorities; a node whose
        // own listener speaks TLS dials no plaintext one).
        let reachable = |m: &NodeRecord| {
            let addr = self.membership.bookie_address(m);
            addr.is_some_and(|a| self.dialer.can_reach(&a))
        };
        let (candidates, unreachable): (Vec<NodeRecord>, Vec<NodeRecord>) = nodes
            .into_iter()
            .filter(|m| m.bookie != except && !m.draining && m.bookie_addr.is_some())
            .partition(reachable);
        if !unreachable.is_empty() {
            self.warn_unreachable(&unreachable);
        }
        let candidates: Vec<String> = candidates.into_iter().map(|m| m.bookie).collect();
        // Bookies whose stream failed lately are left out, unless no other is left (an
        // unreplicated ledger would be worse than trying one of them again).
        let mut bookies: Vec<String> = candidates
            .iter()
            .filter(|b| !self.streams.quarantined(b))
            .cloned()
            .collect();
        if bookies.is_empty() {
            bookies = candidates;
        }
        bookies.sort();
        bookies.dedup();
        if bookies.is_empty() {
            return bookies;
        }
        let start = (self.spread.fetch_add(1, Ordering::Relaxed) as usize) % bookies.len();
        bookies.rotate_left(start);
        bookies.truncate(n);
        bookies
    }
}
