//! One client connection: the socket, the handshake, keepalive, and the dispatch of typed
//! commands to one handler per command kind ([`lookup`], [`produce`], [`consume`]).
//!
//! Slow steps never block the connection's read loop: loading a topic (PRODUCER, SUBSCRIBE),
//! metadata reads (LOOKUP, PARTITIONED_METADATA, GET_SCHEMA) and lake reads (SEEK,
//! GET_LAST_MESSAGE_ID) run as deferred futures whose completions the loop picks up, so a topic
//! that loads slowly delays only the commands that wait for it, never the other producers and
//! consumers on the same connection.
//!
//! Invariants:
//! - Frames leave through one queue (`out`) drained by one writer task: never interleaved.
//! - Every command on a topic is authorized for the connection's principal first.
//! - Broker failures reach the wire through [`super::error::server_error`] only.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use futures::stream::FuturesUnordered;
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::{FramedRead, FramedWrite};
use tokio_util::sync::CancellationToken;

use super::backlog::ClientInfo;
use super::error::server_error;
use super::outbox::{message_bytes, outbox, Outbox};
use super::{Broker, BrokerError, BrokerTopic};
use crate::auth::{Action, Principal, Resource};
use crate::naming::TopicName;
use crate::protocol::codec::PulsarCodec;
use crate::protocol::command::{self, Inbound, Outbound};
use crate::protocol::inbound;
use crate::protocol::proto::ServerError;

mod consume;
mod lookup;
mod produce;

/// A slow step of a command, run beside the read loop.
type Deferred = Pin<Box<dyn Future<Output = Completion> + Send>>;

/// What a deferred step hands back to the connection.
enum Completion {
    /// A PRODUCER's topic (and schema version) is ready, or failed.
    Producer(Box<inbound::Producer>, Result<produce::Opened, BrokerError>),
    /// A SUBSCRIBE's consumer is attached, or it failed.
    Subscribe(
        Box<inbound::Subscribe>,
        Result<consume::Joined, BrokerError>,
    ),
    /// A finished reply to send.
    Reply(Box<Outbound>),
}

impl Completion {
    fn reply(o: Outbound) -> Completion {
        Completion::Reply(Box::new(o))
    }
}

/// A PRODUCER or SUBSCRIBE in progress for one id.
#[derive(Debug, Clone)]
struct Opening {
    request_id: u64,
    /// Cancelled when the client closes the id meanwhile (a request waiting on it, such as a
    /// `WaitForExclusive` producer's turn, gives up).
    cancelled: CancellationToken,
}

/// Records request `request_id` for `id`, unless one is already in progress; the token its
/// close cancels.
fn begin_opening(
    map: &mut HashMap<u64, Opening>,
    id: u64,
    request_id: u64,
    what: &str,
) -> Result<CancellationToken, BrokerError> {
    if map.contains_key(&id) {
        return Err(BrokerError::Stopped(format!(
            "{what} {id} is still being created on this connection; retry"
        )));
    }
    let cancelled = CancellationToken::new();
    map.insert(
        id,
        Opening {
            request_id,
            cancelled: cancelled.clone(),
        },
    );
    Ok(cancelled)
}

/// Marks the request in progress for `id` (if any) cancelled.
fn cancel_opening(map: &mut HashMap<u64, Opening>, id: u64) {
    if let Some(o) = map.get(&id) {
        o.cancelled.cancel();
    }
}

/// Ends request `request_id` for `id`; whether it may register (not cancelled).
fn finish_opening(map: &mut HashMap<u64, Opening>, id: u64, request_id: u64) -> bool {
    match map.get(&id) {
        Some(o) if o.request_id == request_id => {
            let current = !o.cancelled.is_cancelled();
            map.remove(&id);
            current
        }
        _ => false,
    }
}

/// Frames the writer writes before it flushes and settles the queue's count.
const WRITE_BATCH: usize = 64;

/// The longest a closing connection waits for its last frames to be written.
const WRITER_DRAIN: std::time::Duration = std::time::Duration::from_secs(2);

/// A client connection.
pub struct Connection {
    broker: Arc<Broker>,
    id: u64,
    /// The client's address (its host identifies its consumers for the subscribe rate).
    peer: SocketAddr,
    /// The client's address and version (from CONNECT on), shown in its consumers' and
    /// producers' stats.
    client: Arc<ClientInfo>,
    out: Outbox,
    producers: HashMap<u64, produce::ProducerState>,
    consumers: HashMap<u64, consume::ConsumerState>,
    /// Producer and consumer ids whose PRODUCER / SUBSCRIBE is still deferred. Invariant: at
    /// most one request per id is in progress (another one for the same id is refused with
    /// ServiceNotReady, which clients retry, as Pulsar does); a request whose id the client
    /// closed meanwhile is cancelled, and its registration is undone when it completes.
    opening_producers: HashMap<u64, Opening>,
    opening_consumers: HashMap<u64, Opening>,
    /// Slow steps in progress.
    deferred: FuturesUnordered<Deferred>,
    /// Who the connection authenticated as on CONNECT (anonymous while authentication is off).
    /// Invariant: `Some` from CONNECT on; every command on a topic is authorized for it; its
    /// role never changes (a refresh naming another role closes the connection).
    principal: Option<Principal>,
    /// The CONNECT's authentication method and whether the client answers AUTH_CHALLENGE.
    auth_method: String,
    supports_auth_refresh: bool,
    /// An AUTH_CHALLENGE is unanswered. Invariant: set only while the principal has expired.
    refresh_pending: bool,
    /// While set, a publish rate limit of one of this connection's producers is in debt and
    /// no frame is read until then (Pulsar's throttling: nothing is refused or dropped).
    throttled_until: Option<tokio::time::Instant>,
}

