//! `ledgerlake perf produce`: producers over the Pulsar protocol, many per connection, so one
//! process can drive thousands of topics (pulsar-perf's `--num-topics`). Every producer is
//! registered on one of `connections` connections (round robin); each connection has one
//! sender task that paces its producers' share of the rate, taking them in turn, and one
//! receiver task that matches SEND_RECEIPTs to sends. With a rate spread over many topics each
//! send is one message (one entry), as real low-rate producers send; a producer that has many
//! messages due at once sends them as one batch of up to `batch_max`.
//!
//! Latency is measured from each message's scheduled send time to its receipt, so a generator
//! that falls behind its schedule shows up as latency, and the run reports the generator's own
//! CPU use against its threads: when it is near them, the generator, not the service, limits
//! the run.
//!
//! Every 2 s the run also records an [`Interval`] (pulsar-perf prints the same per interval):
//! the rate and latency of the receipts that arrived in it, and the sends still unanswered at
//! its end with the age of the oldest. A tail that is a few stuck sends (the oldest waiting
//! grows with the run) then looks different from a service that is simply behind (every
//! interval's median grows).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::sync::Semaphore;

use super::pulsar_load::{connect, now_ms, PulsarLoadError, Reader, Writer};
use super::{latency_histogram, record, Latency};
use crate::protocol::client;
use crate::protocol::proto::base_command::Type;
use crate::protocol::proto::command_subscribe::SubType;

/// Producer load parameters.
#[derive(Debug, Clone)]
pub struct ProduceOptions {
    /// `host:port` of the Pulsar listener.
    pub addr: String,
    /// Token sent on CONNECT (authentication on).
    pub token: Option<String>,
    /// Topics (each gets `producers_per_topic` producers).
    pub topics: Vec<String>,
    /// Producers per topic.
    pub producers_per_topic: usize,
    /// Connections the producers are spread over (at most one per producer).
    pub connections: usize,
    /// Total messages per second across producers; `None` = as fast as possible.
    pub rate: Option<u64>,
    /// Payload size.
    pub size: usize,
    /// Messages per batch (1 = no batching).
    pub batch_max: usize,
    /// Messages in flight per producer (pooled per connection).
    pub max_pending: usize,
    /// Measured duration (the longest run when `messages` is set).
    pub duration: Duration,
    /// Messages scheduled within this first part of the run are left out of `latency` (they
    /// still count in `latency_whole_run`, the rate and the timeline).
    pub warmup: Duration,
    /// Stop after this many messages in all (split evenly across producers).
    pub messages: Option<u64>,
    /// Partition keys `key-0..key-{keys-1}` (0: no keys), drawn per message.
    pub keys: u64,
    /// Realistic JSON payloads of about `size` bytes, each different (else one random payload).
    pub json: bool,
    /// Backfill: publish times spread evenly over this span, ending now (needs `messages`).
    pub publish_span: Option<Duration>,
    /// Before producing, create this durable subscription on every topic (a consumer
    /// subscribes from the latest position and leaves at once).
    pub subscription: Option<String>,
    /// Worker threads of the generator's runtime (reported with its CPU use).
    pub threads: usize,
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
    /// Publish latency (scheduled send → SEND_RECEIPT) of the messages scheduled after the
    /// warm-up.
    pub latency: Latency,
    /// The same over the whole run, warm-up included.
    pub latency_whole_run: Latency,
    /// SENDs the service refused (SEND_ERROR).
    pub send_errors: u64,
    /// Producers and connections used.
    pub producers: usize,
    /// Connections used.
    pub connections: usize,
    /// Seconds it took to register every producer (and subscription).
    pub setup_seconds: f64,
    /// CPU cores the generator itself used during the run (user + system).
    pub generator_cpu_cores: f64,
    /// Its runtime's worker threads.
    pub generator_threads: usize,
    /// Whether the generator used nearly all of its threads: the figures then describe the
    /// generator as much as the service.
    pub generator_bound: bool,
    /// The run in 2 s intervals.
    pub timeline: Vec<Interval>,
}

