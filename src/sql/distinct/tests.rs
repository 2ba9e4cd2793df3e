//! The rewrite under a memory limit that DataFusion's own accumulator exceeds by orders of
//! magnitude on this data, checked against counts computed here.

use std::collections::HashSet;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray, StructArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Fields, Schema};
use datafusion::datasource::MemTable;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};

use super::DistinctNestedKeys;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const ROWS: usize = 20_000;
const BATCHES: usize = 4;

/// Row `i`: (ledger, entry, batch index) with repeats, and a struct that is null every 7th row.
fn row(i: usize) -> (i64, i64, i32, Option<(i64, String)>) {
    let ledger = (i / 5000) as i64;
    let entry = ((i / 3) % 2000) as i64;
    let index = (i % 3) as i32;
    let s = (i % 7 != 0).then(|| ((i % 500) as i64, format!("k{}", i % 11)));
    (ledger, entry, index, s)
}

fn table() -> Result<MemTable, Box<dyn std::error::Error>> {
    let s_fields = Fields::from(vec![
        Field::new("n", DataType::Int64, false),
        Field::new("k", DataType::Utf8, false),
    ]);
    let schema = Arc::new(Schema::new(vec![
        Field::new("ledger_id", DataType::Int64, false),
        Field::new("entry_id", DataType::Int64, false),
        Field::new("batch_index", DataType::Int32, false),
        Field::new("s", DataType::Struct(s_fields.clone()), true),
    ]));
    let per = ROWS / BATCHES;
    let mut batches = Vec::new();
    for b in 0..BATCHES {
        let rows: Vec<_> = (b * per..(b + 1) * per).map(row).collect();
        let n: Int64Array = rows
            .iter()
            .map(|r| r.3.as_ref().map_or(0, |s| s.0))
            .collect();
        let k: StringArray = rows
            .iter()
            .map(|r| Some(r.3.as_ref().map_or(String::new(), |s| s.1.clone())))
            .collect();
        let valid: Vec<bool> = rows.iter().map(|r| r.3.is_some()).collect();
        let s = StructArray::try_new(
            s_fields.clone(),
            vec![Arc::new(n) as ArrayRef, Arc::new(k)],
            Some(valid.into()),
        )?;
        let columns: Vec<ArrayRef> = vec![
            Arc::new(rows.iter().map(|r| r.0).collect::<Int64Array>()),
            Arc::new(rows.iter().map(|r| r.1).collect::<Int64Array>()),
            Arc::new(rows.iter().map(|r| r.2).collect::<Int32Array>()),
            Arc::new(s),
        ];
        batches.push(RecordBatch::try_new(schema.clone(), columns)?);
    }
    Ok(MemTable::try_new(schema, vec![batches])?)
}

/// A session with a 64 MiB memory pool and two partitions, with or without the rule.
fn context(with_rule: bool) -> Result<SessionContext, Box<dyn std::error::Error>> {
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_limit(64 * 1024 * 1024, 1.0)
        .build_arc()?;
    let state = SessionStateBuilder::new()
        .with_config(SessionConfig::new().with_target_partitions(2))
        .with_runtime_env(runtime)
        .with_default_features()
        .build();
    let ctx = SessionContext::new_with_state(state);
    if with_rule {
        ctx.add_optimizer_rule(Arc::new(DistinctNestedKeys));
    }
    ctx.register_table("t", Arc::new(table()?))?;
    Ok(ctx)
}

async fn ints(ctx: &SessionContext, sql: &str) -> Result<Vec<i64>, Box<dyn std::error::Error>> {
    let batches = ctx.sql(sql).await?.collect().await?;
    let batch = batches.first().ok_or("no rows")?;
    let mut out = Vec::new();
    for c in batch.columns() {
        let c = c
            .as_any()
            .downcast_ref::<Int64Array>()
            .ok_or("not an int64")?;
        out.push(c.value(0));
    }
    Ok(out)
}

#[tokio::test]
async fn a_distinct_count_of_a_tuple_fits_and_is_exact() -> TestResult {
    let ctx = context(true)?;
    let expected: HashSet<_> = (0..ROWS)
        .map(|i| {
            let r = row(i);
            (r.0, r.1, r.2)
        })
        .collect();
    let got = ints(
        &ctx,
        "SELECT count(*), count(DISTINCT (ledger_id, entry_id, batch_index)) FROM t",
    )
    .await?;
    assert_eq!(got, vec![ROWS as i64, expected.len() as i64]);
    // The name of the aggregate is unchanged, and it agrees with SELECT DISTINCT.
    let df = ctx
        .sql("SELECT count(DISTINCT (ledger_id, entry_id, batch_index)) FROM t")
        .await?;
    let name = df.schema().field(0).name().clone();
    assert!(name.starts_with("count(DISTINCT struct("), "{name}");
    let via_group = ints(
        &ctx,
        "SELECT count(*) FROM (SELECT DISTINCT ledger_id, entry_id, batch_index FROM t)",
    )
    .await?;
    assert_eq!(via_group, vec![expected.len() as i64]);
    Ok(())
}

#[tokio::test]
async fn a_distinct_count_of_a_struct_column_skips_nulls() -> TestResult {
    let ctx = context(true)?;
    let expected: HashSet<_> = (0..ROWS).filter_map(|i| row(i).3).collect();
    let got = ints(
        &ctx,
        "SELECT count(DISTINCT s), count(DISTINCT ledger_id) FROM t GROUP BY true",
    )
    .await?;
    assert_eq!(got, vec![expected.len() as i64, 4]);
    // Per group too.
    let batches = ctx
        .sql(
            "SELECT ledger_id, count(DISTINCT s) AS n FROM t GROUP BY ledger_id ORDER BY ledger_id",
        )
        .await?
        .collect()
        .await?;
    let mut per_ledger = Vec::new();
    for b in &batches {
        let n = b
            .column(1)
            .as_any()
            .downcast_ref::<Int64Array>()
            .ok_or("n")?;
        per_ledger.extend((0..b.num_rows()).map(|i| n.value(i)));
    }
    let expected: Vec<i64> = (0..4)
        .map(|l| {
            (0..ROWS)
                .filter(|i| row(*i).0 == l)
                .filter_map(|i| row(i).3)
                .collect::<HashSet<_>>()
                .len() as i64
        })
        .collect();
    assert_eq!(per_ledger, expected);
    Ok(())
}

#[tokio::test]
async fn explain_shows_the_key() -> TestResult {
    let ctx = context(true)?;
    let plan = ctx
        .sql("EXPLAIN SELECT count(*), count(DISTINCT (ledger_id, entry_id)) FROM t")
        .await?
        .collect()
        .await?;
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&plan)?.to_string();
    assert!(text.contains("distinct_key("), "{text}");
    Ok(())
}

#[tokio::test]
async fn a_distinct_count_of_lists_fits_and_is_exact() -> TestResult {
    let ctx = context(true)?;
    let expected: HashSet<_> = (0..ROWS).map(|i| (row(i).1, row(i).0)).collect();
    let got = ints(
        &ctx,
        "SELECT count(*), count(DISTINCT [entry_id, ledger_id]) FROM t",
    )
    .await?;
    assert_eq!(got, vec![ROWS as i64, expected.len() as i64]);
    Ok(())
}
