//! The client side of the protocol, for ledgerlake's own tools (`ledgerlake perf`): a codec
//! that sends client commands and decodes broker frames, and builders for the commands a
//! producer and a consumer need, including Pulsar batches.

use bytes::{Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use super::codec::FRAME_OVERHEAD;
use super::entry::build_batch_entry;
use super::frame::{
    build_entry, check, encode_command, encode_payload_command, parse, Frame, FrameError,
};
use super::proto::base_command::Type;
use super::proto::{self, BaseCommand};

/// A frame a client sends.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientFrame {
    /// A simple command.
    Command(BaseCommand),
    /// SEND with its entry (checksum block included).
    Send(BaseCommand, Bytes),
}

/// Codec for the client side of a connection.
#[derive(Debug, Clone)]
pub struct ClientCodec {
    max_frame: usize,
}

impl ClientCodec {
    /// Accepts broker frames carrying messages up to `max_message_size`.
    pub fn new(max_message_size: usize) -> Self {
        Self {
            max_frame: max_message_size + FRAME_OVERHEAD,
        }
    }
}

impl Decoder for ClientCodec {
    type Item = Frame;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        match check(src, self.max_frame)? {
            None => Ok(None),
            Some(len) => parse(src.split_to(len).freeze()).map(Some),
        }
    }
}

impl Encoder<ClientFrame> for ClientCodec {
    type Error = std::io::Error;

    fn encode(&mut self, item: ClientFrame, dst: &mut BytesMut) -> Result<(), std::io::Error> {
        match item {
            ClientFrame::Command(c) => encode_command(&c, dst),
            ClientFrame::Send(c, entry) => encode_payload_command(&c, &entry, dst),
        }
        Ok(())
    }
}

fn base(kind: Type) -> BaseCommand {
    BaseCommand {
        r#type: kind as i32,
        ..Default::default()
    }
}

/// CONNECT.
pub fn connect(client_version: &str, token: Option<&str>) -> ClientFrame {
    let mut c = base(Type::Connect);
    c.connect = Some(proto::CommandConnect {
        client_version: client_version.to_string(),
        protocol_version: Some(20),
        auth_method_name: token.map(|_| "token".to_string()),
        auth_data: token.map(|t| t.as_bytes().to_vec()),
        ..Default::default()
    });
    ClientFrame::Command(c)
}

/// PONG (answer to a broker PING).
pub fn pong() -> ClientFrame {
    let mut c = base(Type::Pong);
    c.pong = Some(proto::CommandPong {});
    ClientFrame::Command(c)
}

/// PRODUCER.
pub fn producer(topic: &str, producer_id: u64, request_id: u64) -> ClientFrame {
    let mut c = base(Type::Producer);
    c.producer = Some(proto::CommandProducer {
        topic: topic.to_string(),
        producer_id,
        request_id,
        ..Default::default()
    });
    ClientFrame::Command(c)
}

/// SUBSCRIBE (durable, from the earliest or latest position).
pub fn subscribe(
    topic: &str,
    subscription: &str,
    sub_type: proto::command_subscribe::SubType,
    consumer_id: u64,
    request_id: u64,
    earliest: bool,
) -> ClientFrame {
    use proto::command_subscribe::InitialPosition;
    let mut c = base(Type::Subscribe);
    c.subscribe = Some(proto::CommandSubscribe {
        topic: topic.to_string(),
        subscription: subscription.to_string(),
        sub_type: sub_type as i32,
        consumer_id,
        request_id,
        initial_position: Some(if earliest {
            InitialPosition::Earliest
        } else {
            InitialPosition::Latest
        } as i32),
        ..Default::default()
    });
    ClientFrame::Command(c)
}

/// CLOSE_CONSUMER (the subscription stays).
pub fn close_consumer(consumer_id: u64, request_id: u64) -> ClientFrame {
    let mut c = base(Type::CloseConsumer);
    c.close_consumer = Some(proto::CommandCloseConsumer {
        consumer_id,
        request_id,
        ..Default::default()
    });
    ClientFrame::Command(c)
}

