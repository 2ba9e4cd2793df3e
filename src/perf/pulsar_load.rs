//! `ledgerlake perf produce|consume`: load over the Pulsar protocol against a running service,
//! in the spirit of pulsar-perf. Producers batch like Pulsar clients (several messages per
//! entry), keep a window of messages in flight, and measure publish latency from each message's
//! scheduled send time (so client-side batching and any lag count) to its SEND_RECEIPT.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::net::TcpStream;
use tokio_util::codec::{FramedRead, FramedWrite};

use super::{latency_histogram, record, Latency};
use crate::protocol::client::{self, ClientCodec};
use crate::protocol::frame::Frame;
use crate::protocol::proto::base_command::Type;
use crate::protocol::proto::command_subscribe::SubType;

/// Why a load run failed.
#[derive(Debug, thiserror::Error)]
pub enum PulsarLoadError {
    /// Connecting or talking to the service failed.
    #[error("connection to {addr}: {source}")]
    Io {
        /// Address.
        addr: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The service answered something unexpected.
    #[error("{0}")]
    Protocol(String),
}

/// The read half of a client connection.
pub(super) type Reader = FramedRead<tokio::net::tcp::OwnedReadHalf, ClientCodec>;
/// The write half of a client connection.
pub(super) type Writer = FramedWrite<tokio::net::tcp::OwnedWriteHalf, ClientCodec>;

/// Connects and says CONNECT.
pub(super) async fn connect(
    addr: &str,
    token: Option<&str>,
) -> Result<(Reader, Writer), PulsarLoadError> {
    let io = |source| PulsarLoadError::Io {
        addr: addr.to_string(),
        source,
    };
    let stream = TcpStream::connect(addr).await.map_err(io)?;
    stream.set_nodelay(true).map_err(io)?;
    let (r, w) = stream.into_split();
    let mut rd = FramedRead::new(r, ClientCodec::new(64 << 20));
    let mut wr = FramedWrite::new(w, ClientCodec::new(64 << 20));
    wr.send(client::connect(
        concat!("ledgerlake-perf-", env!("CARGO_PKG_VERSION")),
        token,
    ))
    .await
    .map_err(io)?;
    expect(&mut rd, Type::Connected).await?;
    Ok((rd, wr))
}

async fn expect(rd: &mut Reader, want: Type) -> Result<Frame, PulsarLoadError> {
    loop {
        match rd.next().await {
            Some(Ok(f)) if f.command.r#type == want as i32 => return Ok(f),
            Some(Ok(f)) if f.command.r#type == Type::Error as i32 => {
                return Err(PulsarLoadError::Protocol(format!(
                    "service refused: {:?}",
                    f.command.error
                )))
            }
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Err(PulsarLoadError::Protocol(e.to_string())),
            None => return Err(PulsarLoadError::Protocol("connection closed".into())),
        }
    }
}

/// Calls `progress` with the rate of `counter` every 2 s until aborted.
pub(super) fn spawn_reporter(
    counter: Arc<AtomicU64>,
    progress: impl Fn(f64) + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut last = 0;
        let mut tick = tokio::time::interval(Duration::from_secs(2));
        tick.tick().await;
        loop {
            tick.tick().await;
            let now = counter.load(Ordering::Relaxed);
            progress((now - last) as f64 / 2.0);
            last = now;
        }
    })
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Consumer load parameters.
#[derive(Debug, Clone)]
pub struct ConsumeOptions {
    /// `host:port` of the Pulsar listener.
    pub addr: String,
    /// Token sent on CONNECT (authentication on).
    pub token: Option<String>,
    /// Topics (the partitions of a partitioned topic, or plain topics); each gets `consumers`
    /// consumers.
    pub topics: Vec<String>,
    /// Subscription name.
    pub subscription: String,
    /// Consumers (Shared when more than one).
    pub consumers: usize,
    /// Measured duration (the longest run when `messages` is set).
    pub duration: Duration,
    /// Stop once this many messages arrived; the rate is then measured up to the last one.
    pub messages: Option<u64>,
}

