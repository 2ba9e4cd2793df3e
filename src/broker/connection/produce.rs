//! Producers on a connection: PRODUCER (the topic loads beside the read loop), SEND (checks,
//! deduplication verdict, append with the log's backpressure), CLOSE_PRODUCER, and each
//! producer's receipt task, which answers SENDs strictly in SEND order.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::{error_reply, open_topic, Completion, Connection};
use crate::auth::Action;
use crate::broker::dedup::highest_sequence_id;
use crate::broker::topic::{ProducerSlot, Published};
use crate::broker::{BrokerError, BrokerTopic};
use crate::ledger::{AppendError, AppendReceipt};
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

/// A PRODUCER's topic once loaded, with the schema version its schema resolved to.
pub(super) struct Opened {
    topic: Arc<BrokerTopic>,
    schema_version: Option<Vec<u8>>,
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

/// A producer registered on this connection.
pub(super) struct ProducerState {
    topic: Arc<BrokerTopic>,
    name: String,
    receipts: mpsc::Sender<ReceiptItem>,
}

impl Connection {
    /// PRODUCER: authorizes and loads the topic and resolves the schema beside the read loop.
    pub(super) fn begin_producer(&mut self, p: Box<Producer>) {
        self.opening_producers.insert(p.producer_id, p.request_id);
        let (broker, principal) = (self.broker.clone(), self.principal());
        self.defer(async move {
            let opened = async {
                let topic = open_topic(&broker, &principal, &p.topic, Action::Produce).await?;
                let schema_version = match &p.schema {
                    Some(sc) => {
                        let base = topic.name.base().to_string();
                        let v = schema::resolve(&broker.metadata(), &base, sc).await?;
                        Some(schema_version_bytes(v))
                    }
                    None => None,
                };
                Ok(Opened {
                    topic,
                    schema_version,
                })
            }
            .await;
            Completion::Producer(p, opened)
        });
    }

    /// Registers the producer whose topic is ready and answers PRODUCER_SUCCESS.
    pub(super) async fn finish_producer(
        &mut self,
        p: Producer,
        opened: Result<Opened, BrokerError>,
    ) {
        if self.opening_producers.get(&p.producer_id) != Some(&p.request_id) {
            let e = BrokerError::Stopped("the producer was closed while it was created".into());
            return self.send(error_reply(p.request_id, &e)).await;
        }
        self.opening_producers.remove(&p.producer_id);
        let Opened {
            topic,
            schema_version,
        } = match opened {
            Ok(o) => o,
            Err(e) => return self.send(error_reply(p.request_id, &e)).await,
        };
        let name = p
            .name
            .clone()
            .unwrap_or_else(|| self.broker.generate_producer_name());
        if let Err(e) = self.register(&topic, &name, p.exclusive, p.producer_id) {
            return self.send(error_reply(p.request_id, &e)).await;
        }
        let (tx, rx) = mpsc::channel::<ReceiptItem>(RECEIPT_QUEUE);
        let task = receipts(
            rx,
            self.out.clone(),
            p.producer_id,
            topic.clone(),
            name.clone(),
        );
        self.broker.tasks.spawn(task);
        let last_sequence_id = topic.last_sequence_id(&name);
        self.producers.insert(
            p.producer_id,
            ProducerState {
                topic,
                name: name.clone(),
                receipts: tx,
            },
        );
        self.send(command::producer_success(
            p.request_id,
            &name,
            last_sequence_id,
            schema_version,
        ))
        .await;
    }

    /// Adds the producer to the topic's registry, unless an exclusive producer or one of the
    /// same name is there.
    fn register(
        &self,
        topic: &BrokerTopic,
        name: &str,
        exclusive: bool,
        producer_id: u64,
    ) -> Result<(), BrokerError> {
        let mut producers = topic.producers.lock().unwrap_or_else(|e| e.into_inner());
        if topic.is_deleted() {
            return Err(BrokerError::Stopped(format!(
                "topic {} was deleted meanwhile; retry",
                topic.name
            )));
        }
        if producers.values().any(|v| v.exclusive) || (exclusive && !producers.is_empty()) {
            return Err(BrokerError::ProducerBusy(
                "topic has an exclusive producer".into(),
            ));
        }
        if producers.contains_key(name) {
            return Err(BrokerError::ProducerBusy(
                "a producer with this name is already connected".into(),
            ));
        }
        producers.insert(
            name.to_string(),
            ProducerSlot {
                conn: self.id,
                producer_id,
                exclusive,
                out: self.out.clone(),
            },
        );
        Ok(())
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
        // Awaiting here is the backpressure: while the log is full this connection is not read.
        let item = match producer
            .topic
            .publish(&producer.name, highest, publish_time, payload.entry)
            .await
        {
            Published::Appended(receipt) => ReceiptItem::Append {
                sequence_id,
                highest,
                receipt,
            },
            Published::Duplicate => ReceiptItem::Duplicate { sequence_id },
            Published::InFlight => ReceiptItem::Refused {
                sequence_id,
                error: ServerError::PersistenceError,
                message: "Cannot determine whether the message is a duplicate at this time".into(),
            },
        };
        let _ = producer.receipts.send(item).await;
    }

    pub(super) async fn on_close_producer(&mut self, c: proto::CommandCloseProducer) {
        self.opening_producers.remove(&c.producer_id);
        if let Some(p) = self.producers.remove(&c.producer_id) {
            p.topic
                .producers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&p.name);
        }
        self.send(command::success(c.request_id)).await;
    }

    /// Takes this connection's producers out of their topics' registries.
    pub(super) fn close_producers(&mut self) {
        for (pid, p) in self.producers.drain() {
            p.topic
                .producers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|_, v| !(v.conn == self.id && v.producer_id == pid));
        }
    }
}

/// One producer's receipt task: receipts resolve in append order, so answering items in
/// arrival order keeps SEND_RECEIPTs in SEND order. Ends when the producer goes.
async fn receipts(
    mut rx: mpsc::Receiver<ReceiptItem>,
    out: mpsc::Sender<command::Outbound>,
    producer_id: u64,
    topic: Arc<BrokerTopic>,
    name: String,
) {
    let partition = topic.partition;
    while let Some(item) = rx.recv().await {
        let frame = match item {
            ReceiptItem::Duplicate { sequence_id } => command::send_receipt(
                producer_id,
                sequence_id,
                command::no_message_id(partition, None),
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
                topic.published(&name, highest, result.is_ok());
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
}
