//! Typed columns: a topic with a JSON or Avro schema gets one lake column per top-level field
//! of its (Avro-syntax) schema definition, nested records as structs.
//!
//! Mapping (Avro → Iceberg): boolean, int, long, float, double, string, bytes → binary,
//! fixed → binary, enum → string, record → struct, array → list, map → map<string, _>,
//! `[null, T]` → optional T; logical types keep their physical type (timestamp-millis → long,
//! date → int, decimal → binary, uuid → string). Fields of other union shapes, of type null,
//! or named references are not given a column (they stay in `payload`). Every typed column is
//! optional. A field whose name equals an envelope column is stored as `value_<name>`.
//!
//! Decoding: JSON payloads are decoded by arrow-json against the columns' Arrow types; Avro
//! payloads are first decoded with the writer schema of their `schema_version`, then go the
//! same way. A payload that does not decode gives null typed columns and a `decode_error`
//! (never a lost row).

use std::collections::HashMap;
use std::sync::Arc;

use apache_avro::schema::Schema as Avro;
use apache_avro::types::Value as AvroValue;
use arrow::array::ArrayRef;
use arrow::datatypes::{Field, Schema as ArrowSchema};
use arrow::json::reader::{Decoder, ReaderBuilder};
use iceberg::spec::{ListType, MapType, NestedField, PrimitiveType, StructType, Type};

use super::schema::ENVELOPE_COLUMNS;

/// Why the typed columns of a batch could not be built (a schema the decoder cannot build: a
/// bug, not bad input; a bad payload only nulls its own row).
#[derive(Debug, thiserror::Error)]
pub enum TypedError {
    /// Arrow refused the decoder or the arrays.
    #[error("typed columns: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// The decoder failed on an empty row.
    #[error("typed columns: {0}")]
    Decoder(String),
}

/// Encoding of a topic's payloads.
#[derive(Debug, Clone)]
pub enum PayloadCodec {
    /// JSON text.
    Json,
    /// Avro binary datums; the writer schema per schema version.
    Avro(HashMap<u64, Avro>),
}

/// The codec and the wanted typed columns (name, Iceberg type; newest version's type first) of
/// a topic whose schema versions are `versions` (ascending). `None` unless the newest version
/// is a JSON or Avro schema. Versions whose definition does not parse give no columns (logged).
pub fn topic_codec(
    topic: &str,
    versions: &[(u64, crate::protocol::proto::Schema)],
) -> Option<(PayloadCodec, Vec<(String, Type)>)> {
    use crate::protocol::proto::schema::Type as SchemaType;
    let (_, latest) = versions.last()?;
    let kind = latest.r#type();
    if !matches!(kind, SchemaType::Json | SchemaType::Avro) {
        return None;
    }
    let mut definitions = HashMap::new();
    for (v, s) in versions {
        if s.r#type() == kind {
            match parse_definition(&s.schema_data) {
                Ok(d) => {
                    definitions.insert(*v, d);
                }
                Err(e) => {
                    tracing::warn!(topic, version = v, error = %e,
                        "schema definition does not parse; no typed columns from it");
                }
            }
        }
    }
    // Newest first, so a column takes the newest type of its field.
    let mut wanted: Vec<(String, Type)> = Vec::new();
    let mut ordered: Vec<&u64> = definitions.keys().collect();
    ordered.sort_unstable_by(|a, b| b.cmp(a));
    for v in ordered {
        for (name, t) in columns_of(&definitions[v]) {
            if !wanted.iter().any(|(n, _)| *n == name) {
                wanted.push((name, t));
            }
        }
    }
    let codec = match kind {
        SchemaType::Avro => PayloadCodec::Avro(definitions),
        _ => PayloadCodec::Json,
    };
    Some((codec, wanted))
}

