//! On-disk framing of the segment files: the segment header and the entry record.
//!
//! A segment file is `[SegmentHeader][Record]*[zero fill]`. Every record carries the CRC32C of its
//! body, so a torn or flipped byte is detected before anything is returned as data.
//!
//! ```text
//! SegmentHeader (16 bytes): b"LLSG" | version u8 | flags u8 | reserved u16 | segment_id u64
//! Record:                   body_len u32 | crc32c(body) u32 | body
//! body:                     ledger_id u64 | entry_id u64 | publish_time_ms i64 | payload
//! ```
//! All integers are little-endian. `body_len == 0` marks the end of written data (preallocated
//! space reads as zeros). Changing this layout needs a new `SEGMENT_VERSION` and an ADR in
//! `docs/adr/` describing how old segments are read.

use bytes::{BufMut, Bytes};

/// Magic bytes at the start of every segment file.
pub const SEGMENT_MAGIC: [u8; 4] = *b"LLSG";
/// Version of the segment and record layout written by this build.
pub const SEGMENT_VERSION: u8 = 1;
/// Size of the segment header in bytes.
pub const SEGMENT_HEADER_LEN: u64 = 16;
/// Size of the record header (`body_len` + `crc`) in bytes.
pub const RECORD_HEADER_LEN: usize = 8;
/// Fixed part of a record body (ledger id, entry id, publish time).
pub const RECORD_BODY_FIXED_LEN: usize = 24;
/// Total framing overhead per entry.
pub const RECORD_OVERHEAD: usize = RECORD_HEADER_LEN + RECORD_BODY_FIXED_LEN;

/// Encodes the 16-byte header of segment `segment_id`.
pub fn encode_segment_header(segment_id: u32) -> [u8; SEGMENT_HEADER_LEN as usize] {
    let mut h = [0u8; SEGMENT_HEADER_LEN as usize];
    h[0..4].copy_from_slice(&SEGMENT_MAGIC);
    h[4] = SEGMENT_VERSION;
    h[8..16].copy_from_slice(&u64::from(segment_id).to_le_bytes());
    h
}

/// Why a segment header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// The file does not start with [`SEGMENT_MAGIC`].
    #[error("not a ledgerlake segment (bad magic)")]
    BadMagic,
    /// The file was written by a layout version this build does not read.
    #[error("unsupported segment version {0} (this build reads version {SEGMENT_VERSION})")]
    UnsupportedVersion(u8),
    /// The id in the header differs from the id in the file name.
    #[error("segment header names segment {found}, file name says {expected}")]
    WrongId {
        /// Id from the file name.
        expected: u32,
        /// Id found in the header.
        found: u64,
    },
}

/// Checks a segment header read from the file named for `segment_id`.
pub fn check_segment_header(buf: &[u8; 16], segment_id: u32) -> Result<(), HeaderError> {
    if buf[0..4] != SEGMENT_MAGIC {
        return Err(HeaderError::BadMagic);
    }
    if buf[4] != SEGMENT_VERSION {
        return Err(HeaderError::UnsupportedVersion(buf[4]));
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&buf[8..16]);
    let found = u64::from_le_bytes(id);
    if found != u64::from(segment_id) {
        return Err(HeaderError::WrongId {
            expected: segment_id,
            found,
        });
    }
    Ok(())
}

/// One entry as framed on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Ledger the entry belongs to.
    pub ledger_id: u64,
    /// Dense entry id inside the ledger, from 0.
    pub entry_id: u64,
    /// Publish time in milliseconds since the Unix epoch.
    pub publish_time_ms: i64,
    /// Opaque payload (for the broker: a Pulsar batch, metadata + payload).
    pub payload: Bytes,
}

impl Record {
    /// Bytes this record occupies on disk.
    pub fn encoded_len(&self) -> usize {
        RECORD_OVERHEAD + self.payload.len()
    }
}

/// Appends the framed record to `out` and returns the CRC32C of its body.
pub fn encode_record(
    out: &mut Vec<u8>,
    ledger_id: u64,
    entry_id: u64,
    publish_time_ms: i64,
    payload: &[u8],
) -> u32 {
    let body_len = RECORD_BODY_FIXED_LEN + payload.len();
    let start = out.len();
    out.reserve(RECORD_HEADER_LEN + body_len);
    out.put_u32_le(body_len as u32);
    out.put_u32_le(0); // crc, filled below
    out.put_u64_le(ledger_id);
    out.put_u64_le(entry_id);
    out.put_i64_le(publish_time_ms);
    out.extend_from_slice(payload);
    let crc = crc32c::crc32c(&out[start + RECORD_HEADER_LEN..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    crc
}

/// What the decoder found at a position in a segment.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// A valid record of `len` bytes (header included) with its body CRC.
    Record {
        /// The record.
        record: Record,
        /// Total bytes consumed.
        len: usize,
        /// CRC32C of the body, as stored and verified.
        crc: u32,
    },
    /// Zero length: the end of written data.
    End,
    /// Not enough bytes in `buf` for the record header or the declared body.
    NeedMore {
        /// Bytes needed from the record start to decode the whole record.
        needed: usize,
    },
    /// The bytes cannot be a valid record (bad length or CRC mismatch).
    Invalid {
        /// Why.
        reason: InvalidRecord,
    },
}

/// Why bytes failed to decode as a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRecord {
    /// The declared body length is below the fixed part or above the limit.
    #[error("declared record length {0} is impossible")]
    BadLength(u32),
    /// The stored checksum does not match the body.
    #[error("checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    ChecksumMismatch {
        /// CRC stored in the record header.
        stored: u32,
        /// CRC computed over the body read back.
        computed: u32,
    },
}