/// One 2 s interval of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Interval {
    /// Seconds from the start of the run to the end of the interval.
    pub at_s: f64,
    /// Messages acknowledged per second within the interval.
    pub msgs_per_s: f64,
    /// Latency of the messages acknowledged within the interval.
    pub latency: Latency,
    /// Messages sent and not yet answered at the interval's end.
    pub waiting: u64,
    /// Age of the oldest of them (from its scheduled send time), in milliseconds.
    pub oldest_waiting_ms: u64,
}

/// One registered producer of a connection.
struct Slot {
    id: u64,
    name: String,
    /// Messages of its quota left (`u64::MAX`: no quota).
    left: u64,
    next_sequence: u64,
}

/// Sends of one connection awaiting their receipt, by producer id, in order: (first sequence
/// id, scheduled time of each message).
type InFlight = Arc<Mutex<Vec<VecDeque<(u64, Vec<Instant>)>>>>;

/// What every connection adds to.
#[derive(Clone)]
struct Totals {
    acked: Arc<AtomicU64>,
    in_time: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
    last_ack: Arc<Mutex<Option<Instant>>>,
    /// After the warm-up.
    hist: Arc<Mutex<Histogram<u64>>>,
    whole: Arc<Mutex<Histogram<u64>>>,
    /// Latencies of the current interval (reset by the timeline at each interval's end).
    recent: Arc<Mutex<Histogram<u64>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs producers; `progress` is called with each 2 s interval.
pub async fn produce(
    opts: ProduceOptions,
    progress: impl Fn(&Interval) + Send + 'static,
) -> Result<ProduceResult, PulsarLoadError> {
    let producers: Vec<&String> = opts
        .topics
        .iter()
        .flat_map(|t| std::iter::repeat_n(t, opts.producers_per_topic.max(1)))
        .collect();
    let n_conn = opts.connections.clamp(1, producers.len().max(1));
    let quota = opts
        .messages
        .map(|m| m.div_ceil(producers.len().max(1) as u64));
    // Register everything first, all connections at once, each pipelining its requests.
    let setup_started = Instant::now();
    let mut setups = Vec::new();
    for c in 0..n_conn {
        let mine: Vec<String> = producers
            .iter()
            .skip(c)
            .step_by(n_conn)
            .map(|t| t.to_string())
            .collect();
        let (addr, token, sub) = (
            opts.addr.clone(),
            opts.token.clone(),
            opts.subscription.clone(),
        );
        setups.push(tokio::spawn(async move {
            register(&addr, token.as_deref(), &mine, sub.as_deref(), quota).await
        }));
    }
    let mut conns = Vec::new();
    for s in setups {
        conns.push(
            s.await
                .map_err(|e| PulsarLoadError::Protocol(e.to_string()))??,
        );
    }
    let setup_seconds = setup_started.elapsed().as_secs_f64();
    let totals = Totals {
        acked: Arc::default(),
        in_time: Arc::default(),
        errors: Arc::default(),
        last_ack: Arc::default(),
        hist: Arc::new(Mutex::new(latency_histogram())),
        whole: Arc::new(Mutex::new(latency_histogram())),
        recent: Arc::new(Mutex::new(latency_histogram())),
    };
    let payload = Bytes::from(super::pseudo_random_bytes(opts.size.max(1)));
    let cpu_before = super::process_cpu_seconds();
    let start = Instant::now();
    let end = start + opts.duration;
    let mut tasks = Vec::new();
    let mut inflights = Vec::new();
    for (i, (rd, wr, slots)) in conns.into_iter().enumerate() {
        let share = slots.len() as f64 / producers.len().max(1) as f64;
        let run = ConnRun {
            opts: opts.clone(),
            rate: opts.rate.map(|r| r as f64 * share),
            start,
            end,
            payload: payload.clone(),
            seed: i as u64 + 1,
        };
        let inflight: InFlight = Arc::new(Mutex::new(vec![VecDeque::new(); slots.len()]));
        inflights.push(inflight.clone());
        tasks.push(spawn_connection(
            run,
            rd,
            wr,
            slots,
            inflight,
            totals.clone(),
        ));
    }
    let (stop_timeline, stopped) = tokio::sync::oneshot::channel();
    let timeline = tokio::spawn(record_timeline(
        totals.clone(),
        inflights,
        start,
        stopped,
        progress,
    ));
    for t in tasks {
        let _ = t.await;
    }
    let _ = stop_timeline.send(());
    let timeline = timeline.await.unwrap_or_default();
    let wall = start.elapsed().as_secs_f64();
    let cpu = super::process_cpu_seconds() - cpu_before;
    let messages = totals.acked.load(Ordering::Relaxed);
    let seconds = match opts.messages {
        Some(_) => lock(&totals.last_ack)
            .map_or(opts.duration, |t| t.duration_since(start))
            .as_secs_f64(),
        None => opts.duration.as_secs_f64(),
    };
    let in_time = totals.in_time.load(Ordering::Relaxed) as f64;
    let cores = if wall > 0.0 { cpu / wall } else { 0.0 };
    let latency = Latency::from_histogram(&lock(&totals.hist));
    let latency_whole_run = Latency::from_histogram(&lock(&totals.whole));
    Ok(ProduceResult {
        messages,
        seconds,
        msgs_per_s: in_time / seconds,
        mb_per_s: in_time * opts.size as f64 / seconds / 1e6,
        latency,
        latency_whole_run,
        send_errors: totals.errors.load(Ordering::Relaxed),
        producers: producers.len(),
        connections: n_conn,
        setup_seconds,
        generator_cpu_cores: cores,
        generator_threads: opts.threads,
        generator_bound: cores >= 0.85 * opts.threads.max(1) as f64,
        timeline,
    })
}

/// Records an [`Interval`] every 2 s (and hands it to `progress`) until `stop`.
async fn record_timeline(
    totals: Totals,
    inflights: Vec<InFlight>,
    start: Instant,
    mut stop: tokio::sync::oneshot::Receiver<()>,
    progress: impl Fn(&Interval),
) -> Vec<Interval> {
    const EVERY: Duration = Duration::from_secs(2);
    let mut timeline = Vec::new();
    let mut tick = tokio::time::interval_at((start + EVERY).into(), EVERY);
    let mut last_acked = 0;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = &mut stop => return timeline,
        }
        let now = Instant::now();
        let acked = totals.acked.load(Ordering::Relaxed);
        let latency = {
            let mut recent = lock(&totals.recent);
            let l = Latency::from_histogram(&recent);
            recent.reset();
            l
        };
        let (mut waiting, mut oldest) = (0u64, None::<Instant>);
        for inflight in &inflights {
            for queue in lock(inflight).iter() {
                waiting += queue
                    .iter()
                    .map(|(_, times)| times.len() as u64)
                    .sum::<u64>();
                let first = queue.front().and_then(|(_, times)| times.first().copied());
                if let Some(t) = first {
                    oldest = Some(oldest.map_or(t, |o| o.min(t)));
                }
            }
        }
        let interval = Interval {
            at_s: now.duration_since(start).as_secs_f64(),
            msgs_per_s: (acked - last_acked) as f64 / EVERY.as_secs_f64(),
            latency,
            waiting,
            oldest_waiting_ms: oldest
                .map_or(0, |t| now.saturating_duration_since(t).as_millis() as u64),
        };
        last_acked = acked;
        progress(&interval);
        timeline.push(interval);
    }
}