/// `t` with fresh, unique field ids for its nested fields, taken from `next` (what Iceberg does
/// when it adds a column; for a schema built without a table).
pub fn renumber(t: &Type, next: &mut i32) -> Type {
    fn take(next: &mut i32) -> i32 {
        let id = *next;
        *next += 1;
        id
    }
    match t {
        Type::Primitive(_) => t.clone(),
        Type::Struct(s) => {
            let fields: Vec<Arc<NestedField>> = s
                .fields()
                .iter()
                .map(|f| {
                    let id = take(next);
                    let inner = renumber(&f.field_type, next);
                    let mut nf = NestedField::new(id, f.name.clone(), inner, f.required);
                    nf.doc = f.doc.clone();
                    Arc::new(nf)
                })
                .collect();
            Type::Struct(StructType::new(fields))
        }
        Type::List(l) => {
            let id = take(next);
            let inner = renumber(&l.element_field.field_type, next);
            Type::List(ListType::new(Arc::new(NestedField::list_element(
                id,
                inner,
                l.element_field.required,
            ))))
        }
        Type::Map(m) => {
            let key_id = take(next);
            let value_id = take(next);
            let key = renumber(&m.key_field.field_type, next);
            let value = renumber(&m.value_field.field_type, next);
            Type::Map(MapType::new(
                Arc::new(NestedField::map_key_element(key_id, key)),
                Arc::new(NestedField::map_value_element(
                    value_id,
                    value,
                    m.value_field.required,
                )),
            ))
        }
    }
}

/// Parses the Avro-syntax definition carried by a Pulsar JSON or AVRO schema.
pub fn parse_definition(schema_data: &[u8]) -> Result<Avro, String> {
    let text = std::str::from_utf8(schema_data).map_err(|e| e.to_string())?;
    Avro::parse_str(text).map_err(|e| e.to_string())
}

/// Column name of a top-level schema field.
pub fn column_name(json_key: &str) -> String {
    if ENVELOPE_COLUMNS.contains(&json_key) {
        format!("value_{json_key}")
    } else {
        json_key.to_string()
    }
}

/// The JSON key a typed column reads (inverse of [`column_name`]).
pub fn json_key(column: &str) -> &str {
    match column.strip_prefix("value_") {
        Some(k) if ENVELOPE_COLUMNS.contains(&k) => k,
        _ => column,
    }
}

/// The typed columns a schema definition asks for: (column name, Iceberg type), in field order.
/// Nested field ids are placeholders; Iceberg assigns fresh ones when the column is added.
pub fn columns_of(definition: &Avro) -> Vec<(String, Type)> {
    let Avro::Record(record) = definition else {
        return Vec::new();
    };
    record
        .fields
        .iter()
        .filter_map(|f| iceberg_type(&f.schema).map(|t| (column_name(&f.name), t)))
        .collect()
}

fn optional(id: i32, name: &str, t: Type) -> Arc<NestedField> {
    Arc::new(NestedField::optional(id, name, t))
}

fn iceberg_type(schema: &Avro) -> Option<Type> {
    let p = |t| Some(Type::Primitive(t));
    match schema {
        Avro::Boolean => p(PrimitiveType::Boolean),
        Avro::Int | Avro::Date | Avro::TimeMillis => p(PrimitiveType::Int),
        Avro::Long
        | Avro::TimeMicros
        | Avro::TimestampMillis
        | Avro::TimestampMicros
        | Avro::TimestampNanos
        | Avro::LocalTimestampMillis
        | Avro::LocalTimestampMicros
        | Avro::LocalTimestampNanos => p(PrimitiveType::Long),
        Avro::Float => p(PrimitiveType::Float),
        Avro::Double => p(PrimitiveType::Double),
        Avro::String | Avro::Uuid | Avro::Enum(_) => p(PrimitiveType::String),
        Avro::Bytes | Avro::Fixed(_) | Avro::Decimal(_) | Avro::BigDecimal | Avro::Duration => {
            p(PrimitiveType::Binary)
        }
        Avro::Union(u) => {
            let variants = u.variants();
            let non_null: Vec<&Avro> = variants.iter().filter(|v| **v != Avro::Null).collect();
            match non_null.as_slice() {
                [one] => iceberg_type(one),
                _ => None,
            }
        }
        Avro::Array(a) => {
            iceberg_type(&a.items).map(|t| Type::List(ListType::new(optional(0, "element", t))))
        }
        Avro::Map(m) => iceberg_type(&m.types).map(|t| {
            Type::Map(MapType::new(
                Arc::new(NestedField::map_key_element(
                    0,
                    Type::Primitive(PrimitiveType::String),
                )),
                Arc::new(NestedField::map_value_element(0, t, false)),
            ))
        }),
        Avro::Record(r) => {
            let fields: Vec<Arc<NestedField>> = r
                .fields
                .iter()
                .filter_map(|f| iceberg_type(&f.schema).map(|t| optional(0, &f.name, t)))
                .collect();
            (!fields.is_empty()).then(|| Type::Struct(StructType::new(fields)))
        }
        _ => None,
    }
}

