//! [`Coordination`] on etcd: versions are etcd revisions, compare-and-set is a transaction
//! guarded by the key's mod revision, a session is a lease, a watch is an etcd watch.
//!
//! The lease is renewed every third of its time-to-live. The session turns
//! [`SessionState::Lost`] when two thirds of the time-to-live have passed since the send time
//! of the last renewal etcd confirmed: etcd counts the time-to-live from when it received that
//! renewal, which was after the send, so the node knows before the lease can have expired.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, LeaseKeepAliveStream, LeaseKeeper,
    PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    end_session, CoordError, Coordination, Expect, SessionState, Versioned, Watch, WatchEvent,
    WATCH_BUFFER,
};

fn backend(op: &'static str) -> impl FnOnce(etcd_client::Error) -> CoordError {
    move |e| CoordError::Backend {
        op,
        source: Box::new(e),
    }
}

fn version(revision: i64) -> u64 {
    u64::try_from(revision).unwrap_or(0)
}

/// One session on etcd, under a root prefix.
pub struct EtcdCoordination {
    client: Client,
    /// Invariant: every key is `root` + `/` + a relative key.
    root: String,
    /// Invariant: granted at start; revoked by `close`.
    lease: i64,
    /// Invariant: `Live` until the renewal task reports `Lost` or `close` sets `Closed`;
    /// never changes again after that.
    state: Arc<watch::Sender<SessionState>>,
    /// Stops the renewal task.
    stop: CancellationToken,
    /// `false` stops renewals without ending the session, as on a hung or partitioned node
    /// (tests use it).
    #[cfg_attr(not(test), allow(dead_code))]
    renewing: Arc<AtomicBool>,
}

impl std::fmt::Debug for EtcdCoordination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdCoordination")
            .field("root", &self.root)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl EtcdCoordination {
    /// Grants a lease of `ttl` (whole seconds, at least etcd's minimum) and starts renewing it.
    pub async fn start(client: Client, root: &str, ttl: Duration) -> Result<Self, CoordError> {
        let ttl_secs = i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let mut lease_client = client.lease_client();
        let granted = lease_client
            .grant(ttl_secs, None)
            .await
            .map_err(backend("grant lease"))?;
        let lease = granted.id();
        let ttl = Duration::from_secs(version(granted.ttl()).max(1));
        let state = Arc::new(watch::channel(SessionState::Live).0);
        let stop = CancellationToken::new();
        let renewing = Arc::new(AtomicBool::new(true));
        let renewal = Renewal {
            client: client.clone(),
            lease,
            ttl,
            renewing: renewing.clone(),
        };
        tokio::spawn(renewal.run(state.clone(), stop.clone()));
        Ok(EtcdCoordination {
            client,
            root: root.trim_end_matches('/').to_string(),
            lease,
            state,
            stop,
            renewing,
        })
    }

    fn full(&self, key: &str) -> String {
        format!("{}/{key}", self.root)
    }

    fn relative(&self, key: &[u8]) -> Result<String, CoordError> {
        std::str::from_utf8(key)
            .ok()
            .and_then(|k| k.strip_prefix(self.root.as_str()))
            .and_then(|k| k.strip_prefix('/'))
            .map(str::to_string)
            .ok_or_else(|| CoordError::Backend {
                op: "read key",
                source: "a key outside the root or not UTF-8".into(),
            })
    }

    /// Stops renewing without revoking, as a hung or partitioned node would (tests).
    #[cfg(test)]
    pub(crate) fn stop_renewing(&self) {
        self.renewing.store(false, Ordering::Relaxed);
    }

    fn guard(&self, key: &str, expect: Expect) -> Option<Compare> {
        let full = self.full(key);
        match expect {
            Expect::Any => None,
            Expect::Absent => Some(Compare::version(full, CompareOp::Equal, 0)),
            Expect::Version(v) => Some(Compare::mod_revision(
                full,
                CompareOp::Equal,
                i64::try_from(v).unwrap_or(i64::MAX),
            )),
        }
    }

    /// Runs `write` if `expect` holds for `key`; a conflict names the version found.
    async fn guarded(
        &self,
        op: &'static str,
        key: &str,
        expect: Expect,
        write: TxnOp,
    ) -> Result<etcd_client::TxnResponse, CoordError> {
        let txn = Txn::new()
            .when(self.guard(key, expect).into_iter().collect::<Vec<_>>())
            .and_then([write])
            .or_else([TxnOp::get(self.full(key), None)]);
        let resp = self
            .client
            .kv_client()
            .txn(txn)
            .await
            .map_err(backend(op))?;
        if !resp.succeeded() {
            return Err(self.conflict(key, expect, resp.op_responses().first()));
        }
        Ok(resp)
    }

    fn conflict(&self, key: &str, expect: Expect, found: Option<&TxnOpResponse>) -> CoordError {
        let found = match found {
            Some(TxnOpResponse::Get(r)) => r.kvs().first().map(|kv| version(kv.mod_revision())),
            _ => None,
        };
        CoordError::Conflict {
            key: key.to_string(),
            expected: expect,
            found,
        }
    }
}

