//! Consumers on a connection: SUBSCRIBE (the topic loads beside the read loop), FLOW, ACK,
//! REDELIVER, CLOSE_CONSUMER / UNSUBSCRIBE, SEEK and GET_LAST_MESSAGE_ID (whose lake reads run
//! beside the read loop too). The subscription task owns the cursor; this file only routes.

use std::sync::Arc;

use super::{error_reply, open_topic, Completion, Connection};
use crate::auth::Action;
use crate::broker::subscription::{self, SeekTarget, SubscriptionCommand, SubscriptionHandle};
use crate::broker::{BrokerError, BrokerTopic};
use crate::ledger::Position;
use crate::protocol::command;
use crate::protocol::frame::entry_message_count;
use crate::protocol::inbound::{Ack, Seek, SeekTo, StartAt, Subscribe};
use crate::protocol::proto;
use crate::schema;

/// A consumer registered on this connection.
pub(super) struct ConsumerState {
    topic: Arc<BrokerTopic>,
    subscription: SubscriptionHandle,
}

/// The reply when a subscription task has ended under a request.
fn stopped() -> BrokerError {
    BrokerError::Stopped("subscription stopped".into())
}

impl Connection {
    /// SUBSCRIBE: authorizes and loads the topic and checks the schema beside the read loop.
    pub(super) fn begin_subscribe(&mut self, s: Box<Subscribe>) {
        self.opening_consumers.insert(s.consumer_id, s.request_id);
        let (broker, principal) = (self.broker.clone(), self.principal());
        self.defer(async move {
            let opened = async {
                let topic = open_topic(&broker, &principal, &s.topic, Action::Consume).await?;
                if let Some(sc) = &s.schema {
                    let base = topic.name.base().to_string();
                    schema::resolve(&broker.metadata(), &base, sc).await?;
                }
                Ok(topic)
            }
            .await;
            Completion::Subscribe(s, opened)
        });
    }

