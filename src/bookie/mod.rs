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
//!   other connections go on.
//! - The listener serves only what the log has confirmed (see [`crate::ledger::replica`]).
//!
//! Not built yet (issue 19): writes from other nodes (replicated ledgers), fencing; the
//! listener has no authentication or TLS of its own, so it is bound to an address only the
//! cluster's nodes reach.

use std::net::SocketAddr;
use std::sync::Arc;

use futures::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::codec::Framed;
use tokio_util::sync::CancellationToken;

use crate::ledger::{Confirmed, Entry, Log, ReadError};
use crate::protocol::bookie::{
    codec, decode_request, encode_response, BookieErrorCode, BookieRequest, BookieResponse,
    WireEntry, READ_BUDGET,
};

pub mod client;

/// Serves the bookie protocol on `listener` until `stop` is cancelled.
pub fn serve(
    listener: TcpListener,
    log: Arc<Log>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = stop.cancelled() => return,
                a = listener.accept() => a,
            };
            match accepted {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(connection(stream, peer, log.clone(), stop.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a bookie connection failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    })
}

async fn connection(stream: TcpStream, peer: SocketAddr, log: Arc<Log>, stop: CancellationToken) {
    let mut framed = Framed::new(stream, codec());
    loop {
        let frame = tokio::select! {
            _ = stop.cancelled() => return,
            f = framed.next() => f,
        };
        let frame = match frame {
            None => return,
            Some(Ok(f)) => f.freeze(),
            Some(Err(e)) => {
                tracing::warn!(%peer, error = %e, "bookie connection closed: bad framing");
                return;
            }
        };
        let (id, request) = match decode_request(frame) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(%peer, error = %e, "bookie connection closed: bad frame");
                return;
            }
        };
        let response = answer(&log, request).await;
        if let Err(e) = framed.send(encode_response(id, &response)).await {
            tracing::debug!(%peer, error = %e, "bookie connection closed while answering");
            return;
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
                return error(BookieErrorCode::BadRequest, 0, "last entry before first");
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
            error(BookieErrorCode::NoSuchEntry, *available, &e.to_string())
        }
        ReadError::Remote { .. } | ReadError::Deleted(_) | ReadError::UnknownLedger { .. } => {
            error(BookieErrorCode::NotHeld, 0, &e.to_string())
        }
        ReadError::Corrupt { .. } | ReadError::Index(_) => {
            tracing::error!(error = %e, "a peer's read found a corrupt entry");
            error(BookieErrorCode::Corrupt, 0, &e.to_string())
        }
        _ => error(BookieErrorCode::Unavailable, 0, &e.to_string()),
    }
}

fn error(code: BookieErrorCode, available: u64, message: &str) -> BookieResponse {
    BookieResponse::Error {
        code,
        available,
        message: message.to_string(),
    }
}

#[cfg(test)]
mod tests;