/// Converts a decoded Avro value into the JSON the column decoder reads.
fn avro_to_json(v: AvroValue) -> serde_json::Value {
    use serde_json::Value as J;
    let hex = |b: &[u8]| J::String(b.iter().map(|x| format!("{x:02x}")).collect());
    match v {
        AvroValue::Null => J::Null,
        AvroValue::Boolean(b) => J::Bool(b),
        AvroValue::Int(i) | AvroValue::Date(i) | AvroValue::TimeMillis(i) => J::from(i),
        AvroValue::Long(l)
        | AvroValue::TimeMicros(l)
        | AvroValue::TimestampMillis(l)
        | AvroValue::TimestampMicros(l)
        | AvroValue::TimestampNanos(l)
        | AvroValue::LocalTimestampMillis(l)
        | AvroValue::LocalTimestampMicros(l)
        | AvroValue::LocalTimestampNanos(l) => J::from(l),
        AvroValue::Float(f) => {
            serde_json::Number::from_f64(f64::from(f)).map_or(J::Null, J::Number)
        }
        AvroValue::Double(d) => serde_json::Number::from_f64(d).map_or(J::Null, J::Number),
        AvroValue::Bytes(b) | AvroValue::Fixed(_, b) => hex(&b),
        AvroValue::String(s) | AvroValue::Enum(_, s) => J::String(s),
        AvroValue::Uuid(u) => J::String(u.to_string()),
        AvroValue::Union(_, inner) => avro_to_json(*inner),
        AvroValue::Array(items) => J::Array(items.into_iter().map(avro_to_json).collect()),
        AvroValue::Map(m) => J::Object(m.into_iter().map(|(k, v)| (k, avro_to_json(v))).collect()),
        AvroValue::Record(fields) => J::Object(
            fields
                .into_iter()
                .map(|(k, v)| (k, avro_to_json(v)))
                .collect(),
        ),
        AvroValue::Decimal(d) => Vec::<u8>::try_from(d).map_or(J::Null, |b| hex(&b)),
        other => J::String(format!("{other:?}")),
    }
}

/// Typed columns of a batch and the rows that did not decode (row index, reason).
pub type TypedOutput = (Vec<ArrayRef>, Vec<(usize, String)>);

/// Builds the typed columns of one batch of rows.
pub struct TypedColumns {
    codec: PayloadCodec,
    /// Decoder schema: the table's typed fields renamed to their JSON keys.
    decode_schema: Arc<ArrowSchema>,
    /// Per row: the JSON to decode, or `None` for an all-null row.
    pending: Vec<Option<Vec<u8>>>,
    /// Rows already known to be bad (row index, reason).
    errors: Vec<(usize, String)>,
}

impl std::fmt::Debug for TypedColumns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TypedColumns")
            .field("columns", &self.decode_schema.fields().len())
            .finish()
    }
}

impl TypedColumns {
    /// Typed columns for `table_schema` (the table's Arrow schema); `None` when the table has
    /// no typed column.
    pub fn new(table_schema: &ArrowSchema, codec: PayloadCodec) -> Option<Self> {
        let typed: Vec<Field> = table_schema
            .fields()
            .iter()
            .skip(ENVELOPE_COLUMNS.len())
            .map(|f| {
                f.as_ref()
                    .clone()
                    .with_name(json_key(f.name()))
                    .with_nullable(true)
            })
            .collect();
        if typed.is_empty() {
            return None;
        }
        Some(Self {
            codec,
            decode_schema: Arc::new(ArrowSchema::new(typed)),
            pending: Vec::new(),
            errors: Vec::new(),
        })
    }

