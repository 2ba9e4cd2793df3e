//! Stopping a PostgreSQL client's query when the client asks or goes away.
//!
//! - A cancel request (psql's Ctrl-C, JDBC `Statement.cancel()`, psycopg `connection.cancel()`)
//!   arrives on a new connection with the process id and secret key the server gave the
//!   session at startup; [`Cancels`] finds the session by that pair and fires its running
//!   query's token. The query's task is aborted and the client gets SQLSTATE 57014.
//! - A client that closes its connection while a query runs (killed, timed out, network gone)
//!   is seen at once: a second handle on the socket is watched, never read, for the peer's
//!   FIN or reset (`EPOLLRDHUP`, as PostgreSQL's `client_connection_check_interval` polls
//!   for), and the session's token, parent of every query token, fires. pgwire itself reads
//!   the socket only between queries, so without the watch a long query would run on for a
//!   client that is gone. A client that shuts down only its sending side and still waits for
//!   the answer counts as gone too, as it does for PostgreSQL's check.
//!
//! Invariants:
//! - A session is in [`Cancels`] from the end of its startup until it ends (dropped), under
//!   its (pid, secret key); the registry holds it weakly.
//! - Each query's token is a child of its session's `gone` token.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use async_trait::async_trait;
use bytes::Bytes;
use pgwire::api::cancel::CancelHandler;
use pgwire::messages::cancel::CancelRequest;
use pgwire::messages::startup::SecretKey;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// The sessions a cancel request can reach, by (process id, secret key).
#[derive(Debug, Default)]
pub(super) struct Cancels {
    /// Invariant: holds every session past startup that has not ended, and no other.
    sessions: Mutex<HashMap<(i32, Bytes), Weak<Session>>>,
}

impl Cancels {
    /// Fires the running query's token of the session `pid`/`secret` names, if any.
    fn cancel(&self, pid: i32, secret: &SecretKey) -> bool {
        let found = self
            .sessions
            .lock()
            .ok()
            .and_then(|m| m.get(&(pid, secret.to_bytes())).and_then(Weak::upgrade));
        match found {
            Some(session) => {
                session.cancel_query();
                true
            }
            None => false,
        }
    }
}

#[async_trait]
impl CancelHandler for Cancels {
    async fn on_cancel_request(&self, request: CancelRequest) {
        let found = self.cancel(request.pid, &request.secret_key);
        tracing::debug!(pid = request.pid, found, "postgres cancel request");
    }
}

/// One PostgreSQL connection's queries.
#[derive(Debug)]
pub(super) struct Session {
    /// The registry this session enters at the end of its startup.
    cancels: Arc<Cancels>,
    /// Invariant: fires once the client has gone, and every query token is its child.
    gone: CancellationToken,
    /// Invariant: the token of the query running now, or of the last one.
    query: Mutex<CancellationToken>,
    /// Invariant: the key this session is registered under in `cancels`, once registered.
    key: Mutex<Option<(i32, Bytes)>>,
}

impl Session {
    pub(super) fn new(cancels: Arc<Cancels>) -> Arc<Session> {
        let gone = CancellationToken::new();
        Arc::new(Session {
            cancels,
            query: Mutex::new(gone.child_token()),
            gone,
            key: Mutex::new(None),
        })
    }

    /// Makes this session reachable by cancel requests naming `pid` and `secret`.
    pub(super) fn register(self: &Arc<Self>, pid: i32, secret: &SecretKey) {
        let key = (pid, secret.to_bytes());
        let (Ok(mut mine), Ok(mut all)) = (self.key.lock(), self.cancels.sessions.lock()) else {
            return;
        };
        if mine.as_ref() != Some(&key) {
            all.insert(key.clone(), Arc::downgrade(self));
            *mine = Some(key);
        }
    }

    /// A token for the query starting now: fired by a cancel request or the client leaving.
    pub(super) fn start_query(&self) -> CancellationToken {
        let token = self.gone.child_token();
        if let Ok(mut q) = self.query.lock() {
            *q = token.clone();
        }
        token
    }

    fn cancel_query(&self) {
        if let Ok(q) = self.query.lock() {
            q.cancel();
        }
    }

    /// Marks the client gone: its running query stops.
    pub(super) fn client_gone(&self) {
        self.gone.cancel();
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let key = self.key.get_mut().ok().and_then(|k| k.take());
        if let (Some(key), Ok(mut all)) = (key, self.cancels.sessions.lock()) {
            all.remove(&key);
        }
    }
}

/// `socket` and a second handle on the same connection for [`peer_closed`] (none if the
/// descriptor could not be duplicated: the session then only notices a departed client when
/// it next reads or writes).
pub(super) fn with_watch(socket: TcpStream) -> std::io::Result<(TcpStream, Option<TcpStream>)> {
    let socket = socket.into_std()?;
    let watch = socket
        .try_clone()
        .map_err(|e| tracing::debug!(error = %e, "postgres: no watch on the connection"))
        .ok()
        .and_then(|w| TcpStream::from_std(w).ok());
    Ok((TcpStream::from_std(socket)?, watch))
}

/// Returns once the peer of `watch` has closed its side of the connection or reset it; never,
/// without a watch. Nothing is read: readiness is only observed, then cleared until the next
/// event, so data the session has yet to read does not wake this again.
pub(super) async fn peer_closed(watch: Option<TcpStream>) {
    let Some(watch) = watch else {
        return std::future::pending().await;
    };
    loop {
        match watch.ready(Interest::READABLE).await {
            Ok(ready) if ready.is_read_closed() => return,
            Ok(_) => {
                let _ = watch.try_io(Interest::READABLE, || {
                    Err::<(), _>(std::io::ErrorKind::WouldBlock.into())
                });
            }
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancel_request_reaches_only_its_session_and_only_while_it_lives() {
        let cancels = Arc::new(Cancels::default());
        let a = Session::new(cancels.clone());
        let b = Session::new(cancels.clone());
        a.register(1, &SecretKey::I32(11));
        b.register(2, &SecretKey::I32(22));
        let qa = a.start_query();
        let qb = b.start_query();
        assert!(!cancels.cancel(1, &SecretKey::I32(12)), "wrong secret");
        assert!(!qa.is_cancelled());
        assert!(cancels.cancel(1, &SecretKey::I32(11)));
        assert!(qa.is_cancelled() && !qb.is_cancelled());
        // The next query of `a` starts uncancelled.
        assert!(!a.start_query().is_cancelled());
        drop(a);
        assert!(
            !cancels.cancel(1, &SecretKey::I32(11)),
            "ended sessions are forgotten"
        );
        assert_eq!(cancels.sessions.lock().map(|m| m.len()).unwrap_or(0), 1);
    }

    #[test]
    fn a_departed_client_cancels_its_running_query() {
        let s = Session::new(Arc::new(Cancels::default()));
        let q = s.start_query();
        s.client_gone();
        assert!(q.is_cancelled());
    }

    #[tokio::test]
    async fn the_watch_sees_the_peer_close_with_unread_data_pending() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let client = std::net::TcpStream::connect(addr).expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        let (_server, watch) = with_watch(server).expect("watch");
        assert!(watch.is_some());
        let watcher = tokio::spawn(peer_closed(watch));
        // Data the session has not read yet does not end the watch.
        std::io::Write::write_all(&mut &client, b"Sync").expect("write");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(!watcher.is_finished());
        drop(client);
        tokio::time::timeout(std::time::Duration::from_secs(5), watcher)
            .await
            .expect("the close is seen")
            .expect("watch task");
    }
}
