//! The schema registry: topic schemas registered with versions in the metadata store, and
//! BACKWARD compatibility checks. The broker registers and resolves them (PRODUCER, SUBSCRIBE,
//! GET_SCHEMA); offload and SQL read them for typed columns. Versions travel as 8-byte ids
//! ([`crate::naming::schema_version_bytes`]).
//!
//! A schema is stored per topic (for a partitioned topic: per base topic, shared by its
//! partitions) as `version u8 (=1) | protobuf-encoded Schema`. A producer or consumer whose
//! schema equals a stored version (type, definition and properties) uses that version; a new
//! schema is registered as the next version only if it is BACKWARD compatible with the latest
//! one: data written with the latest schema can be read with the new one.
//!
//! BACKWARD rules applied (Avro semantics, also used for JSON schemas, which Pulsar describes
//! with Avro): the schema type must not change; for record schemas, every field added must have
//! a default, and fields present in both must keep their type (or widen it: int → long, float,
//! double; long → float, double; float → double; a type made nullable as a union with null).
//! Other types (primitive, protobuf, key/value) must keep the exact definition.

use std::sync::Arc;

use prost::Message;
use serde_json::Value;

use crate::ledger::metadata::{MetadataError, MetadataStore};
use crate::protocol::proto::{self, schema::Type};

const STORED_VERSION: u8 = 1;

/// Why a schema was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// The new schema cannot read data written with the latest one.
    #[error("schema is incompatible with version {version} (BACKWARD): {reason}")]
    Incompatible {
        /// Latest version checked against.
        version: u64,
        /// What breaks.
        reason: String,
    },
    /// A stored schema cannot be decoded.
    #[error("stored schema version {0} is unreadable")]
    Corrupt(u64),
    /// The metadata store failed.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
}

fn encode(schema: &proto::Schema) -> Vec<u8> {
    let mut out = vec![STORED_VERSION];
    out.extend_from_slice(&schema.encode_to_vec());
    out
}

fn decode(version: u64, blob: &[u8]) -> Result<proto::Schema, SchemaError> {
    match blob.split_first() {
        Some((&STORED_VERSION, rest)) => {
            proto::Schema::decode(rest).map_err(|_| SchemaError::Corrupt(version))
        }
        _ => Err(SchemaError::Corrupt(version)),
    }
}

fn same(a: &proto::Schema, b: &proto::Schema) -> bool {
    let props = |s: &proto::Schema| {
        let mut p: Vec<(String, String)> = s
            .properties
            .iter()
            .map(|kv| (kv.key.clone(), kv.value.clone()))
            .collect();
        p.sort();
        p
    };
    a.r#type == b.r#type && a.schema_data == b.schema_data && props(a) == props(b)
}

/// All versions of a topic's schema, ascending.
pub async fn versions(
    meta: &Arc<dyn MetadataStore>,
    topic: &str,
) -> Result<Vec<(u64, proto::Schema)>, SchemaError> {
    meta.schemas(topic)
        .await?
        .into_iter()
        .map(|(v, blob)| decode(v, &blob).map(|s| (v, s)))
        .collect()
}

