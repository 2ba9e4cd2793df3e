//! `SingleMessageMetadata` read in place: a borrowed view of one batched message's metadata,
//! without allocating.
//!
//! Why by hand: prost decodes into owned `String`s and `Vec`s, one allocation per key and per
//! property of every message, and it needs a reference-counted `Bytes` per message. The offload
//! only copies these fields into Arrow builders, so reading them where they lie is enough
//! (the owned path, [`super::entry::unroll_entry`], still decodes with prost).
//!
//! Invariants:
//! - Reads what prost reads from the same bytes (proto2): the last occurrence of a singular field
//!   wins, unknown fields are skipped, `bool` is "varint ≠ 0", `int32` is the varint truncated.
//!   A proptest round-trip against prost holds this.
//! - Refuses what prost refuses (truncated or over-long varints, lengths past the end, invalid
//!   UTF-8 in strings, a known field with the wrong wire type), and also groups (wire types 3
//!   and 4), which no Pulsar client writes. A refused entry is still stored whole by the caller.

/// Why a `SingleMessageMetadata` cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed single message metadata: {0}")]
pub struct ViewError(&'static str);

/// One batched message's metadata, borrowed from the stored batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SingleMessageView<'a> {
    /// The encoded metadata (for [`SingleMessageView::properties`]).
    raw: &'a [u8],
    /// Invariant: every `properties` field in `raw` parsed as a `KeyValue` with UTF-8 strings.
    property_count: usize,
    /// `partition_key` (2).
    pub partition_key: Option<&'a str>,
    /// `payload_size` (3).
    pub payload_size: i32,
    /// `compacted_out` (4).
    pub compacted_out: Option<bool>,
    /// `event_time` (5).
    pub event_time: Option<u64>,
    /// `partition_key_b64_encoded` (6).
    pub partition_key_b64_encoded: Option<bool>,
    /// `ordering_key` (7).
    pub ordering_key: Option<&'a [u8]>,
    /// `sequence_id` (8).
    pub sequence_id: Option<u64>,
    /// `null_value` (9).
    pub null_value: Option<bool>,
    /// `null_partition_key` (10).
    pub null_partition_key: Option<bool>,
}

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

/// A cursor over protobuf wire format.
struct Wire<'a> {
    buf: &'a [u8],
}

impl<'a> Wire<'a> {
    fn varint(&mut self) -> Result<u64, ViewError> {
        let mut value = 0u64;
        for (i, &b) in self.buf.iter().take(10).enumerate() {
            value |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                if i == 9 && b > 1 {
                    return Err(ViewError("varint overflows 64 bits"));
                }
                self.buf = &self.buf[i + 1..];
                return Ok(value);
            }
        }
        Err(ViewError(if self.buf.len() < 10 {
            "truncated varint"
        } else {
            "varint longer than 10 bytes"
        }))
    }

    fn key(&mut self) -> Result<(u64, u8), ViewError> {
        let key = self.varint()?;
        if key > u64::from(u32::MAX) || key >> 3 == 0 {
            return Err(ViewError("invalid field key"));
        }
        Ok((key >> 3, (key & 7) as u8))
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], ViewError> {
        let n = usize::try_from(n).map_err(|_| ViewError("field longer than the buffer"))?;
        if n > self.buf.len() {
            return Err(ViewError("field longer than the buffer"));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn len_delimited(&mut self) -> Result<&'a [u8], ViewError> {
        let n = self.varint()?;
        self.take(n)
    }

    fn skip(&mut self, wire: u8) -> Result<(), ViewError> {
        match wire {
            VARINT => self.varint().map(drop),
            FIXED64 => self.take(8).map(drop),
            LEN => self.len_delimited().map(drop),
            FIXED32 => self.take(4).map(drop),
            _ => Err(ViewError("groups and unknown wire types are not read")),
        }
    }

    /// Checks that a known field came with the wire type it must have.
    fn expect(wire: u8, expected: u8) -> Result<(), ViewError> {
        if wire == expected {
            Ok(())
        } else {
            Err(ViewError("known field with the wrong wire type"))
        }
    }

    fn string(&mut self) -> Result<&'a str, ViewError> {
        std::str::from_utf8(self.len_delimited()?).map_err(|_| ViewError("invalid UTF-8"))
    }
}

