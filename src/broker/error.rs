//! Why the broker refused or failed a request, and the one mapping of those reasons to Pulsar's
//! `ServerError` on the wire ([`server_error`]). Every handler and every subscription reply
//! goes through it; no handler picks a `ServerError` of its own for a broker failure.

use crate::protocol::proto::ServerError;

/// Why the broker could not serve a request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BrokerError {
    /// The topic name is invalid.
    #[error(transparent)]
    InvalidTopic(#[from] crate::naming::TopicNameError),
    /// The topic does not exist and auto-creation is off.
    #[error("topic {0} does not exist")]
    TopicNotFound(String),
    /// The topic would be created in a namespace that does not exist.
    #[error("Namespace {0} does not exist")]
    NamespaceNotFound(String),
    /// The metadata store failed.
    #[error("metadata store: {0}")]
    Metadata(#[from] crate::ledger::metadata::MetadataError),
    /// A shared producer meets an exclusive one (or `WaitForExclusive` ones waiting), or a
    /// producer of the same name is connected.
    #[error("{0}")]
    ProducerBusy(String),
    /// An exclusive producer meets another producer (Pulsar's `ProducerFencedException`).
    #[error("{0}")]
    ProducerFenced(String),
    /// The subscription refuses another consumer (Exclusive taken, or another type).
    #[error("{0}")]
    ConsumerBusy(String),
    /// Producers or consumers are attached (a topic deletion without `force`).
    #[error("{0}")]
    TopicBusy(String),
    /// The command names a producer or consumer this connection does not have.
    #[error("{0}")]
    UnknownClient(String),
    /// A command is malformed for this broker (missing fields, unsupported kinds).
    #[error("{0}")]
    NotSupported(String),
    /// Reading or writing the log (or the lake behind it) failed.
    #[error("storage: {0}")]
    Storage(String),
    /// A schema was refused.
    #[error(transparent)]
    Schema(#[from] crate::schema::SchemaError),
    /// The connection's principal may not do this (Pulsar's message, then who and on what).
    #[error("Client is not authorized to {verb} ({0})", verb = pulsar_verb(.0.action))]
    Denied(#[from] crate::auth::Denied),
    /// The topic or subscription is stopping (deleted, unloaded, shutting down).
    #[error("{0}")]
    Stopped(String),
    /// A consumer subscribed more often than the topic's `subscribeRate` allows.
    #[error("{0}")]
    SubscribeRateExceeded(String),
    /// Creating the topic would exceed its namespace's `maxTopicsPerNamespace`.
    #[error("{0}")]
    TooManyTopics(String),
    /// No subscription of that name on the topic.
    #[error("{0}")]
    SubscriptionNotFound(String),
    /// A subscription of that name exists already.
    #[error("{0}")]
    SubscriptionExists(String),
    /// A `producer_request_hold` backlog quota is exceeded: the client retries.
    #[error("{0}")]
    QuotaHold(String),
    /// A `producer_exception` backlog quota is exceeded: the client fails pending sends.
    #[error("{0}")]
    QuotaException(String),
    /// Another node serves the topic, or nobody can now (the client looks it up again).
    #[error(transparent)]
    Ownership(#[from] crate::cluster::ownership::OwnershipError),
}

/// The verb of Pulsar's "Client is not authorized to …" refusals.
fn pulsar_verb(action: crate::auth::Action) -> &'static str {
    use crate::auth::Action;
    match action {
        Action::Produce => "Produce",
        Action::Consume => "subscribe",
        Action::Lookup => "Lookup",
        _ => "do this",
    }
}

/// Maps broker errors to the wire (the one place for this surface).
pub fn server_error(e: &BrokerError) -> ServerError {
    match e {
        BrokerError::InvalidTopic(_) => ServerError::InvalidTopicName,
        BrokerError::TopicNotFound(_) | BrokerError::NamespaceNotFound(_) => {
            ServerError::TopicNotFound
        }
        // Another node owns the topic now: the client looks it up again.
        BrokerError::Metadata(crate::ledger::metadata::MetadataError::Fenced { .. }) => {
            ServerError::ServiceNotReady
        }
        BrokerError::Metadata(_) => ServerError::MetadataError,
        BrokerError::ProducerBusy(_) => ServerError::ProducerBusy,
        BrokerError::ProducerFenced(_) => ServerError::ProducerFenced,
        BrokerError::ConsumerBusy(_) => ServerError::ConsumerBusy,
        BrokerError::TopicBusy(_) => ServerError::ServiceNotReady,
        BrokerError::UnknownClient(_) => ServerError::ConsumerNotFound,
        BrokerError::NotSupported(_) => ServerError::NotAllowedError,
        BrokerError::Storage(_) => ServerError::PersistenceError,
        BrokerError::Schema(crate::schema::SchemaError::Incompatible { .. }) => {
            ServerError::IncompatibleSchema
        }
        BrokerError::Schema(_) => ServerError::MetadataError,
        BrokerError::Denied(_) => ServerError::AuthorizationError,
        BrokerError::Stopped(_) => ServerError::ServiceNotReady,
        BrokerError::TooManyTopics(_) | BrokerError::SubscribeRateExceeded(_) => {
            ServerError::NotAllowedError
        }
        BrokerError::SubscriptionNotFound(_) => ServerError::SubscriptionNotFound,
        BrokerError::SubscriptionExists(_) => ServerError::ConsumerBusy,
        BrokerError::QuotaHold(_) => ServerError::ProducerBlockedQuotaExceededError,
        BrokerError::QuotaException(_) => ServerError::ProducerBlockedQuotaExceededException,
        BrokerError::Ownership(_) => ServerError::ServiceNotReady,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_keep_their_kind_on_the_wire() {
        let cases = [
            (
                BrokerError::ProducerBusy("p".into()),
                ServerError::ProducerBusy,
            ),
            (
                BrokerError::ProducerFenced("p".into()),
                ServerError::ProducerFenced,
            ),
            (
                BrokerError::ConsumerBusy("c".into()),
                ServerError::ConsumerBusy,
            ),
            (
                BrokerError::TopicNotFound("t".into()),
                ServerError::TopicNotFound,
            ),
            (
                BrokerError::Stopped("s".into()),
                ServerError::ServiceNotReady,
            ),
            (
                BrokerError::Metadata(crate::ledger::metadata::MetadataError::Fenced {
                    topic_id: 1,
                    epoch: 2,
                    fenced_at: 3,
                }),
                ServerError::ServiceNotReady,
            ),
            (
                BrokerError::QuotaHold("h".into()),
                ServerError::ProducerBlockedQuotaExceededError,
            ),
            (
                BrokerError::QuotaException("e".into()),
                ServerError::ProducerBlockedQuotaExceededException,
            ),
            (
                BrokerError::Denied(crate::auth::Denied {
                    principal: "role 'x'".into(),
                    action: crate::auth::Action::Produce,
                    resource: "topic t".into(),
                }),
                ServerError::AuthorizationError,
            ),
        ];
        for (e, wire) in cases {
            assert_eq!(server_error(&e), wire, "{e}");
        }
    }
}