/// Connects and registers a producer on each of `topics` (after creating `subscription` on
/// it when asked), pipelining the requests.
async fn register(
    addr: &str,
    token: Option<&str>,
    topics: &[String],
    subscription: Option<&str>,
    quota: Option<u64>,
) -> Result<(Reader, Writer, Vec<Slot>), PulsarLoadError> {
    let (mut rd, mut wr) = connect(addr, token).await?;
    let io = |e: std::io::Error| PulsarLoadError::Protocol(e.to_string());
    // Request ids: 1..=n producers; subscriptions and closes above them. A consumer is closed
    // only once subscribed (a close racing its SUBSCRIBE fails that SUBSCRIBE).
    let n = topics.len() as u64;
    if let Some(sub) = subscription {
        for (i, t) in topics.iter().enumerate() {
            let i = i as u64;
            wr.feed(client::subscribe(
                t,
                sub,
                SubType::Exclusive,
                i,
                n + 1 + i,
                false,
            ))
            .await
            .map_err(io)?;
        }
        wr.flush().await.map_err(io)?;
        answers(&mut rd, &mut wr, topics.len(), &mut []).await?;
        for i in 0..n {
            wr.feed(client::close_consumer(i, 2 * n + 1 + i))
                .await
                .map_err(io)?;
        }
    }
    for (i, t) in topics.iter().enumerate() {
        wr.feed(client::producer(t, i as u64, i as u64 + 1))
            .await
            .map_err(io)?;
    }
    wr.flush().await.map_err(io)?;
    let mut names: Vec<Option<String>> = vec![None; topics.len()];
    let closes = if subscription.is_some() {
        topics.len()
    } else {
        0
    };
    answers(&mut rd, &mut wr, topics.len() + closes, &mut names).await?;
    let slots = names
        .into_iter()
        .enumerate()
        .map(|(i, name)| Slot {
            id: i as u64,
            name: name.unwrap_or_default(),
            left: quota.unwrap_or(u64::MAX),
            next_sequence: 0,
        })
        .collect();
    Ok((rd, wr, slots))
}