/// Reads one `KeyValue` (key = 1, value = 2; both required, "" when absent as prost does).
fn key_value(raw: &[u8]) -> Result<(&str, &str), ViewError> {
    let mut w = Wire { buf: raw };
    let (mut key, mut value) = ("", "");
    while !w.buf.is_empty() {
        let (field, wire) = w.key()?;
        match field {
            1 => {
                Wire::expect(wire, LEN)?;
                key = w.string()?;
            }
            2 => {
                Wire::expect(wire, LEN)?;
                value = w.string()?;
            }
            _ => w.skip(wire)?,
        }
    }
    Ok((key, value))
}

impl<'a> SingleMessageView<'a> {
    /// Reads `raw`, the encoded metadata of one batched message.
    pub fn parse(raw: &'a [u8]) -> Result<Self, ViewError> {
        let mut view = SingleMessageView {
            raw,
            ..Default::default()
        };
        let mut w = Wire { buf: raw };
        while !w.buf.is_empty() {
            let (field, wire) = w.key()?;
            let varint = |w: &mut Wire<'a>| -> Result<u64, ViewError> {
                Wire::expect(wire, VARINT)?;
                w.varint()
            };
            match field {
                1 => {
                    Wire::expect(wire, LEN)?;
                    key_value(w.len_delimited()?)?;
                    view.property_count += 1;
                }
                2 => {
                    Wire::expect(wire, LEN)?;
                    view.partition_key = Some(w.string()?);
                }
                3 => view.payload_size = varint(&mut w)? as i32,
                4 => view.compacted_out = Some(varint(&mut w)? != 0),
                5 => view.event_time = Some(varint(&mut w)?),
                6 => view.partition_key_b64_encoded = Some(varint(&mut w)? != 0),
                7 => {
                    Wire::expect(wire, LEN)?;
                    view.ordering_key = Some(w.len_delimited()?);
                }
                8 => view.sequence_id = Some(varint(&mut w)?),
                9 => view.null_value = Some(varint(&mut w)? != 0),
                10 => view.null_partition_key = Some(varint(&mut w)? != 0),
                _ => w.skip(wire)?,
            }
        }
        Ok(view)
    }

    /// The message's properties, in stored order.
    pub fn properties(&self) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
        let mut w = Wire { buf: self.raw };
        let mut left = self.property_count;
        std::iter::from_fn(move || {
            // `parse` checked every field, so the errors below cannot happen; they end the
            // iteration rather than panic.
            while left > 0 && !w.buf.is_empty() {
                let (field, wire) = w.key().ok()?;
                if field == 1 && wire == LEN {
                    left -= 1;
                    return key_value(w.len_delimited().ok()?).ok();
                }
                w.skip(wire).ok()?;
            }
            None
        })
    }

    /// How many properties the message has.
    pub fn property_count(&self) -> usize {
        self.property_count
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::proto::{KeyValue, SingleMessageMetadata};
    use proptest::prelude::*;
    use prost::Message;

    fn metadata() -> impl Strategy<Value = SingleMessageMetadata> {
        let text = "\\PC{0,12}";
        (
            proptest::collection::vec((text, text), 0..4),
            proptest::option::of(text),
            any::<i32>(),
            proptest::option::of(any::<bool>()),
            proptest::option::of(any::<u64>()),
            proptest::option::of(any::<bool>()),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..8)),
            proptest::option::of(any::<u64>()),
            proptest::option::of(any::<bool>()),
            proptest::option::of(any::<bool>()),
        )
            .prop_map(|(props, key, size, c, et, b64, ok, seq, nv, npk)| {
                SingleMessageMetadata {
                    properties: props
                        .into_iter()
                        .map(|(key, value)| KeyValue { key, value })
                        .collect(),
                    partition_key: key,
                    payload_size: size,
                    compacted_out: c,
                    event_time: et,
                    partition_key_b64_encoded: b64,
                    ordering_key: ok,
                    sequence_id: seq,
                    null_value: nv,
                    null_partition_key: npk,
                }
            })
    }

    fn same(view: &SingleMessageView<'_>, m: &SingleMessageMetadata) {
        assert_eq!(view.partition_key, m.partition_key.as_deref());
        assert_eq!(view.payload_size, m.payload_size);
        assert_eq!(view.compacted_out, m.compacted_out);
        assert_eq!(view.event_time, m.event_time);
        assert_eq!(view.partition_key_b64_encoded, m.partition_key_b64_encoded);
        assert_eq!(view.ordering_key, m.ordering_key.as_deref());
        assert_eq!(view.sequence_id, m.sequence_id);
        assert_eq!(view.null_value, m.null_value);
        assert_eq!(view.null_partition_key, m.null_partition_key);
        let props: Vec<(&str, &str)> = view.properties().collect();
        let expected: Vec<(&str, &str)> = m
            .properties
            .iter()
            .map(|kv| (kv.key.as_str(), kv.value.as_str()))
            .collect();
        assert_eq!(props, expected);
        assert_eq!(view.property_count(), m.properties.len());
    }

    proptest! {
        #[test]
        fn reads_what_prost_wrote(m in metadata()) {
            let raw = m.encode_to_vec();
            let view = SingleMessageView::parse(&raw);
            prop_assert!(view.is_ok(), "{view:?}");
            if let Ok(view) = view {
                same(&view, &m);
            }
        }

        #[test]
        fn agrees_with_prost_on_arbitrary_bytes(raw in proptest::collection::vec(any::<u8>(), 0..48)) {
            // Never panics; when both read the bytes, they read the same values. (prost also
            // accepts groups, which the view refuses.)
            let view = SingleMessageView::parse(&raw);
            let prost = SingleMessageMetadata::decode(&raw[..]);
            if let (Ok(view), Ok(m)) = (&view, &prost) {
                same(view, m);
            }
            if prost.is_err() {
                prop_assert!(view.is_err(), "prost refuses {raw:?}, the view read {view:?}");
            }
        }
    }

    #[test]
    fn later_fields_win_and_unknown_fields_are_skipped() {
        let mut raw = SingleMessageMetadata {
            partition_key: Some("first".into()),
            payload_size: 3,
            ..Default::default()
        }
        .encode_to_vec();
        // Unknown field 15 as fixed32, fixed64 and varint, then field 2 again.
        raw.extend_from_slice(&[15 << 3 | 5, 1, 2, 3, 4]);
        raw.extend_from_slice(&[15 << 3 | 1, 1, 2, 3, 4, 5, 6, 7, 8]);
        raw.extend_from_slice(&[15 << 3, 0x80, 0x01]);
        raw.extend_from_slice(&[2 << 3 | 2, 6]);
        raw.extend_from_slice(b"second");
        let view = SingleMessageView::parse(&raw).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(view.partition_key, Some("second"));
        assert_eq!(view.payload_size, 3);
        let prost = SingleMessageMetadata::decode(&raw[..]).unwrap_or_else(|e| panic!("{e}"));
        same(&view, &prost);
    }

    #[test]
    fn broken_metadata_is_an_error() {
        for raw in [
            &[2 << 3 | 2, 5, b'a'][..], // string past the end
            &[2 << 3 | 2, 1, 0xff],     // invalid UTF-8
            &[3 << 3, 0x80],            // truncated varint
            &[3 << 3 | 2, 0],           // known field, wrong wire type
            &[15 << 3 | 3],             // a group
            &[0],                       // field number 0
            &[
                3 << 3,
                0xff,
                0xff,
                0xff,
                0xff,
                0xff,
                0xff,
                0xff,
                0xff,
                0xff,
                0x7f,
            ],
        ] {
            assert!(SingleMessageView::parse(raw).is_err(), "{raw:?}");
        }
    }
}
