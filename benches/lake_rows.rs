//! Criterion micro-benchmarks of the offload pipeline's two CPU stages, on one thread
//! (`cargo bench --bench lake_rows`).
//!
//! - `decode/<size>`: sealed Pulsar batch entries (100 messages each, realistic JSON of about
//!   `size` bytes, keyed) → Arrow record batches in the lake schema (`RowBuilder`), batches of
//!   `lake.batch_rows` rows, each dropped once built (as the encoder does after writing it).
//! - `encode/<size>`: the same record batches → Parquet in memory with the lake's writer
//!   properties (`ArrowWriter`): the comparison in the same run.
//!
//! Throughput is raw payload bytes.

use std::sync::Arc;
use std::time::Duration;

use arrow::record_batch::RecordBatch;
use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ledgerlake::config::LakeConfig;
use ledgerlake::lake::commit::parquet_properties;
use ledgerlake::lake::rows::RowBuilder;
use ledgerlake::lake::schema::envelope_schema;
use ledgerlake::ledger::{Entry, Position};
use ledgerlake::perf::offload_bench::{batch_entry, json_message};
use parquet::arrow::ArrowWriter;
use rand::rngs::StdRng;
use rand::SeedableRng;

/// Messages per benchmark iteration (about 31 MB at 100 B, 200 MB at 1 KiB).
const MESSAGES: usize = 200_000;
/// Messages per Pulsar batch entry.
const BATCH: usize = 100;

struct Workload {
    entries: Vec<Entry>,
    raw_bytes: u64,
}

fn workload(size: usize) -> Workload {
    let mut rng = StdRng::seed_from_u64(7);
    let start_ms = 1_767_225_600_000u64;
    let mut entries = Vec::new();
    let mut raw_bytes = 0;
    let mut n = 0u64;
    while (n as usize) < MESSAGES {
        let payloads: Vec<Vec<u8>> = (0..BATCH)
            .map(|i| json_message(&mut rng, n + i as u64, size))
            .collect();
        raw_bytes += payloads.iter().map(|p| p.len() as u64).sum::<u64>();
        let payload: Bytes = batch_entry(&payloads, n, start_ms + n / 10, true);
        entries.push(Entry {
            position: Position {
                ledger: 1,
                entry: entries.len() as u64,
            },
            publish_time_ms: (start_ms + n / 10) as i64,
            payload,
        });
        n += BATCH as u64;
    }
    Workload { entries, raw_bytes }
}

fn arrow_schema() -> arrow::datatypes::SchemaRef {
    #[allow(clippy::expect_used)]
    Arc::new(iceberg::arrow::schema_to_arrow_schema(&envelope_schema()).expect("lake schema"))
}

/// Runs the decode stage over `entries`, handing each finished batch to `sink`.
fn decode(
    builder: &mut RowBuilder,
    entries: &[Entry],
    batch_rows: usize,
    mut sink: impl FnMut(RecordBatch),
) {
    for e in entries {
        builder.push_entry(e);
        if builder.is_full(batch_rows) {
            #[allow(clippy::expect_used)]
            sink(builder.finish().expect("batch").0);
        }
    }
    if builder.rows() > 0 {
        #[allow(clippy::expect_used)]
        sink(builder.finish().expect("batch").0);
    }
}

#[allow(clippy::expect_used)]
fn stages(c: &mut Criterion) {
    let schema = arrow_schema();
    let batch_rows = LakeConfig::default().batch_rows;
    let mut group = c.benchmark_group("lake_rows");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(8));
    for size in [100usize, 1024] {
        let w = workload(size);
        group.throughput(Throughput::Bytes(w.raw_bytes));
        let mut builder = RowBuilder::new(schema.clone(), -1, None);
        group.bench_function(BenchmarkId::new("decode", size), |b| {
            b.iter(|| {
                let mut rows = 0;
                decode(&mut builder, &w.entries, batch_rows, |batch| {
                    rows += batch.num_rows()
                });
                assert_eq!(rows, MESSAGES);
            })
        });
        let mut batches = Vec::new();
        decode(&mut builder, &w.entries, batch_rows, |b| batches.push(b));
        let props = parquet_properties(&schema);
        group.bench_function(BenchmarkId::new("encode", size), |b| {
            b.iter(|| {
                let mut out = Vec::with_capacity(64 << 20);
                let mut writer =
                    ArrowWriter::try_new(&mut out, schema.clone(), Some(props.clone()))
                        .expect("writer");
                for batch in &batches {
                    writer.write(batch).expect("write");
                }
                writer.close().expect("close");
                out.len()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, stages);
criterion_main!(benches);
