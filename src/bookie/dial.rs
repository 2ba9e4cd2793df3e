//! Opening a connection to another node's bookie listener: over TLS when the peer's listener
//! speaks it (its registration says so; the peer's certificate is checked against
//! `server.bookie_tls_trust_certs_file`, ADR 0013), and authenticated when this node has
//! credentials for its peers (`broker.authentication.node_token`, ADR 0012): the connection's
//! first request is `Hello` with the token, and it is used only once the bookie answered
//! `Welcome`.
//!
//! The listener's side is [`super::admit`]: with authentication on it answers anything but a
//! valid `Hello` of a superuser role with `Unauthorized` and closes the connection.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_util::codec::{Framed, LengthDelimitedCodec};

use crate::cluster::membership::BookieAddr;

use crate::protocol::bookie::{
    codec, decode_response, encode_request, BookieErrorCode, BookieRequest, BookieResponse,
};

/// A byte stream between two nodes: plain TCP or TLS over it.
pub trait PeerIo: AsyncRead + AsyncWrite + Send + Unpin + std::fmt::Debug {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + std::fmt::Debug> PeerIo for T {}

/// A connection to a bookie, ready for requests.
pub type Conn = Framed<Box<dyn PeerIo>, LengthDelimitedCodec>;

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

/// How this node opens connections to its peers' bookies: what it presents, and which
/// certificate authorities it trusts.
#[derive(Clone, Default)]
pub struct Dialer {
    /// The node token, presented in `Hello` (ADR 0012).
    token: Option<Arc<str>>,
    /// TLS to peers whose listener speaks it; `None`: this node cannot dial such peers.
    tls: Option<TlsConnector>,
}

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dialer")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Dialer {
    /// A dialer presenting `token`, trusting the authorities of `tls` for TLS peers.
    pub fn new(token: Option<String>, tls: Option<Arc<rustls::ClientConfig>>) -> Dialer {
        Dialer {
            token: token.map(Into::into),
            tls: tls.map(TlsConnector::from),
        }
    }

    /// Connects to `peer` within `timeout`: over TLS when its listener speaks it, then, with a
    /// token, authenticated.
    pub async fn dial(&self, peer: &BookieAddr, timeout: Duration) -> Result<Conn, DialError> {
        let open = self.open(peer);
        tokio::time::timeout(timeout, open)
            .await
            .map_err(|_| DialError::Timeout(peer.to_string()))?
    }

    async fn open(&self, peer: &BookieAddr) -> Result<Conn, DialError> {
        let addr = peer.addr.as_str();
        let io = |why: String| DialError::Io {
            addr: peer.to_string(),
            why,
        };
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| io(e.to_string()))?;
        let _ = stream.set_nodelay(true);
        let stream: Box<dyn PeerIo> = if peer.tls {
            let connector = self.tls.as_ref().ok_or_else(|| {
                io("its bookie listener speaks TLS: set server.bookie_tls_trust_certs_file".into())
            })?;
            let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let name = ServerName::try_from(host.to_string())
                .map_err(|e| io(format!("{host} is no server name: {e}")))?;
            let tls = connector
                .connect(name, stream)
                .await
                .map_err(|e| io(format!("TLS: {e}")))?;
            Box::new(tls)
        } else {
            Box::new(stream)
        };
        hello(Framed::new(stream, codec()), self.token.as_deref(), peer).await
    }
}

/// With `token`, authenticates `conn` (`Hello`, answered `Welcome`).
async fn hello(mut conn: Conn, token: Option<&str>, peer: &BookieAddr) -> Result<Conn, DialError> {
    let io = |why: String| DialError::Io {
        addr: peer.to_string(),
        why,
    };
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
            addr: peer.to_string(),
            message,
        }),
        (id, other) => Err(io(format!("answered hello with {other:?} (request {id})"))),
    }
}