impl Connection {
    /// Serves one connection until it closes, fails, or the broker stops.
    /// The stream is plain TCP (`pulsar://`) or TLS (`pulsar+ssl://`).
    pub async fn run<S>(broker: Arc<Broker>, stream: S, peer: SocketAddr)
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let max = broker.config.max_message_size.as_u64() as usize;
        let (read, write) = tokio::io::split(stream);
        let mut frames = FramedRead::new(read, PulsarCodec::new(max));
        let (out, mut out_rx) = outbox();
        let writer = tokio::spawn(async move {
            let mut sink = FramedWrite::new(write, PulsarCodec::new(max));
            while let Some(first) = out_rx.rx.recv().await {
                let mut bytes = message_bytes(&first);
                if sink.feed(first).await.is_err() {
                    return;
                }
                // Settle in bounded batches: a queue that keeps filling must not keep the
                // connection unwritable for its consumers.
                for _ in 1..WRITE_BATCH {
                    let Ok(more) = out_rx.rx.try_recv() else {
                        break;
                    };
                    bytes += message_bytes(&more);
                    if sink.feed(more).await.is_err() {
                        return;
                    }
                }
                if sink.flush().await.is_err() {
                    return;
                }
                out_rx.written(bytes);
            }
            // Every sender is gone: end the stream (a TLS close_notify, a TCP FIN).
            let _ = sink.close().await;
        });
        let mut conn = Connection {
            id: broker.next_id(),
            peer,
            client: Arc::new(ClientInfo {
                address: format!("/{peer}"),
                version: String::new(),
            }),
            broker: broker.clone(),
            out,
            producers: HashMap::new(),
            consumers: HashMap::new(),
            opening_producers: HashMap::new(),
            opening_consumers: HashMap::new(),
            deferred: FuturesUnordered::new(),
            principal: None,
            auth_method: String::new(),
            supports_auth_refresh: false,
            refresh_pending: false,
            throttled_until: None,
        };
        tracing::debug!(peer = %peer, conn = conn.id, "connection opened");
        let keepalive = broker.config.keepalive;
        let mut ping = tokio::time::interval(keepalive);
        ping.tick().await;
        let mut last_heard = Instant::now();
        let mut refresh_check =
            tokio::time::interval(broker.config.authentication.refresh_check_interval);
        refresh_check.tick().await;
        let reason = loop {
            tokio::select! {
                _ = broker.stop.cancelled() => break "broker shutting down".to_string(),
                _ = refresh_check.tick(), if broker.access.required() => {
                    if let Err(reason) = conn.check_credentials().await {
                        break reason;
                    }
                }
                _ = ping.tick() => {
                    if conn.throttled_until.is_none() && last_heard.elapsed() > keepalive * 2 {
                        break "keepalive timeout".to_string();
                    }
                    if conn.principal.is_some() {
                        let _ = conn.out.send(command::ping()).await;
                    }
                }
                Some(done) = conn.deferred.next(), if !conn.deferred.is_empty() => {
                    conn.complete(done).await;
                }
                _ = sleep_until_some(conn.throttled_until), if conn.throttled_until.is_some() => {
                    conn.throttled_until = None;
                    // Frames the client sent meanwhile are waiting unread.
                    last_heard = Instant::now();
                }
                frame = frames.next(), if conn.throttled_until.is_none() => {
                    last_heard = Instant::now();
                    match frame {
                        None => break "closed by client".to_string(),
                        Some(Err(e)) => break format!("protocol error: {e}"),
                        Some(Ok(cmd)) => {
                            if let Err(reason) = conn.handle(cmd).await {
                                break reason;
                            }
                        }
                    }
                }
            }
        };
        tracing::debug!(peer = %peer, conn = conn.id, %reason, "connection closed");
        conn.close().await;
        drop(conn);
        // A peer that stopped reading must not hold up the broker's shutdown.
        let abort = writer.abort_handle();
        if tokio::time::timeout(WRITER_DRAIN, writer).await.is_err() {
            abort.abort();
        }
    }

    /// Queues `o` for the writer (waits while the queue is full). The future owns a clone of
    /// the queue's sender, so it borrows nothing of the connection.
    fn send(&self, o: Outbound) -> impl Future<Output = ()> + Send + 'static {
        let out = self.out.clone();
        async move {
            let _ = out.send(o).await;
        }
    }

    /// Runs `fut` beside the read loop; its completion comes back to [`Connection::complete`].
    fn defer(&mut self, fut: impl Future<Output = Completion> + Send + 'static) {
        self.deferred.push(Box::pin(fut));
    }

    async fn complete(&mut self, done: Completion) {
        match done {
            Completion::Producer(p, opened) => self.finish_producer(*p, opened).await,
            Completion::Subscribe(s, joined) => self.finish_subscribe(*s, joined).await,
            Completion::Reply(o) => self.send(*o).await,
        }
    }

    /// The principal, for a deferred step (commands before CONNECT never get here).
    fn principal(&self) -> Principal {
        self.principal.clone().unwrap_or_else(Principal::anonymous)
    }

    async fn close(&mut self) {
        self.close_consumers().await;
        self.close_producers().await;
    }

    /// Handles one command; `Err(reason)` closes the connection.
    async fn handle(&mut self, cmd: Inbound) -> Result<(), String> {
        if self.principal.is_none() && !matches!(cmd, Inbound::Connect(_)) {
            return Err("protocol error: command before CONNECT".into());
        }
        match cmd {
            Inbound::Connect(c) => return self.on_connect(c).await,
            Inbound::Ping => self.send(command::pong()).await,
            Inbound::Pong => {}
            Inbound::PartitionedMetadata(m) => self.on_partitioned_metadata(m),
            Inbound::Lookup(l) => self.on_lookup(l),
            Inbound::GetSchema(g) => self.on_get_schema(g),
            Inbound::Producer(p) => self.begin_producer(p).await,
            Inbound::Send(send, payload) => self.on_send(send, *payload).await,
            Inbound::CloseProducer(c) => self.on_close_producer(c).await,
            Inbound::Subscribe(s) => self.begin_subscribe(s).await,
            Inbound::Flow(f) => self.on_flow(f),
            Inbound::Ack(a) => self.on_ack(a),
            Inbound::Redeliver(r) => self.on_redeliver(r),
            Inbound::CloseConsumer(c) => {
                let _ = self.remove_consumer(c.consumer_id, false).await;
                self.send(command::success(c.request_id)).await;
            }
            Inbound::Unsubscribe(u) if !self.consumers.contains_key(&u.consumer_id) => {
                // A consumer this connection does not have (or is still opening) cannot
                // unsubscribe; nothing changes. Pulsar refuses it too, with MetadataError
                // "Consumer not found"; here ConsumerNotFound, as for every command naming
                // a consumer the connection does not have.
                let e = BrokerError::UnknownClient(format!("consumer {} not found", u.consumer_id));
                let refused = command::error(u.request_id, server_error(&e), e.to_string());
                self.send(refused).await;
            }
            Inbound::Unsubscribe(u) => {
                // Not reported done when the cursor stayed (a later owner fenced the topic and
                // keeps the subscription). The consumer is detached here already, so it is
                // then closed too, after the error: it looks the topic up again and reaches
                // the new owner, where it may unsubscribe again.
                match self.remove_consumer(u.consumer_id, true).await {
                    Ok(()) => self.send(command::success(u.request_id)).await,
                    Err(e) => {
                        let refused = command::error(u.request_id, server_error(&e), e.to_string());
                        self.send(refused).await;
                        self.send(command::close_consumer(u.consumer_id)).await;
                    }
                }
            }
            Inbound::GetLastMessageId(g) => self.on_last_message_id(g).await,
            Inbound::Seek(s) => self.on_seek(s).await,
            Inbound::AuthResponse(r) => return self.on_auth_response(r),
            Inbound::Unsupported { kind, request_id } => {
                tracing::debug!(conn = self.id, kind, "unsupported command");
                if let Some(id) = request_id {
                    self.send(command::error(
                        id,
                        ServerError::NotAllowedError,
                        format!("command type {kind} is not supported by this broker"),
                    ))
                    .await;
                }
            }
        }
        Ok(())
    }
}

