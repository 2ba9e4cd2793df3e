//! The node-to-node bookie listener (`--bookie-addr`) and its client: how nodes read the
//! ledgers each other's bookies hold, over the protocol of [`crate::protocol::bookie`].
//!
//! - [`serve`]: answers reads of the ledgers this node's log holds ([`Log::serve_read`],
//!   [`Log::serve_confirmed`]); one task per connection, requests answered in order.
//! - [`client::BookieClient`]: the log's [`crate::ledger::ReplicaSource`], resolving a bookie
//!   id to the address its node advertises in its membership record.
//!
//! Invariants:
//! - A frame that fails to decode closes its connection and nothing else; the listener and the
//!   other connections go on. Request frames are capped at
//!   [`crate::protocol::bookie::MAX_REQUEST_FRAME`] before anything is reserved for them, and
//!   at most [`MAX_CONNECTIONS`] connections are served at once.
//! - The listener stops after the broker has handed its topics over at shutdown (new owners
//!   read the sealed ledgers here until this node exits).
//! - The listener serves only what the log has confirmed (see [`crate::ledger::replica`]).
//!
//! - Adds of replicated ledgers ([`Log::replica_add`]) are handed to the journal in the order
//!   they arrive on their connection and answered in that order once durable.
//!
//! - [`autorecovery`]: copies sealed ledgers that lost copies to other bookies until each has
//!   its write quorum again.
//!
//! - With authentication on ([`PeerCheck`]), a connection is served only after its first
//!   request, `Hello`, presented a token of a superuser role (ADR 0012); anything else first,
//!   or a refused token, is answered `Unauthorized` and the connection closed. Nodes dial
//!   with their `broker.authentication.node_token` ([`dial`]).
//!
//! - With `server.bookie_tls` the listener speaks TLS only (ADR 0013): each connection's
//!   handshake runs in its own task within [`crate::tls::HANDSHAKE_TIMEOUT`] before any frame
//!   is read, and the node's registration says so, so its peers dial it over TLS
//!   ([`dial::Dialer`]), checking its certificate against their trusted authorities.

use std::net::SocketAddr;
use std::sync::Arc;

use futures::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::codec::{FramedRead, FramedWrite};
use tokio_util::sync::CancellationToken;

use crate::ledger::{Confirmed, Entry, Log, ReadError, ReplicaAddError};
use crate::protocol::bookie::{
    codec, decode_request, encode_response, request_codec, BookieErrorCode, BookieRequest,
    BookieResponse, WireCopy, WireEntry, READ_BUDGET,
};

/// Connections served at once; more wait in the listen backlog.
pub const MAX_CONNECTIONS: usize = 256;
/// How long a connection to a bookie that requires credentials has to present them.
pub const HELLO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

pub mod autorecovery;
pub mod client;
pub mod dial;
pub mod streams;

/// Checks a connecting node's token: the superuser role it names, or why it is refused.
pub type PeerCheck = Arc<dyn Fn(&str) -> Result<String, String> + Send + Sync>;

/// The check of a listener whose clients authenticate through `access`: a token must name one
/// of `superusers`. `None` when authentication is off. A connection admitted stays admitted:
/// credentials that expire later are not asked for again (a node reconnects with its token).
pub fn peer_check(access: &crate::auth::Access, superusers: &[String]) -> Option<PeerCheck> {
    if !access.required() {
        return None;
    }
    let (access, superusers) = (access.clone(), superusers.to_vec());
    Some(Arc::new(move |token: &str| {
        let principal = access
            .authenticate_token(Some(token))
            .map_err(|e| e.to_string())?;
        if superusers.contains(&principal.role) {
            Ok(principal.role)
        } else {
            Err(format!(
                "role '{}' is not a superuser (broker.authentication.superuser_roles)",
                principal.role
            ))
        }
    }))
}

