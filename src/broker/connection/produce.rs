//! Producers on a connection: PRODUCER (the topic loads beside the read loop), SEND (checks,
//! deduplication verdict, append with the log's backpressure), CLOSE_PRODUCER, and each
//! producer's receipt task, which answers SENDs strictly in SEND order.
//!
//! Invariant: a broker-initiated CLOSE_PRODUCER leaves after the answer to every SEND the
//! topic's owner took. A SEND's receipt is queued before the SEND reaches the owner, and the
//! owner's close (a cancelled token) makes the receipt task answer what is queued, then close;
//! a client thus never resends a message that was stored (a duplicate without deduplication).

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::{
    begin_opening, cancel_opening, error_reply, finish_opening, open_topic, Completion, Connection,
};
use crate::auth::Action;
use crate::broker::dedup::highest_sequence_id;
use crate::broker::error::server_error;
use crate::broker::publisher::PublisherMeasure;
use crate::broker::topic::{ProducerSlot, Published};
use crate::broker::{BrokerError, BrokerTopic};
use crate::naming::schema_version_bytes;
use crate::protocol::command;
use crate::protocol::frame::Payload;
use crate::protocol::inbound::Producer;
use crate::protocol::proto::{self, ServerError};
use crate::schema;

/// Receipts in flight per producer before the connection stops reading.
const RECEIPT_QUEUE: usize = 4096;

/// Bytes of metadata a message may carry beyond `broker.max_message_size` (Pulsar's
/// `MESSAGE_SIZE_FRAME_PADDING`).
const METADATA_PADDING: usize = 10 * 1024;

/// A PRODUCER registered with its topic's owner, with its name, its `last_sequence_id`, the
/// schema version its schema resolved to and the token its owner cancels to close it.
pub(super) struct Opened {
    registration: Registration,
    close: CancellationToken,
    last_sequence_id: i64,
    schema_version: Option<Vec<u8>>,
}

/// A producer's registration with its topic's owner, undone when dropped unless kept (so a
/// PRODUCER whose connection closed, or that the client closed, while it was created does not
/// hold its name for ever).
pub(super) struct Registration {
    topic: Arc<BrokerTopic>,
    publisher: Arc<PublisherMeasure>,
    conn: u64,
    kept: bool,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        let (topic, name) = (self.topic.clone(), self.publisher.name.to_string());
        let (conn, producer_id) = (self.conn, self.publisher.producer_id);
        tokio::spawn(async move { topic.remove_producer(name, conn, producer_id).await });
    }
}

/// What a `WaitForExclusive` producer's registration needs besides the slot.
#[derive(Clone, Copy)]
struct Waits<'a> {
    /// Its connection's outbox, for the not-ready PRODUCER_SUCCESS.
    out: &'a crate::broker::outbox::Outbox,
    /// Its PRODUCER's request id.
    request_id: u64,
    /// Cancelled when the client closes the producer meanwhile.
    abandoned: &'a CancellationToken,
}

/// Registers `slot` with `topic`'s owner. A `WaitForExclusive` producer (`waits`) may wait its
/// turn there; its client is told so at once (PRODUCER_SUCCESS, not ready), and a close
/// meanwhile gives its turn up (the owner skips a waiter nobody waits for).
async fn register(
    topic: &Arc<BrokerTopic>,
    slot: ProducerSlot,
    waits: Option<Waits<'_>>,
) -> Result<i64, BrokerError> {
    // Armed until the owner's answer is in hand: given up or dropped before (the client
    // closed the producer, the connection went), a registration the owner may have made
    // meanwhile is taken out again.
    let mut undo = Unregister {
        topic: topic.clone(),
        name: slot.publisher.name.to_string(),
        conn: slot.conn,
        producer_id: slot.publisher.producer_id,
        armed: true,
    };
    let Some(waits) = waits else {
        let done = topic.add_producer(slot, None).await;
        undo.armed = false;
        return done;
    };
    let (queued, told) = oneshot::channel();
    let registered = topic.add_producer(slot, Some(queued));
    tokio::pin!(registered);
    let gave_up = || {
        Err(BrokerError::Stopped(
            "the producer was closed while it waited".into(),
        ))
    };
    tokio::select! {
        biased;
        done = &mut registered => {
            undo.armed = false;
            return done;
        }
        () = waits.abandoned.cancelled() => return gave_up(),
        Ok(()) = told => {}
    }
    // Sent before the answer can be: the ready PRODUCER_SUCCESS follows it.
    let _ = waits
        .out
        .send(command::producer_waiting(waits.request_id, &undo.name))
        .await;
    tokio::select! {
        biased;
        done = &mut registered => {
            undo.armed = false;
            done
        }
        () = waits.abandoned.cancelled() => gave_up(),
    }
}

