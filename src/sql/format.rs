//! Result batches as bytes for HTTP and the CLI (JSON rows, CSV, Arrow IPC stream), and nested
//! values as JSON (for CSV cells and PostgreSQL `json` columns).
//!
//! Encoders are incremental: `begin`, then `batch` per record batch, then `finish`, each
//! returning the bytes to send, so a large result streams without being held whole.
//!
//! A union value (what `json_get` and `->` return) is its active member's value as JSON; the
//! `array` and `object` members of datafusion-functions-json's union hold JSON text and are
//! written as the JSON they hold.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, StringArray, UnionArray};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{DataType, Field, FieldRef, Schema, SchemaRef};
use arrow::error::ArrowError;
use arrow::json::writer::{
    EncoderFactory, EncoderOptions, JsonArray, LineDelimited, NullableEncoder, WriterBuilder,
};
use arrow::util::display::{ArrayFormatter, FormatOptions};

/// Media type of Arrow IPC streams.
pub const ARROW_STREAM: &str = "application/vnd.apache.arrow.stream";

/// A result encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A JSON array of row objects (`application/json`).
    Json,
    /// CSV with a header row (`text/csv`); nested values as JSON text, binary as hex.
    Csv,
    /// Arrow IPC stream (`application/vnd.apache.arrow.stream`).
    Arrow,
}

impl Format {
    /// The format an `Accept` header asks for (JSON when absent or `*/*`).
    pub fn from_accept(accept: Option<&str>) -> Result<Format, String> {
        let Some(accept) = accept else {
            return Ok(Format::Json);
        };
        for part in accept.split(',') {
            let media = part
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            match media.as_str() {
                "application/json" | "*/*" | "application/*" | "" => return Ok(Format::Json),
                "text/csv" | "text/*" => return Ok(Format::Csv),
                ARROW_STREAM => return Ok(Format::Arrow),
                _ => {}
            }
        }
        Err(format!(
            "cannot produce '{accept}': ask for application/json, text/csv or {ARROW_STREAM}"
        ))
    }

    /// The `Content-Type` of this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Json => "application/json",
            Format::Csv => "text/csv; charset=utf-8",
            Format::Arrow => ARROW_STREAM,
        }
    }

    /// An encoder for results of `schema`.
    pub fn encoder(self, schema: SchemaRef) -> Result<Encoder, ArrowError> {
        Ok(match self {
            Format::Json => Encoder::Json {
                writer: WriterBuilder::new()
                    .with_explicit_nulls(true)
                    .with_encoder_factory(Arc::new(UnionsAsValues))
                    .build::<_, JsonArray>(Vec::new()),
                started: false,
            },
            Format::Csv => Encoder::Csv {
                schema,
                header: true,
            },
            Format::Arrow => Encoder::Arrow(arrow::ipc::writer::StreamWriter::try_new(
                Vec::new(),
                &schema,
            )?),
        })
    }
}

/// An incremental result encoder.
pub enum Encoder {
    /// JSON rows.
    Json {
        /// Writer into a buffer drained after each call.
        writer: arrow::json::Writer<Vec<u8>, JsonArray>,
        /// Whether a batch was written (an empty result is `[]`).
        started: bool,
    },
    /// CSV.
    Csv {
        /// Result schema (for the header).
        schema: SchemaRef,
        /// Whether the header is still to be written.
        header: bool,
    },
    /// Arrow IPC stream.
    Arrow(arrow::ipc::writer::StreamWriter<Vec<u8>>),
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Encoder::Json { .. } => "Encoder::Json",
            Encoder::Csv { .. } => "Encoder::Csv",
            Encoder::Arrow(_) => "Encoder::Arrow",
        })
    }
}

impl Encoder {
    /// Bytes of one batch (with whatever must precede it).
    pub fn batch(&mut self, batch: &RecordBatch) -> Result<Vec<u8>, ArrowError> {
        match self {
            Encoder::Json { writer, started } => {
                if batch.num_rows() == 0 {
                    return Ok(Vec::new());
                }
                *started = true;
                writer.write(batch)?;
                Ok(std::mem::take(writer.get_mut()))
            }
            Encoder::Csv { header, .. } => {
                let flat = csv_ready(batch)?;
                let mut out = Vec::new();
                {
                    let mut w = arrow::csv::WriterBuilder::new()
                        .with_header(*header)
                        .build(&mut out);
                    w.write(&flat)?;
                }
                *header = false;
                Ok(out)
            }
            Encoder::Arrow(w) => {
                w.write(batch)?;
                Ok(std::mem::take(w.get_mut()))
            }
        }
    }