/// What keeps one lease alive.
struct Renewal {
    client: Client,
    lease: i64,
    ttl: Duration,
    renewing: Arc<AtomicBool>,
}

impl Renewal {
    /// Keeps the lease alive until `stop`; reports the session lost when renewals stop
    /// arriving in time. A renewal is sent every third of the time-to-live; one unanswered
    /// within [`Renewal::answer_within`] failed. After a failed one (e.g. the etcd member
    /// its stream went to stopped or hangs), the next is sent on a new stream after
    /// [`Renewal::retry`], so that one failure does not use up the margin before the session
    /// counts as lost.
    async fn run(self, state: Arc<watch::Sender<SessionState>>, stop: CancellationToken) {
        let lease = self.lease;
        let mut last_ok = Instant::now();
        let mut channel: Option<(LeaseKeeper, LeaseKeepAliveStream)> = None;
        let mut wait = self.ttl / 3;
        loop {
            let lost_at = last_ok + self.ttl * 2 / 3;
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep_until(lost_at) => {
                    tracing::error!(lease, "coordination session lost: the lease was not renewed in time");
                    end_session(&state, SessionState::Lost);
                    return;
                }
                renewed = self.once(&mut channel, wait) => match renewed {
                    Ok(Some(sent)) => {
                        last_ok = sent;
                        wait = self.ttl / 3;
                    }
                    Ok(None) => {
                        tracing::error!(lease, "coordination session lost: etcd expired the lease");
                        end_session(&state, SessionState::Lost);
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(lease, error = %e, "lease renewal failed; retrying");
                        channel = None;
                        wait = self.retry();
                    }
                },
            }
        }
    }

    /// How long after a failed renewal the next is sent: a twentieth of the time-to-live,
    /// between 100 ms and 1 s.
    fn retry(&self) -> Duration {
        (self.ttl / 20).clamp(Duration::from_millis(100), Duration::from_secs(1))
    }

    /// How long a renewal (with a new stream when it needs one) may take before it counts as
    /// failed: a fifth of the time-to-live, between 200 ms and 3 s. A renewal sent when the
    /// last one landed, a third of the time-to-live after it, then fails early enough for its
    /// retry to land before two thirds.
    fn answer_within(&self) -> Duration {
        (self.ttl / 5).clamp(Duration::from_millis(200), Duration::from_secs(3))
    }

    /// Waits `wait` and renews once: the send time when etcd confirmed, `None` when etcd says
    /// the lease is gone.
    async fn once(
        &self,
        channel: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>,
        wait: Duration,
    ) -> Result<Option<Instant>, etcd_client::Error> {
        tokio::time::sleep(wait).await;
        if !self.renewing.load(Ordering::Relaxed) {
            std::future::pending::<()>().await;
        }
        let within = self.answer_within();
        match tokio::time::timeout(within, self.renew(channel)).await {
            Ok(renewed) => renewed,
            Err(_) => Err(etcd_client::Error::LeaseKeepAliveError(format!(
                "no answer within {within:?}"
            ))),
        }
    }

    /// Sends one renewal and waits for its answer (see [`Renewal::once`]).
    async fn renew(
        &self,
        channel: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>,
    ) -> Result<Option<Instant>, etcd_client::Error> {
        if channel.is_none() {
            *channel = Some(self.client.lease_client().keep_alive(self.lease).await?);
        }
        let Some((keeper, stream)) = channel.as_mut() else {
            return Err(etcd_client::Error::LeaseKeepAliveError("no channel".into()));
        };
        let sent = Instant::now();
        keeper.keep_alive().await?;
        match stream.message().await? {
            Some(resp) if resp.ttl() > 0 => Ok(Some(sent)),
            Some(_) => Ok(None),
            None => Err(etcd_client::Error::LeaseKeepAliveError(
                "keep-alive stream ended".into(),
            )),
        }
    }
}

#[async_trait]
impl Coordination for EtcdCoordination {
    async fn get(&self, key: &str) -> Result<Option<Versioned>, CoordError> {
        let resp = self
            .client
            .kv_client()
            .get(self.full(key), None)
            .await
            .map_err(backend("get"))?;
        Ok(resp.kvs().first().map(|kv| Versioned {
            value: kv.value().to_vec(),
            version: version(kv.mod_revision()),
        }))
    }

