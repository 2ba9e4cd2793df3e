//! Criterion micro-benchmarks of the durable log (`cargo bench --bench ledger_append`).
//!
//! - `log_append/<size>/<writers>`: 20,000 appends per iteration split over N writers (one topic
//!   each, appends pipelined like a Pulsar producer), `sync = always`, until all are durable.
//! - `raw_file/...`: the physical comparison in the same run: sequential `write` + `fdatasync` of
//!   a plain file on the same disk, with 4 KiB and 1 MiB writes.
//!
//! Set `LL_BENCH_DIR` to benchmark another disk (default: the system temp dir).

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ledgerlake::config::LedgerConfig;
use ledgerlake::ledger::metadata::sqlite::SqliteMetadataStore;
use ledgerlake::ledger::{now_ms, Log, MetadataStore};

const ENTRIES_PER_ITER: usize = 20_000;

fn bench_dir() -> tempfile::TempDir {
    let base = std::env::var_os("LL_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    #[allow(clippy::expect_used)]
    tempfile::tempdir_in(base).expect("bench dir")
}

#[allow(clippy::expect_used)]
fn log_append(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = bench_dir();
    let log = rt.block_on(async {
        let meta: Arc<dyn MetadataStore> = Arc::new(
            SqliteMetadataStore::open(&dir.path().join("metadata.db"))
                .await
                .expect("metadata"),
        );
        Arc::new(
            Log::open(&dir.path().join("ledger"), LedgerConfig::default(), meta)
                .await
                .expect("log"),
        )
    });
    let mut group = c.benchmark_group("log_append");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(ENTRIES_PER_ITER as u64));
    for size in [100usize, 1024] {
        let payload = Bytes::from(ledgerlake::perf::pseudo_random_bytes(size));
        for writers in [1usize, 16, 256] {
            let topics = rt.block_on(async {
                let mut t = Vec::new();
                for w in 0..writers {
                    t.push(
                        log.topic(&format!("bench-{size}-{w}"))
                            .await
                            .expect("topic"),
                    );
                }
                t
            });
            group.bench_with_input(
                BenchmarkId::new(format!("{size}B"), writers),
                &writers,
                |b, &writers| {
                    b.to_async(&rt).iter(|| {
                        let topics = topics.clone();
                        let payload = payload.clone();
                        async move {
                            let per_writer = ENTRIES_PER_ITER / writers;
                            let mut tasks = Vec::with_capacity(writers);
                            for topic in topics {
                                let payload = payload.clone();
                                tasks.push(tokio::spawn(async move {
                                    let mut receipts = Vec::with_capacity(per_writer);
                                    for _ in 0..per_writer {
                                        receipts.push(
                                            topic
                                                .append(now_ms(), payload.clone())
                                                .await
                                                .expect("append"),
                                        );
                                    }
                                    for r in receipts {
                                        r.durable().await.expect("durable");
                                    }
                                }));
                            }
                            for t in tasks {
                                t.await.expect("writer");
                            }
                        }
                    })
                },
            );
        }
    }
    group.finish();
    rt.block_on(log.shutdown()).expect("shutdown");
}

#[allow(clippy::expect_used)]
fn raw_file(c: &mut Criterion) {
    let dir = bench_dir();
    let mut group = c.benchmark_group("raw_file");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    for size in [4096usize, 1 << 20] {
        let block = ledgerlake::perf::pseudo_random_bytes(size);
        let path = dir.path().join(format!("raw-{size}"));
        let mut f = std::fs::File::create(&path).expect("file");
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_function(BenchmarkId::new("write_fdatasync", size), |b| {
            b.iter(|| {
                f.write_all(&block).expect("write");
                f.sync_data().expect("fdatasync");
            })
        });
    }
    group.finish();
}

criterion_group!(benches, log_append, raw_file);
criterion_main!(benches);