/// Result of a consumer run.
#[derive(Debug, Clone, Serialize)]
pub struct ConsumeResult {
    /// Messages received.
    pub messages: u64,
    /// Seconds measured.
    pub seconds: f64,
    /// Messages per second.
    pub msgs_per_s: f64,
    /// Publish-to-receive latency (ms resolution, from the message's publish time).
    pub end_to_end: Latency,
}

/// Runs consumers from the earliest position; `progress(msgs_per_s)` every 2 s.
pub async fn consume(
    opts: ConsumeOptions,
    progress: impl Fn(f64) + Send + 'static,
) -> Result<ConsumeResult, PulsarLoadError> {
    let received = Arc::new(AtomicU64::new(0));
    let hist: Arc<Mutex<Histogram<u64>>> = Arc::new(Mutex::new(latency_histogram()));
    let start = Instant::now();
    let end = start + opts.duration;
    let reached: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let stop_after = opts.messages;
    let sub_type = if opts.consumers > 1 {
        SubType::Shared
    } else {
        SubType::Exclusive
    };
    let mut tasks = Vec::new();
    let pairs = opts
        .topics
        .iter()
        .flat_map(|t| (0..opts.consumers).map(move |_| t.clone()));
    for (i, topic) in pairs.enumerate() {
        let (mut rd, mut wr) = connect(&opts.addr, opts.token.as_deref()).await?;
        let consumer_id = i as u64;
        wr.send(client::subscribe(
            &topic,
            &opts.subscription,
            sub_type,
            consumer_id,
            1,
            true,
        ))
        .await
        .map_err(|e| PulsarLoadError::Protocol(e.to_string()))?;
        expect(&mut rd, Type::Success).await?;
        let (received, hist, reached) = (received.clone(), hist.clone(), reached.clone());
        tasks.push(tokio::spawn(async move {
            let _ = wr.send(client::flow(consumer_id, 1000)).await;
            let mut since_flow = 0u32;
            let mut h = latency_histogram();
            loop {
                let next = tokio::time::timeout_at(end.into(), rd.next()).await;
                let Ok(Some(Ok(frame))) = next else { break };
                if frame.command.r#type == Type::Ping as i32 {
                    let _ = wr.send(client::pong()).await;
                    continue;
                }
                let (Some(msg), Some(payload)) = (frame.command.message, frame.payload) else {
                    continue;
                };
                let n = payload.metadata.num_messages_in_batch.unwrap_or(1).max(1) as u32;
                let age = now_ms().saturating_sub(payload.metadata.publish_time);
                for _ in 0..n {
                    record(&mut h, Duration::from_millis(age));
                }
                let total = received.fetch_add(u64::from(n), Ordering::Relaxed) + u64::from(n);
                if stop_after.is_some_and(|want| total >= want) {
                    let mut at = reached.lock().unwrap_or_else(|p| p.into_inner());
                    at.get_or_insert_with(Instant::now);
                    break;
                }
                if stop_after.is_some_and(|want| received.load(Ordering::Relaxed) >= want) {
                    break;
                }
                since_flow += n;
                if since_flow >= 500 {
                    let send = async {
                        if sub_type == SubType::Exclusive {
                            wr.send(client::ack_cumulative(consumer_id, msg.message_id.clone()))
                                .await?;
                        }
                        wr.send(client::flow(consumer_id, since_flow)).await
                    };
                    if send.await.is_err() {
                        break;
                    }
                    since_flow = 0;
                }
            }
            let _ = hist.lock().unwrap_or_else(|p| p.into_inner()).add(&h);
        }));
    }
    let reporter = spawn_reporter(received.clone(), progress);
    for t in tasks {
        let _ = t.await;
    }
    reporter.abort();
    let messages = received.load(Ordering::Relaxed);
    let seconds = match *reached.lock().unwrap_or_else(|p| p.into_inner()) {
        Some(at) => (at - start).as_secs_f64(),
        None => opts.duration.as_secs_f64(),
    };
    let end_to_end = Latency::from_histogram(&hist.lock().unwrap_or_else(|p| p.into_inner()));
    Ok(ConsumeResult {
        messages,
        seconds,
        msgs_per_s: messages as f64 / seconds,
        end_to_end,
    })
}
