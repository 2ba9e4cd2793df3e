//! PostgreSQL values of Arrow columns: the type each Arrow type is reported as, the row
//! description of a result, each batch's rows encoded as text or binary values, and the
//! SQLSTATE of each SQL error.
//!
//! Invariant: a column's values are encoded with the type [`pg_type`] reports for it.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{
    DataType, Date32Type, Float16Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type,
    Int8Type, SchemaRef, TimeUnit, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use futures::{stream, StreamExt};
use pgwire::api::portal::Format;
use pgwire::api::results::{DataRowEncoder, FieldFormat, FieldInfo};
use pgwire::api::Type;
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::data::DataRow;

use super::format::{display_strings, json_values};
use super::SqlError;

/// The one place SQL errors become PostgreSQL errors (SQLSTATE codes).
pub fn to_pg_error(e: SqlError) -> PgWireError {
    let code = match &e {
        SqlError::Refused(_) => "25006",         // read_only_sql_transaction
        SqlError::Invalid(_) => "42000",         // syntax_error_or_access_rule_violation
        SqlError::TableNotFound(_) => "42P01",   // undefined_table
        SqlError::Execution(_) => "XX000",       // internal_error
        SqlError::MemoryLimit { .. } => "53200", // out_of_memory
        SqlError::Timeout(_) => "57014",         // query_canceled
        SqlError::Unauthenticated(_) => "28P01", // invalid_password
        SqlError::Denied(_) => "42501",          // insufficient_privilege
        SqlError::Stopped => "57P01",            // admin_shutdown
        SqlError::Cancelled => "57014",          // query_canceled
    };
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".to_owned(),
        code.to_owned(),
        e.to_string(),
    )))
}

/// A query's batches as PostgreSQL data rows (an error ends them).
pub(super) fn encoded(
    rows: impl futures::Stream<Item = Result<RecordBatch, SqlError>> + Send + 'static,
    fields: Arc<Vec<FieldInfo>>,
) -> impl futures::Stream<Item = PgWireResult<DataRow>> + Send + 'static {
    rows.flat_map(move |batch| {
        let rows = match batch {
            Ok(b) => encode_batch(&b, &fields),
            Err(e) => vec![Err(to_pg_error(e))],
        };
        stream::iter(rows)
    })
}

/// The PostgreSQL type of an Arrow type.
pub(crate) fn pg_type(dt: &DataType) -> Type {
    match dt {
        DataType::Boolean => Type::BOOL,
        DataType::Int8 | DataType::Int16 | DataType::UInt8 => Type::INT2,
        DataType::Int32 | DataType::UInt16 => Type::INT4,
        DataType::Int64 | DataType::UInt32 | DataType::UInt64 => Type::INT8,
        DataType::Float16 | DataType::Float32 => Type::FLOAT4,
        DataType::Float64 => Type::FLOAT8,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Type::TEXT,
        DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_) => Type::BYTEA,
        DataType::Date32 => Type::DATE,
        DataType::Timestamp(_, Some(_)) => Type::TIMESTAMPTZ,
        DataType::Timestamp(_, None) => Type::TIMESTAMP,
        DataType::Map(..)
        | DataType::Struct(_)
        | DataType::List(_)
        | DataType::LargeList(_)
        | DataType::FixedSizeList(..)
        | DataType::Union(..) => Type::JSON,
        _ => Type::TEXT,
    }
}

pub(super) fn field_infos(schema: &SchemaRef, format: Option<&Format>) -> Vec<FieldInfo> {
    schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let fmt = format.map_or(FieldFormat::Text, |f| f.format_for(i));
            FieldInfo::new(f.name().clone(), None, None, pg_type(f.data_type()), fmt)
        })
        .collect()
}

