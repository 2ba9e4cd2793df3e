//! Drives the log in-process: N writers, each appending to its own topic with a window of
//! in-flight appends, optionally at a fixed total rate; measures throughput and
//! append-to-durable latency.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::sync::mpsc;

use super::{latency_histogram, record, Latency};
use crate::config::{LedgerConfig, SyncPolicy};
use crate::ledger::metadata::sqlite::SqliteMetadataStore;
use crate::ledger::record::RECORD_OVERHEAD;
use crate::ledger::{now_ms, AppendError, AppendReceipt, Log, MetadataStore};

/// Parameters of one run.
#[derive(Debug, Clone)]
pub struct LogLoadOptions {
    /// Directory for the run's log (created; should be empty).
    pub dir: PathBuf,
    /// Concurrent writers (one topic each).
    pub writers: usize,
    /// Payload bytes per entry.
    pub message_size: usize,
    /// Measured duration.
    pub duration: Duration,
    /// Unmeasured warm-up before it.
    pub warmup: Duration,
    /// Total entries per second across writers; `None` = as fast as possible.
    pub rate: Option<u64>,
    /// In-flight appends per writer.
    pub window: usize,
    /// Log settings.
    pub ledger: LedgerConfig,
}

/// Result of one run.
#[derive(Debug, Clone, Serialize)]
pub struct LogLoadResult {
    /// Writers.
    pub writers: usize,
    /// Payload bytes per entry.
    pub message_size: usize,
    /// Sync policy.
    pub sync: SyncPolicy,
    /// Requested rate, if any.
    pub target_rate: Option<u64>,
    /// Entries acknowledged in the measured window.
    pub messages: u64,
    /// Length of the measured window.
    pub seconds: f64,
    /// Entries per second.
    pub msgs_per_s: f64,
    /// Payload MB/s (10^6 bytes).
    pub payload_mb_per_s: f64,
    /// MB/s written to the journal (payload + framing).
    pub journal_mb_per_s: f64,
    /// Append-to-durable latency.
    pub latency: Latency,
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum LogLoadError {
    /// The log failed to open.
    #[error(transparent)]
    Open(#[from] crate::ledger::OpenError),
    /// The metadata store failed.
    #[error(transparent)]
    Metadata(#[from] crate::ledger::metadata::MetadataError),
    /// An append failed.
    #[error(transparent)]
    Append(#[from] AppendError),
    /// A task panicked.
    #[error("writer task failed: {0}")]
    Task(String),
}

/// Progress snapshot passed to the callback every couple of seconds.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    /// Seconds since start.
    pub elapsed: f64,
    /// Entries per second over the last interval.
    pub msgs_per_s: f64,
    /// Payload MB/s over the last interval.
    pub mb_per_s: f64,
}

/// Runs the load and returns the measured result.
pub async fn run(
    opts: LogLoadOptions,
    progress: impl Fn(Progress) + Send + 'static,
) -> Result<LogLoadResult, LogLoadError> {
    std::fs::create_dir_all(&opts.dir).map_err(|source| crate::ledger::OpenError::Io {
        path: opts.dir.clone(),
        source,
    })?;
    let meta = SqliteMetadataStore::open(&opts.dir.join("metadata.db")).await?;
    let store: Arc<dyn MetadataStore> = Arc::new(meta.clone());
    let log = Arc::new(Log::open(&opts.dir.join("ledger"), opts.ledger.clone(), store).await?);

    // One shared block of pseudo-random bytes; payloads are slices of it (no per-entry alloc).
    let block = Bytes::from(super::pseudo_random_bytes(
        opts.message_size.max(1) * 1024 + 4096,
    ));
    let start = Instant::now();
    let measure_from = start + opts.warmup;
    let end = measure_from + opts.duration;
    let acked = Arc::new(AtomicU64::new(0));
    let histograms: Arc<Mutex<Histogram<u64>>> = Arc::new(Mutex::new(latency_histogram()));
    let per_writer_rate = opts
        .rate
        .map(|r| (r as f64 / opts.writers as f64).max(0.001));

    let mut tasks = Vec::new();
    for w in 0..opts.writers {
        let topic = log
            .topic(&format!("persistent://public/perf/writer-{w}"))
            .await?;
        let (tx, mut rx) = mpsc::channel::<(Instant, AppendReceipt)>(opts.window.max(1));
        let block = block.clone();
        let size = opts.message_size;
        let producer = tokio::spawn(async move {
            let mut next = Instant::now();
            let mut i = 0usize;
            while Instant::now() < end {
                if let Some(rate) = per_writer_rate {
                    next += Duration::from_secs_f64(1.0 / rate);
                    if next > Instant::now() {
                        tokio::time::sleep_until(next.into()).await;
                    }
                }
                let off = (i * 7919) % (block.len() - size);
                i += 1;
                let t0 = Instant::now();
                let r = topic.append(now_ms(), block.slice(off..off + size)).await?;
                if tx.send((t0, r)).await.is_err() {
                    break;
                }
            }
            Ok::<(), AppendError>(())
        });
        let acked = acked.clone();
        let histograms = histograms.clone();
        let completer = tokio::spawn(async move {
            let mut h = latency_histogram();
            let mut count = 0u64;
            while let Some((t0, r)) = rx.recv().await {
                r.durable().await?;
                if t0 >= measure_from && t0 < end {
                    record(&mut h, t0.elapsed());
                    count += 1;
                    acked.fetch_add(1, Ordering::Relaxed);
                }
            }
            let _ = histograms.lock().unwrap_or_else(|p| p.into_inner()).add(&h);
            Ok::<u64, AppendError>(count)
        });
        tasks.push((producer, completer));
    }

    let reporter_acked = acked.clone();
    let size = opts.message_size;
    let reporter = tokio::spawn(async move {
        let mut last = 0u64;
        let mut tick = tokio::time::interval(Duration::from_secs(2));
        tick.tick().await;
        loop {
            tick.tick().await;
            let now = reporter_acked.load(Ordering::Relaxed);
            let rate = (now - last) as f64 / 2.0;
            last = now;
            progress(Progress {
                elapsed: start.elapsed().as_secs_f64(),
                msgs_per_s: rate,
                mb_per_s: rate * size as f64 / 1e6,
            });
        }
    });

    let mut messages = 0u64;
    let mut first_error = None;
    for (producer, completer) in tasks {
        match producer.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => first_error = first_error.or(Some(LogLoadError::Append(e))),
            Err(e) => first_error = first_error.or(Some(LogLoadError::Task(e.to_string()))),
        }
        match completer.await {
            Ok(Ok(n)) => messages += n,
            Ok(Err(e)) => first_error = first_error.or(Some(LogLoadError::Append(e))),
            Err(e) => first_error = first_error.or(Some(LogLoadError::Task(e.to_string()))),
        }
    }
    reporter.abort();
    log.shutdown().await?;
    meta.close().await;
    if let Some(e) = first_error {
        return Err(e);
    }
    let seconds = opts.duration.as_secs_f64();
    let msgs_per_s = messages as f64 / seconds;
    let latency = Latency::from_histogram(&histograms.lock().unwrap_or_else(|p| p.into_inner()));
    Ok(LogLoadResult {
        writers: opts.writers,
        message_size: opts.message_size,
        sync: opts.ledger.sync,
        target_rate: opts.rate,
        messages,
        seconds,
        msgs_per_s,
        payload_mb_per_s: msgs_per_s * opts.message_size as f64 / 1e6,
        journal_mb_per_s: msgs_per_s * (opts.message_size + RECORD_OVERHEAD) as f64 / 1e6,
        latency,
    })
}
