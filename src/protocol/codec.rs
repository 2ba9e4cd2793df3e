//! A `tokio_util` codec over [`frame`](super::frame): decodes checked frames into [`Inbound`]
//! commands and encodes [`Outbound`] ones.

use bytes::BytesMut;
use tokio_util::codec::{Decoder, Encoder};

use super::command::{Inbound, Outbound};
use super::frame::{check, encode_command, encode_payload_command, parse, FrameError};

/// Room for the command and metadata around a message of the maximum size.
pub const FRAME_OVERHEAD: usize = 64 * 1024;

/// Most bytes reserved ahead of a frame's arrival.
const RESERVE_AHEAD: usize = 64 * 1024;

/// The Pulsar codec for one connection.
#[derive(Debug, Clone)]
pub struct PulsarCodec {
    /// Largest frame accepted (message limit plus [`FRAME_OVERHEAD`]).
    max_frame: usize,
}

impl PulsarCodec {
    /// A codec accepting messages up to `max_message_size` bytes.
    pub fn new(max_message_size: usize) -> Self {
        Self {
            max_frame: max_message_size + FRAME_OVERHEAD,
        }
    }
}

impl Decoder for PulsarCodec {
    type Item = Inbound;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Inbound>, FrameError> {
        match check(src, self.max_frame)? {
            None => {
                if src.len() >= 4 {
                    // Room for the rest of the frame, but no more than a chunk ahead of what
                    // arrived: a header alone must not reserve a whole large frame (thousands
                    // of connections that send only headers would hold gigabytes).
                    let total = u32::from_be_bytes([src[0], src[1], src[2], src[3]]) as usize;
                    src.reserve((4 + total - src.len()).min(RESERVE_AHEAD));
                }
                Ok(None)
            }
            Some(len) => {
                let frame = parse(src.split_to(len).freeze())?;
                Inbound::try_from(frame).map(Some)
            }
        }
    }
}

impl Encoder<Outbound> for PulsarCodec {
    type Error = std::io::Error;