    /// Queues the payload of the next row (written with schema `version`).
    pub fn push(&mut self, payload: &[u8], version: Option<u64>) {
        let row = self.pending.len();
        match &self.codec {
            PayloadCodec::Json => self.pending.push(Some(payload.to_vec())),
            PayloadCodec::Avro(schemas) => {
                let schema = version
                    .and_then(|v| schemas.get(&v))
                    .or_else(|| schemas.iter().max_by_key(|(v, _)| **v).map(|(_, s)| s));
                let decoded = schema
                    .ok_or_else(|| "the topic has no Avro schema".to_string())
                    .and_then(|s| {
                        apache_avro::from_avro_datum(s, &mut &payload[..], None)
                            .map_err(|e| format!("Avro payload does not decode: {e}"))
                    });
                match decoded {
                    Ok(v) => self
                        .pending
                        .push(Some(avro_to_json(v).to_string().into_bytes())),
                    Err(e) => {
                        self.errors.push((row, e));
                        self.pending.push(None);
                    }
                }
            }
        }
    }

    /// Queues a row whose typed columns are all null (no payload, or an opaque one).
    pub fn push_null(&mut self) {
        self.pending.push(None);
    }

    fn decoder(&self, rows: usize) -> Result<Decoder, TypedError> {
        Ok(ReaderBuilder::new(self.decode_schema.clone())
            .with_batch_size(rows.max(1) + 1)
            .build_decoder()?)
    }

    fn decode_all(&self) -> Result<Option<arrow::array::RecordBatch>, String> {
        let mut d = self
            .decoder(self.pending.len())
            .map_err(|e| e.to_string())?;
        for row in &self.pending {
            let json: &[u8] = row.as_deref().unwrap_or(b"{}");
            let used = d.decode(json).map_err(|e| e.to_string())?;
            if used != json.len() {
                return Err("payload is not one JSON value".into());
            }
        }
        d.flush().map_err(|e| e.to_string())
    }

    fn decode_one(&self, json: &[u8]) -> Result<arrow::array::RecordBatch, String> {
        let mut d = self.decoder(1).map_err(|e| e.to_string())?;
        let used = d
            .decode(json)
            .map_err(|e| format!("JSON payload does not decode: {e}"))?;
        let batch = d
            .flush()
            .map_err(|e| format!("JSON payload does not fit the schema: {e}"))?;
        match batch {
            Some(b) if used == json.len() && b.num_rows() == 1 => Ok(b),
            _ => Err("payload is not one JSON object".into()),
        }
    }

    /// The typed columns of the queued rows, and the rows that did not decode (index, reason).
    pub fn finish(&mut self) -> Result<TypedOutput, TypedError> {
        let mut errors = std::mem::take(&mut self.errors);
        let rows = self.pending.len();
        let fast = self
            .decode_all()
            .ok()
            .flatten()
            .filter(|b| b.num_rows() == rows);
        let batch = match fast {
            Some(b) => b,
            None => {
                // Slow path: row by row, so one bad payload only nulls its own row.
                let mut parts = Vec::with_capacity(rows);
                for (i, row) in self.pending.iter().enumerate() {
                    let one = match row {
                        Some(json) => match self.decode_one(json) {
                            Ok(b) => b,
                            Err(e) => {
                                errors.push((i, e));
                                self.decode_one(b"{}").map_err(TypedError::Decoder)?
                            }
                        },
                        None => self.decode_one(b"{}").map_err(TypedError::Decoder)?,
                    };
                    parts.push(one);
                }
                if parts.is_empty() {
                    arrow::array::RecordBatch::new_empty(self.decode_schema.clone())
                } else {
                    arrow::compute::concat_batches(&self.decode_schema, &parts)?
                }
            }
        };
        self.pending.clear();
        errors.sort_by_key(|(i, _)| *i);
        Ok((batch.columns().to_vec(), errors))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEF: &str = r#"{"type":"record","name":"Order","fields":[
        {"name":"id","type":"long"},
        {"name":"key","type":["null","string"]},
        {"name":"tags","type":{"type":"array","items":"string"}},
        {"name":"customer","type":{"type":"record","name":"C","fields":[{"name":"name","type":"string"}]}},
        {"name":"odd","type":["int","string"]}
    ]}"#;

    #[test]
    fn avro_definitions_map_to_columns() -> Result<(), String> {
        let def = parse_definition(DEF.as_bytes())?;
        let cols: Vec<String> = columns_of(&def).into_iter().map(|(n, _)| n).collect();
        assert_eq!(cols, vec!["id", "value_key", "tags", "customer"]);
        assert_eq!(json_key("value_key"), "key");
        assert_eq!(json_key("value_other"), "value_other");
        Ok(())
    }
}
