//! One client connection: handshake, keepalive, and the mapping of typed commands onto topics
//! and subscriptions. Errors map to Pulsar's `ServerError` here, in [`server_error`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use futures::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::codec::{FramedRead, FramedWrite};

use super::dedup::Verdict;
use super::subscription::{self, SeekTarget, SubscriptionCommand, SubscriptionHandle};
use super::{Broker, BrokerError, BrokerTopic, PROTOCOL_VERSION, SERVER_VERSION};
use crate::auth::{Action, Principal, Resource};
use crate::ledger::{AppendError, AppendReceipt, Position};
use crate::naming::TopicName;
use crate::protocol::codec::PulsarCodec;
use crate::protocol::command::{self, Inbound, Outbound};
use crate::protocol::frame::entry_message_count;
use crate::protocol::proto::{self, command_ack::AckType, command_subscribe, ServerError};
use crate::schema;

/// Outbound frames queued per connection before the dispatcher waits.
const OUTBOUND_QUEUE: usize = 1024;
/// Receipts in flight per producer before the connection stops reading.
const RECEIPT_QUEUE: usize = 4096;

/// Bytes of metadata a message may carry beyond `broker.max_message_size` (Pulsar's
/// `MESSAGE_SIZE_FRAME_PADDING`).
const METADATA_PADDING: usize = 10 * 1024;

/// Maps broker errors to the wire (the one place for this surface).
fn server_error(e: &BrokerError) -> ServerError {
    match e {
        BrokerError::InvalidTopic(_) => ServerError::InvalidTopicName,
        BrokerError::TopicNotFound(_) => ServerError::TopicNotFound,
        BrokerError::Metadata(_) => ServerError::MetadataError,
        BrokerError::Busy(_) => ServerError::ProducerBusy,
        BrokerError::NotSupported(_) => ServerError::NotAllowedError,
        BrokerError::Storage(_) => ServerError::PersistenceError,
        BrokerError::Schema(schema::SchemaError::Incompatible { .. }) => {
            ServerError::IncompatibleSchema
        }
        BrokerError::Schema(_) => ServerError::MetadataError,
        BrokerError::Denied(_) => ServerError::AuthorizationError,
    }
}

/// What a producer's receipt task answers for one SEND, in SEND order.
enum ReceiptItem {
    /// An append: SEND_RECEIPT once durable, SEND_ERROR if it fails.
    Append {
        sequence_id: u64,
        highest: i64,
        receipt: Result<AppendReceipt, AppendError>,
    },
    /// A duplicate: SEND_RECEIPT with id (-1, -1) at once.
    Duplicate { sequence_id: u64 },
    /// A refusal: SEND_ERROR.
    Refused {
        sequence_id: u64,
        error: ServerError,
        message: String,
    },
}

struct ProducerState {
    topic: Arc<BrokerTopic>,
    name: String,
    receipts: mpsc::Sender<ReceiptItem>,
}

struct ConsumerState {
    topic: Arc<BrokerTopic>,
    subscription: SubscriptionHandle,
}

/// A client connection.
pub struct Connection {
    broker: Arc<Broker>,
    id: u64,
    out: mpsc::Sender<Outbound>,
    producers: HashMap<u64, ProducerState>,
    consumers: HashMap<u64, ConsumerState>,
    /// Who the connection authenticated as on CONNECT (anonymous while authentication is off).
    /// Invariant: `Some` from CONNECT on; every command on a topic is authorized for it.
    principal: Option<Principal>,
}