/// Reads `pending` answers (SUCCESS or PRODUCER_SUCCESS; producer names into `names` by
/// request id), answering PINGs; an ERROR fails.
async fn answers(
    rd: &mut Reader,
    wr: &mut Writer,
    mut pending: usize,
    names: &mut [Option<String>],
) -> Result<(), PulsarLoadError> {
    while pending > 0 {
        let frame = match rd.next().await {
            Some(Ok(f)) => f,
            Some(Err(e)) => return Err(PulsarLoadError::Protocol(e.to_string())),
            None => return Err(PulsarLoadError::Protocol("connection closed".into())),
        };
        let c = &frame.command;
        if c.r#type == Type::ProducerSuccess as i32 {
            if let Some(ok) = &c.producer_success {
                if let Some(slot) = names.get_mut((ok.request_id as usize).wrapping_sub(1)) {
                    *slot = Some(ok.producer_name.clone());
                }
            }
            pending -= 1;
        } else if c.r#type == Type::Success as i32 {
            pending -= 1;
        } else if c.r#type == Type::Error as i32 {
            return Err(PulsarLoadError::Protocol(format!(
                "service refused: {:?}",
                c.error
            )));
        } else if c.r#type == Type::Ping as i32 {
            wr.send(client::pong())
                .await
                .map_err(|e| PulsarLoadError::Protocol(e.to_string()))?;
        }
    }
    Ok(())
}

/// What one connection's sender needs.
struct ConnRun {
    opts: ProduceOptions,
    /// This connection's share of the rate (`None`: as fast as possible).
    rate: Option<f64>,
    start: Instant,
    end: Instant,
    payload: Bytes,
    seed: u64,
}

