//! Typed commands: what the broker receives ([`Inbound`], parsed from a [`Frame`]) and what it
//! sends ([`Outbound`], built by the constructors here).

use bytes::Bytes;

use super::frame::{Frame, FrameError, Payload};
use super::inbound;
use super::proto::base_command::Type;
use super::proto::{self, BaseCommand};

/// A command from a client, with its body checked present.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Inbound {
    /// CONNECT.
    Connect(proto::CommandConnect),
    /// PING.
    Ping,
    /// PONG.
    Pong,
    /// PARTITIONED_METADATA.
    PartitionedMetadata(proto::CommandPartitionedTopicMetadata),
    /// LOOKUP.
    Lookup(proto::CommandLookupTopic),
    /// PRODUCER.
    Producer(Box<inbound::Producer>),
    /// SEND with its payload.
    Send(proto::CommandSend, Box<Payload>),
    /// CLOSE_PRODUCER.
    CloseProducer(proto::CommandCloseProducer),
    /// SUBSCRIBE.
    Subscribe(Box<inbound::Subscribe>),
    /// FLOW.
    Flow(proto::CommandFlow),
    /// ACK.
    Ack(inbound::Ack),
    /// CLOSE_CONSUMER.
    CloseConsumer(proto::CommandCloseConsumer),
    /// UNSUBSCRIBE.
    Unsubscribe(proto::CommandUnsubscribe),
    /// REDELIVER_UNACKNOWLEDGED_MESSAGES.
    Redeliver(proto::CommandRedeliverUnacknowledgedMessages),
    /// SEEK.
    Seek(inbound::Seek),
    /// GET_LAST_MESSAGE_ID.
    GetLastMessageId(proto::CommandGetLastMessageId),
    /// GET_SCHEMA.
    GetSchema(proto::CommandGetSchema),
    /// AUTH_RESPONSE: fresh credentials answering an AUTH_CHALLENGE.
    AuthResponse(proto::CommandAuthResponse),
    /// Any other command: answered with an error naming it, when it has a request id.
    Unsupported {
        /// Command type number.
        kind: i32,
        /// Its request id, if it carries one.
        request_id: Option<u64>,
    },
}

macro_rules! body {
    ($cmd:expr, $field:ident, $name:literal) => {
        $cmd.$field.take().ok_or(FrameError::MissingBody($name))?
    };
}

impl TryFrom<Frame> for Inbound {
    type Error = FrameError;

    fn try_from(frame: Frame) -> Result<Self, FrameError> {
        let mut c = frame.command;
        let kind = c.r#type;
        Ok(match Type::try_from(kind) {
            Ok(Type::Connect) => Inbound::Connect(body!(c, connect, "CONNECT")),
            Ok(Type::Ping) => Inbound::Ping,
            Ok(Type::Pong) => Inbound::Pong,
            Ok(Type::PartitionedMetadata) => {
                Inbound::PartitionedMetadata(body!(c, partition_metadata, "PARTITIONED_METADATA"))
            }
            Ok(Type::Lookup) => Inbound::Lookup(body!(c, lookup_topic, "LOOKUP")),
            Ok(Type::Producer) => {
                Inbound::Producer(Box::new(body!(c, producer, "PRODUCER").into()))
            }
            Ok(Type::Send) => {
                let send = body!(c, send, "SEND");
                let payload = frame
                    .payload
                    .ok_or(FrameError::MissingBody("SEND payload"))?;
                Inbound::Send(send, Box::new(payload))
            }
            Ok(Type::CloseProducer) => {
                Inbound::CloseProducer(body!(c, close_producer, "CLOSE_PRODUCER"))
            }
            Ok(Type::Subscribe) => {
                Inbound::Subscribe(Box::new(body!(c, subscribe, "SUBSCRIBE").into()))
            }
            Ok(Type::Flow) => Inbound::Flow(body!(c, flow, "FLOW")),
            Ok(Type::Ack) => Inbound::Ack(body!(c, ack, "ACK").into()),
            Ok(Type::CloseConsumer) => {
                Inbound::CloseConsumer(body!(c, close_consumer, "CLOSE_CONSUMER"))
            }
            Ok(Type::Unsubscribe) => Inbound::Unsubscribe(body!(c, unsubscribe, "UNSUBSCRIBE")),
            Ok(Type::RedeliverUnacknowledgedMessages) => Inbound::Redeliver(body!(
                c,
                redeliver_unacknowledged_messages,
                "REDELIVER_UNACKNOWLEDGED_MESSAGES"
            )),
            Ok(Type::Seek) => Inbound::Seek(body!(c, seek, "SEEK").into()),
            Ok(Type::GetLastMessageId) => {
                Inbound::GetLastMessageId(body!(c, get_last_message_id, "GET_LAST_MESSAGE_ID"))
            }
            Ok(Type::GetSchema) => Inbound::GetSchema(body!(c, get_schema, "GET_SCHEMA")),
            Ok(Type::AuthResponse) => {
                Inbound::AuthResponse(body!(c, auth_response, "AUTH_RESPONSE"))
            }
            _ => Inbound::Unsupported {
                kind,
                request_id: request_id_of(&c),
            },
        })
    }
}

