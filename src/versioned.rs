//! `[format byte][JSON]`: how the service persists its small records — namespace policies
//! (ADR 0002), tenancy records (ADR 0005), etcd metadata records (ADR 0006), node and owner
//! records (ADR 0006, 0007). A reader refuses every format byte but the one it reads; within
//! one format the JSON only grows by fields that have defaults. Each owner keeps its own format
//! number and round-trip proptest.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// The stored form of `record` under `format`.
pub fn encode<T: Serialize>(format: u8, record: &T) -> Vec<u8> {
    let mut out = vec![format];
    // The records are structs of strings, numbers, options, sets and string-keyed maps:
    // serialising them into a Vec cannot fail; an error would be a bug in their types.
    if let Err(e) = serde_json::to_writer(&mut out, record) {
        unreachable!("encoding a {} failed: {e}", std::any::type_name::<T>());
    }
    out
}

/// Reads a record `encode` wrote under `format`; `what` names it in errors.
pub fn decode<T: DeserializeOwned>(format: u8, what: &str, bytes: &[u8]) -> Result<T, String> {
    match bytes.split_first() {
        Some((&f, body)) if f == format => {
            serde_json::from_slice(body).map_err(|e| format!("{what}: {e}"))
        }
        Some((other, _)) => Err(format!(
            "{what}: format {other}; this build reads format {format}"
        )),
        None => Err(format!("{what}: empty record")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn records_round_trip_and_other_formats_are_refused(
            format in any::<u8>(), value in proptest::collection::btree_map(".*", any::<i64>(), 0..4)
        ) {
            let bytes = encode(format, &value);
            prop_assert_eq!(bytes[0], format);
            prop_assert_eq!(decode(format, "map", &bytes), Ok(value.clone()));
            let other = format.wrapping_add(1);
            prop_assert!(decode::<std::collections::BTreeMap<String, i64>>(other, "map", &bytes).is_err());
        }
    }

    #[test]
    fn empty_and_malformed_records_are_refused() {
        assert!(decode::<u64>(1, "n", &[]).is_err());
        assert!(decode::<u64>(1, "n", &[1, b'x']).is_err());
    }
}