    /// The closing bytes.
    pub fn finish(&mut self) -> Result<Vec<u8>, ArrowError> {
        match self {
            Encoder::Json { writer, started } => {
                if !*started {
                    return Ok(b"[]".to_vec());
                }
                writer.finish()?;
                Ok(std::mem::take(writer.get_mut()))
            }
            Encoder::Csv { schema, header } => {
                if !*header {
                    return Ok(Vec::new());
                }
                // No rows: the header alone, from an empty batch.
                let empty = RecordBatch::new_empty(schema.clone());
                self.batch(&empty)
            }
            Encoder::Arrow(w) => {
                w.finish()?;
                Ok(std::mem::take(w.get_mut()))
            }
        }
    }
}

fn is_nested(dt: &DataType) -> bool {
    matches!(
        dt,
        DataType::Map(..)
            | DataType::Union(..)
            | DataType::Struct(_)
            | DataType::List(_)
            | DataType::LargeList(_)
            | DataType::FixedSizeList(..)
            | DataType::ListView(_)
            | DataType::LargeListView(_)
    )
}

fn is_binary(dt: &DataType) -> bool {
    matches!(
        dt,
        DataType::Binary
            | DataType::LargeBinary
            | DataType::BinaryView
            | DataType::FixedSizeBinary(_)
    )
}

/// CSV cells: nested values as JSON text, binary as hex, everything else as is.
fn csv_ready(batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    let schema = batch.schema();
    if !schema
        .fields()
        .iter()
        .any(|f| is_nested(f.data_type()) || is_binary(f.data_type()))
    {
        return Ok(batch.clone());
    }
    let mut fields = Vec::with_capacity(schema.fields().len());
    let mut columns = Vec::with_capacity(schema.fields().len());
    for (f, c) in schema.fields().iter().zip(batch.columns()) {
        if is_nested(f.data_type()) {
            let text: StringArray = json_values(c)?
                .into_iter()
                .map(|v| v.map(|v| v.to_string()))
                .collect();
            fields.push(Field::new(f.name(), DataType::Utf8, true));
            columns.push(Arc::new(text) as ArrayRef);
        } else if is_binary(f.data_type()) {
            fields.push(Field::new(f.name(), DataType::Utf8, true));
            columns.push(Arc::new(display_strings(c)?) as ArrayRef);
        } else {
            fields.push(f.as_ref().clone());
            columns.push(c.clone());
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
}

/// Each value of `array` as text (Arrow's display: hex for binary).
pub fn display_strings(array: &ArrayRef) -> Result<StringArray, ArrowError> {
    let options = FormatOptions::default();
    let formatter = ArrayFormatter::try_new(array.as_ref(), &options)?;
    // Logical nulls: a NullArray (an untyped NULL) has no null buffer.
    let nulls = array.logical_nulls();
    Ok((0..array.len())
        .map(|i| {
            let valid = nulls.as_ref().is_none_or(|n| n.is_valid(i));
            valid.then(|| formatter.value(i).to_string())
        })
        .collect())
}

/// Each value of `array` as JSON (maps with string keys become objects; `None` for null).
pub fn json_values(array: &ArrayRef) -> Result<Vec<Option<serde_json::Value>>, ArrowError> {
    let schema = Arc::new(Schema::new(vec![Field::new(
        "v",
        array.data_type().clone(),
        true,
    )]));
    let batch = RecordBatch::try_new(schema, vec![array.clone()])?;
    let mut writer = WriterBuilder::new()
        .with_explicit_nulls(true)
        .with_encoder_factory(Arc::new(UnionsAsValues))
        .build::<_, LineDelimited>(Vec::new());
    writer.write(&batch)?;
    writer.finish()?;
    let text = writer.into_inner();
    let mut out = Vec::with_capacity(array.len());
    for (i, line) in text
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .enumerate()
    {
        if array.is_null(i) {
            out.push(None);
            continue;
        }
        let mut row: serde_json::Value =
            serde_json::from_slice(line).map_err(|e| ArrowError::JsonError(e.to_string()))?;
        // JSON null (a union's null member) is SQL NULL.
        out.push(
            row.get_mut("v")
                .map(serde_json::Value::take)
                .filter(|v| !v.is_null()),
        );
    }
    if out.len() != array.len() {
        return Err(ArrowError::JsonError(format!(
            "{} JSON rows for {} values",
            out.len(),
            array.len()
        )));
    }
    Ok(out)
}

/// Writes union columns as their active member's value (see the module docs).
#[derive(Debug)]
struct UnionsAsValues;

impl EncoderFactory for UnionsAsValues {
    fn make_default_encoder<'a>(
        &self,
        _field: &'a FieldRef,
        array: &'a dyn Array,
        _options: &'a EncoderOptions,
    ) -> Result<Option<NullableEncoder<'a>>, ArrowError> {
        let Some(union) = array.as_any().downcast_ref::<UnionArray>() else {
            return Ok(None);
        };
        let values = union_values(union)?;
        let nulls = NullBuffer::from(values.iter().map(Option::is_some).collect::<Vec<_>>());
        Ok(Some(NullableEncoder::new(
            Box::new(JsonValues(values)),
            Some(nulls),
        )))
    }
}