/// Serves the bookie protocol on `listener` until `stop` is cancelled; with `check`, only to
/// connections that authenticate first.
pub fn serve(
    listener: TcpListener,
    log: Arc<Log>,
    check: Option<PeerCheck>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    tokio::spawn(async move {
        loop {
            let permit = tokio::select! {
                _ = stop.cancelled() => return,
                p = slots.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => return,
                },
            };
            let accepted = tokio::select! {
                _ = stop.cancelled() => return,
                a = listener.accept() => a,
            };
            match accepted {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    let (log, check, stop) = (log.clone(), check.clone(), stop.clone());
                    let tls = tls.clone();
                    // One deadline from accept for the TLS handshake and the hello, so a
                    // connection that never authenticates holds its slot that long at most.
                    let admit_by = tokio::time::Instant::now() + HELLO_TIMEOUT;
                    tokio::spawn(async move {
                        if let Some(stream) = handshake(stream, peer, tls, admit_by).await {
                            connection(stream, peer, log, check, (stop, admit_by)).await;
                        }
                        drop(permit);
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a bookie connection failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    })
}

/// The connection's byte stream: TLS once its handshake completed by `admit_by` with the
/// bookie ALPN ([`dial::ALPN`]), or the TCP stream itself without `tls`. Failed handshakes
/// are logged at debug level only (probes, scanners and plaintext dialers would flood the log;
/// the dialling node reports its own failure).
async fn handshake(
    stream: TcpStream,
    peer: SocketAddr,
    tls: Option<tokio_rustls::TlsAcceptor>,
    admit_by: tokio::time::Instant,
) -> Option<Box<dyn dial::PeerIo>> {
    let Some(acceptor) = tls else {
        return Some(Box::new(stream));
    };
    match tokio::time::timeout_at(admit_by, acceptor.accept(stream)).await {
        Ok(Ok(tls)) if tls.get_ref().1.alpn_protocol() == Some(dial::ALPN) => Some(Box::new(tls)),
        Ok(Ok(_)) => {
            tracing::debug!(%peer, "bookie connection closed: TLS without the bookie ALPN");
            None
        }
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "bookie connection closed: TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(%peer, "bookie connection closed: TLS handshake timed out");
            None
        }
    }
}

async fn connection(
    stream: Box<dyn dial::PeerIo>,
    peer: SocketAddr,
    log: Arc<Log>,
    check: Option<PeerCheck>,
    (stop, admit_by): (CancellationToken, tokio::time::Instant),
) {
    // Requests are read with the small request limit (plus one entry, which an add carries),
    // answers written with the answers' one.
    let (read, write) = tokio::io::split(stream);
    let mut requests = FramedRead::new(read, request_codec(log.max_entry_size()));
    let answers = FramedWrite::new(write, codec());
    // Answers leave in request order. An add is handed to the journal here, in the order the
    // writer sent it; the answer waits, in the writer task, until it is durable.
    let (tx, rx) = tokio::sync::mpsc::channel::<(u64, Pending)>(PIPELINE);
    let writer = tokio::spawn(write_answers(answers, rx, peer));
    // Invariant: no request but `Hello` is served before this is set; until then frames are
    // held to a request's size without an entry and the first must come within HELLO_TIMEOUT.
    let mut admitted = check.is_none();
    if !admitted {
        requests
            .decoder_mut()
            .set_max_frame_length(crate::protocol::bookie::MAX_REQUEST_FRAME);
    }
    loop {
        let deadline = async {
            if admitted {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep_until(admit_by).await;
        };
        let frame = tokio::select! {
            _ = stop.cancelled() => break,
            () = deadline => {
                tracing::warn!(%peer, "bookie connection closed: no credentials in time");
                break;
            }
            f = requests.next() => f,
        };
        let frame = match frame {
            None => break,
            Some(Ok(f)) => f.freeze(),
            // A TLS peer gone without its close_notify between frames: a close, as a TCP
            // end of stream.
            Some(Err(e))
                if e.kind() == std::io::ErrorKind::UnexpectedEof
                    && requests.read_buffer().is_empty() =>
            {
                break
            }
            Some(Err(e)) => {
                tracing::warn!(%peer, error = %e, "bookie connection closed: bad framing");
                break;
            }
        };
        let (id, request) = match decode_request(frame) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(%peer, error = %e, "bookie connection closed: bad frame");
                break;
            }
        };
        let (pending, close) = match request {
            BookieRequest::Hello { token } => {
                let response = admit(check.as_ref(), &token, peer);
                let ok = matches!(response, BookieResponse::Welcome { .. });
                if ok && !admitted {
                    admitted = true;
                    let max = crate::protocol::bookie::MAX_REQUEST_FRAME + log.max_entry_size();
                    requests.decoder_mut().set_max_frame_length(max);
                }
                (ready(response), !ok)
            }
            _ if !admitted => {
                tracing::warn!(%peer, "bookie connection closed: a request before credentials");
                let response = BookieResponse::error(
                    BookieErrorCode::Unauthorized,
                    0,
                    "this bookie serves only nodes of its cluster: present a superuser token (Hello) first",
                );
                (ready(response), true)
            }
            BookieRequest::AddEntry {
                topic: _,
                ledger,
                entry,
                publish_time_ms,
                payload,
                recovery,
            } => (
                add(&log, ledger, entry, publish_time_ms, payload, recovery).await,
                false,
            ),
            other => {
                let log = log.clone();
                let pending = Box::pin(async move { answer(&log, other).await }) as Pending;
                (pending, false)
            }
        };
        if tx.send((id, pending)).await.is_err() || close {
            break;
        }
    }
    drop(tx);
    let _ = writer.await;
}

/// Requests of one connection whose answers are not written yet, at most.
const PIPELINE: usize = 1024;

/// An answer still being worked out.
type Pending = std::pin::Pin<Box<dyn std::future::Future<Output = BookieResponse> + Send>>;

/// Writes each answer as it resolves, in request order.
async fn write_answers(
    mut answers: FramedWrite<
        tokio::io::WriteHalf<Box<dyn dial::PeerIo>>,
        tokio_util::codec::LengthDelimitedCodec,
    >,
    mut rx: tokio::sync::mpsc::Receiver<(u64, Pending)>,
    peer: SocketAddr,
) {
    while let Some((id, pending)) = rx.recv().await {
        let response = pending.await;
        if let Err(e) = answers.send(encode_response(id, &response)).await {
            tracing::debug!(%peer, error = %e, "bookie connection closed while answering");
            return;
        }
    }
}

/// An answer known at once.
fn ready(response: BookieResponse) -> Pending {
    Box::pin(async move { response })
}

/// The answer to a `Hello`: `Welcome` when no credentials are required or the token names a
/// superuser role; `Unauthorized` otherwise.
fn admit(check: Option<&PeerCheck>, token: &str, peer: SocketAddr) -> BookieResponse {
    let Some(check) = check else {
        return BookieResponse::Welcome {
            role: String::new(),
        };
    };
    match check(token) {
        Ok(role) => BookieResponse::Welcome { role },
        Err(why) => {
            tracing::warn!(%peer, why, "bookie connection refused: bad credentials");
            BookieResponse::error(BookieErrorCode::Unauthorized, 0, why)
        }
    }
}

/// Hands a replicated entry to the log; the answer resolves once it is durable.
async fn add(
    log: &Log,
    ledger: u64,
    entry: u64,
    publish_time_ms: i64,
    payload: bytes::Bytes,
    recovery: bool,
) -> Pending {
    match log
        .replica_add(ledger, entry, publish_time_ms, payload, recovery)
        .await
    {
        Ok(durable) => Box::pin(async move {
            match durable.await {
                Ok(Ok(_)) => BookieResponse::Added { ledger, entry },
                Ok(Err(e)) => BookieResponse::error(BookieErrorCode::Unavailable, 0, e.to_string()),
                Err(_) => BookieResponse::error(BookieErrorCode::Unavailable, 0, "log closed"),
            }
        }),
        Err(e) => {
            let code = match e {
                ReplicaAddError::OutOfOrder { .. } | ReplicaAddError::Fenced(_) => {
                    BookieErrorCode::BadRequest
                }
                ReplicaAddError::NotReplica(_) => BookieErrorCode::NotHeld,
                ReplicaAddError::Append(_) | ReplicaAddError::Storage(_) => {
                    BookieErrorCode::Unavailable
                }
            };
            tracing::warn!(ledger, entry, error = %e, "refused a replicated entry");
            ready(BookieResponse::error(code, 0, e.to_string()))
        }
    }
}

async fn answer(log: &Log, request: BookieRequest) -> BookieResponse {
    match request {
        BookieRequest::ReadEntries {
            topic,
            ledger,
            first,
            last,
            max_bytes,
        } => {
            if last < first {
                return BookieResponse::error(
                    BookieErrorCode::BadRequest,
                    0,
                    "last entry before first",
                );
            }
            let budget = u64::from(max_bytes.min(READ_BUDGET));
            match log.serve_read(&topic, ledger, first, last, budget).await {
                Ok(entries) => BookieResponse::Entries(entries.into_iter().map(wire).collect()),
                Err(e) => refusal(&e),
            }
        }
        BookieRequest::LastConfirmed { topic, ledger } => {
            match log.serve_confirmed(&topic, ledger).await {
                Ok(Confirmed { count, open }) => BookieResponse::LastConfirmed { count, open },
                Err(e) => refusal(&e),
            }
        }
        BookieRequest::Sealed {
            topic: _,
            ledger,
            count,
        } => match log.replica_seal(ledger, count).await {
            Ok(count) => BookieResponse::LastConfirmed { count, open: false },
            Err(e) => refusal(&e),
        },
        BookieRequest::Fence { topic: _, ledger } => match log.replica_fence(ledger).await {
            Ok(c) => BookieResponse::Fenced(WireCopy {
                first_segment: c.first_segment,
                entry_count: c.seal.entry_count,
                size_bytes: c.seal.size_bytes,
                min_publish_ms: c.seal.min_publish_ms,
                max_publish_ms: c.seal.max_publish_ms,
                last_segment: c.seal.last_segment,
                checksum: c.seal.checksum,
            }),
            Err(e) => refusal(&e),
        },
        BookieRequest::AddEntry { .. } | BookieRequest::Hello { .. } => BookieResponse::error(
            BookieErrorCode::BadRequest,
            0,
            "answered in the connection's loop",
        ),
    }
}

fn wire(e: Entry) -> WireEntry {
    WireEntry {
        entry: e.position.entry,
        publish_time_ms: e.publish_time_ms,
        payload: e.payload,
    }
}

/// The one mapping of the log's read errors to the bookie wire.
fn refusal(e: &ReadError) -> BookieResponse {
    match e {
        ReadError::NoSuchEntry { available, .. } => {
            BookieResponse::error(BookieErrorCode::NoSuchEntry, *available, e.to_string())
        }
        ReadError::Remote { .. } | ReadError::Deleted(_) | ReadError::UnknownLedger { .. } => {
            BookieResponse::error(BookieErrorCode::NotHeld, 0, e.to_string())
        }
        // The copy was deleted (after its offload) between the check and the read.
        ReadError::Index(crate::ledger::index::IndexFileError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            BookieResponse::error(BookieErrorCode::NotHeld, 0, e.to_string())
        }
        ReadError::Corrupt { .. } | ReadError::Index(_) => {
            tracing::error!(error = %e, "a peer's read found a corrupt entry");
            BookieResponse::error(BookieErrorCode::Corrupt, 0, e.to_string())
        }
        _ => BookieResponse::error(BookieErrorCode::Unavailable, 0, e.to_string()),
    }
}

#[cfg(test)]
mod moved_tests;
#[cfg(test)]
mod replication_tests;
#[cfg(test)]
mod striping_repair_tests;
#[cfg(test)]
mod striping_tests;
#[cfg(test)]
mod tests;
