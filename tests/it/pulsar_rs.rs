//! The Rust `pulsar` crate (pulsar-rs) against an in-process service: produce and consume
//! unbatched and batched/compressed messages, with ordered receipts and acks.

use futures::TryStreamExt;
use ledgerlake::config::{Config, ServerConfig};
use ledgerlake::service::Service;
use pulsar::compression::{Compression, CompressionLz4, CompressionZstd};
use pulsar::consumer::{ConsumerOptions, InitialPosition};
use pulsar::message::proto::command_subscribe::SubType;
use pulsar::message::Payload;
use pulsar::{producer, Consumer, DeserializeMessage, Pulsar, SerializeMessage, TokioExecutor};

use crate::common::{runtime, TestResult};

/// Raw bytes in and out.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Raw(Vec<u8>);

impl SerializeMessage for Raw {
    fn serialize_message(input: Self) -> Result<producer::Message, pulsar::Error> {
        Ok(producer::Message {
            payload: input.0,
            ..Default::default()
        })
    }
}

impl DeserializeMessage for Raw {
    type Output = Raw;
    fn deserialize_message(payload: &Payload) -> Raw {
        Raw(payload.data.clone())
    }
}

async fn start() -> Result<(tempfile::TempDir, Service), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let config = Config {
        data_dir: dir.path().join("data"),
        server: ServerConfig {
            pulsar_addr: "127.0.0.1:0".parse()?,
            http_addr: "127.0.0.1:0".parse()?,
            pg_addr: "127.0.0.1:0".parse()?,
            ..ServerConfig::default()
        },
        ..Config::default()
    };
    let service = Service::start(&config).await?;
    Ok((dir, service))
}

async fn round_trip(
    client: &Pulsar<TokioExecutor>,
    topic: &str,
    options: producer::ProducerOptions,
    n: usize,
) -> TestResult {
    let batched = options.batch_size.is_some();
    let mut producer = client
        .producer()
        .with_topic(topic)
        .with_options(options)
        .build()
        .await?;
    let sent: Vec<Raw> = (0..n)
        .map(|i| Raw(format!("{topic}-{i}-{}", "x".repeat(i % 50)).into_bytes()))
        .collect();
    let mut ids = Vec::new();
    // pulsar-rs bounds its own in-flight sends (SlowDown): send in windows of 50.
    for window in sent.chunks(50) {
        let mut receipts = Vec::new();
        for m in window {
            receipts.push(producer.send_non_blocking(m.clone()).await?);
        }
        if batched {
            producer.send_batch().await?;
        }
        for r in receipts {
            let receipt = r.await?;
            let id = receipt.message_id.ok_or("receipt without message id")?;
            ids.push((id.ledger_id, id.entry_id, id.batch_index.unwrap_or(-1)));
        }
    }
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    assert_eq!(ids, sorted, "receipts must come back in send order");

    let mut consumer: Consumer<Raw, _> = client
        .consumer()
        .with_topic(topic)
        .with_subscription("rs")
        .with_subscription_type(SubType::Exclusive)
        .with_options(ConsumerOptions::default().with_initial_position(InitialPosition::Earliest))
        .build()
        .await?;
    let mut got = Vec::new();
    while got.len() < n {
        let msg = tokio::time::timeout(std::time::Duration::from_secs(10), consumer.try_next())
            .await??
            .ok_or("stream ended")?;
        consumer.ack(&msg).await?;
        got.push(msg.deserialize());
    }
    assert_eq!(got, sent);
    Ok(())
}

#[test]
fn pulsar_rs_produces_and_consumes() -> TestResult {
    runtime()?.block_on(async {
        let (_dir, service) = start().await?;
        let url = format!("pulsar://{}", service.pulsar_addr);
        let client: Pulsar<_> = Pulsar::builder(url, TokioExecutor).build().await?;
        round_trip(
            &client,
            "rs-plain",
            producer::ProducerOptions::default(),
            500,
        )
        .await?;
        round_trip(
            &client,
            "rs-lz4-batched",
            producer::ProducerOptions {
                batch_size: Some(10),
                compression: Some(Compression::Lz4(CompressionLz4::default())),
                ..Default::default()
            },
            500,
        )
        .await?;
        round_trip(
            &client,
            "persistent://public/default/rs-zstd",
            producer::ProducerOptions {
                compression: Some(Compression::Zstd(CompressionZstd::default())),
                ..Default::default()
            },
            200,
        )
        .await?;
        // A schema registered by a producer is returned by GET_SCHEMA.
        let string_schema = pulsar::message::proto::Schema {
            name: "s".into(),
            r#type: pulsar::message::proto::schema::Type::String as i32,
            ..Default::default()
        };
        round_trip(
            &client,
            "rs-schema",
            producer::ProducerOptions {
                schema: Some(string_schema),
                ..Default::default()
            },
            10,
        )
        .await?;
        let mut consumer: Consumer<Raw, _> = client
            .consumer()
            .with_topic("rs-schema")
            .with_subscription("schema-reader")
            .build()
            .await?;
        let schema = consumer
            .get_schema("rs-schema", None)
            .await?
            .ok_or("no schema returned")?;
        assert_eq!(
            schema.r#type,
            pulsar::message::proto::schema::Type::String as i32
        );
        drop(consumer);
        drop(client);
        service.shutdown().await?;
        Ok(())
    })
}

/// Malformed or oversized frames close only the connection that sent them.
#[test]
fn bad_frames_close_only_their_connection() -> TestResult {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    runtime()?.block_on(async {
        let (_dir, service) = start().await?;
        let url = format!("pulsar://{}", service.pulsar_addr);
        let client: Pulsar<_> = Pulsar::builder(url, TokioExecutor).build().await?;
        let mut producer = client.producer().with_topic("isolation").build().await?;
        producer
            .send_non_blocking(Raw(b"before".to_vec()))
            .await?
            .await?;

        for garbage in [
            // A frame declaring 1 GiB: refused before any allocation.
            vec![0x40, 0, 0, 0, 0, 0, 0, 4, 1, 2, 3, 4],
            // A well-sized frame whose command is not protobuf.
            vec![0, 0, 0, 8, 0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff],
            // A command size larger than the frame.
            vec![0, 0, 0, 6, 0, 0, 0, 99, 8, 2],
        ] {
            let mut raw = tokio::net::TcpStream::connect(service.pulsar_addr).await?;
            raw.write_all(&garbage).await?;
            let mut buf = [0u8; 64];
            let n = tokio::time::timeout(std::time::Duration::from_secs(5), raw.read(&mut buf))
                .await??;
            assert_eq!(
                n, 0,
                "the broker must close a connection that sent {garbage:?}"
            );
        }

        // The well-behaved client's connection is untouched.
        producer
            .send_non_blocking(Raw(b"after".to_vec()))
            .await?
            .await?;
        drop(producer);
        drop(client);
        service.shutdown().await?;
        Ok(())
    })
}
