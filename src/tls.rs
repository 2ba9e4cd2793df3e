//! TLS for the service's listeners (rustls): the server configuration from PEM files, and
//! [`TlsIncoming`], which accepts TCP connections and completes their handshakes beside the
//! accept loop, so one slow or hostile client cannot hold up the others.
//!
//! Used by `pulsar+ssl://` (the broker reads handshaken streams), `https://` (axum serves
//! [`TlsIncoming`] as its listener), PostgreSQL SSL (pgwire negotiates `SSLRequest` with
//! the same acceptor) and the bookie listener (which handshakes in each connection's task);
//! [`client_config`] is the other side of the bookie connections a node opens.
//!
//! Invariants:
//! - A handshake that does not finish within [`HANDSHAKE_TIMEOUT`] drops its connection, and
//!   at most [`MAX_HANDSHAKES`] run at once per listener.
//! - Nothing is accepted after the stop token is cancelled.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// The longest a client may take to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshakes in progress at once per listener; further connections wait to be accepted.
pub const MAX_HANDSHAKES: usize = 256;

/// Why the TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or holds nothing usable.
    #[error("{path}: {reason}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// rustls refused the certificate and key.
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// A TLS server configuration from a PEM certificate chain and its key, offering `alpn`
/// protocols (empty: none).
pub fn server_config(
    cert_file: &Path,
    key_file: &Path,
    alpn: &[&[u8]],
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let pem_err = |path: &Path, reason: String| TlsError::Pem {
        path: path.to_path_buf(),
        reason,
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_file)
        .map_err(|e| pem_err(cert_file, e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| pem_err(cert_file, e.to_string()))?;
    if certs.is_empty() {
        return Err(pem_err(cert_file, "no certificate found".into()));
    }
    let key =
        PrivateKeyDer::from_pem_file(key_file).map_err(|e| pem_err(key_file, e.to_string()))?;
    // Explicit provider: more than one may be compiled into the binary.
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// A TLS client configuration trusting the CA certificates of `trust_file` (PEM), for the
/// node-to-node bookie connections.
pub fn client_config(trust_file: &Path) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let pem_err = |reason: String| TlsError::Pem {
        path: trust_file.to_path_buf(),
        reason,
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(trust_file).map_err(|e| pem_err(e.to_string()))? {
        roots
            .add(cert.map_err(|e| pem_err(e.to_string()))?)
            .map_err(|e| pem_err(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(pem_err("no certificate found".into()));
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Handshaken TLS connections of one listener.
#[derive(Debug)]
pub struct TlsIncoming {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsIncoming {
    /// Accepts on `listener` until `stop`, handshaking each connection in a task of its own.
    pub fn start(
        listener: TcpListener,
        acceptor: TlsAcceptor,
        stop: CancellationToken,
    ) -> std::io::Result<TlsIncoming> {
        let local = listener.local_addr()?;
        let (tx, rx) = mpsc::channel(64);
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
        tokio::spawn(async move {
            loop {
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return;
                };
                let (tcp, peer) = tokio::select! {
                    _ = stop.cancelled() => return,
                    accepted = listener.accept() => match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            tracing::warn!(error = %e, %local, "accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                };
                let _ = tcp.set_nodelay(true);
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp));
                    let done = handshake.await;
                    drop(slot);
                    match done {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsIncoming { rx, local })
    }

    /// The next handshaken connection (`None` once stopped).
    pub async fn next(&mut self) -> Option<(TlsStream<TcpStream>, SocketAddr)> {
        self.rx.recv().await
    }
}

impl axum::serve::Listener for TlsIncoming {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(c) => c,
            // Stopped: axum's graceful shutdown ends the server; never yield again.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