/// The request id of commands the broker does not implement, so it can answer them.
fn request_id_of(c: &BaseCommand) -> Option<u64> {
    c.get_schema
        .as_ref()
        .map(|x| x.request_id)
        .or(c.get_or_create_schema.as_ref().map(|x| x.request_id))
        .or(c.consumer_stats.as_ref().map(|x| x.request_id))
        .or(c.get_topics_of_namespace.as_ref().map(|x| x.request_id))
        .or(c.new_txn.as_ref().map(|x| x.request_id))
        .or(c.tc_client_connect_request.as_ref().map(|x| x.request_id))
        .or(c.watch_topic_list.as_ref().map(|x| x.request_id))
}

/// A frame the broker sends.
///
/// The command is boxed: a `BaseCommand` holds every command kind inline (kilobytes), and
/// every connection's queue allocates room for a block of frames up front.
#[derive(Debug, Clone, PartialEq)]
pub enum Outbound {
    /// A simple command.
    Command(Box<BaseCommand>),
    /// MESSAGE with the stored entry (checksum block included).
    Message(Box<BaseCommand>, Bytes),
}

fn base(kind: Type) -> BaseCommand {
    BaseCommand {
        r#type: kind as i32,
        ..Default::default()
    }
}

/// A message id as sent to clients.
pub fn message_id(
    ledger: u64,
    entry: u64,
    partition: i32,
    batch_index: Option<i32>,
) -> proto::MessageIdData {
    proto::MessageIdData {
        ledger_id: ledger,
        entry_id: entry,
        partition: Some(partition),
        batch_index,
        ..Default::default()
    }
}

/// The id of "no message": a duplicate's receipt, or GET_LAST_MESSAGE_ID of an empty topic
/// (ledger and entry -1 on the wire).
pub fn no_message_id(partition: i32, batch_index: Option<i32>) -> proto::MessageIdData {
    message_id(u64::MAX, u64::MAX, partition, batch_index)
}

/// ERROR refusing a CONNECT (it answers no request: the request id is -1 on the wire).
pub fn connect_refused(error: proto::ServerError, message: impl Into<String>) -> Outbound {
    self::error(u64::MAX, error, message)
}

/// CONNECTED.
pub fn connected(server_version: &str, protocol_version: i32, max_message_size: i32) -> Outbound {
    let mut c = base(Type::Connected);
    c.connected = Some(proto::CommandConnected {
        server_version: server_version.to_string(),
        protocol_version: Some(protocol_version),
        max_message_size: Some(max_message_size),
        feature_flags: None,
    });
    Outbound::Command(Box::new(c))
}

/// AUTH_CHALLENGE asking for fresh credentials of `method` (Pulsar's "PulsarAuthRefresh").
pub fn auth_challenge(server_version: &str, protocol_version: i32, method: &str) -> Outbound {
    let mut c = base(Type::AuthChallenge);
    c.auth_challenge = Some(proto::CommandAuthChallenge {
        server_version: Some(server_version.to_string()),
        challenge: Some(proto::AuthData {
            auth_method_name: Some(method.to_string()),
            auth_data: Some(b"PulsarAuthRefresh".to_vec()),
        }),
        protocol_version: Some(protocol_version),
    });
    Outbound::Command(Box::new(c))
}

/// PING.
pub fn ping() -> Outbound {
    let mut c = base(Type::Ping);
    c.ping = Some(proto::CommandPing {});
    Outbound::Command(Box::new(c))
}

/// PONG.
pub fn pong() -> Outbound {
    let mut c = base(Type::Pong);
    c.pong = Some(proto::CommandPong {});
    Outbound::Command(Box::new(c))
}