/// One column of a batch, ready to give a value per row.
enum Column<'a> {
    Bool(&'a arrow::array::BooleanArray),
    I16(Vec<Option<i16>>),
    I32(Vec<Option<i32>>),
    I64(Vec<Option<i64>>),
    F32(Vec<Option<f32>>),
    F64(Vec<Option<f64>>),
    Text(Vec<Option<String>>),
    Bytes(&'a ArrayRef),
    Date(Vec<Option<chrono::NaiveDate>>),
    TimestampTz(Vec<Option<chrono::DateTime<chrono::Utc>>>),
    Timestamp(Vec<Option<chrono::NaiveDateTime>>),
    Json(Vec<Option<serde_json::Value>>),
}

fn micros(unit: &TimeUnit, v: i64) -> i64 {
    match unit {
        TimeUnit::Second => v.saturating_mul(1_000_000),
        TimeUnit::Millisecond => v.saturating_mul(1000),
        TimeUnit::Microsecond => v,
        TimeUnit::Nanosecond => v.div_euclid(1000),
    }
}

fn prepare_column(c: &ArrayRef) -> Result<Column<'_>, arrow::error::ArrowError> {
    macro_rules! prim {
        ($t:ty, $variant:ident, $conv:expr) => {
            Column::$variant(
                c.as_primitive::<$t>()
                    .iter()
                    .map(|v| v.map($conv))
                    .collect(),
            )
        };
    }
    Ok(match c.data_type() {
        DataType::Boolean => Column::Bool(c.as_boolean()),
        DataType::Int8 => prim!(Int8Type, I16, i16::from),
        DataType::Int16 => prim!(Int16Type, I16, |v| v),
        DataType::UInt8 => prim!(UInt8Type, I16, i16::from),
        DataType::Int32 => prim!(Int32Type, I32, |v| v),
        DataType::UInt16 => prim!(UInt16Type, I32, i32::from),
        DataType::Int64 => prim!(Int64Type, I64, |v| v),
        DataType::UInt32 => prim!(UInt32Type, I64, i64::from),
        DataType::UInt64 => prim!(UInt64Type, I64, |v: u64| i64::try_from(v)
            .unwrap_or(i64::MAX)),
        DataType::Float16 => prim!(Float16Type, F32, f32::from),
        DataType::Float32 => prim!(Float32Type, F32, |v| v),
        DataType::Float64 => prim!(Float64Type, F64, |v| v),
        DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_) => Column::Bytes(c),
        DataType::Date32 => Column::Date(
            c.as_primitive::<Date32Type>()
                .iter()
                .map(|v| v.and_then(Date32Type::to_naive_date_opt))
                .collect(),
        ),
        DataType::Timestamp(unit, tz) => {
            let values = arrow::compute::cast(c, &DataType::Int64)?;
            let us: Vec<Option<i64>> = values
                .as_primitive::<Int64Type>()
                .iter()
                .map(|v| v.map(|v| micros(unit, v)))
                .collect();
            if tz.is_some() {
                Column::TimestampTz(
                    us.into_iter()
                        .map(|v| v.and_then(chrono::DateTime::from_timestamp_micros))
                        .collect(),
                )
            } else {
                Column::Timestamp(
                    us.into_iter()
                        .map(|v| {
                            v.and_then(chrono::DateTime::from_timestamp_micros)
                                .map(|t| t.naive_utc())
                        })
                        .collect(),
                )
            }
        }
        dt if pg_type(dt) == Type::JSON => Column::Json(json_values(c)?),
        _ => Column::Text(
            display_strings(c)?
                .iter()
                .map(|v| v.map(str::to_string))
                .collect(),
        ),
    })
}

fn encode_batch(batch: &RecordBatch, fields: &Arc<Vec<FieldInfo>>) -> Vec<PgWireResult<DataRow>> {
    let columns: Result<Vec<Column<'_>>, _> = batch.columns().iter().map(prepare_column).collect();
    let columns = match columns {
        Ok(c) => c,
        Err(e) => return vec![Err(to_pg_error(SqlError::Execution(e.to_string())))],
    };
    let mut encoder = DataRowEncoder::new(fields.clone());
    let mut rows = Vec::with_capacity(batch.num_rows());
    for row in 0..batch.num_rows() {
        let mut failed = None;
        for c in &columns {
            let r = match c {
                Column::Bool(a) => encoder.encode_field(&(a.is_valid(row).then(|| a.value(row)))),
                Column::I16(v) => encoder.encode_field(&v[row]),
                Column::I32(v) => encoder.encode_field(&v[row]),
                Column::I64(v) => encoder.encode_field(&v[row]),
                Column::F32(v) => encoder.encode_field(&v[row]),
                Column::F64(v) => encoder.encode_field(&v[row]),
                Column::Text(v) => encoder.encode_field(&v[row]),
                Column::Bytes(a) => {
                    let value: Option<Vec<u8>> = a.is_valid(row).then(|| binary_at(a, row));
                    encoder.encode_field(&value)
                }
                Column::Date(v) => encoder.encode_field(&v[row]),
                Column::TimestampTz(v) => encoder.encode_field(&v[row]),
                Column::Timestamp(v) => encoder.encode_field(&v[row]),
                Column::Json(v) => encoder.encode_field(&v[row]),
            };
            if let Err(e) = r {
                failed = Some(e);
                break;
            }
        }
        match failed {
            Some(e) => {
                rows.push(Err(e));
                return rows;
            }
            None => rows.push(Ok(encoder.take_row())),
        }
    }
    rows
}

fn binary_at(a: &ArrayRef, row: usize) -> Vec<u8> {
    match a.data_type() {
        DataType::Binary => a.as_binary::<i32>().value(row).to_vec(),
        DataType::LargeBinary => a.as_binary::<i64>().value(row).to_vec(),
        DataType::BinaryView => a.as_binary_view().value(row).to_vec(),
        DataType::FixedSizeBinary(_) => a.as_fixed_size_binary().value(row).to_vec(),
        _ => Vec::new(),
    }
}