/// Starts the receiver and the sender of one connection; the handle ends when both did.
fn spawn_connection(
    run: ConnRun,
    mut rd: Reader,
    wr: Writer,
    slots: Vec<Slot>,
    inflight: InFlight,
    totals: Totals,
) -> tokio::task::JoinHandle<()> {
    let window = Arc::new(Semaphore::new(
        (run.opts.max_pending.max(run.opts.batch_max)) * slots.len(),
    ));
    let wr = Arc::new(tokio::sync::Mutex::new(wr));
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (inflight_r, window_r, wr_r, end, by_count) = (
        inflight.clone(),
        window.clone(),
        wr.clone(),
        run.end,
        run.opts.messages.is_some(),
    );
    let warm_until = run.start + run.opts.warmup;
    let receiver = tokio::spawn(async move {
        let (mut h, mut whole) = (latency_histogram(), latency_histogram());
        loop {
            let frame = tokio::select! {
                f = rd.next() => f,
                _ = &mut stop_rx => None,
            };
            let Some(Ok(frame)) = frame else { break };
            let c = &frame.command;
            let (pid, ok) = if c.r#type == Type::SendReceipt as i32 {
                (c.send_receipt.as_ref().map(|r| r.producer_id), true)
            } else if c.r#type == Type::SendError as i32 {
                (c.send_error.as_ref().map(|r| r.producer_id), false)
            } else {
                // Never waits for the writer: the sender may hold it while it waits for
                // permits only this task gives back (a busy connection is not silent anyway).
                if c.r#type == Type::Ping as i32 {
                    if let Ok(mut w) = wr_r.try_lock() {
                        let _ = w.send(client::pong()).await;
                    }
                }
                continue;
            };
            let popped = pid.and_then(|p| {
                lock(&inflight_r)
                    .get_mut(p as usize)
                    .and_then(VecDeque::pop_front)
            });
            let Some((_, times)) = popped else { continue };
            let now = Instant::now();
            if ok {
                let mut recent = lock(&totals.recent);
                for t in times.iter().filter(|t| **t < end) {
                    let took = now.saturating_duration_since(*t);
                    if *t >= warm_until {
                        record(&mut h, took);
                    }
                    record(&mut whole, took);
                    record(&mut recent, took);
                }
                drop(recent);
                totals
                    .acked
                    .fetch_add(times.len() as u64, Ordering::Relaxed);
                // A timed run's rate counts what was acknowledged within its duration.
                if by_count || now <= end {
                    totals
                        .in_time
                        .fetch_add(times.len() as u64, Ordering::Relaxed);
                }
                *lock(&totals.last_ack) = Some(now);
            } else {
                totals.errors.fetch_add(1, Ordering::Relaxed);
            }
            window_r.add_permits(times.len());
        }
        let _ = lock(&totals.hist).add(&h);
        let _ = lock(&totals.whole).add(&whole);
    });
    tokio::spawn(async move {
        let full = run.opts.max_pending.max(run.opts.batch_max) * slots.len();
        send_loop(run, slots, &inflight, &window, &wr).await;
        // Let outstanding receipts arrive (bounded), then stop the receiver.
        let _ =
            tokio::time::timeout(Duration::from_secs(30), window.acquire_many(full as u32)).await;
        let _ = stop_tx.send(());
        let _ = receiver.await;
    })
}

/// Sends this connection's share until the run's end or every quota is met.
async fn send_loop(
    run: ConnRun,
    mut slots: Vec<Slot>,
    inflight: &InFlight,
    window: &Arc<Semaphore>,
    wr: &tokio::sync::Mutex<Writer>,
) {
    let opts = &run.opts;
    let mut rng = rand::rngs::StdRng::seed_from_u64(run.seed);
    let span_start = now_ms();
    let total_quota = opts
        .messages
        .map(|_| slots.iter().map(|s| s.left).sum::<u64>());
    let mut scheduled = 0u64; // messages of this connection scheduled so far
    let mut turn = 0usize; // the producer whose turn it is
    loop {
        let now = Instant::now();
        if now >= run.end || slots.iter().all(|s| s.left == 0) {
            return;
        }
        // Messages due now (rate) or one full batch per producer in turn (unlimited).
        let due = match run.rate {
            Some(rate) => {
                let due_total = (now.duration_since(run.start).as_secs_f64() * rate) as u64;
                let due = due_total.saturating_sub(scheduled);
                if due == 0 {
                    let next = run.start + Duration::from_secs_f64((scheduled + 1) as f64 / rate);
                    tokio::time::sleep_until(next.max(now + Duration::from_micros(200)).into())
                        .await;
                    continue;
                }
                due
            }
            None => (opts.batch_max * slots.len()) as u64,
        };
        let due = total_quota.map_or(due, |_| due.min(slots.iter().map(|s| s.left).sum()));
        // Spread `due` over the producers in turn; each sends what it got as one entry (or
        // several of at most `batch_max`).
        let per = take_turns(
            &mut slots,
            &mut turn,
            due,
            run.rate.is_some(),
            opts.batch_max,
        );
        let mut w = wr.lock().await;
        for (i, k) in per {
            let mut k = k;
            while k > 0 {
                let m = k.min(opts.batch_max as u64);
                k -= m;
                let times: Vec<Instant> = (0..m)
                    .map(|j| match run.rate {
                        Some(rate) => {
                            run.start + Duration::from_secs_f64((scheduled + j) as f64 / rate)
                        }
                        None => now,
                    })
                    .collect();
                scheduled += m;
                let Ok(permit) = window.clone().acquire_many_owned(m as u32).await else {
                    return;
                };
                permit.forget();
                let slot = &mut slots[i];
                let msgs: Vec<Bytes> = if opts.json {
                    (0..m)
                        .map(|j| {
                            Bytes::from(super::offload_bench::json_message(
                                &mut rng,
                                slot.next_sequence + j,
                                opts.size,
                            ))
                        })
                        .collect()
                } else {
                    vec![run.payload.clone(); m as usize]
                };
                let keys: Vec<Option<String>> = if opts.keys > 0 {
                    (0..m)
                        .map(|_| Some(format!("key-{}", rng.random_range(0..opts.keys))))
                        .collect()
                } else {
                    Vec::new()
                };
                let publish_ms = match (opts.publish_span, total_quota) {
                    (Some(span), Some(q)) => {
                        let span = span.as_millis() as u64;
                        span_start.saturating_sub(span)
                            + (scheduled - m).saturating_mul(span) / q.max(1)
                    }
                    _ => now_ms(),
                };
                let seq = slot.next_sequence;
                slot.next_sequence += m;
                lock(inflight)[i].push_back((seq, times));
                let frame = client::send_keyed(slot.id, &slot.name, seq, publish_ms, &msgs, &keys);
                if w.feed(frame).await.is_err() {
                    return;
                }
            }
        }
        if w.flush().await.is_err() {
            return;
        }
    }
}