/// Takes a producer out of its topic's registry when dropped armed ([`register`]); a no-op
/// when the owner has no such registration (it matches the connection and producer id).
struct Unregister {
    topic: Arc<BrokerTopic>,
    name: String,
    conn: u64,
    producer_id: u64,
    armed: bool,
}

impl Drop for Unregister {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (topic, name) = (self.topic.clone(), std::mem::take(&mut self.name));
            let (conn, producer_id) = (self.conn, self.producer_id);
            rt.spawn(async move { topic.remove_producer(name, conn, producer_id).await });
        }
    }
}

/// One SEND for its producer's receipt task to answer, in SEND order: SEND_RECEIPT once
/// settled, SEND_ERROR if it fails.
struct ReceiptItem {
    sequence_id: u64,
    settled: oneshot::Receiver<Published>,
}

/// A producer registered on this connection.
pub(super) struct ProducerState {
    topic: Arc<BrokerTopic>,
    /// Its registration (name, id, the counters of its appends).
    publisher: Arc<PublisherMeasure>,
    receipts: mpsc::Sender<ReceiptItem>,
}

impl Connection {
    /// PRODUCER: authorizes and loads the topic, resolves the schema and registers the producer
    /// with the topic's owner, beside the read loop.
    pub(super) async fn begin_producer(&mut self, p: Box<Producer>) {
        let opening = &mut self.opening_producers;
        let abandoned = match begin_opening(opening, p.producer_id, p.request_id, "producer") {
            Ok(token) => token,
            Err(e) => return self.send(error_reply(p.request_id, &e)).await,
        };
        let (broker, principal, conn) = (self.broker.clone(), self.principal(), self.id);
        let (client, out) = (self.client.clone(), self.out.clone());
        let close = CancellationToken::new();
        self.defer(async move {
            let opened = async {
                let mut topic =
                    open_topic(&broker, &principal, &p.topic, Action::Produce, None).await?;
                let schema_version = match &p.schema {
                    Some(sc) => {
                        let base = topic.name.base().to_string();
                        let v = schema::resolve(&broker.metadata(), &base, sc).await?;
                        Some(schema_version_bytes(v))
                    }
                    None => None,
                };
                let name = p
                    .name
                    .clone()
                    .unwrap_or_else(|| broker.generate_producer_name());
                let publisher = Arc::new(PublisherMeasure::new(
                    p.producer_id,
                    Arc::from(name),
                    p.access_mode,
                    client,
                ));
                let slot = ProducerSlot {
                    conn,
                    exclusive: p.exclusive,
                    close: close.clone(),
                    publisher: publisher.clone(),
                };
                let waits = (p.wait_for_exclusive).then_some(Waits {
                    out: &out,
                    request_id: p.request_id,
                    abandoned: &abandoned,
                });
                let last_sequence_id = match register(&topic, slot.clone(), waits).await {
                    // Unloaded (idle) between the lookup and the registration: load it again.
                    Err(BrokerError::Stopped(_)) if !abandoned.is_cancelled() => {
                        topic = broker.topic(&topic.name).await?;
                        register(&topic, slot, waits).await?
                    }
                    other => other?,
                };
                // Undone when dropped: from here on, a connection closing meanwhile leaves
                // no registration behind.
                let registration = Registration {
                    topic,
                    publisher,
                    conn,
                    kept: false,
                };
                // The ledger is opened now, so the first SEND does not wait for it; if this
                // fails, that SEND tries again and reports why.
                let topic = &registration.topic;
                if let Err(e) = topic.log.open_ledger().await {
                    tracing::warn!(topic = %topic.name, error = %e,
                        "could not open a ledger for a new producer");
                }
                Ok(Opened {
                    registration,
                    close,
                    last_sequence_id,
                    schema_version,
                })
            }
            .await;
            Completion::Producer(p, opened)
        });
    }