/// Decodes the record at the start of `buf` (its payload copied out). `max_body` bounds the
/// declared length so garbage cannot make the reader allocate or skip gigabytes.
pub fn decode_record(buf: &[u8], max_body: usize) -> Decoded {
    decode_with(buf, max_body, |payload| {
        Bytes::copy_from_slice(&buf[payload])
    })
}

/// [`decode_record`] on shared bytes: the payload is a slice of `buf`, not a copy. It keeps
/// `buf` alive as long as it lives (log reads use windows of at most 1 MiB).
pub fn decode_record_shared(buf: &Bytes, max_body: usize) -> Decoded {
    decode_with(buf, max_body, |payload| buf.slice(payload))
}

fn decode_with(
    buf: &[u8],
    max_body: usize,
    payload: impl FnOnce(std::ops::Range<usize>) -> Bytes,
) -> Decoded {
    if buf.len() < RECORD_HEADER_LEN {
        // Fewer bytes than a header: treat all-zero as the end, otherwise ask for more.
        if buf.iter().all(|b| *b == 0) && !buf.is_empty() {
            return Decoded::End;
        }
        return Decoded::NeedMore {
            needed: RECORD_HEADER_LEN,
        };
    }
    let body_len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let stored = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
    if body_len == 0 {
        return Decoded::End;
    }
    let body_len_usize = body_len as usize;
    if body_len_usize < RECORD_BODY_FIXED_LEN || body_len_usize > max_body {
        return Decoded::Invalid {
            reason: InvalidRecord::BadLength(body_len),
        };
    }
    let total = RECORD_HEADER_LEN + body_len_usize;
    if buf.len() < total {
        return Decoded::NeedMore { needed: total };
    }
    let body = &buf[RECORD_HEADER_LEN..total];
    let computed = crc32c::crc32c(body);
    if computed != stored {
        return Decoded::Invalid {
            reason: InvalidRecord::ChecksumMismatch { stored, computed },
        };
    }
    let u64_at = |o: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&body[o..o + 8]);
        b
    };
    Decoded::Record {
        record: Record {
            ledger_id: u64::from_le_bytes(u64_at(0)),
            entry_id: u64::from_le_bytes(u64_at(8)),
            publish_time_ms: i64::from_le_bytes(u64_at(16)),
            payload: payload(RECORD_HEADER_LEN + RECORD_BODY_FIXED_LEN..total),
        },
        len: total,
        crc: stored,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::FileFailurePersistence;

    proptest! {
        #![proptest_config(ProptestConfig {
            failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
            ..ProptestConfig::default()
        })]
        #[test]
        fn record_round_trips(ledger in any::<u64>(), entry in any::<u64>(), t in any::<i64>(),
                              payload in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut buf = Vec::new();
            let crc = encode_record(&mut buf, ledger, entry, t, &payload);
            prop_assert_eq!(buf.len(), RECORD_OVERHEAD + payload.len());
            match decode_record(&buf, 1 << 20) {
                Decoded::Record { record, len, crc: c } => {
                    prop_assert_eq!(len, buf.len());
                    prop_assert_eq!(c, crc);
                    prop_assert_eq!(record.ledger_id, ledger);
                    prop_assert_eq!(record.entry_id, entry);
                    prop_assert_eq!(record.publish_time_ms, t);
                    prop_assert_eq!(&record.payload[..], &payload[..]);
                }
                other => prop_assert!(false, "decoded {:?}", other),
            }
        }

        #[test]
        fn any_flipped_byte_is_detected(payload in proptest::collection::vec(any::<u8>(), 1..256),
                                         pos in any::<prop::sample::Index>(), bit in 0u8..8) {
            let mut buf = Vec::new();
            encode_record(&mut buf, 7, 9, 11, &payload);
            let i = pos.index(buf.len());
            buf[i] ^= 1 << bit;
            let detected = !matches!(decode_record(&buf, 1 << 20), Decoded::Record { .. });
            prop_assert!(detected, "corruption at byte {} not detected", i);
        }

        #[test]
        fn truncated_record_never_decodes(payload in proptest::collection::vec(any::<u8>(), 0..256),
                                          cut in any::<prop::sample::Index>()) {
            let mut buf = Vec::new();
            encode_record(&mut buf, 1, 2, 3, &payload);
            let cut = cut.index(buf.len());
            let decoded = decode_record(&buf[..cut], 1 << 20);
            let is_record = matches!(decoded, Decoded::Record { .. });
            prop_assert!(!is_record);
        }
    }

    #[test]
    fn header_round_trip_and_refusals() {
        let h = encode_segment_header(42);
        assert_eq!(check_segment_header(&h, 42), Ok(()));
        assert!(matches!(
            check_segment_header(&h, 43),
            Err(HeaderError::WrongId { .. })
        ));
        let mut bad = h;
        bad[4] = 99;
        assert_eq!(
            check_segment_header(&bad, 42),
            Err(HeaderError::UnsupportedVersion(99))
        );
        bad[0] = b'X';
        assert_eq!(check_segment_header(&bad, 42), Err(HeaderError::BadMagic));
    }

    #[test]
    fn zeros_are_the_end() {
        assert_eq!(decode_record(&[0u8; 64], 1024), Decoded::End);
        assert_eq!(decode_record(&[0u8; 3], 1024), Decoded::End);
    }
}
