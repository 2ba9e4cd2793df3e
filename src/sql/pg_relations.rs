//! `pg_namespace`, `pg_class` and `pg_attribute` over the topics, with oids that are the same in
//! every session: a tool reads a table's oid in one query and asks for its columns by that oid in
//! the next, and each query runs in a session of its own. (datafusion-pg-catalog 0.17 numbers
//! relations in the order a session's scans happen to meet them, so oids differed between queries,
//! and within one query after a `pg_attribute` scan.)
//!
//! Invariants:
//! - An oid is a hash of the object's names (FNV-1a, fixed across builds and restarts) folded
//!   into PostgreSQL's range for user objects (≥ 16384); `pg_catalog` is 11, as in PostgreSQL.
//! - Column types are the PostgreSQL types the wire reports for them (`pg_values::pg_type`).
//! - The tables hold exactly the session's listing; every column of the crate's schema is present
//!   (tools select `c.*`), unknown ones null or zero.

use std::sync::Arc;

use arrow::array::{new_empty_array, ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, Field, SchemaRef};
use datafusion::catalog::MemTable;
use datafusion::common::{Result as DFResult, ScalarValue};
use datafusion::datasource::TableProvider;

use super::catalog::{Listing, Shared};

/// PostgreSQL's oid of `pg_catalog`.
pub(crate) const PG_CATALOG_OID: i32 = 11;

/// The oid of the object named `names` of kind `kind` (`n` namespace, `r` relation).
pub(crate) fn stable_oid(kind: &str, names: &[&str]) -> i32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in std::iter::once(kind).chain(names.iter().copied()) {
        for b in part.bytes().chain(std::iter::once(0)) {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    const FIRST: u64 = 16_384;
    let span = i32::MAX as u64 - FIRST;
    (FIRST + hash % span) as i32
}

/// One row: values by column name; columns not named are null (or zero when not nullable).
type Row = Vec<(&'static str, ScalarValue)>;

fn text(v: &str) -> ScalarValue {
    ScalarValue::Utf8(Some(v.to_string()))
}

fn int(v: i32) -> ScalarValue {
    ScalarValue::Int32(Some(v))
}

/// The rows of `pg_namespace`.
fn namespaces(listing: &Listing) -> Vec<Row> {
    let mut rows = vec![vec![
        ("oid", int(PG_CATALOG_OID)),
        ("nspname", text("pg_catalog")),
        ("nspowner", int(10)),
    ]];
    for (tenant, namespaces) in listing {
        for ns in namespaces.keys() {
            rows.push(vec![
                ("oid", int(stable_oid("n", &[tenant, ns]))),
                ("nspname", text(ns)),
                ("nspowner", int(10)),
            ]);
        }
    }
    rows
}

/// The rows of `pg_class` (one ordinary table per topic).
fn classes(listing: &Listing) -> Vec<Row> {
    let mut rows = Vec::new();
    for (tenant, namespaces) in listing {
        for (ns, topics) in namespaces {
            for topic in topics {
                rows.push(vec![
                    ("oid", int(stable_oid("r", &[tenant, ns, topic]))),
                    ("relname", text(topic)),
                    ("relnamespace", int(stable_oid("n", &[tenant, ns]))),
                    ("relowner", int(10)),
                    ("relpersistence", text("p")),
                    ("relkind", text("r")),
                    ("relispopulated", ScalarValue::Boolean(Some(true))),
                    ("relreplident", text("d")),
                    ("reltuples", ScalarValue::Float64(Some(-1.0))),
                ]);
            }
        }
    }
    rows
}

/// The rows of `pg_attribute` (each topic's columns, numbered from 1).
async fn attributes(shared: &Shared, listing: &Listing) -> DFResult<Vec<Row>> {
    let mut rows = Vec::new();
    for (tenant, namespaces) in listing {
        for (ns, topics) in namespaces {
            for topic in topics {
                let schema = super::catalog::topic_schema(shared, tenant, ns, topic)
                    .await
                    .map_err(|e| datafusion::common::DataFusionError::External(Box::new(e)))?;
                let rel = stable_oid("r", &[tenant, ns, topic]);
                for (i, f) in schema.fields().iter().enumerate() {
                    let typ = super::pg_values::pg_type(f.data_type());
                    rows.push(vec![
                        ("attrelid", int(rel)),
                        ("attname", text(f.name())),
                        ("atttypid", int(typ.oid() as i32)),
                        ("attlen", ScalarValue::Int16(Some(-1))),
                        ("attnum", ScalarValue::Int16(Some(i as i16 + 1))),
                        ("atttypmod", int(-1)),
                        ("attnotnull", ScalarValue::Boolean(Some(!f.is_nullable()))),
                        ("attislocal", ScalarValue::Boolean(Some(true))),
                        ("attalign", text("i")),
                        ("attstorage", text("x")),
                    ]);
                }
            }
        }
    }
    Ok(rows)
}

/// The table `name` (one of the three) with the crate's `schema`, `None` for other names.
pub(crate) async fn table(
    name: &str,
    schema: SchemaRef,
    shared: &Shared,
    listing: &Listing,
) -> DFResult<Option<Arc<dyn TableProvider>>> {
    let rows = match name {
        "pg_namespace" => namespaces(listing),
        "pg_class" => classes(listing),
        "pg_attribute" => attributes(shared, listing).await?,
        _ => return Ok(None),
    };
    let batch = batch(&schema, &rows)?;
    Ok(Some(Arc::new(MemTable::try_new(
        schema,
        vec![vec![batch]],
    )?)))
}

fn batch(schema: &SchemaRef, rows: &[Row]) -> DFResult<RecordBatch> {
    let columns = schema
        .fields()
        .iter()
        .map(|f| {
            if rows.is_empty() {
                return Ok(new_empty_array(f.data_type()));
            }
            let values = rows
                .iter()
                .map(|r| match r.iter().find(|(n, _)| *n == f.name()) {
                    Some((_, v)) => Ok(v.clone()),
                    None => default_of(f),
                })
                .collect::<DFResult<Vec<_>>>()?;
            ScalarValue::iter_to_array(values)
        })
        .collect::<DFResult<Vec<ArrayRef>>>()?;
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}

/// Null, or for a column that may not be null: zero, false or the empty string.
fn default_of(f: &Field) -> DFResult<ScalarValue> {
    if f.is_nullable() {
        return ScalarValue::try_from(f.data_type());
    }
    Ok(match f.data_type() {
        DataType::Utf8 => text(""),
        DataType::Boolean => ScalarValue::Boolean(Some(false)),
        other => ScalarValue::new_zero(other)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oids_are_stable_distinct_and_in_the_user_range() {
        let a = stable_oid("r", &["public", "default", "orders"]);
        assert_eq!(a, stable_oid("r", &["public", "default", "orders"]));
        assert_ne!(a, stable_oid("r", &["public", "default", "orders2"]));
        assert_ne!(a, stable_oid("n", &["public", "default", "orders"]));
        // Names are separated: ("ab", "c") is not ("a", "bc").
        assert_ne!(stable_oid("n", &["ab", "c"]), stable_oid("n", &["a", "bc"]));
        assert!(a >= 16_384);
    }
}