    /// Takes the registered producer into the connection and answers PRODUCER_SUCCESS.
    pub(super) async fn finish_producer(
        &mut self,
        p: Producer,
        opened: Result<Opened, BrokerError>,
    ) {
        let current = finish_opening(&mut self.opening_producers, p.producer_id, p.request_id);
        let mut o = match opened {
            Ok(o) if current => o,
            Ok(_) => {
                // The client closed this producer id while it was created: dropping the
                // registration undoes it.
                let e = BrokerError::Stopped("the producer was closed while it was created".into());
                return self.send(error_reply(p.request_id, &e)).await;
            }
            Err(e) => return self.send(error_reply(p.request_id, &e)).await,
        };
        o.registration.kept = true;
        let (topic, publisher) = (
            o.registration.topic.clone(),
            o.registration.publisher.clone(),
        );
        // PRODUCER_SUCCESS leaves before the receipt task starts: a close the owner asked
        // meanwhile follows it on the wire.
        self.send(command::producer_success(
            p.request_id,
            &publisher.name,
            o.last_sequence_id,
            o.schema_version.take(),
        ))
        .await;
        let (tx, rx) = mpsc::channel::<ReceiptItem>(RECEIPT_QUEUE);
        let receipts = Receipts {
            out: self.out.clone(),
            producer_id: p.producer_id,
            partition: topic.partition,
        };
        self.broker.tasks.spawn(receipts.run(rx, o.close));
        self.producers.insert(
            p.producer_id,
            ProducerState {
                topic,
                publisher,
                receipts: tx,
            },
        );
    }

    /// SEND: checks, deduplication, append; the answer goes through the producer's receipts.
    pub(super) async fn on_send(&mut self, send: proto::CommandSend, payload: Payload) {
        let refuse = |error, message: String| {
            command::send_error(send.producer_id, send.sequence_id, error, message)
        };
        let Some(producer) = self.producers.get(&send.producer_id) else {
            let reply = refuse(ServerError::NotAllowedError, "unknown producer id".into());
            return self.send(reply).await;
        };
        if !payload.checksum_ok {
            let reply = refuse(
                ServerError::ChecksumError,
                "payload checksum mismatch".into(),
            );
            return self.send(reply).await;
        }
        // As Pulsar: the limit is on the message payload; its metadata may add up to 10 KiB
        // (clients cut chunks of exactly `max_message_size` payload bytes).
        let max = self.broker.config.max_message_size.as_u64() as usize;
        let body = payload.body().len();
        if body > max || payload.entry.len() > max + METADATA_PADDING {
            let reply = refuse(
                ServerError::NotAllowedError,
                format!(
                    "message of {body} payload bytes ({} with metadata) exceeds the limit of \
                     {max} (+{METADATA_PADDING} for metadata)",
                    payload.entry.len()
                ),
            );
            return self.send(reply).await;
        }
        let sequence_id = send.sequence_id;
        let highest = highest_sequence_id(
            sequence_id,
            send.highest_sequence_id
                .or(payload.metadata.highest_sequence_id),
            send.num_messages.or(payload.metadata.num_messages_in_batch),
        );
        let publish_time = payload.metadata.publish_time as i64;
        // The count is the client's word: no more messages than the entry has bytes.
        let messages = send
            .num_messages
            .or(payload.metadata.num_messages_in_batch)
            .map_or(1, |n| n.max(1) as u64)
            .min(payload.entry.len().max(1) as u64);
        // Over a publish rate, this SEND still goes through, and the connection is not read
        // until the limit's debt is repaid.
        if let Some(resume) = producer
            .topic
            .throttle
            .acquire(messages, payload.entry.len() as u64)
        {
            self.throttled_until = Some(self.throttled_until.map_or(resume, |t| t.max(resume)));
        }
        // The receipt is queued before the owner can take the SEND (the invariant above).
        // A receipt task that is gone was closed by the owner: the client resends this SEND
        // wherever the topic goes next.
        let (reply, settled) = oneshot::channel();
        let item = ReceiptItem {
            sequence_id,
            settled,
        };
        if producer.receipts.send(item).await.is_err() {
            return;
        }
        // Awaiting here is the backpressure: while the topic's owner is behind (or the log is
        // full) this connection is not read. A refusal drops `reply`: the receipt task answers
        // that the topic went away.
        let _ = producer
            .topic
            .publish(
                producer.publisher.clone(),
                highest,
                publish_time,
                payload.entry,
                reply,
            )
            .await;
    }