/// Each value of `union` as JSON (`None` for the null member or a null member value).
fn union_values(union: &UnionArray) -> Result<Vec<Option<serde_json::Value>>, ArrowError> {
    let DataType::Union(fields, _) = union.data_type() else {
        return Err(ArrowError::JsonError("not a union".into()));
    };
    let mut members = std::collections::HashMap::new();
    for (type_id, field) in fields.iter() {
        let holds_json = matches!(field.name().as_str(), "array" | "object");
        members.insert(type_id, (holds_json, json_values(union.child(type_id))?));
    }
    (0..union.len())
        .map(|i| {
            let (holds_json, values) = members
                .get(&union.type_id(i))
                .ok_or_else(|| ArrowError::JsonError("union member out of range".into()))?;
            let value = values.get(union.value_offset(i)).cloned().flatten();
            Ok(match value {
                Some(serde_json::Value::String(text)) if *holds_json => {
                    Some(serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)))
                }
                other => other,
            })
        })
        .collect()
}

/// Precomputed JSON values, written one per row.
struct JsonValues(Vec<Option<serde_json::Value>>);

impl arrow::json::writer::Encoder for JsonValues {
    fn encode(&mut self, idx: usize, out: &mut Vec<u8>) {
        match self.0.get(idx).and_then(Option::as_ref) {
            Some(v) => out.extend_from_slice(v.to_string().as_bytes()),
            None => out.extend_from_slice(b"null"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, LargeBinaryArray, MapBuilder, StringBuilder};

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    fn sample() -> Result<RecordBatch, ArrowError> {
        let mut props = MapBuilder::new(None, StringBuilder::new(), StringBuilder::new());
        props.keys().append_value("k");
        props.values().append_value("v,1");
        props.append(true)?;
        props.append(true)?;
        let props = Arc::new(props.finish()) as ArrayRef;
        let ids = Arc::new(Int64Array::from(vec![Some(1), None])) as ArrayRef;
        let payload =
            Arc::new(LargeBinaryArray::from(vec![Some(&b"\x01\xff"[..]), None])) as ArrayRef;
        RecordBatch::try_from_iter(vec![
            ("id", ids),
            ("properties", props),
            ("payload", payload),
        ])
    }

    #[test]
    fn accept_headers_pick_the_format() {
        assert_eq!(Format::from_accept(None), Ok(Format::Json));
        assert_eq!(Format::from_accept(Some("text/csv")), Ok(Format::Csv));
        assert_eq!(
            Format::from_accept(Some("application/vnd.apache.arrow.stream")),
            Ok(Format::Arrow)
        );
        assert!(Format::from_accept(Some("image/png")).is_err());
    }

    #[test]
    fn json_rows_and_csv_cells() -> TestResult {
        let batch = sample()?;
        let mut json = Format::Json.encoder(batch.schema())?;
        let mut bytes = json.batch(&batch)?;
        bytes.extend(json.finish()?);
        let rows: serde_json::Value = serde_json::from_slice(&bytes)?;
        assert_eq!(rows[0]["id"], 1);
        assert_eq!(rows[0]["properties"]["k"], "v,1");
        assert!(rows[1]["id"].is_null());

        let mut csv = Format::Csv.encoder(batch.schema())?;
        let text = String::from_utf8(csv.batch(&batch)?)?;
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("id,properties,payload"));
        assert_eq!(lines.next(), Some(r#"1,"{""k"":""v,1""}",01ff"#));
        Ok(())
    }

    #[test]
    fn empty_results_are_well_formed() -> TestResult {
        let schema = sample()?.schema();
        assert_eq!(Format::Json.encoder(schema.clone())?.finish()?, b"[]");
        assert_eq!(
            Format::Csv.encoder(schema)?.finish()?,
            b"id,properties,payload\n"
        );
        Ok(())
    }
}