    fn encode(&mut self, item: Outbound, dst: &mut BytesMut) -> Result<(), std::io::Error> {
        match item {
            Outbound::Command(c) => encode_command(&c, dst),
            Outbound::Message(c, entry) => encode_payload_command(&c, &entry, dst),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::command::{self, Inbound, Outbound};
    use super::super::frame::{build_entry, FrameError};
    use super::super::proto::{self, base_command::Type, BaseCommand};
    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::FileFailurePersistence;

    fn encode(o: Outbound) -> BytesMut {
        let mut buf = BytesMut::new();
        let _ = PulsarCodec::new(1 << 20).encode(o, &mut buf);
        buf
    }

    fn send_frame(
        producer_id: u64,
        sequence_id: u64,
        payload: &[u8],
        key: Option<String>,
    ) -> BytesMut {
        let metadata = proto::MessageMetadata {
            producer_name: "p".into(),
            sequence_id,
            publish_time: 1_700_000_000_000,
            partition_key: key,
            ..Default::default()
        };
        let entry = build_entry(&metadata, payload);
        let cmd = BaseCommand {
            r#type: Type::Send as i32,
            send: Some(proto::CommandSend {
                producer_id,
                sequence_id,
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut buf = BytesMut::new();
        super::super::frame::encode_payload_command(&cmd, &entry, &mut buf);
        buf
    }

    #[test]
    fn ping_matches_the_wire_bytes_clients_send() -> Result<(), FrameError> {
        let wire = [0u8, 0, 0, 9, 0, 0, 0, 5, 8, 0x12, 0x92, 1, 0];
        let mut buf = BytesMut::from(&wire[..]);
        assert_eq!(
            PulsarCodec::new(1024).decode(&mut buf)?,
            Some(Inbound::Ping)
        );
        assert_eq!(&encode(command::ping())[..], &wire[..]);
        Ok(())
    }

    #[test]
    fn partial_frames_wait_for_more_bytes() -> Result<(), FrameError> {
        let full = send_frame(1, 2, b"hello", None);
        let mut codec = PulsarCodec::new(1 << 20);
        for cut in 0..full.len() {
            let mut part = BytesMut::from(&full[..cut]);
            assert!(
                codec.decode(&mut part)?.is_none(),
                "decoded from {cut} bytes"
            );
        }
        let mut whole = full.clone();
        match codec.decode(&mut whole)? {
            Some(Inbound::Send(send, payload)) => {
                assert_eq!((send.producer_id, send.sequence_id), (1, 2));
                assert!(payload.checksum_ok);
                assert_eq!(&payload.body()[..], b"hello");
                assert_eq!(payload.metadata.sequence_id, 2);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(whole.is_empty());
        Ok(())
    }

    #[test]
    fn bad_checksum_is_reported_not_fatal() -> Result<(), FrameError> {
        let mut frame = send_frame(1, 2, b"hello", None);
        let last = frame.len() - 1;
        frame[last] ^= 1;
        match PulsarCodec::new(1 << 20).decode(&mut frame)? {
            Some(Inbound::Send(_, payload)) => assert!(!payload.checksum_ok),
            other => panic!("unexpected {other:?}"),
        }
        Ok(())
    }

    #[test]
    fn oversized_and_malformed_frames_are_errors() {
        let mut big = BytesMut::from(&[0x7f, 0, 0, 0, 0, 0, 0, 0][..]);
        assert!(matches!(
            PulsarCodec::new(1024).decode(&mut big),
            Err(FrameError::TooLarge { .. })
        ));
        let mut bad = BytesMut::from(&[0, 0, 0, 6, 0, 0, 0, 9, 1, 2][..]);
        assert!(PulsarCodec::new(1024).decode(&mut bad).is_err());
        // A command type whose body is missing.
        let cmd = BaseCommand {
            r#type: Type::Producer as i32,
            ..Default::default()
        };
        let mut buf = encode(Outbound::Command(Box::new(cmd)));
        assert!(matches!(
            PulsarCodec::new(1024).decode(&mut buf),
            Err(FrameError::MissingBody("PRODUCER"))
        ));
    }

    /// Checks that a parsed command is the expected variant.
    type IsVariant = fn(&Inbound) -> bool;

    proptest! {
        #![proptest_config(ProptestConfig {
            failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
            ..ProptestConfig::default()
        })]
        #[test]
        fn send_round_trips(producer in any::<u64>(), seq in any::<u64>(),
                            payload in proptest::collection::vec(any::<u8>(), 0..2048),
                            key in proptest::option::of("[a-z]{0,12}")) {
            let mut frame = send_frame(producer, seq, &payload, key.clone());
            match PulsarCodec::new(1 << 20).decode(&mut frame) {
                Ok(Some(Inbound::Send(send, p))) => {
                    prop_assert_eq!(send.producer_id, producer);
                    prop_assert_eq!(send.sequence_id, seq);
                    prop_assert_eq!(&p.body()[..], &payload[..]);
                    prop_assert_eq!(p.metadata.partition_key, key);
                    prop_assert!(p.checksum_ok);
                }
                other => prop_assert!(false, "decoded {:?}", other),
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut buf = BytesMut::from(&bytes[..]);
            let _ = PulsarCodec::new(1 << 16).decode(&mut buf);
        }

        #[test]
        fn every_outbound_command_round_trips(request_id in any::<u64>(), id in any::<u64>(),
                                              name in "[a-z]{1,20}", seq in any::<i64>(),
                                              ledger in any::<u64>(), entry in any::<u64>(),
                                              partition in -1i32..16, n in any::<u32>(),
                                              flag in any::<bool>(),
                                              version in proptest::collection::vec(any::<u8>(), 0..9),
                                              payload in proptest::collection::vec(any::<u8>(), 0..300)) {
            use proto::ServerError;
            let mid = command::message_id(ledger, entry, partition, Some(partition));
            let schema = proto::Schema { name: name.clone(), schema_data: version.clone(),
                                         r#type: 2, properties: vec![] };
            let outs = vec![
                command::connected(&name, partition, n as i32),
                command::ping(),
                command::pong(),
                command::success(request_id),
                command::error(request_id, ServerError::ProducerBusy, name.clone()),
                command::partitioned_metadata(request_id, n),
                command::partitioned_metadata_failed(request_id, ServerError::TopicNotFound, name.clone()),
                command::lookup_connect(request_id, &name, None),
                command::lookup_failed(request_id, ServerError::InvalidTopicName, name.clone()),
                command::producer_success(request_id, &name, seq, Some(version.clone())),
                command::send_receipt(id, request_id, mid.clone()),
                command::send_error(id, request_id, ServerError::ChecksumError, name.clone()),
                command::close_consumer(id),
                command::active_consumer_change(id, flag),
                command::last_message_id(request_id, mid.clone(), flag.then(|| mid.clone())),
                command::get_schema_response(request_id, Ok((schema, version.clone()))),
                command::get_schema_response(request_id, Err((ServerError::TopicNotFound, name.clone()))),
                command::message(id, mid.clone(), n % 5, vec![seq], build_entry(&proto::MessageMetadata {
                    producer_name: name.clone(), sequence_id: id, publish_time: 7, ..Default::default()
                }, &payload)),
            ];
            for out in outs {
                let buf = encode(out.clone());
                let frame = super::super::frame::parse(buf.freeze())
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                match out {
                    Outbound::Command(expected) => {
                        prop_assert_eq!(&frame.command, &*expected);
                        prop_assert!(frame.payload.is_none());
                    }
                    Outbound::Message(expected, entry) => {
                        prop_assert_eq!(&frame.command, &*expected);
                        let p = frame.payload.ok_or_else(|| TestCaseError::fail("no payload"))?;
                        prop_assert!(p.checksum_ok);
                        prop_assert_eq!(&p.entry, &entry);
                        prop_assert_eq!(&p.body()[..], &payload[..]);
                    }
                }
            }
        }

        #[test]
        fn every_inbound_command_parses_to_its_typed_form(request_id in any::<u64>(), id in any::<u64>(),
                                                           topic in "[a-z]{1,12}", permits in any::<u32>()) {
            let cases: Vec<(BaseCommand, IsVariant)> = vec![
                (BaseCommand { r#type: Type::Connect as i32, connect: Some(proto::CommandConnect {
                    client_version: topic.clone(), protocol_version: Some(20), ..Default::default() }),
                    ..Default::default() }, |i| matches!(i, Inbound::Connect(_))),
                (BaseCommand { r#type: Type::Lookup as i32, lookup_topic: Some(proto::CommandLookupTopic {
                    topic: topic.clone(), request_id, ..Default::default() }), ..Default::default() },
                    |i| matches!(i, Inbound::Lookup(_))),
                (BaseCommand { r#type: Type::PartitionedMetadata as i32, partition_metadata: Some(
                    proto::CommandPartitionedTopicMetadata { topic: topic.clone(), request_id, ..Default::default() }),
                    ..Default::default() }, |i| matches!(i, Inbound::PartitionedMetadata(_))),
                (BaseCommand { r#type: Type::Producer as i32, producer: Some(proto::CommandProducer {
                    topic: topic.clone(), producer_id: id, request_id, ..Default::default() }),
                    ..Default::default() }, |i| matches!(i, Inbound::Producer(_))),
                (BaseCommand { r#type: Type::Subscribe as i32, subscribe: Some(proto::CommandSubscribe {
                    topic: topic.clone(), subscription: topic.clone(), consumer_id: id, request_id,
                    ..Default::default() }), ..Default::default() }, |i| matches!(i, Inbound::Subscribe(_))),
                (BaseCommand { r#type: Type::Flow as i32, flow: Some(proto::CommandFlow {
                    consumer_id: id, message_permits: permits }), ..Default::default() },
                    |i| matches!(i, Inbound::Flow(_))),
                (BaseCommand { r#type: Type::Ack as i32, ack: Some(proto::CommandAck {
                    consumer_id: id, ..Default::default() }), ..Default::default() },
                    |i| matches!(i, Inbound::Ack(_))),
                (BaseCommand { r#type: Type::CloseProducer as i32, close_producer: Some(
                    proto::CommandCloseProducer { producer_id: id, request_id, ..Default::default() }),
                    ..Default::default() }, |i| matches!(i, Inbound::CloseProducer(_))),
                (BaseCommand { r#type: Type::CloseConsumer as i32, close_consumer: Some(
                    proto::CommandCloseConsumer { consumer_id: id, request_id, ..Default::default() }),
                    ..Default::default() }, |i| matches!(i, Inbound::CloseConsumer(_))),
                (BaseCommand { r#type: Type::Unsubscribe as i32, unsubscribe: Some(
                    proto::CommandUnsubscribe { consumer_id: id, request_id, ..Default::default() }),
                    ..Default::default() }, |i| matches!(i, Inbound::Unsubscribe(_))),
                (BaseCommand { r#type: Type::RedeliverUnacknowledgedMessages as i32,
                    redeliver_unacknowledged_messages: Some(proto::CommandRedeliverUnacknowledgedMessages {
                        consumer_id: id, ..Default::default() }), ..Default::default() },
                    |i| matches!(i, Inbound::Redeliver(_))),
                (BaseCommand { r#type: Type::Seek as i32, seek: Some(proto::CommandSeek {
                    consumer_id: id, request_id, ..Default::default() }), ..Default::default() },
                    |i| matches!(i, Inbound::Seek(_))),
                (BaseCommand { r#type: Type::GetLastMessageId as i32, get_last_message_id: Some(
                    proto::CommandGetLastMessageId { consumer_id: id, request_id }), ..Default::default() },
                    |i| matches!(i, Inbound::GetLastMessageId(_))),
                (BaseCommand { r#type: Type::GetSchema as i32, get_schema: Some(proto::CommandGetSchema {
                    request_id, topic: topic.clone(), schema_version: None }), ..Default::default() },
                    |i| matches!(i, Inbound::GetSchema(_))),
                (BaseCommand { r#type: Type::ConsumerStats as i32, consumer_stats: Some(
                    proto::CommandConsumerStats { request_id, consumer_id: id }), ..Default::default() },
                    |i| matches!(i, Inbound::Unsupported { request_id: Some(_), .. })),
            ];
            for (cmd, is) in cases {
                let mut buf = encode(Outbound::Command(Box::new(cmd)));
                let parsed = PulsarCodec::new(1 << 20).decode(&mut buf)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?
                    .ok_or_else(|| TestCaseError::fail("incomplete"))?;
                prop_assert!(is(&parsed), "unexpected {:?}", parsed);
            }
        }
    }
}