/// Hands `due` messages to the producers in turn from `turn` (one each per turn at a rate, a
/// full batch each when unlimited), skipping those whose quota is met. Returns (producer,
/// messages) in the order they were first served.
fn take_turns(
    slots: &mut [Slot],
    turn: &mut usize,
    due: u64,
    paced: bool,
    batch_max: usize,
) -> Vec<(usize, u64)> {
    let n = slots.len();
    let mut order: Vec<usize> = Vec::new();
    let mut got: std::collections::HashMap<usize, u64> = std::collections::HashMap::new();
    let mut left = due;
    let mut idle_turns = 0;
    while left > 0 && idle_turns < n {
        let i = *turn % n;
        *turn = turn.wrapping_add(1);
        if slots[i].left == 0 {
            idle_turns += 1;
            continue;
        }
        idle_turns = 0;
        let each = if paced { 1 } else { batch_max as u64 };
        let take = each.min(left).min(slots[i].left);
        slots[i].left -= take;
        left -= take;
        let k = got.entry(i).or_insert(0);
        if *k == 0 {
            order.push(i);
        }
        *k += take;
    }
    order.into_iter().map(|i| (i, got[&i])).collect()
}

#[cfg(test)]
mod tests {
    use super::{take_turns, Slot};

    fn slots(quotas: &[u64]) -> Vec<Slot> {
        quotas
            .iter()
            .enumerate()
            .map(|(i, q)| Slot {
                id: i as u64,
                name: String::new(),
                left: *q,
                next_sequence: 0,
            })
            .collect()
    }

    #[test]
    fn paced_messages_go_round_robin_and_quotas_hold() {
        let mut s = slots(&[u64::MAX, 1, u64::MAX]);
        let mut turn = 0;
        assert_eq!(
            take_turns(&mut s, &mut turn, 2, true, 100),
            vec![(0, 1), (1, 1)]
        );
        // Producer 1 met its quota: it is skipped from now on.
        assert_eq!(
            take_turns(&mut s, &mut turn, 4, true, 100),
            vec![(2, 2), (0, 2)]
        );
        let mut done = slots(&[0, 0]);
        assert!(take_turns(&mut done, &mut 0, 5, true, 10).is_empty());
    }

    #[test]
    fn unpaced_producers_get_whole_batches() {
        let mut s = slots(&[u64::MAX, 150]);
        let mut turn = 0;
        assert_eq!(
            take_turns(&mut s, &mut turn, 300, false, 100),
            vec![(0, 200), (1, 100)]
        );
    }
}