/// SUCCESS.
pub fn success(request_id: u64) -> Outbound {
    let mut c = base(Type::Success);
    c.success = Some(proto::CommandSuccess {
        request_id,
        schema: None,
    });
    Outbound::Command(Box::new(c))
}

/// ERROR.
pub fn error(request_id: u64, error: proto::ServerError, message: impl Into<String>) -> Outbound {
    let mut c = base(Type::Error);
    c.error = Some(proto::CommandError {
        request_id,
        error: error as i32,
        message: message.into(),
    });
    Outbound::Command(Box::new(c))
}

/// PARTITIONED_METADATA_RESPONSE (success).
pub fn partitioned_metadata(request_id: u64, partitions: u32) -> Outbound {
    let mut c = base(Type::PartitionedMetadataResponse);
    c.partition_metadata_response = Some(proto::CommandPartitionedTopicMetadataResponse {
        partitions: Some(partitions),
        request_id,
        response: Some(
            proto::command_partitioned_topic_metadata_response::LookupType::Success as i32,
        ),
        ..Default::default()
    });
    Outbound::Command(Box::new(c))
}

/// PARTITIONED_METADATA_RESPONSE (failure, inside the typed response as clients require).
pub fn partitioned_metadata_failed(
    request_id: u64,
    error: proto::ServerError,
    message: impl Into<String>,
) -> Outbound {
    let mut c = base(Type::PartitionedMetadataResponse);
    c.partition_metadata_response = Some(proto::CommandPartitionedTopicMetadataResponse {
        request_id,
        response: Some(
            proto::command_partitioned_topic_metadata_response::LookupType::Failed as i32,
        ),
        error: Some(error as i32),
        message: Some(message.into()),
        ..Default::default()
    });
    Outbound::Command(Box::new(c))
}

/// LOOKUP_RESPONSE answering "connect to me".
pub fn lookup_connect(request_id: u64, broker_url: &str, broker_url_tls: Option<&str>) -> Outbound {
    let mut c = base(Type::LookupResponse);
    c.lookup_topic_response = Some(proto::CommandLookupTopicResponse {
        broker_service_url: Some(broker_url.to_string()),
        broker_service_url_tls: broker_url_tls.map(str::to_string),
        response: Some(proto::command_lookup_topic_response::LookupType::Connect as i32),
        request_id,
        authoritative: Some(true),
        proxy_through_service_url: Some(false),
        ..Default::default()
    });
    Outbound::Command(Box::new(c))
}

/// LOOKUP_RESPONSE answering "ask that broker" (`authoritative`: it is to serve the topic,
/// so its answer is final).
pub fn lookup_redirect(
    request_id: u64,
    broker_url: &str,
    broker_url_tls: Option<&str>,
    authoritative: bool,
) -> Outbound {
    let mut c = base(Type::LookupResponse);
    c.lookup_topic_response = Some(proto::CommandLookupTopicResponse {
        broker_service_url: Some(broker_url.to_string()),
        broker_service_url_tls: broker_url_tls.map(str::to_string),
        response: Some(proto::command_lookup_topic_response::LookupType::Redirect as i32),
        request_id,
        authoritative: Some(authoritative),
        proxy_through_service_url: Some(false),
        ..Default::default()
    });
    Outbound::Command(Box::new(c))
}

/// LOOKUP_RESPONSE (failure).
pub fn lookup_failed(
    request_id: u64,
    error: proto::ServerError,
    message: impl Into<String>,
) -> Outbound {
    let mut c = base(Type::LookupResponse);
    c.lookup_topic_response = Some(proto::CommandLookupTopicResponse {
        response: Some(proto::command_lookup_topic_response::LookupType::Failed as i32),
        request_id,
        error: Some(error as i32),
        message: Some(message.into()),
        ..Default::default()
    });
    Outbound::Command(Box::new(c))
}

/// PRODUCER_SUCCESS.
pub fn producer_success(
    request_id: u64,
    producer_name: &str,
    last_sequence_id: i64,
    schema_version: Option<Vec<u8>>,
) -> Outbound {
    let mut c = base(Type::ProducerSuccess);
    c.producer_success = Some(proto::CommandProducerSuccess {
        request_id,
        producer_name: producer_name.to_string(),
        last_sequence_id: Some(last_sequence_id),
        producer_ready: Some(true),
        schema_version,
        ..Default::default()
    });
    Outbound::Command(Box::new(c))
}

