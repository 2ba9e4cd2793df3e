//! `ledgerlake perf`: load generators.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use serde::Serialize;

use super::serve::GlobalLogFlags;
use crate::config::{LedgerConfig, LogFormat, SyncPolicy};
use crate::perf::disk::{self, Bandwidth, SyncLatency};
use crate::perf::log_load::{self, LogLoadOptions, LogLoadResult};
use crate::perf::{produce, pulsar_load};

/// Load generators.
#[derive(Debug, Subcommand)]
pub enum PerfCommand {
    /// Benchmark the durable log in-process (no running service needed) beside the disk's own
    /// limit measured by the same tool: sequential writes + fdatasync of a plain file.
    Log(LogArgs),
    /// Produce to a running service over the Pulsar protocol; prints msg/s, MB/s and publish
    /// latency percentiles every 2 s and a summary.
    Produce(ProduceArgs),
    /// Consume from a running service over the Pulsar protocol (from the earliest position).
    Consume(ConsumeArgs),
    /// Offload throughput in-process: realistic JSON messages in Pulsar batches, sealed, then
    /// written and committed to the configured lake; beside plain parquet-rs encoding of the same
    /// rows to memory. The lake comes from the configuration (file and LEDGERLAKE_LAKE__* env).
    Offload(OffloadArgs),
}

/// Flags of `ledgerlake perf offload`.
#[derive(Debug, Args)]
pub struct OffloadArgs {
    /// Working directory (log, and the local warehouse and catalog unless configured).
    #[arg(long, default_value = "./data/perf-offload")]
    pub dir: PathBuf,
    /// Configuration file for the lake (warehouse, catalog, S3); env applies on top.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Message sizes in bytes; a comma-separated list runs each in turn.
    #[arg(long, value_delimiter = ',', default_value = "100,1024")]
    pub size: Vec<usize>,
    /// Raw payload bytes per run.
    #[arg(long, default_value = "256MiB")]
    pub total: bytesize::ByteSize,
    /// Messages per Pulsar batch.
    #[arg(long, default_value_t = 100)]
    pub batch: usize,
    /// Also write each run's rows as Arrow IPC (`<dir>/rows-<size>.arrow`) for
    /// benches/pyiceberg_append.py.
    #[arg(long)]
    pub dump_arrow: bool,
    /// Print the results as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `ledgerlake perf produce`.
#[derive(Debug, Args)]
pub struct ProduceArgs {
    /// Pulsar service URL of the running service.
    #[arg(long, default_value = "pulsar://127.0.0.1:6650")]
    pub service_url: String,
    /// Token to authenticate with (a service with authentication on; also sent to the admin
    /// API).
    #[arg(long, env = "LEDGERLAKE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Topic names; several may be given (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "persistent://public/default/perf"
    )]
    pub topic: Vec<String>,
    /// Producers per topic (per partition).
    #[arg(long, default_value_t = 1)]
    pub producers: usize,
    /// Produce to N plain topics named `<topic>-<i>` (i = 0..N) instead of `<topic>` itself.
    #[arg(long, default_value_t = 0)]
    pub topic_count: u32,
    /// Connections the producers are spread over (many producers share one, as with one
    /// Pulsar client); at most one per producer.
    #[arg(long, default_value_t = 16)]
    pub connections: usize,
    /// Worker threads of the generator (default: the machine's cores). Its CPU use is reported
    /// against them.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Create this durable subscription on every topic before producing (its backlog is what
    /// the run produces).
    #[arg(long)]
    pub subscription: Option<String>,
    /// Make each topic a partitioned topic of N partitions (created through the admin API at
    /// --admin-url if it does not exist) and produce to every partition; 0 = not partitioned.
    #[arg(long, default_value_t = 0)]
    pub partitions: u32,
    /// HTTP admin API of the running service (used with --partitions).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub admin_url: String,
    /// Total messages per second across producers; omit for as fast as possible.
    #[arg(long)]
    pub rate: Option<u64>,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 100)]
    pub size: usize,
    /// Messages per batch (1 disables batching).
    #[arg(long, default_value_t = 1000)]
    pub batch_max_messages: usize,
    /// Messages in flight per producer.
    #[arg(long, default_value_t = 10000)]
    pub max_pending: usize,
    /// Duration of the run (the longest run with --messages).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Leave the messages scheduled in this first part of the run out of the publish latency
    /// (as pulsar-perf's --warmup-time does); the summary gives the whole run's latency too.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub warmup: Duration,
    /// Stop after this many messages in all (for generating a data set).
    #[arg(long)]
    pub messages: Option<u64>,
    /// Give messages partition keys key-0..key-{N-1} (random per message); 0 = no keys.
    #[arg(long, default_value_t = 0)]
    pub keys: u64,
    /// Realistic JSON payloads of about --size bytes, each different, instead of one random
    /// payload.
    #[arg(long)]
    pub json_payloads: bool,
    /// Backfill: publish times spread evenly over this span ending now (e.g. 30d), so a data
    /// set covers a month; needs --messages.
    #[arg(long, value_parser = humantime::parse_duration, requires = "messages")]
    pub publish_time_span: Option<Duration>,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `ledgerlake perf consume`.
