//! Consumes a topic from the earliest message with the Rust `pulsar` crate (pulsar-rs) and
//! writes one line per message: `ledger,entry,batch_index,payload_hex,key,props,publish,event`
//! (properties sorted as `k=v` joined by `;`, empty fields for absent values). The interop
//! tests compare these lines with what the official Python client received.
//!
//!     pulsar_rs_dump URL TOPIC SUBSCRIPTION COUNT OUT_FILE

use std::fmt::Write as _;
use std::io::Write as _;
use std::time::Duration;

use futures::TryStreamExt;
use pulsar::consumer::{ConsumerOptions, InitialPosition};
use pulsar::message::proto::command_subscribe::SubType;
use pulsar::{Consumer, Pulsar, TokioExecutor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, topic, subscription, count, out] = args.as_slice() else {
        return Err("usage: pulsar_rs_dump URL TOPIC SUBSCRIPTION COUNT OUT_FILE".into());
    };
    let count: usize = count.parse()?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        let client: Pulsar<TokioExecutor> =
            Pulsar::builder(url.as_str(), TokioExecutor).build().await?;
        let mut consumer: Consumer<Vec<u8>, _> = client
            .consumer()
            .with_topic(topic)
            .with_subscription(subscription)
            .with_subscription_type(SubType::Exclusive)
            .with_options(
                ConsumerOptions::default().with_initial_position(InitialPosition::Earliest),
            )
            .build()
            .await?;
        let mut file = std::io::BufWriter::new(std::fs::File::create(out)?);
        let mut line = String::new();
        for n in 0..count {
            let msg = tokio::time::timeout(Duration::from_secs(60), consumer.try_next())
                .await
                .map_err(|_| format!("no message after {n} of {count}"))??
                .ok_or("stream ended")?;
            let id = &msg.message_id.id;
            let m = msg.metadata();
            let mut props: Vec<String> = m
                .properties
                .iter()
                .map(|kv| format!("{}={}", kv.key, kv.value))
                .collect();
            props.sort();
            line.clear();
            write!(
                line,
                "{},{},{},",
                id.ledger_id,
                id.entry_id,
                id.batch_index.unwrap_or(-1)
            )?;
            for b in &msg.payload.data {
                write!(line, "{b:02x}")?;
            }
            writeln!(
                line,
                ",{},{},{},{}",
                m.partition_key.as_deref().unwrap_or(""),
                props.join(";"),
                m.publish_time,
                m.event_time
                    .filter(|t| *t > 0)
                    .map_or(String::new(), |t| t.to_string())
            )?;
            file.write_all(line.as_bytes())?;
            if n % 1000 == 999 || n + 1 == count {
                consumer.ack(&msg).await?;
            }
        }
        file.flush()?;
        consumer.close().await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
}