    pub(super) async fn on_close_producer(&mut self, c: proto::CommandCloseProducer) {
        cancel_opening(&mut self.opening_producers, c.producer_id);
        if let Some(p) = self.producers.remove(&c.producer_id) {
            p.topic
                .remove_producer(p.publisher.name.to_string(), self.id, c.producer_id)
                .await;
        }
        self.send(command::success(c.request_id)).await;
    }

    /// Takes this connection's producers out of their topics' registries.
    pub(super) async fn close_producers(&mut self) {
        for (pid, p) in self.producers.drain() {
            p.topic
                .remove_producer(p.publisher.name.to_string(), self.id, pid)
                .await;
        }
    }
}

/// One producer's receipt task: SENDs settle in the order the topic's owner appended them, so
/// answering items in arrival order keeps SEND_RECEIPTs in SEND order.
struct Receipts {
    out: crate::broker::outbox::Outbox,
    producer_id: u64,
    partition: i32,
}

impl Receipts {
    /// Answers items until the producer goes (its sender dropped) or its owner closes it
    /// (`close` cancelled); then answers what is queued and sends CLOSE_PRODUCER.
    async fn run(self, mut rx: mpsc::Receiver<ReceiptItem>, close: CancellationToken) {
        loop {
            let item = tokio::select! {
                biased;
                () = close.cancelled() => break,
                item = rx.recv() => match item {
                    Some(item) => item,
                    None => return,
                },
            };
            let Some(frame) = self.answer(item, false).await else {
                continue;
            };
            if self.out.send(frame).await.is_err() {
                return;
            }
        }
        // Every SEND the owner took has its item queued by now; later SENDs are refused at
        // the queue and resent by the client after it reconnects.
        rx.close();
        while let Some(item) = rx.recv().await {
            let Some(frame) = self.answer(item, true).await else {
                continue;
            };
            if self.out.send(frame).await.is_err() {
                return;
            }
        }
        let _ = self
            .out
            .send(command::close_producer(self.producer_id))
            .await;
    }

    /// The answer to one SEND once it settled. `closing`: a SEND the owner never took goes
    /// unanswered, as the client resends it after CLOSE_PRODUCER anyway.
    async fn answer(&self, item: ReceiptItem, closing: bool) -> Option<command::Outbound> {
        let (producer_id, sequence_id) = (self.producer_id, item.sequence_id);
        let outcome = match item.settled.await {
            Ok(Published::Persisted(Ok(pos))) => Ok(Some(pos)),
            Ok(Published::Persisted(Err(e))) => Err(BrokerError::Storage(e.to_string())),
            Ok(Published::Duplicate) => Ok(None),
            Ok(Published::InFlight) => Err(BrokerError::Storage(
                "cannot determine whether the message is a duplicate at this time".into(),
            )),
            Ok(Published::DedupUnavailable(reason)) => Err(BrokerError::Storage(format!(
                "deduplication state unavailable: {reason}"
            ))),
            Ok(Published::Refused(e)) => Err(e),
            Err(_) if closing => return None,
            Err(_) => Err(BrokerError::Stopped(
                "the topic was deleted or unloaded before the message was stored; retry".into(),
            )),
        };
        Some(match outcome {
            Ok(Some(pos)) => command::send_receipt(
                producer_id,
                sequence_id,
                command::message_id(pos.ledger, pos.entry, self.partition, None),
            ),
            Ok(None) => command::send_receipt(
                producer_id,
                sequence_id,
                command::no_message_id(self.partition, None),
            ),
            Err(e) => {
                command::send_error(producer_id, sequence_id, server_error(&e), e.to_string())
            }
        })
    }
}