/// Sleeps until `at` (forever when `None`; the caller guards the branch).
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// `name` parsed, once `principal` is authorized to do `action` on it (a partition is
/// authorized as its partitioned topic), through `subscription` when it consumes.
async fn authorized(
    broker: &Broker,
    principal: &Principal,
    name: &str,
    action: Action,
    subscription: Option<&str>,
) -> Result<TopicName, BrokerError> {
    let name = name.parse::<TopicName>()?;
    let on = match subscription {
        Some(sub) => Resource::Subscription {
            topic: name.base(),
            name: sub.to_string(),
        },
        None => Resource::Topic(name.base()),
    };
    broker.access.authorize(principal, action, &on).await?;
    Ok(name)
}

/// The topic partition `name` for `action` (through `subscription` when it consumes):
/// authorized, then loaded (or created).
async fn open_topic(
    broker: &Broker,
    principal: &Principal,
    name: &str,
    action: Action,
    subscription: Option<&str>,
) -> Result<Arc<BrokerTopic>, BrokerError> {
    let name = authorized(broker, principal, name, action, subscription).await?;
    broker.topic(&name).await
}

/// An ERROR reply for `request_id` carrying `e`.
fn error_reply(request_id: u64, e: &BrokerError) -> Outbound {
    command::error(request_id, server_error(e), e.to_string())
}