/// PRODUCER_SUCCESS with `producer_ready = false`: a `WaitForExclusive` producer waits its
/// turn; the client keeps its request open (no timeout) until the ready PRODUCER_SUCCESS.
pub fn producer_waiting(request_id: u64, producer_name: &str) -> Outbound {
    let mut c = base(Type::ProducerSuccess);
    c.producer_success = Some(proto::CommandProducerSuccess {
        request_id,
        producer_name: producer_name.to_string(),
        producer_ready: Some(false),
        ..Default::default()
    });
    Outbound::Command(Box::new(c))
}

/// SEND_RECEIPT.
pub fn send_receipt(producer_id: u64, sequence_id: u64, id: proto::MessageIdData) -> Outbound {
    let mut c = base(Type::SendReceipt);
    c.send_receipt = Some(proto::CommandSendReceipt {
        producer_id,
        sequence_id,
        message_id: Some(id),
        ..Default::default()
    });
    Outbound::Command(Box::new(c))
}

/// SEND_ERROR.
pub fn send_error(
    producer_id: u64,
    sequence_id: u64,
    error: proto::ServerError,
    message: impl Into<String>,
) -> Outbound {
    let mut c = base(Type::SendError);
    c.send_error = Some(proto::CommandSendError {
        producer_id,
        sequence_id,
        error: error as i32,
        message: message.into(),
    });
    Outbound::Command(Box::new(c))
}

/// MESSAGE carrying a stored entry; `ack_set` lists a partly acknowledged batch's remaining
/// indices (empty when none were acknowledged).
pub fn message(
    consumer_id: u64,
    id: proto::MessageIdData,
    redelivery_count: u32,
    ack_set: Vec<i64>,
    entry: Bytes,
) -> Outbound {
    let mut c = base(Type::Message);
    c.message = Some(proto::CommandMessage {
        consumer_id,
        message_id: id,
        redelivery_count: (redelivery_count > 0).then_some(redelivery_count),
        ack_set,
        ..Default::default()
    });
    Outbound::Message(Box::new(c), entry)
}

/// CLOSE_CONSUMER sent by the broker.
pub fn close_consumer(consumer_id: u64) -> Outbound {
    let mut c = base(Type::CloseConsumer);
    c.close_consumer = Some(proto::CommandCloseConsumer {
        consumer_id,
        request_id: u64::MAX,
        ..Default::default()
    });
    Outbound::Command(Box::new(c))
}

/// CLOSE_PRODUCER sent by the broker (the topic is going away; the client reconnects).
pub fn close_producer(producer_id: u64) -> Outbound {
    let mut c = base(Type::CloseProducer);
    c.close_producer = Some(proto::CommandCloseProducer {
        producer_id,
        request_id: u64::MAX,
        ..Default::default()
    });
    Outbound::Command(Box::new(c))
}

/// ACTIVE_CONSUMER_CHANGE (Failover subscriptions).
pub fn active_consumer_change(consumer_id: u64, is_active: bool) -> Outbound {
    let mut c = base(Type::ActiveConsumerChange);
    c.active_consumer_change = Some(proto::CommandActiveConsumerChange {
        consumer_id,
        is_active: Some(is_active),
    });
    Outbound::Command(Box::new(c))
}

/// GET_SCHEMA_RESPONSE: the schema, or an error code.
pub fn get_schema_response(
    request_id: u64,
    result: Result<(proto::Schema, Vec<u8>), (proto::ServerError, String)>,
) -> Outbound {
    let mut c = base(Type::GetSchemaResponse);
    c.get_schema_response = Some(match result {
        Ok((schema, version)) => proto::CommandGetSchemaResponse {
            request_id,
            schema: Some(schema),
            schema_version: Some(version),
            ..Default::default()
        },
        Err((code, message)) => proto::CommandGetSchemaResponse {
            request_id,
            error_code: Some(code as i32),
            error_message: Some(message),
            ..Default::default()
        },
    });
    Outbound::Command(Box::new(c))
}

/// GET_LAST_MESSAGE_ID_RESPONSE.
pub fn last_message_id(
    request_id: u64,
    last: proto::MessageIdData,
    mark_delete: Option<proto::MessageIdData>,
) -> Outbound {
    let mut c = base(Type::GetLastMessageIdResponse);
    c.get_last_message_id_response = Some(proto::CommandGetLastMessageIdResponse {
        last_message_id: last,
        request_id,
        consumer_mark_delete_position: mark_delete,
    });
    Outbound::Command(Box::new(c))
}