#[derive(Debug, Args)]
pub struct ConsumeArgs {
    /// Pulsar service URL of the running service.
    #[arg(long, default_value = "pulsar://127.0.0.1:6650")]
    pub service_url: String,
    /// Token to authenticate with (a service with authentication on; also sent to the admin
    /// API).
    #[arg(long, env = "LEDGERLAKE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Topic to consume.
    #[arg(long, default_value = "persistent://public/default/perf")]
    pub topic: String,
    /// The topic is partitioned into N partitions: consume every partition (consumers each).
    #[arg(long, default_value_t = 0)]
    pub partitions: u32,
    /// Subscription name.
    #[arg(long, default_value = "perf")]
    pub subscription: String,
    /// Consumers (a Shared subscription when more than one).
    #[arg(long, default_value_t = 1)]
    pub consumers: usize,
    /// Duration of the run (the longest, with `--messages`).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Stop after this many messages; the rate is measured up to the last one (replay rate).
    #[arg(long)]
    pub messages: Option<u64>,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

fn service_addr(url: &str) -> anyhow::Result<String> {
    url.strip_prefix("pulsar://")
        .map(|s| s.trim_end_matches('/').to_string())
        .ok_or_else(|| anyhow::anyhow!("service URL must look like pulsar://host:port, got {url}"))
}

/// Flags of `ledgerlake perf log`.
#[derive(Debug, Args)]
pub struct LogArgs {
    /// Directory for the benchmark's log and baseline files (on the disk you want to measure).
    /// A fresh subdirectory is created per run and removed afterwards unless --keep.
    #[arg(long, default_value = "./data/perf")]
    pub dir: PathBuf,
    /// Concurrent writers, one topic each; a comma-separated list runs each in turn.
    #[arg(long, value_delimiter = ',', default_value = "1,16,256")]
    pub writers: Vec<usize>,
    /// Payload size in bytes; a comma-separated list runs each in turn.
    #[arg(long, value_delimiter = ',', default_value = "100,1024")]
    pub size: Vec<usize>,
    /// Measured duration of each run (e.g. 10s, 1m).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Unmeasured warm-up before each run.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub warmup: Duration,
    /// Total appends per second across all writers; omit for as fast as possible.
    #[arg(long)]
    pub rate: Option<u64>,
    /// In-flight appends per writer (like a Pulsar producer's max pending messages).
    #[arg(long, default_value_t = 1000)]
    pub window: usize,
    /// Durability policy for the run. `never` is unsafe and only shows the cost of fsync.
    #[arg(long, value_enum, default_value = "always")]
    pub sync: SyncPolicy,
    /// Skip the plain-file baseline.
    #[arg(long)]
    pub no_baseline: bool,
    /// Bytes per write in the latency baseline (write + fdatasync back to back).
    #[arg(long, default_value_t = 4096)]
    pub baseline_latency_write: usize,
    /// Bytes per write in the bandwidth baseline (write + fdatasync back to back).
    #[arg(long, default_value_t = 4 << 20)]
    pub baseline_bandwidth_write: usize,
    /// Print the summary as JSON on stdout (progress still goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// Keep the benchmark's files.
    #[arg(long)]
    pub keep: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    machine: Machine,
    baseline: Option<Baseline>,
    runs: Vec<LogLoadResult>,
}

#[derive(Debug, Serialize)]
struct Machine {
    cores: usize,
    kernel: String,
    dir: String,
}

#[derive(Debug, Serialize)]
struct Baseline {
    bandwidth: Bandwidth,
    latency: SyncLatency,
}

pub fn run(cmd: PerfCommand, global: GlobalLogFlags) -> anyhow::Result<()> {
    crate::telemetry::init(
        global.log_format.unwrap_or(LogFormat::Human),
        global.log_level.as_deref().unwrap_or("warn"),
    )?;
    match cmd {
        PerfCommand::Log(args) => perf_log(args),
        PerfCommand::Produce(args) => perf_produce(args),
        PerfCommand::Consume(args) => perf_consume(args),
        PerfCommand::Offload(args) => perf_offload(args, &global),
    }
}

fn perf_offload(args: OffloadArgs, global: &GlobalLogFlags) -> anyhow::Result<()> {
    let config = super::serve::load_config(args.config.as_deref(), Default::default(), global)?;
    let mut reports = Vec::new();
    for size in &args.size {
        let dir = args.dir.join(format!("run-{size}"));
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
        }
        std::fs::create_dir_all(&dir)?;
        let mut run_config = config.clone();
        if run_config.lake.warehouse.starts_with("s3") {
            run_config.lake.warehouse = format!(
                "{}/run-{size}-{}",
                run_config.lake.warehouse.trim_end_matches('/'),
                crate::lake::commit::attempt_id()
            );
        }
        let opts = crate::perf::offload_bench::OffloadBenchOptions {
            dir: dir.clone(),
            config: run_config,
            message_size: *size,
            total_bytes: args.total.as_u64(),
            batch: args.batch.max(1),
            dump_arrow: args
                .dump_arrow
                .then(|| args.dir.join(format!("rows-{size}.arrow"))),
        };
        eprintln!("offload benchmark: {size} B messages, {} raw", args.total);
        let report = runtime()?
            .block_on(crate::perf::offload_bench::run(opts))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        if !args.json {
            println!(
                "{:>5} B: {} msgs, pipeline {:.1} MB/s ({:.0} rows/s, {:.2} CPU s, lake/raw {:.3}); parquet-rs to memory {:.1} MB/s (ratio {:.3}); pipeline/parquet-rs {:.2}; decode alone {:.1} MB/s",
                report.message_size, report.messages, report.pipeline_mb_per_s,
                report.pipeline_rows_per_s, report.pipeline_cpu_seconds, report.lake_ratio, report.parquet_rs_mb_per_s,
                report.parquet_rs_ratio, report.pipeline_vs_parquet_rs, report.decode_mb_per_s
            );
        }
        reports.push(report);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
    }
    Ok(())
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// The partitions of `topic` (`<topic>-partition-<i>`), or the topic itself when `n = 0`.
fn partition_names(topic: &str, n: u32) -> anyhow::Result<Vec<String>> {
    let name: crate::naming::TopicName = topic.parse()?;
    Ok(if n == 0 {
        vec![name.to_string()]
    } else {
        (0..n).map(|i| name.partition_name(i).to_string()).collect()
    })
}

/// Creates `topic` as a partitioned topic of `n` partitions (an existing one is kept if it has
/// `n` partitions).
async fn create_partitioned(
    admin_url: &str,
    topic: &str,
    n: u32,
    token: Option<&str>,
) -> anyhow::Result<()> {
    let name: crate::naming::TopicName = topic.parse()?;
    let url = format!(
        "{}/admin/v2/persistent/{}/{}/{}/partitions",
        admin_url.trim_end_matches('/'),
        name.namespace.tenant,
        name.namespace.name,
        name.local
    );
    let http = reqwest::Client::new();
    let bearer = |r: reqwest::RequestBuilder| match token {
        Some(t) => r.bearer_auth(t),
        None => r,
    };
    let resp = bearer(http.put(&url))
        .body(n.to_string())
        .send()
        .await
        .with_context(|| format!("PUT {url}"))?;
    if resp.status().is_success() {
        return Ok(());
    }
    let existing: serde_json::Value = bearer(http.get(&url)).send().await?.json().await?;
    if existing["partitions"].as_u64() == Some(u64::from(n)) {
        return Ok(());
    }
    anyhow::bail!(
        "{topic} exists with {} partitions, not {n}",
        existing["partitions"]
    )
}

fn perf_produce(args: ProduceArgs) -> anyhow::Result<()> {
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get)
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let mut topics = Vec::new();
    for t in &args.topic {
        if args.topic_count > 0 {
            let name: crate::naming::TopicName = t.parse()?;
            for i in 0..args.topic_count {
                topics.push(format!("{name}-{i}"));
            }
            continue;
        }
        if args.partitions > 0 {
            rt.block_on(create_partitioned(
                &args.admin_url,
                t,
                args.partitions,
                args.token.as_deref(),
            ))?;
        }
        topics.extend(partition_names(t, args.partitions)?);
    }
    let opts = produce::ProduceOptions {
        addr: service_addr(&args.service_url)?,
        token: args.token.clone(),
        topics,
        producers_per_topic: args.producers.max(1),
        connections: args.connections.max(1),
        subscription: args.subscription.clone(),
        threads,
        rate: args.rate,
        size: args.size,
        batch_max: args.batch_max_messages.max(1),
        max_pending: args.max_pending.max(1),
        duration: args.duration,
        warmup: args.warmup,
        messages: args.messages,
        keys: args.keys,
        json: args.json_payloads,
        publish_span: args.publish_time_span,
    };
    let result = rt.block_on(produce::produce(opts, |i| {
        let ms = |us: u64| us as f64 / 1000.0;
        eprintln!(
            "  {:>5.1} s  acked {:>8.0} msg/s  p50 {:>9.1} ms  p99 {:>9.1} ms  max {:>9.1} ms  waiting {:>7} (oldest {} ms)",
            i.at_s, i.msgs_per_s, ms(i.latency.p50_us), ms(i.latency.p99_us), ms(i.latency.max_us),
            i.waiting, i.oldest_waiting_ms
        );
    }))?;
    if result.generator_bound {
        eprintln!(
            "warning: the generator used {:.2} of its {} threads: it, not the service, may be what limits this run (give it --threads or run it on another machine)",
            result.generator_cpu_cores, result.generator_threads
        );
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        println!(
            "produced {} messages in {:.1} s: {:.0} msg/s, {:.1} MB/s; publish latency{} p50 {} µs, p99 {} µs, p999 {} µs (whole run: p99 {} µs); {} producers on {} connections (set up in {:.1} s); {} send errors; generator CPU {:.2} cores of {}",
            result.messages, result.seconds, result.msgs_per_s, result.mb_per_s,
            if args.warmup.is_zero() { String::new() } else { format!(" after a {:?} warm-up", args.warmup) },
            result.latency.p50_us, result.latency.p99_us, result.latency.p999_us,
            result.latency_whole_run.p99_us,
            result.producers, result.connections, result.setup_seconds, result.send_errors,
            result.generator_cpu_cores, result.generator_threads
        );
    }
    Ok(())
}