    /// Joins the consumer whose topic is ready to its subscription (created when new).
    pub(super) async fn finish_subscribe(
        &mut self,
        s: Subscribe,
        opened: Result<Arc<BrokerTopic>, BrokerError>,
    ) {
        if self.opening_consumers.get(&s.consumer_id) != Some(&s.request_id) {
            let e = BrokerError::Stopped("the consumer was closed while it subscribed".into());
            return self.send(error_reply(s.request_id, &e)).await;
        }
        self.opening_consumers.remove(&s.consumer_id);
        let topic = match opened {
            Ok(t) => t,
            Err(e) => return self.send(error_reply(s.request_id, &e)).await,
        };
        let handle = {
            let mut subs = topic.subscriptions.lock().await;
            if topic.is_deleted() {
                drop(subs);
                let e = BrokerError::Stopped(format!(
                    "topic {} was deleted meanwhile; retry",
                    topic.name
                ));
                return self.send(error_reply(s.request_id, &e)).await;
            }
            match subs.get(&s.subscription) {
                Some(h) => h.clone(),
                None => {
                    let start = start_position(&topic, s.start);
                    let h = subscription::spawn(
                        topic.clone(),
                        s.subscription.clone(),
                        s.sub_type,
                        s.durable,
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
                sub_type: s.sub_type,
                name: s.consumer_name.clone(),
                priority: s.priority,
                out: self.out.clone(),
                reply,
            })
            .await
            .unwrap_or_else(|| Err(stopped()));
        match result {
            Ok(()) => {
                self.consumers.insert(
                    s.consumer_id,
                    ConsumerState {
                        topic,
                        subscription: handle,
                    },
                );
                self.send(command::success(s.request_id)).await;
            }
            Err(e) => self.send(error_reply(s.request_id, &e)).await,
        }
    }

    pub(super) fn on_flow(&mut self, f: proto::CommandFlow) {
        if let Some(c) = self.consumers.get(&f.consumer_id) {
            let _ = c.subscription.tx.send(SubscriptionCommand::Flow(
                (self.id, f.consumer_id),
                f.message_permits,
            ));
        }
    }

    pub(super) fn on_ack(&mut self, a: Ack) {
        if let Some(c) = self.consumers.get(&a.consumer_id) {
            let positions = a
                .ids
                .into_iter()
                .map(|m| (Position::new(m.ledger, m.entry), m.unacked_in_batch))
                .collect();
            let _ = c.subscription.tx.send(SubscriptionCommand::Ack {
                key: (self.id, a.consumer_id),
                positions,
                cumulative: a.cumulative,
            });
        }
    }

    pub(super) fn on_redeliver(&mut self, r: proto::CommandRedeliverUnacknowledgedMessages) {
        if let Some(c) = self.consumers.get(&r.consumer_id) {
            let _ = c
                .subscription
                .tx
                .send(SubscriptionCommand::Redeliver((self.id, r.consumer_id)));
        }
    }

    /// Detaches a consumer (CLOSE_CONSUMER, UNSUBSCRIBE); a non-durable subscription goes
    /// with it, and UNSUBSCRIBE deletes a durable one.
    pub(super) async fn remove_consumer(&mut self, consumer_id: u64, unsubscribe: bool) {
        self.opening_consumers.remove(&consumer_id);
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

    /// Detaches every consumer of this connection (it is closing).
    pub(super) async fn close_consumers(&mut self) {
        let ids: Vec<u64> = self.consumers.keys().copied().collect();
        for id in ids {
            self.remove_consumer(id, false).await;
        }
    }

    /// SEEK: the subscription resets its cursor (a seek by time may search the lake) and
    /// disconnects its consumers; the reply comes when it did.
    pub(super) async fn on_seek(&mut self, s: Seek) {
        let to = match s.to {
            Some(SeekTo::Message { ledger, entry }) => {
                SeekTarget::Position(Position::new(ledger, entry))
            }
            Some(SeekTo::PublishTime(t)) => SeekTarget::PublishTime(t),
            None => {
                let e =
                    BrokerError::NotSupported("SEEK needs a message id or a publish time".into());
                return self.send(error_reply(s.request_id, &e)).await;
            }
        };
        let Some(c) = self.consumers.remove(&s.consumer_id) else {
            let e = BrokerError::UnknownClient("unknown consumer id".into());
            return self.send(error_reply(s.request_id, &e)).await;
        };
        let key = (self.id, s.consumer_id);
        self.defer(async move {
            let result = c
                .subscription
                .ask(|reply| SubscriptionCommand::Seek { to, reply })
                .await
                .unwrap_or_else(|| Err(stopped()));
            if result.is_err() {
                // A successful seek disconnects every consumer; a failed one must not leave
                // this one attached to the subscription but unknown to the connection.
                let _ = c
                    .subscription
                    .tx
                    .send(SubscriptionCommand::RemoveConsumer(key));
            }
            Completion::reply(match result {
                Ok(()) => command::success(s.request_id),
                Err(e) => error_reply(s.request_id, &e),
            })
        });
    }

    /// GET_LAST_MESSAGE_ID: the last entry may be in the lake only, so it is read through
    /// replay beside the read loop.
    pub(super) async fn on_last_message_id(&mut self, g: proto::CommandGetLastMessageId) {
        let Some(c) = self.consumers.get(&g.consumer_id) else {
            let e = BrokerError::UnknownClient("unknown consumer id".into());
            return self.send(error_reply(g.request_id, &e)).await;
        };
        let (topic, sub) = (c.topic.clone(), c.subscription.clone());
        self.defer(async move {
            let partition = topic.partition;
            let last = match topic.log.last_confirmed() {
                None => command::no_message_id(partition, Some(-1)),
                Some(pos) => {
                    let mut reader =
                        crate::replay::EntryReader::new(topic.log.clone(), topic.lake.clone());
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
            let mark = sub
                .ask(SubscriptionCommand::MarkDelete)
                .await
                .flatten()
                .map(|p| command::message_id(p.ledger, p.entry, partition, None));
            Completion::reply(command::last_message_id(g.request_id, last, mark))
        });
    }
}

/// The position a new subscription starts at.
fn start_position(topic: &BrokerTopic, start: StartAt) -> Position {
    match start {
        StartAt::Earliest => topic.log.first_position(),
        StartAt::Latest => topic.log.last_confirmed().map_or(Position::new(0, 0), |p| {
            Position::new(p.ledger, p.entry + 1)
        }),
        // The broker redelivers the whole start entry; the client filters by batch index.
        StartAt::Message { ledger, entry } => Position::new(ledger, entry),
    }
}
