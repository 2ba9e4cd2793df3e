//! Opening a connection to another node's bookie listener, authenticated when this node has
//! credentials for its peers (`broker.authentication.node_token`, ADR 0012): the connection's
//! first request is `Hello` with the token, and it is used only once the bookie answered
//! `Welcome`.
//!
//! The listener's side is [`super::admit`]: with authentication on it answers anything but a
//! valid `Hello` of a superuser role with `Unauthorized` and closes the connection.

use std::path::PathBuf;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_util::codec::{Framed, LengthDelimitedCodec};

use crate::protocol::bookie::{
    codec, decode_response, encode_request, BookieErrorCode, BookieRequest, BookieResponse,
};

/// A connection to a bookie, ready for requests.
pub type Conn = Framed<TcpStream, LengthDelimitedCodec>;

/// Request id of the `Hello` that opens an authenticated connection.
const HELLO_ID: u64 = 0;

/// Why a dial failed, for people.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// No connection within the time given.
    #[error("connecting to {0} timed out")]
    Timeout(String),
    /// The connection failed or closed.
    #[error("connecting to {addr}: {why}")]
    Io {
        /// Address dialled.
        addr: String,
        /// Cause.
        why: String,
    },
    /// The bookie refused this node's credentials.
    #[error("the bookie at {addr} refused this node's credentials: {message}")]
    Refused {
        /// Address dialled.
        addr: String,
        /// The bookie's reason.
        message: String,
    },
}

/// The token of `spec`: the token itself, or `file:PATH` of a file holding it (trimmed).
pub fn load_token(spec: &str) -> Result<String, (PathBuf, std::io::Error)> {
    match spec.strip_prefix("file:") {
        Some(path) => std::fs::read_to_string(path)
            .map(|t| t.trim().to_string())
            .map_err(|e| (PathBuf::from(path), e)),
        None => Ok(spec.to_string()),
    }
}

/// Connects to `addr` within `timeout` and, with `token`, authenticates the connection.
pub async fn dial(addr: &str, token: Option<&str>, timeout: Duration) -> Result<Conn, DialError> {
    let io = |why: String| DialError::Io {
        addr: addr.to_string(),
        why,
    };
    let open = async {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| io(e.to_string()))?;
        let _ = stream.set_nodelay(true);
        let mut conn = Framed::new(stream, codec());
        let Some(token) = token else {
            return Ok(conn);
        };
        let hello = BookieRequest::Hello {
            token: token.to_string(),
        };
        conn.send(encode_request(HELLO_ID, &hello))
            .await
            .map_err(|e| io(e.to_string()))?;
        let frame = conn
            .next()
            .await
            .ok_or_else(|| io("closed before answering hello".into()))?
            .map_err(|e| io(e.to_string()))?;
        match decode_response(frame.freeze()).map_err(|e| io(e.to_string()))? {
            (HELLO_ID, BookieResponse::Welcome { .. }) => Ok(conn),
            (
                HELLO_ID,
                BookieResponse::Error {
                    code: BookieErrorCode::Unauthorized,
                    message,
                    ..
                },
            ) => Err(DialError::Refused {
                addr: addr.to_string(),
                message,
            }),
            (id, other) => Err(io(format!("answered hello with {other:?} (request {id})"))),
        }
    };
    tokio::time::timeout(timeout, open)
        .await
        .map_err(|_| DialError::Timeout(addr.to_string()))?
}
