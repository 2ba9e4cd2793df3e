//! Serving the HTTP surface on a listener (plain TCP, or the handshaken connections of a TLS
//! listener): hyper's HTTP/1 and HTTP/2 connections with a timer, so that a client has
//! `server.http_header_read_timeout` to send a request's head (a slow-loris client that
//! trickles it is disconnected), then graceful shutdown: on `stop`, no new connection is
//! accepted and the open ones finish their requests.
//!
//! `axum::serve` does the same but gives hyper no timer, and hyper's header-read timeout only
//! runs with one.

use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio_util::sync::CancellationToken;

/// How long open connections may take to finish once `stop` fired.
const DRAIN: Duration = Duration::from_secs(10);

/// Serves `app` on every connection `listener` accepts until `stop`, giving each client
/// `header_read_timeout` to send each request's head.
pub async fn serve<L>(
    mut listener: L,
    app: Router,
    stop: CancellationToken,
    header_read_timeout: Duration,
) where
    L: axum::serve::Listener,
{
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    let graceful = GracefulShutdown::new();
    loop {
        let (io, _peer) = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let service = TowerToHyperService::new(app.clone());
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(io), service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "http connection ended");
            }
        });
    }
    if tokio::time::timeout(DRAIN, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("http connections still open {DRAIN:?} after shutdown began");
    }
}
