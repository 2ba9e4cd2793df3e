//! `ledgerlake perf produce|consume`: load over the Pulsar protocol against a running service,
//! in the spirit of pulsar-perf. Producers batch like Pulsar clients (several messages per
//! entry), keep a window of messages in flight, and measure publish latency from each message's
//! scheduled send time (so client-side batching and any lag count) to its SEND_RECEIPT.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio_util::codec::{FramedRead, FramedWrite};

use super::{latency_histogram, record, Latency};
use crate::protocol::client::{self, ClientCodec};
use crate::protocol::frame::Frame;
use crate::protocol::proto::base_command::Type;
use crate::protocol::proto::command_subscribe::SubType;

/// Sends awaiting their receipt, in order: (first sequence id, scheduled time of each message).
type InFlight = Arc<Mutex<VecDeque<(u64, Vec<Instant>)>>>;

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

/// Producer load parameters.
#[derive(Debug, Clone)]
pub struct ProduceOptions {
    /// `host:port` of the Pulsar listener.
    pub addr: String,
    /// Token sent on CONNECT (authentication on).
    pub token: Option<String>,
    /// Topics (each gets `producers_per_topic` producers).
    pub topics: Vec<String>,
    /// Producers per topic, each on its own connection.
    pub producers_per_topic: usize,
    /// Total messages per second across producers; `None` = as fast as possible.
    pub rate: Option<u64>,
    /// Payload size.
    pub size: usize,
    /// Messages per batch (1 = no batching).
    pub batch_max: usize,
    /// Messages in flight per producer.
    pub max_pending: usize,
    /// Measured duration (the longest run when `messages` is set).
    pub duration: Duration,
    /// Stop after this many messages in all (split evenly across producers).
    pub messages: Option<u64>,
    /// Partition keys `key-0..key-{keys-1}` (0: no keys), drawn per message.
    pub keys: u64,
    /// Realistic JSON payloads of about `size` bytes, each different (else one random payload).
    pub json: bool,
    /// Backfill: publish times spread evenly over this span, ending now (needs `messages`).
    pub publish_span: Option<Duration>,
}

/// Result of a producer run.
#[derive(Debug, Clone, Serialize)]
pub struct ProduceResult {
    /// Messages acknowledged by the service (also those of the in-flight window drained after
    /// a timed run).
    pub messages: u64,
    /// Seconds measured.
    pub seconds: f64,
    /// Messages per second (acknowledged within the measured duration).
    pub msgs_per_s: f64,
    /// Payload MB/s (acknowledged within the measured duration).
    pub mb_per_s: f64,
    /// Publish latency (scheduled send → SEND_RECEIPT).
    pub latency: Latency,
}

async fn connect(
    addr: &str,
    token: Option<&str>,
) -> Result<
    (
        FramedRead<tokio::net::tcp::OwnedReadHalf, ClientCodec>,
        FramedWrite<tokio::net::tcp::OwnedWriteHalf, ClientCodec>,
    ),
    PulsarLoadError,