impl Connection {
    /// Serves one connection until it closes, fails, or the broker stops.
    pub async fn run(broker: Arc<Broker>, stream: TcpStream, peer: SocketAddr) {
        let max = broker.config.max_message_size.as_u64() as usize;
        let (read, write) = stream.into_split();
        let mut frames = FramedRead::new(read, PulsarCodec::new(max));
        let (out, mut out_rx) = mpsc::channel::<Outbound>(OUTBOUND_QUEUE);
        let writer = tokio::spawn(async move {
            let mut sink = FramedWrite::new(write, PulsarCodec::new(max));
            while let Some(first) = out_rx.recv().await {
                if sink.feed(first).await.is_err() {
                    return;
                }
                while let Ok(more) = out_rx.try_recv() {
                    if sink.feed(more).await.is_err() {
                        return;
                    }
                }
                if sink.flush().await.is_err() {
                    return;
                }
            }
        });
        let mut conn = Connection {
            id: broker.next_id(),
            broker: broker.clone(),
            out,
            producers: HashMap::new(),
            consumers: HashMap::new(),
            principal: None,
        };
        tracing::debug!(peer = %peer, conn = conn.id, "connection opened");
        let keepalive = broker.config.keepalive;
        let mut ping = tokio::time::interval(keepalive);
        ping.tick().await;
        let mut last_heard = Instant::now();
        let reason = loop {
            tokio::select! {
                _ = broker.stop.cancelled() => break "broker shutting down".to_string(),
                _ = ping.tick() => {
                    if last_heard.elapsed() > keepalive * 2 {
                        break "keepalive timeout".to_string();
                    }
                    if conn.principal.is_some() {
                        let _ = conn.out.send(command::ping()).await;
                    }
                }
                frame = frames.next() => {
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
        let _ = writer.await;
    }

    async fn send(&self, o: Outbound) {
        let _ = self.out.send(o).await;
    }

    async fn close(&mut self) {
        for (consumer_id, c) in self.consumers.drain() {
            let _ = c
                .subscription
                .tx
                .send(SubscriptionCommand::RemoveConsumer((self.id, consumer_id)));
            if !c.subscription.durable {
                c.topic
                    .subscriptions
                    .lock()
                    .await
                    .remove(&c.subscription.name);
            }
        }
        for (pid, p) in self.producers.drain() {
            p.topic
                .producers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|_, v| !(v.conn == self.id && v.producer_id == pid));
        }
    }

    /// Handles one command; `Err(reason)` closes the connection.
    async fn handle(&mut self, cmd: Inbound) -> Result<(), String> {
        if self.principal.is_none() && !matches!(cmd, Inbound::Connect(_)) {
            return Err("protocol error: command before CONNECT".into());
        }
        match cmd {
            Inbound::Connect(c) => {
                let method = c.auth_method_name.as_deref().unwrap_or("none");
                let data = c.auth_data.as_deref().unwrap_or(&[]);
                match self.broker.access.authenticate(method, data) {
                    Ok(principal) => {
                        tracing::debug!(conn = self.id, %principal, "authenticated");
                        self.principal = Some(principal);
                    }
                    Err(e) => {
                        self.send(command::error(
                            u64::MAX,
                            ServerError::AuthenticationError,
                            e.to_string(),
                        ))
                        .await;
                        return Err(format!("authentication failed: {e}"));
                    }
                }
                let version = c.protocol_version.unwrap_or(0).min(PROTOCOL_VERSION);
                let max = self.broker.config.max_message_size.as_u64() as i32;
                self.send(command::connected(SERVER_VERSION, version, max))
                    .await;
            }
            Inbound::Ping => self.send(command::pong()).await,
            Inbound::Pong => {}
            Inbound::PartitionedMetadata(m) => {
                let partitions = match self.authorized(&m.topic, Action::Lookup).await {
                    Ok(name) => self.broker.partitions(&name).await,
                    Err(e) => Err(e),
                };
                let reply = match partitions {
                    Ok(n) => command::partitioned_metadata(m.request_id, n),
                    // Failures go inside the typed response: the C++ client matches a bare
                    // ERROR only against its other pending requests.
                    Err(e) => command::partitioned_metadata_failed(
                        m.request_id,
                        server_error(&e),
                        e.to_string(),
                    ),
                };
                self.send(reply).await;
            }
            Inbound::Lookup(l) => {
                let reply = match self.authorized(&l.topic, Action::Lookup).await {
                    Ok(_) => command::lookup_connect(l.request_id, &self.broker.service_url),
                    Err(e) => command::lookup_failed(l.request_id, server_error(&e), e.to_string()),
                };
                self.send(reply).await;
            }
            Inbound::Producer(p) => self.add_producer(*p).await,
            Inbound::Send(send, payload) => {
                let Some(producer) = self.producers.get(&send.producer_id) else {
                    self.send(command::send_error(
                        send.producer_id,
                        send.sequence_id,
                        ServerError::NotAllowedError,
                        "unknown producer id",
                    ))
                    .await;
                    return Ok(());
                };
                if !payload.checksum_ok {
                    self.send(command::send_error(
                        send.producer_id,
                        send.sequence_id,
                        ServerError::ChecksumError,
                        "payload checksum mismatch",
                    ))
                    .await;
                    return Ok(());
                }
                // As Pulsar: the limit is on the message payload; its metadata may add up to
                // 10 KiB (clients cut chunks of exactly `max_message_size` payload bytes).
                let max = self.broker.config.max_message_size.as_u64() as usize;
                let body = payload.body().len();
                if body > max || payload.entry.len() > max + METADATA_PADDING {
                    self.send(command::send_error(
                        send.producer_id,
                        send.sequence_id,
                        ServerError::NotAllowedError,
                        format!(
                            "message of {body} payload bytes ({} with metadata) exceeds the \
                             limit of {max} (+{METADATA_PADDING} for metadata)",
                            payload.entry.len()
                        ),
                    ))
                    .await;
                    return Ok(());
                }
                let sequence_id = send.sequence_id;
                let highest = super::dedup::highest_sequence_id(
                    sequence_id,
                    send.highest_sequence_id
                        .or(payload.metadata.highest_sequence_id),
                    send.num_messages.or(payload.metadata.num_messages_in_batch),
                );
                if let Some(parts) = producer.topic.dedup() {
                    let verdict = parts
                        .live
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .check(&producer.name, highest);
                    let item = match verdict {
                        Verdict::New => None,
                        Verdict::Duplicate => Some(ReceiptItem::Duplicate { sequence_id }),
                        Verdict::Unknown => Some(ReceiptItem::Refused {
                            sequence_id,
                            error: ServerError::PersistenceError,
                            message:
                                "Cannot determine whether the message is a duplicate at this time"
                                    .into(),
                        }),
                    };
                    if let Some(item) = item {
                        let _ = producer.receipts.send(item).await;
                        return Ok(());
                    }
                }
                let publish_time = payload.metadata.publish_time as i64;
                // Awaiting here is the backpressure: while the log is full this connection is
                // not read.
                let receipt = producer
                    .topic
                    .log
                    .append(publish_time, payload.entry.clone())
                    .await;
                let _ = producer
                    .receipts
                    .send(ReceiptItem::Append {
                        sequence_id,
                        highest,
                        receipt,
                    })
                    .await;
            }
            Inbound::CloseProducer(c) => {
                if let Some(p) = self.producers.remove(&c.producer_id) {
                    p.topic
                        .producers
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&p.name);
                }
                self.send(command::success(c.request_id)).await;
            }
            Inbound::Subscribe(s) => self.subscribe(*s).await,
            Inbound::Flow(f) => {
                if let Some(c) = self.consumers.get(&f.consumer_id) {
                    let _ = c.subscription.tx.send(SubscriptionCommand::Flow(
                        (self.id, f.consumer_id),
                        f.message_permits,
                    ));
                }
            }
            Inbound::Ack(a) => {
                if let Some(c) = self.consumers.get(&a.consumer_id) {
                    let positions = a
                        .message_id
                        .iter()
                        .map(|m| {
                            let partial = (!m.ack_set.is_empty()).then(|| m.ack_set.clone());
                            (Position::new(m.ledger_id, m.entry_id), partial)
                        })
                        .collect();
                    let _ = c.subscription.tx.send(SubscriptionCommand::Ack {
                        key: (self.id, a.consumer_id),
                        positions,
                        cumulative: a.ack_type == AckType::Cumulative as i32,
                    });
                }
            }
            Inbound::Redeliver(r) => {
                if let Some(c) = self.consumers.get(&r.consumer_id) {
                    let _ = c
                        .subscription
                        .tx
                        .send(SubscriptionCommand::Redeliver((self.id, r.consumer_id)));
                }
            }
            Inbound::CloseConsumer(c) => {
                self.remove_consumer(c.consumer_id, false).await;
                self.send(command::success(c.request_id)).await;
            }
            Inbound::Unsubscribe(u) => {
                self.remove_consumer(u.consumer_id, true).await;
                self.send(command::success(u.request_id)).await;
            }
            Inbound::GetLastMessageId(g) => self.last_message_id(g).await,
            Inbound::GetSchema(g) => {
                let result = match self.authorized(&g.topic, Action::Lookup).await {
                    Ok(name) => {
                        let wanted = g
                            .schema_version
                            .as_deref()
                            .and_then(crate::naming::schema_version_from_bytes);
                        match schema::versions(&self.broker.metadata(), &name.base().to_string())
                            .await
                        {
                            Ok(all) => {
                                let found = match wanted {
                                    Some(v) => all.into_iter().find(|(n, _)| *n == v),
                                    None => all.into_iter().last(),
                                };
                                found
                                    .map(|(v, sc)| (sc, crate::naming::schema_version_bytes(v)))
                                    .ok_or((
                                        ServerError::TopicNotFound,
                                        "schema not found".to_string(),
                                    ))
                            }
                            Err(e) => Err((ServerError::MetadataError, e.to_string())),
                        }
                    }
                    Err(e) => Err((server_error(&e), e.to_string())),
                };
                self.send(command::get_schema_response(g.request_id, result))
                    .await;
            }
            Inbound::Seek(s) => self.seek(s).await,
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

    /// `name` parsed, once the connection's principal is authorized to do `action` on it
    /// (a partition is authorized as its partitioned topic).
    async fn authorized(&self, name: &str, action: Action) -> Result<TopicName, BrokerError> {
        let name = name.parse::<TopicName>()?;
        let principal = self
            .principal
            .as_ref()
            .ok_or_else(|| BrokerError::NotSupported("command before CONNECT".into()))?;
        self.broker
            .access
            .authorize(principal, action, &Resource::Topic(name.base()))
            .await?;
        Ok(name)
    }

    /// The topic partition `name` for `action`, or `None` after answering ERROR for
    /// `request_id`.
    async fn open_topic(
        &mut self,
        name: &str,
        action: Action,
        request_id: u64,
    ) -> Option<Arc<BrokerTopic>> {
        let topic = match self.authorized(name, action).await {
            Ok(name) => self.broker.topic(&name).await,
            Err(e) => Err(e),
        };
        match topic {
            Ok(t) => Some(t),
            Err(e) => {
                self.send(command::error(request_id, server_error(&e), e.to_string()))
                    .await;
                None
            }
        }
    }

    async fn add_producer(&mut self, p: proto::CommandProducer) {
        let Some(topic) = self
            .open_topic(&p.topic, Action::Produce, p.request_id)
            .await
        else {
            return;
        };
        let schema_version = match &p.schema {
            Some(sc) => {
                match schema::resolve(&self.broker.metadata(), &topic.name.base().to_string(), sc)
                    .await
                {
                    Ok(v) => Some(crate::naming::schema_version_bytes(v)),
                    Err(e) => {
                        let e = BrokerError::from(e);
                        self.send(command::error(
                            p.request_id,
                            server_error(&e),
                            e.to_string(),
                        ))
                        .await;
                        return;
                    }
                }
            }
            None => None,
        };
        let name = p
            .producer_name
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| self.broker.generate_producer_name());
        let exclusive = p
            .producer_access_mode
            .is_some_and(|m| m != proto::ProducerAccessMode::Shared as i32);
        let refused = {
            let mut producers = topic.producers.lock().unwrap_or_else(|e| e.into_inner());
            let busy =
                producers.values().any(|v| v.exclusive) || (exclusive && !producers.is_empty());
            if busy {
                Some("topic has an exclusive producer")
            } else if producers.contains_key(&name) {
                Some("a producer with this name is already connected")
            } else {
                producers.insert(
                    name.clone(),
                    super::ProducerSlot {
                        conn: self.id,
                        producer_id: p.producer_id,
                        exclusive,
                        out: self.out.clone(),
                    },
                );
                None
            }
        };
        if let Some(why) = refused {
            self.send(command::error(p.request_id, ServerError::ProducerBusy, why))
                .await;
            return;
        }
        let (tx, mut rx) = mpsc::channel::<ReceiptItem>(RECEIPT_QUEUE);
        let out = self.out.clone();
        let producer_id = p.producer_id;
        let receipt_topic = topic.clone();
        let receipt_name = name.clone();
        tokio::spawn(async move {
            // Receipts resolve in append order; answering items in arrival order keeps
            // SEND_RECEIPTs in SEND order.
            let partition = receipt_topic.partition;
            while let Some(item) = rx.recv().await {
                let frame = match item {
                    ReceiptItem::Duplicate { sequence_id } => command::send_receipt(
                        producer_id,
                        sequence_id,
                        command::message_id(u64::MAX, u64::MAX, partition, None),
                    ),
                    ReceiptItem::Refused {
                        sequence_id,
                        error,
                        message,
                    } => command::send_error(producer_id, sequence_id, error, message),
                    ReceiptItem::Append {
                        sequence_id,
                        highest,
                        receipt,
                    } => {
                        let result = match receipt {
                            Ok(r) => r.durable().await,
                            Err(e) => Err(e),
                        };
                        if let Some(parts) = receipt_topic.dedup() {
                            let mut live = parts.live.lock().unwrap_or_else(|e| e.into_inner());
                            match &result {
                                Ok(_) => live.persisted(&receipt_name, highest),
                                Err(_) => live.failed(&receipt_name),
                            }
                        }
                        match result {
                            Ok(pos) => command::send_receipt(
                                producer_id,
                                sequence_id,
                                command::message_id(pos.ledger, pos.entry, partition, None),
                            ),
                            Err(e) => command::send_error(
                                producer_id,
                                sequence_id,
                                ServerError::PersistenceError,
                                e.to_string(),
                            ),
                        }
                    }
                };
                if out.send(frame).await.is_err() {
                    return;
                }
            }
        });
        self.producers.insert(
            p.producer_id,
            ProducerState {
                topic,
                name: name.clone(),
                receipts: tx,
            },
        );
        let last_sequence_id = self.producers[&p.producer_id]
            .topic
            .dedup()
            .map_or(-1, |parts| {
                parts
                    .live
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .last_sequence_id(&name)
            });
        self.send(command::producer_success(
            p.request_id,
            &name,
            last_sequence_id,
            schema_version,
        ))
        .await;
    }

    async fn subscribe(&mut self, s: proto::CommandSubscribe) {
        let Some(topic) = self
            .open_topic(&s.topic, Action::Consume, s.request_id)
            .await
        else {
            return;
        };
        if let Some(sc) = &s.schema {
            if let Err(e) =
                schema::resolve(&self.broker.metadata(), &topic.name.base().to_string(), sc).await
            {
                let e = BrokerError::from(e);
                self.send(command::error(
                    s.request_id,
                    server_error(&e),
                    e.to_string(),
                ))
                .await;
                return;
            }
        }
        let sub_type = command_subscribe::SubType::try_from(s.sub_type)
            .unwrap_or(command_subscribe::SubType::Exclusive);
        let durable = s.durable.unwrap_or(true);
        let handle = {
            let mut subs = topic.subscriptions.lock().await;
            match subs.get(&s.subscription) {
                Some(h) => h.clone(),
                None => {
                    let start = start_position(&topic, &s);
                    let h = subscription::spawn(
                        topic.clone(),
                        s.subscription.clone(),
                        sub_type,
                        durable,
                        start,
                        None,
                        self.broker.config.cursor_persist_interval,
                    );
                    subs.insert(s.subscription.clone(), h.clone());
                    h
                }
            }
        };
        let result = handle
            .ask(|reply| SubscriptionCommand::AddConsumer {
                key: (self.id, s.consumer_id),
                sub_type,
                name: s.consumer_name.clone().unwrap_or_default(),
                priority: s.priority_level.unwrap_or(0),
                out: self.out.clone(),
                reply,
            })
            .await;
        match result {
            Some(Ok(())) => {
                self.consumers.insert(
                    s.consumer_id,
                    ConsumerState {
                        topic,
                        subscription: handle,
                    },
                );
                self.send(command::success(s.request_id)).await;
            }
            Some(Err(why)) => {
                self.send(command::error(s.request_id, ServerError::ConsumerBusy, why))
                    .await;
            }
            None => {
                self.send(command::error(
                    s.request_id,
                    ServerError::ServiceNotReady,
                    "subscription stopped",
                ))
                .await;
            }
        }
    }

    async fn remove_consumer(&mut self, consumer_id: u64, unsubscribe: bool) {
        let Some(c) = self.consumers.remove(&consumer_id) else {
            return;
        };
        let _ = c
            .subscription
            .tx
            .send(SubscriptionCommand::RemoveConsumer((self.id, consumer_id)));
        if unsubscribe || !c.subscription.durable {
            c.topic
                .subscriptions
                .lock()
                .await
                .remove(&c.subscription.name);
            if unsubscribe {
                c.subscription.ask(SubscriptionCommand::Delete).await;
            }
        }
    }

    async fn seek(&mut self, s: proto::CommandSeek) {
        let Some(c) = self.consumers.remove(&s.consumer_id) else {
            self.send(command::error(
                s.request_id,
                ServerError::ConsumerNotFound,
                "unknown consumer id",
            ))
            .await;
            return;
        };
        let to = match (&s.message_id, s.message_publish_time) {
            (Some(id), _) => SeekTarget::Position(Position::new(id.ledger_id, id.entry_id)),
            (None, Some(t)) => SeekTarget::PublishTime(t as i64),
            (None, None) => {
                self.send(command::error(
                    s.request_id,
                    ServerError::MetadataError,
                    "SEEK needs a message id or a publish time",
                ))
                .await;
                return;
            }
        };
        let result = c
            .subscription
            .ask(|reply| SubscriptionCommand::Seek { to, reply })
            .await;
        match result {
            Some(Ok(())) => self.send(command::success(s.request_id)).await,
            Some(Err(why)) => {
                self.send(command::error(s.request_id, ServerError::UnknownError, why))
                    .await
            }
            None => {
                self.send(command::error(
                    s.request_id,
                    ServerError::ServiceNotReady,
                    "subscription stopped",
                ))
                .await
            }
        }
    }

    async fn last_message_id(&mut self, g: proto::CommandGetLastMessageId) {
        let Some(c) = self.consumers.get(&g.consumer_id) else {
            self.send(command::error(
                g.request_id,
                ServerError::ConsumerNotFound,
                "unknown consumer id",
            ))
            .await;
            return;
        };
        let partition = c.topic.partition;
        let last = match c.topic.log.last_confirmed() {
            None => command::message_id(u64::MAX, u64::MAX, partition, Some(-1)),
            Some(pos) => {
                // The last entry may be in the lake only: read it through replay.
                let mut reader =
                    crate::replay::EntryReader::new(c.topic.log.clone(), c.topic.lake.clone());
                let batch_index = match reader.read_entry(pos).await {
                    Ok(e) => {
                        let n = entry_message_count(&e.payload) as i32;
                        Some(if n > 1 { n - 1 } else { -1 })
                    }
                    Err(_) => Some(-1),
                };
                command::message_id(pos.ledger, pos.entry, partition, batch_index)
            }
        };
        let mark = c
            .subscription
            .ask(SubscriptionCommand::MarkDelete)
            .await
            .flatten()
            .map(|p| command::message_id(p.ledger, p.entry, partition, None));
        self.send(command::last_message_id(g.request_id, last, mark))
            .await;
    }
}

/// Where a new subscription starts: a reader's start message id, else the initial position.
fn start_position(topic: &BrokerTopic, s: &proto::CommandSubscribe) -> Position {
    let after_last = || {
        topic.log.last_confirmed().map_or(Position::new(0, 0), |p| {
            Position::new(p.ledger, p.entry + 1)
        })
    };
    if let Some(id) = &s.start_message_id {
        return match (id.ledger_id, id.entry_id) {
            (u64::MAX, u64::MAX) => topic.log.first_position(),
            (l, e) if l == i64::MAX as u64 && e == i64::MAX as u64 => after_last(),
            // The broker redelivers the whole start entry; the client filters by batch index.
            (l, e) => Position::new(l, e),
        };
    }
    match s.initial_position {
        Some(p) if p == command_subscribe::InitialPosition::Earliest as i32 => {
            topic.log.first_position()
        }
        _ => after_last(),
    }
}