/// FLOW.
pub fn flow(consumer_id: u64, permits: u32) -> ClientFrame {
    let mut c = base(Type::Flow);
    c.flow = Some(proto::CommandFlow {
        consumer_id,
        message_permits: permits,
    });
    ClientFrame::Command(c)
}

/// Cumulative ACK up to a message id.
pub fn ack_cumulative(consumer_id: u64, id: proto::MessageIdData) -> ClientFrame {
    let mut c = base(Type::Ack);
    c.ack = Some(proto::CommandAck {
        consumer_id,
        ack_type: proto::command_ack::AckType::Cumulative as i32,
        message_id: vec![id],
        ..Default::default()
    });
    ClientFrame::Command(c)
}

/// SEND of `messages` as one entry: a Pulsar batch when there are several (each message framed
/// with its SingleMessageMetadata), a plain message when there is one.
pub fn send(
    producer_id: u64,
    producer_name: &str,
    sequence_id: u64,
    publish_time_ms: u64,
    messages: &[Bytes],
) -> ClientFrame {
    send_keyed(
        producer_id,
        producer_name,
        sequence_id,
        publish_time_ms,
        messages,
        &[],
    )
}

/// SEND of `messages` with partition keys (`keys[i]` for message `i`; missing or `None`: no
/// key), one entry (a batch when more than one message).
pub fn send_keyed(
    producer_id: u64,
    producer_name: &str,
    sequence_id: u64,
    publish_time_ms: u64,
    messages: &[Bytes],
    keys: &[Option<String>],
) -> ClientFrame {
    let key_of = |i: usize| keys.get(i).cloned().flatten();
    let mut metadata = proto::MessageMetadata {
        producer_name: producer_name.to_string(),
        sequence_id,
        publish_time: publish_time_ms,
        ..Default::default()
    };
    let entry = if messages.len() == 1 {
        metadata.partition_key = key_of(0);
        build_entry(&metadata, &messages[0])
    } else {
        metadata.highest_sequence_id = Some(sequence_id + messages.len() as u64 - 1);
        let singles = messages.iter().enumerate().map(|(i, m)| {
            let single = proto::SingleMessageMetadata {
                sequence_id: Some(sequence_id + i as u64),
                partition_key: key_of(i),
                ..Default::default()
            };
            (single, m)
        });
        build_batch_entry(metadata, singles)
    };
    let mut c = base(Type::Send);
    c.send = Some(proto::CommandSend {
        producer_id,
        sequence_id,
        num_messages: Some(messages.len() as i32),
        highest_sequence_id: Some(sequence_id + messages.len() as u64 - 1),
        ..Default::default()
    });
    ClientFrame::Send(c, entry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::codec::PulsarCodec;
    use crate::protocol::command::Inbound;
    use crate::protocol::frame::entry_message_count;

    #[test]
    fn batches_built_here_are_read_by_the_broker_codec() -> Result<(), Box<dyn std::error::Error>> {
        let msgs: Vec<Bytes> = (0..5).map(|i| Bytes::from(vec![i as u8; 10])).collect();
        let mut buf = BytesMut::new();
        ClientCodec::new(1 << 20).encode(send(1, "p", 10, 5, &msgs), &mut buf)?;
        match PulsarCodec::new(1 << 20).decode(&mut buf)? {
            Some(Inbound::Send(cmd, payload)) => {
                assert_eq!(cmd.sequence_id, 10);
                assert!(payload.checksum_ok);
                assert_eq!(entry_message_count(&payload.entry), 5);
                assert_eq!(payload.metadata.highest_sequence_id, Some(14));
            }
            other => return Err(format!("unexpected {other:?}").into()),
        }
        Ok(())
    }
}
