//! The peer measurement for `ledgerlake perf produce`: the same workload against NATS JetStream
//! (file storage, `sync_interval: always`, so every acknowledged message is fsynced as ours are),
//! driven by async-nats with the same payload size and in-flight window.
//!
//! ```sh
//! nats-server -c js.conf &   # listen 127.0.0.1; jetstream { store_dir: DIR, sync_interval: always }
//! cargo bench --bench nats_jetstream -- --url nats://127.0.0.1:4222 --size 100 --duration 10 \
//!     [--rate 20000] [--window 1000]
//! ```
//! Prints one JSON object: msg/s, MB/s and publish-to-ack latency percentiles (µs), latency
//! counted from each message's scheduled send time as `ledgerlake perf produce` does. NATS
//! publishes one message per request (it has no client-side batching); the window bounds the
//! acknowledgements awaited at once (async-nats blocks new publishes while too many acks are
//! outstanding, so keep it at or below its in-flight limit).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use ledgerlake::perf::{latency_histogram, record, Latency};

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

#[allow(clippy::expect_used)]
fn main() {
    let Some(url) = arg("--url") else {
        // A plain `cargo bench` has no server to measure.
        eprintln!("nats_jetstream: pass --url nats://HOST:PORT (see the file's docs)");
        return;
    };
    let size: usize = arg("--size").and_then(|s| s.parse().ok()).unwrap_or(100);
    let seconds: u64 = arg("--duration").and_then(|s| s.parse().ok()).unwrap_or(10);
    let rate: Option<f64> = arg("--rate").and_then(|s| s.parse().ok());
    let window: usize = arg("--window").and_then(|s| s.parse().ok()).unwrap_or(1000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let client = async_nats::connect(&url).await.expect("connect to nats");
        let js = async_nats::jetstream::new(client);
        let _ = js.delete_stream("perf").await;
        js.create_stream(async_nats::jetstream::stream::Config {
            name: "perf".into(),
            subjects: vec!["perf.>".into()],
            storage: async_nats::jetstream::stream::StorageType::File,
            ..Default::default()
        })
        .await
        .expect("create stream");
        let payload = bytes::Bytes::from(ledgerlake::perf::pseudo_random_bytes(size));
        let mut h = latency_histogram();
        let start = Instant::now();
        let end = start + Duration::from_secs(seconds);
        let mut inflight = VecDeque::new();
        let mut sent = 0u64;
        let mut acked = 0u64;
        while Instant::now() < end {
            let scheduled = match rate {
                Some(r) => {
                    let at = start + Duration::from_secs_f64(sent as f64 / r);
                    if at > Instant::now() {
                        tokio::time::sleep_until(at.into()).await;
                    }
                    at
                }
                None => Instant::now(),
            };
            let ack = js
                .publish("perf.x", payload.clone())
                .await
                .expect("publish");
            inflight.push_back((scheduled, ack));
            sent += 1;
            while inflight.len() >= window {
                if let Some((t, ack)) = inflight.pop_front() {
                    ack.await.expect("ack");
                    record(&mut h, t.elapsed());
                    acked += 1;
                }
            }
        }
        while let Some((t, ack)) = inflight.pop_front() {
            ack.await.expect("ack");
            record(&mut h, t.elapsed());
            acked += 1;
        }
        let secs = seconds as f64;
        let latency = Latency::from_histogram(&h);
        println!(
            "{}",
            serde_json::json!({
                "messages": acked, "seconds": secs, "msgs_per_s": acked as f64 / secs,
                "mb_per_s": acked as f64 * size as f64 / secs / 1e6, "latency": latency,
            })
        );
    });
}
