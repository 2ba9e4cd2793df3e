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

/// The ALPN protocol of bookie connections over TLS. Both ends require it, so a dial that
/// reaches another TLS listener of a node (Pulsar, HTTPS, PostgreSQL: the same certificate)
/// fails before any credential is sent.
pub const ALPN: &[u8] = b"ledgerlake-bookie/1";

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
    /// This node's own listener speaks TLS (`server.bookie_tls`): it dials no plaintext peer,
    /// so its token and its entries never cross the network in the clear.
    require_tls: bool,
}

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dialer")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls.is_some())
            .field("require_tls", &self.require_tls)
            .finish()
    }
}

impl Dialer {
    /// A dialer presenting `token`, trusting the authorities of `tls` for TLS peers (their
    /// ALPN set to [`ALPN`] here); with `require_tls`, it dials TLS peers only.
    pub fn new(
        token: Option<String>,
        tls: Option<Arc<rustls::ClientConfig>>,
        require_tls: bool,
    ) -> Dialer {
        let tls = tls.map(|config| {
            let mut config = Arc::unwrap_or_clone(config);
            config.alpn_protocols = vec![ALPN.to_vec()];
            TlsConnector::from(Arc::new(config))
        });
        Dialer {
            token: token.map(Into::into),
            tls,
            require_tls,
        }
    }

    /// Whether this dialer can open `peer` at all (TLS peers need trusted authorities; a
    /// dialer that requires TLS opens no plaintext peer).
    pub fn can_reach(&self, peer: &BookieAddr) -> bool {
        if peer.tls {
            self.tls.is_some()
        } else {
            !self.require_tls
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
        let io = |why: &str| DialError::Io {
            addr: peer.to_string(),
            why: why.to_string(),
        };
        // Refused before any connection: nothing of this node's crosses in the clear.
        if !peer.tls && self.require_tls {
            return Err(io("its bookie listener is plain TCP, and this node \
                 (server.bookie_tls) dials TLS listeners only"));
        }
        let connector = match (&self.tls, peer.tls) {
            (Some(c), true) => Some(c),
            (None, true) => {
                return Err(io(
                    "its bookie listener speaks TLS: set server.bookie_tls_trust_certs_file",
                ))
            }
            (_, false) => None,
        };
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| io(&e.to_string()))?;
        let _ = stream.set_nodelay(true);
        let stream: Box<dyn PeerIo> = match connector {
            Some(connector) => {
                let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let name = ServerName::try_from(host.to_string())
                    .map_err(|e| io(&format!("{host} is no server name: {e}")))?;
                let tls = connector
                    .connect(name, stream)
                    .await
                    .map_err(|e| io(&format!("TLS: {e}")))?;
                if tls.get_ref().1.alpn_protocol() != Some(ALPN) {
                    return Err(io("TLS: the listener is not a bookie (no bookie ALPN)"));
                }
                Box::new(tls)
            }
            None => Box::new(stream),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(tls: bool) -> BookieAddr {
        BookieAddr {
            addr: "127.0.0.1:1".into(),
            tls,
        }
    }

    #[tokio::test]
    async fn a_dialer_opens_only_the_peers_it_can_secure() {
        let plain = Dialer::new(None, None, false);
        assert!(plain.can_reach(&peer(false)) && !plain.can_reach(&peer(true)));
        let err = plain.dial(&peer(true), Duration::from_secs(5)).await;
        let err = err.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("bookie_tls_trust_certs_file"), "{err}");
        // A node whose own listener speaks TLS never dials a plaintext one (its token would
        // cross in the clear): refused before any connection.
        let strict = Dialer::new(Some("t".into()), None, true);
        assert!(!strict.can_reach(&peer(false)));
        let err = strict.dial(&peer(false), Duration::from_secs(5)).await;
        let err = err.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("dials TLS listeners only"), "{err}");
    }
}