    async fn list(&self, prefix: &str) -> Result<(Vec<(String, Versioned)>, u64), CoordError> {
        let resp = self
            .client
            .kv_client()
            .get(self.full(prefix), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(backend("list"))?;
        let at = version(resp.header().map_or(0, |h| h.revision()));
        let mut items = Vec::with_capacity(resp.kvs().len());
        for kv in resp.kvs() {
            let value = Versioned {
                value: kv.value().to_vec(),
                version: version(kv.mod_revision()),
            };
            items.push((self.relative(kv.key())?, value));
        }
        Ok((items, at))
    }

    async fn put(
        &self,
        key: &str,
        value: &[u8],
        expect: Expect,
        ephemeral: bool,
    ) -> Result<u64, CoordError> {
        let state = *self.state.borrow();
        if ephemeral && state != SessionState::Live {
            return Err(CoordError::SessionEnded(state));
        }
        let options = ephemeral.then(|| PutOptions::new().with_lease(self.lease));
        let write = TxnOp::put(self.full(key), value.to_vec(), options);
        let resp = self.guarded("put", key, expect, write).await?;
        Ok(version(resp.header().map_or(0, |h| h.revision())))
    }

    async fn delete(&self, key: &str, expect: Expect) -> Result<bool, CoordError> {
        let write = TxnOp::delete(self.full(key), None);
        let resp = self.guarded("delete", key, expect, write).await?;
        let ops = resp.op_responses();
        Ok(matches!(ops.first(), Some(TxnOpResponse::Delete(d)) if d.deleted() > 0))
    }

    async fn watch(&self, prefix: &str, after: u64) -> Result<Watch, CoordError> {
        let start = i64::try_from(after.saturating_add(1)).unwrap_or(i64::MAX);
        let options = WatchOptions::new().with_prefix().with_start_revision(start);
        let stream = self
            .client
            .watch_client()
            .watch(self.full(prefix), Some(options))
            .await
            .map_err(backend("watch"))?;
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        let root = format!("{}/", self.root);
        tokio::spawn(forward(stream, root, tx));
        Ok(Watch::new(rx))
    }

    fn session(&self) -> watch::Receiver<SessionState> {
        self.state.subscribe()
    }

    async fn close(&self) -> Result<(), CoordError> {
        self.stop.cancel();
        // A lost session stays lost; revoking its lease again is harmless.
        end_session(&self.state, SessionState::Closed);
        self.client
            .lease_client()
            .revoke(self.lease)
            .await
            .map_err(backend("revoke lease"))?;
        Ok(())
    }

    async fn end_session_of(&self, key: &str, expect: Expect) -> Result<bool, CoordError> {
        // Read the key's lease under the same guard; the lease ended is the one the expected
        // version was written under, even if the key changes after the read.
        let read = TxnOp::get(self.full(key), None);
        let resp = self.guarded("end session", key, expect, read).await?;
        let lease = match resp.op_responses().first() {
            Some(TxnOpResponse::Get(r)) => r.kvs().first().map_or(0, |kv| kv.lease()),
            _ => 0,
        };
        if lease == 0 {
            return Ok(false);
        }
        match self.client.lease_client().revoke(lease).await {
            Ok(_) => Ok(true),
            Err(e) => match self.get(key).await? {
                // Still there as read: the revoke itself failed.
                Some(v) if Expect::Version(v.version) == expect || expect == Expect::Any => {
                    Err(backend("revoke another session's lease")(e))
                }
                // Expired, or ended by someone else meanwhile: not by this call.
                _ => Ok(false),
            },
        }
    }

    fn versions_outlive_processes(&self) -> bool {
        true
    }
}

impl Drop for EtcdCoordination {
    fn drop(&mut self) {
        // Without `close` the lease runs out by itself; stop renewing it.
        self.stop.cancel();
    }
}

/// Forwards an etcd watch until it fails, is compacted past, or the reader goes.
async fn forward(mut stream: etcd_client::WatchStream, root: String, tx: mpsc::Sender<WatchEvent>) {
    loop {
        let resp = match stream.message().await {
            Ok(Some(resp)) => resp,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, "coordination watch failed; the reader lists again");
                return;
            }
        };
        if resp.canceled() || resp.compact_revision() > 0 {
            return;
        }
        for event in resp.events() {
            let Some(kv) = event.kv() else { continue };
            let Some(key) = std::str::from_utf8(kv.key())
                .ok()
                .and_then(|k| k.strip_prefix(root.as_str()))
            else {
                continue;
            };
            let key = key.to_string();
            let version = version(kv.mod_revision());
            let event = match event.event_type() {
                EventType::Put => WatchEvent::Put {
                    key,
                    value: kv.value().to_vec(),
                    version,
                },
                EventType::Delete => WatchEvent::Delete { key, version },
            };
            if tx.send(event).await.is_err() {
                return;
            }
        }
    }
}
