//! Consumers on a connection: SUBSCRIBE (the topic loads beside the read loop), FLOW, ACK,
//! REDELIVER, CLOSE_CONSUMER / UNSUBSCRIBE, SEEK and GET_LAST_MESSAGE_ID (whose lake reads run
//! beside the read loop too). The subscription task owns the cursor; this file only routes.

use std::sync::Arc;

use super::{
    begin_opening, cancel_opening, error_reply, finish_opening, open_topic, Completion, Connection,
};
use crate::auth::Action;
use crate::broker::subscription::{
    NewConsumer, SeekTarget, SubscriptionCommand, SubscriptionHandle,
};
use crate::broker::topic::SubscribeRequest;
use crate::broker::{BrokerError, BrokerTopic};
use crate::ledger::Position;
use crate::protocol::command;
use crate::protocol::frame::entry_message_count;
use crate::protocol::inbound::{Ack, Seek, SeekTo, Subscribe};
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

/// A SUBSCRIBE's consumer once attached to its subscription: detached again when dropped
/// unless kept (so a consumer whose connection closed, or that the client closed, while it
/// subscribed does not stay attached).
pub(super) struct Joined {
    state: Option<ConsumerState>,
    key: (u64, u64),
}

impl Drop for Joined {
    fn drop(&mut self) {
        if let Some(c) = self.state.take() {
            let key = self.key;
            tokio::spawn(async move { Connection::detach(key, c, false).await });
        }
    }
}

impl Connection {
    /// SUBSCRIBE: authorizes and loads the topic, checks the schema, and attaches the consumer
    /// to its subscription (created by the topic's owner when new), beside the read loop.
    pub(super) async fn begin_subscribe(&mut self, s: Box<Subscribe>) {
        let opening = &mut self.opening_consumers;
        if let Err(e) = begin_opening(opening, s.consumer_id, s.request_id, "consumer") {
            return self.send(error_reply(s.request_id, &e)).await;
        }
        let (broker, principal) = (self.broker.clone(), self.principal());
        let (key, out, client) = (
            (self.id, s.consumer_id),
            self.out.clone(),
            self.client.clone(),
        );
        // Pulsar's consumer identity for the subscribe rate: client host and consumer name.
        let identity = format!("{}/{}", self.peer.ip(), s.consumer_name);
        self.defer(async move {
            let joined = async {
                let topic = open_topic(
                    &broker,
                    &principal,
                    &s.topic,
                    Action::Consume,
                    Some(&s.subscription),
                )
                .await?;
                if let Some(sc) = &s.schema {
                    let base = topic.name.base().to_string();
                    schema::resolve(&broker.metadata(), &base, sc).await?;
                }
                topic.subscribe_gate.admit(&identity)?;
                let attach = |topic: Arc<BrokerTopic>| {
                    let (s, out, client) = (&s, out.clone(), client.clone());
                    async move {
                        let handle = topic
                            .subscribe(SubscribeRequest {
                                name: s.subscription.clone(),
                                sub_type: s.sub_type,
                                durable: s.durable,
                                start: s.start,
                            })
                            .await?;
                        handle
                            .ask(|reply| {
                                SubscriptionCommand::AddConsumer(Box::new(NewConsumer {
                                    key,
                                    sub_type: s.sub_type,
                                    name: s.consumer_name.clone(),
                                    priority: s.priority,
                                    out,
                                    client,
                                    reply,
                                }))
                            })
                            .await
                            .unwrap_or_else(|| Err(stopped()))?;
                        Ok::<_, BrokerError>((topic, handle))
                    }
                };
                let (topic, handle) = match attach(topic.clone()).await {
                    // Unloaded (idle) between the lookup and the attachment: load it again.
                    Err(BrokerError::Stopped(_)) => {
                        attach(broker.topic(&topic.name).await?).await?
                    }
                    other => other?,
                };
                let state = ConsumerState {
                    topic,
                    subscription: handle,
                };
                Ok(Joined {
                    state: Some(state),
                    key,
                })
            }
            .await;
            Completion::Subscribe(s, joined)
        });
    }

    /// Takes the attached consumer into the connection and answers SUCCESS.
    pub(super) async fn finish_subscribe(
        &mut self,
        s: Subscribe,
        joined: Result<Joined, BrokerError>,
    ) {
        let current = finish_opening(&mut self.opening_consumers, s.consumer_id, s.request_id);
        let mut joined = match joined {
            Ok(j) if current => j,
            Ok(_) => {
                // The client closed this consumer id while it subscribed: dropping the
                // attachment detaches it.
                let e = BrokerError::Stopped("the consumer was closed while it subscribed".into());
                return self.send(error_reply(s.request_id, &e)).await;
            }
            Err(e) => return self.send(error_reply(s.request_id, &e)).await,
        };
        if let Some(state) = joined.state.take() {
            self.consumers.insert(s.consumer_id, state);
        }
        self.send(command::success(s.request_id)).await;
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
    /// Whether an UNSUBSCRIBE deleted the stored cursor (always `Ok` otherwise).
    pub(super) async fn remove_consumer(
        &mut self,
        consumer_id: u64,
        unsubscribe: bool,
    ) -> Result<(), BrokerError> {
        cancel_opening(&mut self.opening_consumers, consumer_id);
        match self.consumers.remove(&consumer_id) {
            Some(c) => Self::detach((self.id, consumer_id), c, unsubscribe).await,
            None => Ok(()),
        }
    }

    /// Takes consumer `key` out of its subscription (see [`Self::remove_consumer`]).
    async fn detach(
        key: (u64, u64),
        c: ConsumerState,
        unsubscribe: bool,
    ) -> Result<(), BrokerError> {
        let _ = c
            .subscription
            .tx
            .send(SubscriptionCommand::RemoveConsumer(key));
        if unsubscribe || !c.subscription.durable {
            c.topic.forget_subscription(c.subscription.clone()).await;
            if unsubscribe {
                let deleted = c.subscription.ask(SubscriptionCommand::Delete).await;
                return deleted
                    .unwrap_or_else(|| Err(crate::broker::subscription::stopped_before_delete()));
            }
        }
        Ok(())
    }

    /// Detaches every consumer of this connection (it is closing).
    pub(super) async fn close_consumers(&mut self) {
        let ids: Vec<u64> = self.consumers.keys().copied().collect();
        for id in ids {
            let _ = self.remove_consumer(id, false).await;
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
        // The consumer leaves the subscription whatever becomes of the seek (a successful one
        // disconnects every consumer anyway), also when the connection closes before the
        // deferred step ran: the guard detaches it when the step ends or is dropped.
        let detach = DetachOnDrop {
            subscription: c.subscription.clone(),
            key: (self.id, s.consumer_id),
        };
        self.defer(async move {
            let result = c
                .subscription
                .ask(|reply| SubscriptionCommand::Seek {
                    to: Box::new(to),
                    reply,
                })
                .await
                .unwrap_or_else(|| Err(stopped()));
            drop(detach);
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

/// Detaches a consumer from its subscription when dropped.
struct DetachOnDrop {
    subscription: SubscriptionHandle,
    key: (u64, u64),
}

impl Drop for DetachOnDrop {
    fn drop(&mut self) {
        let _ = self
            .subscription
            .tx
            .send(SubscriptionCommand::RemoveConsumer(self.key));
    }
}