/// The version of `schema` for `topic`, registering it (after a BACKWARD check) if new.
pub async fn resolve(
    meta: &Arc<dyn MetadataStore>,
    topic: &str,
    schema: &proto::Schema,
) -> Result<u64, SchemaError> {
    loop {
        let existing = versions(meta, topic).await?;
        if let Some((v, _)) = existing.iter().find(|(_, s)| same(s, schema)) {
            return Ok(*v);
        }
        let next = existing.len() as u64;
        if let Some((v, latest)) = existing.last() {
            check_backward(schema, latest).map_err(|reason| SchemaError::Incompatible {
                version: *v,
                reason,
            })?;
        }
        match meta.add_schema(topic, next, &encode(schema)).await {
            Ok(()) => return Ok(next),
            // Another registration won the race: look again.
            Err(MetadataError::Conflict(_)) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Checks that `new` can read data written with `old`.
pub fn check_backward(new: &proto::Schema, old: &proto::Schema) -> Result<(), String> {
    if new.r#type != old.r#type {
        return Err(format!(
            "schema type changes from {:?} to {:?}",
            Type::try_from(old.r#type),
            Type::try_from(new.r#type)
        ));
    }
    match Type::try_from(new.r#type) {
        Ok(Type::Avro) | Ok(Type::Json) => {
            let parse = |s: &proto::Schema| {
                serde_json::from_slice::<Value>(&s.schema_data)
                    .map_err(|e| format!("schema definition is not JSON: {e}"))
            };
            avro_backward(&parse(new)?, &parse(old)?)
        }
        _ if new.schema_data == old.schema_data => Ok(()),
        _ => Err("the schema definition changed".into()),
    }
}

/// Avro reader (`new`) / writer (`old`) compatibility for the shapes Pulsar schemas use.
fn avro_backward(new: &Value, old: &Value) -> Result<(), String> {
    match (new, old) {
        (Value::Object(n), Value::Object(o)) if n.get("type") == Some(&Value::from("record")) => {
            if o.get("type") != Some(&Value::from("record")) {
                return Err("a record replaces a non-record type".into());
            }
            let fields = |v: &serde_json::Map<String, Value>| {
                v.get("fields")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
            };
            let old_fields = fields(o);
            for nf in fields(n) {
                let name = nf.get("name").and_then(Value::as_str).unwrap_or_default();
                let of = old_fields
                    .iter()
                    .find(|f| f.get("name").and_then(Value::as_str) == Some(name));
                match of {
                    None if nf.get("default").is_none() => {
                        return Err(format!("field '{name}' was added without a default"));
                    }
                    None => {}
                    Some(of) => {
                        let nt = nf.get("type").cloned().unwrap_or(Value::Null);
                        let ot = of.get("type").cloned().unwrap_or(Value::Null);
                        avro_backward(&nt, &ot).map_err(|e| format!("field '{name}': {e}"))?;
                    }
                }
            }
            Ok(())
        }
        (Value::Array(branches), _) => {
            // A union reader accepts a writer value if some branch accepts it.
            let writer_branches: Vec<&Value> = match old {
                Value::Array(w) => w.iter().collect(),
                other => vec![other],
            };
            for w in writer_branches {
                if !branches.iter().any(|b| avro_backward(b, w).is_ok()) {
                    return Err(format!("union {new} cannot read {w}"));
                }
            }
            Ok(())
        }
        (n, o) if n == o => Ok(()),
        (Value::String(n), Value::String(o)) if promotes(o, n) => Ok(()),
        _ => Err(format!("type {old} cannot be read as {new}")),
    }
}

fn promotes(writer: &str, reader: &str) -> bool {
    matches!(
        (writer, reader),
        ("int", "long" | "float" | "double")
            | ("long", "float" | "double")
            | ("float", "double")
            | ("string", "bytes")
            | ("bytes", "string")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn avro(def: &str) -> proto::Schema {
        proto::Schema {
            name: "s".into(),
            schema_data: def.as_bytes().to_vec(),
            r#type: Type::Avro as i32,
            properties: vec![],
        }
    }

    const V1: &str = r#"{"type":"record","name":"R","fields":[{"name":"a","type":"int"}]}"#;

    #[test]
    fn backward_rules() {
        let with_default = r#"{"type":"record","name":"R","fields":[{"name":"a","type":"long"},{"name":"b","type":["null","string"],"default":null}]}"#;
        assert_eq!(check_backward(&avro(with_default), &avro(V1)), Ok(()));
        let no_default = r#"{"type":"record","name":"R","fields":[{"name":"a","type":"int"},{"name":"b","type":"string"}]}"#;
        assert!(check_backward(&avro(no_default), &avro(V1)).is_err());
        let narrowed = r#"{"type":"record","name":"R","fields":[{"name":"a","type":"string"}]}"#;
        assert!(check_backward(&avro(narrowed), &avro(V1)).is_err());
        let removed = r#"{"type":"record","name":"R","fields":[]}"#;
        assert_eq!(check_backward(&avro(removed), &avro(V1)), Ok(()));
        let mut json = avro(V1);
        json.r#type = Type::Json as i32;
        assert!(check_backward(&json, &avro(V1)).is_err(), "type change");
    }

    #[tokio::test]
    async fn resolve_registers_reuses_and_refuses() -> Result<(), Box<dyn std::error::Error>> {
        let meta: Arc<dyn MetadataStore> =
            Arc::new(crate::ledger::metadata::memory::MemoryMetadataStore::new());
        assert_eq!(resolve(&meta, "t", &avro(V1)).await?, 0);
        assert_eq!(resolve(&meta, "t", &avro(V1)).await?, 0);
        let v2 = r#"{"type":"record","name":"R","fields":[{"name":"a","type":"int"},{"name":"c","type":"int","default":0}]}"#;
        assert_eq!(resolve(&meta, "t", &avro(v2)).await?, 1);
        assert_eq!(
            resolve(&meta, "t", &avro(V1)).await?,
            0,
            "old versions stay usable"
        );
        let bad = r#"{"type":"record","name":"R","fields":[{"name":"a","type":"int"},{"name":"d","type":"int"}]}"#;
        assert!(matches!(
            resolve(&meta, "t", &avro(bad)).await,
            Err(SchemaError::Incompatible { version: 1, .. })
        ));
        assert_eq!(versions(&meta, "t").await?.len(), 2);
        Ok(())
    }
}