fn perf_consume(args: ConsumeArgs) -> anyhow::Result<()> {
    let opts = pulsar_load::ConsumeOptions {
        addr: service_addr(&args.service_url)?,
        token: args.token.clone(),
        topics: partition_names(&args.topic, args.partitions)?,
        subscription: args.subscription.clone(),
        consumers: args.consumers.max(1),
        duration: args.duration,
        messages: args.messages,
    };
    let result = runtime()?.block_on(pulsar_load::consume(opts, |rate| {
        eprintln!("  consumed {rate:>12.0} msg/s");
    }))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        println!(
            "consumed {} messages in {:.1} s: {:.0} msg/s; publish-to-receive p50 {} ms, p99 {} ms",
            result.messages,
            result.seconds,
            result.msgs_per_s,
            result.end_to_end.p50_us / 1000,
            result.end_to_end.p99_us / 1000
        );
    }
    Ok(())
}

fn perf_log(args: LogArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    let machine = Machine {
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        dir: args.dir.display().to_string(),
    };
    let baseline = if args.no_baseline {
        None
    } else {
        let d = args.duration.min(Duration::from_secs(10));
        eprintln!(
            "baseline: plain file, {} B writes + fdatasync ...",
            args.baseline_bandwidth_write
        );
        let bandwidth = disk::fsync_bandwidth(&args.dir, args.baseline_bandwidth_write, d)?;
        eprintln!(
            "baseline: plain file, {} B writes + fdatasync latency ...",
            args.baseline_latency_write
        );
        let latency = disk::fsync_latency(&args.dir, args.baseline_latency_write, d)?;
        Some(Baseline { bandwidth, latency })
    };
    let mut runs = Vec::new();
    for &size in &args.size {
        for &writers in &args.writers {
            let dir = args
                .dir
                .join(format!("run-{}-{size}B-{writers}w", std::process::id()));
            if dir.exists() {
                std::fs::remove_dir_all(&dir)?;
            }
            let opts = LogLoadOptions {
                dir: dir.clone(),
                writers,
                message_size: size,
                duration: args.duration,
                warmup: args.warmup,
                rate: args.rate,
                window: args.window,
                ledger: LedgerConfig {
                    sync: args.sync,
                    ..LedgerConfig::default()
                },
            };
            eprintln!(
                "run: {writers} writers, {size} B, sync={:?}, rate={:?}",
                args.sync, args.rate
            );
            let result = runtime.block_on(log_load::run(opts, |p| {
                eprintln!(
                    "  {:>6.1}s  {:>12.0} msg/s  {:>8.1} MB/s",
                    p.elapsed, p.msgs_per_s, p.mb_per_s
                );
            }))?;
            if !args.keep {
                std::fs::remove_dir_all(&dir)?;
            }
            runs.push(result);
        }
    }
    let report = Report {
        machine,
        baseline,
        runs,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    Ok(())
}

fn print_table(r: &Report) {
    if let Some(b) = &r.baseline {
        println!(
            "baseline (plain file): {:.1} MB/s with {} B writes + fdatasync; \
             {} B write + fdatasync p50 {} µs, p99 {} µs, p999 {} µs",
            b.bandwidth.mb_per_s,
            b.bandwidth.write_size,
            b.latency.write_size,
            b.latency.latency.p50_us,
            b.latency.latency.p99_us,
            b.latency.latency.p999_us
        );
    }
    println!(
        "{:>8} {:>7} {:>12} {:>10} {:>10} {:>9} {:>9} {:>9} {:>8}",
        "writers",
        "size",
        "msg/s",
        "payload MB/s",
        "journal MB/s",
        "p50 µs",
        "p99 µs",
        "p999 µs",
        "of disk"
    );
    for run in &r.runs {
        let share = r
            .baseline
            .as_ref()
            .map(|b| {
                format!(
                    "{:.0}%",
                    100.0 * run.journal_mb_per_s / b.bandwidth.mb_per_s
                )
            })
            .unwrap_or_default();
        println!(
            "{:>8} {:>7} {:>12.0} {:>12.1} {:>12.1} {:>9} {:>9} {:>9} {:>8}",
            run.writers,
            run.message_size,
            run.msgs_per_s,
            run.payload_mb_per_s,
            run.journal_mb_per_s,
            run.latency.p50_us,
            run.latency.p99_us,
            run.latency.p999_us,
            share
        );
    }
}