> {
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

async fn expect(
    rd: &mut FramedRead<tokio::net::tcp::OwnedReadHalf, ClientCodec>,
    want: Type,
) -> Result<Frame, PulsarLoadError> {
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
fn spawn_reporter(
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

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Runs producers; `progress(msgs_per_s)` is called every 2 s.
pub async fn produce(
    opts: ProduceOptions,
    progress: impl Fn(f64) + Send + 'static,
) -> Result<ProduceResult, PulsarLoadError> {
    let acked = Arc::new(AtomicU64::new(0));
    // Of those, the ones acknowledged within the run's duration (all of them with `messages`).
    let in_time = Arc::new(AtomicU64::new(0));
    // When the last receipt arrived (the run's end when it stops after `messages`).
    let last_ack = Arc::new(Mutex::new(None::<Instant>));
    let hist = Arc::new(Mutex::new(latency_histogram()));
    let producers = opts.topics.len() * opts.producers_per_topic;
    let per_rate = opts.rate.map(|r| r as f64 / producers.max(1) as f64);
    let start = Instant::now();
    let end = start + opts.duration;
    let payload = Bytes::from(super::pseudo_random_bytes(opts.size.max(1)));
    let mut tasks = Vec::new();
    for topic in &opts.topics {
        for _ in 0..opts.producers_per_topic {
            let (mut rd, mut wr) = connect(&opts.addr, opts.token.as_deref()).await?;
            wr.send(client::producer(topic, 0, 1))
                .await
                .map_err(|e| PulsarLoadError::Protocol(e.to_string()))?;
            let ok = expect(&mut rd, Type::ProducerSuccess).await?;
            let name = ok
                .command
                .producer_success
                .map(|p| p.producer_name)
                .unwrap_or_default();
            let window = Arc::new(Semaphore::new(opts.max_pending.max(opts.batch_max)));
            let inflight: InFlight = Arc::default();
            let last_ack_r = last_ack.clone();
            let (acked_r, hist_r, window_r, inflight_r) = (
                acked.clone(),
                hist.clone(),
                window.clone(),
                inflight.clone(),
            );
            let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
            let by_count = opts.messages.is_some();
            let in_time_r = in_time.clone();
            let receiver = tokio::spawn(async move {
                let mut h = latency_histogram();
                loop {
                    let frame = tokio::select! {
                        f = rd.next() => f,
                        _ = &mut stop_rx => None,
                    };
                    let Some(Ok(frame)) = frame else { break };
                    if frame.command.r#type == Type::SendReceipt as i32 {
                        let Some((_, times)) = inflight_r
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .pop_front()
                        else {
                            break;
                        };
                        let now = Instant::now();
                        for t in &times {
                            if *t < end {
                                record(&mut h, now.saturating_duration_since(*t));
                            }
                        }
                        acked_r.fetch_add(times.len() as u64, Ordering::Relaxed);
                        // A timed run's rate counts what was acknowledged within its duration:
                        // the in-flight window drained afterwards (slowly, under a rate limit)
                        // would overstate it.
                        if by_count || now <= end {
                            in_time_r.fetch_add(times.len() as u64, Ordering::Relaxed);
                        }
                        *last_ack_r.lock().unwrap_or_else(|p| p.into_inner()) = Some(now);
                        window_r.add_permits(times.len());
                    } else if frame.command.r#type == Type::SendError as i32 {
                        break;
                    }
                }
                let _ = hist_r.lock().unwrap_or_else(|p| p.into_inner()).add(&h);
            });
            let opts = opts.clone();
            let payload = payload.clone();
            let quota = opts.messages.map(|m| m.div_ceil(producers.max(1) as u64));
            let span_start = now_ms();
            let mut rng = rand::rngs::StdRng::seed_from_u64(tasks.len() as u64 + 1);
            let sender = tokio::spawn(async move {
                let mut seq = 0u64;
                let started = Instant::now();
                loop {
                    let now = Instant::now();
                    if now >= end || quota.is_some_and(|q| seq >= q) {
                        break;
                    }
                    // Messages due now (rate) or a full batch (unlimited), with their
                    // scheduled times.
                    let times: Vec<Instant> = match per_rate {
                        Some(rate) => {
                            let due = (now.duration_since(started).as_secs_f64() * rate) as u64;
                            let k = (due.saturating_sub(seq) as usize).min(opts.batch_max);
                            if k == 0 {
                                tokio::time::sleep(Duration::from_millis(1)).await;
                                continue;
                            }
                            (0..k as u64)
                                .map(|i| started + Duration::from_secs_f64((seq + i) as f64 / rate))
                                .collect()
                        }
                        None => vec![now; opts.batch_max],
                    };
                    let mut times = times;
                    if let Some(q) = quota {
                        times.truncate(q.saturating_sub(seq) as usize);
                    }
                    let n = times.len();
                    let Ok(permit) = window.clone().acquire_many_owned(n as u32).await else {
                        break;
                    };
                    permit.forget();
                    let msgs: Vec<Bytes> = if opts.json {
                        (0..n as u64)
                            .map(|i| {
                                Bytes::from(super::offload_bench::json_message(
                                    &mut rng,
                                    seq + i,
                                    opts.size,
                                ))
                            })
                            .collect()
                    } else {
                        vec![payload.clone(); n]
                    };
                    let keys: Vec<Option<String>> = if opts.keys > 0 {
                        (0..n)
                            .map(|_| Some(format!("key-{}", rng.random_range(0..opts.keys))))
                            .collect()
                    } else {
                        Vec::new()
                    };
                    let publish_ms = match (opts.publish_span, quota) {
                        (Some(span), Some(q)) => {
                            let span = span.as_millis() as u64;
                            span_start.saturating_sub(span) + seq.saturating_mul(span) / q.max(1)
                        }
                        _ => now_ms(),
                    };
                    inflight
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push_back((seq, times));
                    if wr
                        .send(client::send_keyed(0, &name, seq, publish_ms, &msgs, &keys))
                        .await
                        .is_err()
                    {
                        break;
                    }
                    seq += n as u64;
                }
                // Let outstanding receipts arrive.
                let _ = window
                    .acquire_many(opts.max_pending.max(opts.batch_max) as u32)
                    .await;
                drop(wr);
            });
            tasks.push((sender, stop_tx, receiver));
        }
    }
    let reporter = spawn_reporter(acked.clone(), progress);
    for (sender, stop, receiver) in tasks {
        // The sender returns once every receipt arrived (or after a grace period).
        let _ = tokio::time::timeout(opts.duration + Duration::from_secs(30), sender).await;
        let _ = stop.send(());
        let _ = receiver.await;
    }
    reporter.abort();
    let messages = acked.load(Ordering::Relaxed);
    let seconds = match opts.messages {
        Some(_) => last_ack
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map_or(opts.duration, |t| t.duration_since(start))
            .as_secs_f64(),
        None => opts.duration.as_secs_f64(),
    };
    let latency = Latency::from_histogram(&hist.lock().unwrap_or_else(|p| p.into_inner()));
    Ok(ProduceResult {
        messages,
        seconds,
        msgs_per_s: in_time.load(Ordering::Relaxed) as f64 / seconds,
        mb_per_s: in_time.load(Ordering::Relaxed) as f64 * opts.size as f64 / seconds / 1e6,
        latency,
    })
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
