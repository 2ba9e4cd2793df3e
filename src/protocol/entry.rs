//! Unrolling a stored entry into its messages: metadata, decompression, and the batch format.
//!
//! A stored entry is `[0x0e01][crc32c][u32 meta_size][MessageMetadata][payload]`. The payload is
//! compressed as a whole with `metadata.compression` (LZ4 block, ZLIB, ZSTD, raw SNAPPY) and,
//! when `num_messages_in_batch` is set, holds that many
//! `[u32 single_meta_size][SingleMessageMetadata][payload_size bytes]` records.
//!
//! The raw metadata bytes are returned next to the parsed values so that a later reader can
//! rebuild the entry exactly, including fields this crate does not model.

use std::io::Read;

use bytes::Bytes;
use prost::Message;

use super::frame::{build_entry, entry_metadata_range, FrameError};
use super::proto::{CompressionType, MessageMetadata, SingleMessageMetadata};

/// Most bytes a payload may decompress to (guards against decompression bombs).
pub const MAX_UNCOMPRESSED_SIZE: usize = 64 * 1024 * 1024;

/// Why an entry could not be unrolled.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EntryError {
    /// The framing around the metadata is wrong.
    #[error("malformed entry: {0}")]
    Malformed(&'static str),
    /// A protobuf does not decode.
    #[error("malformed {what}: {source}")]
    Protobuf {
        /// Which message.
        what: &'static str,
        /// Decoder error.
        #[source]
        source: prost::DecodeError,
    },
    /// The payload does not decompress.
    #[error("payload does not decompress with {codec}: {reason}")]
    Decompress {
        /// Codec named by the metadata.
        codec: &'static str,
        /// Why.
        reason: String,
    },
}

/// One message of an entry.
#[derive(Debug, Clone, PartialEq)]
pub struct UnrolledMessage {
    /// Index inside the batch (0 for an unbatched message).
    pub batch_index: u32,
    /// The per-message metadata of a batched message.
    pub single: Option<SingleMessageMetadata>,
    /// Its raw bytes, exactly as stored.
    pub single_raw: Option<Bytes>,
    /// The message's payload, decompressed.
    pub payload: Bytes,
}

/// An entry with its messages.
#[derive(Debug, Clone, PartialEq)]
pub struct UnrolledEntry {
    /// The entry's metadata.
    pub metadata: MessageMetadata,
    /// Its raw bytes, exactly as stored.
    pub metadata_raw: Bytes,
    /// `num_messages_in_batch` when batched, `None` otherwise.
    pub batch_size: Option<u32>,
    /// The payload is kept as stored, neither decompressed nor unrolled: it is encrypted, or
    /// one chunk of a chunked message (compressed as a whole before chunking).
    pub opaque: bool,
    /// The messages, in batch order.
    pub messages: Vec<UnrolledMessage>,
}

fn be_u32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// Unrolls a stored entry (the checksum is not re-verified: it was checked on SEND and the log
/// checks its own record checksum on read).
pub fn unroll_entry(entry: &Bytes) -> Result<UnrolledEntry, EntryError> {
    let range = entry_metadata_range(entry).map_err(|e| match e {
        FrameError::Malformed(why) => EntryError::Malformed(why),
        _ => EntryError::Malformed("entry framing"),
    })?;
    let payload_start = range.end;
    let metadata_raw = entry.slice(range);
    let metadata =
        MessageMetadata::decode(metadata_raw.clone()).map_err(|source| EntryError::Protobuf {
            what: "message metadata",
            source,
        })?;
    let batch_size = metadata.num_messages_in_batch.map(|n| n.max(0) as u32);
    let raw = entry.slice(payload_start..);
    let opaque =
        !metadata.encryption_keys.is_empty() || metadata.num_chunks_from_msg.unwrap_or(0) > 1;
    if opaque {
        return Ok(UnrolledEntry {
            metadata,
            metadata_raw,
            batch_size,
            opaque,
            messages: vec![UnrolledMessage {
                batch_index: 0,
                single: None,
                single_raw: None,
                payload: raw,
            }],
        });
    }
    let payload = decompress(&metadata, raw)?;
    let messages = match batch_size {
        None => vec![UnrolledMessage {
            batch_index: 0,
            single: None,
            single_raw: None,
            payload,
        }],
        Some(n) => unroll_batch(&payload, n)?,
    };
    Ok(UnrolledEntry {
        metadata,
        metadata_raw,
        batch_size,
        opaque,
        messages,
    })
}

/// Builds the stored form of a batch entry: each message framed with its
/// `SingleMessageMetadata` (whose `payload_size` is set here), `num_messages_in_batch` set on
/// `metadata`. The inverse of [`unroll_entry`] for uncompressed batches.
pub fn build_batch_entry(
    mut metadata: MessageMetadata,
    messages: impl IntoIterator<Item = (SingleMessageMetadata, impl AsRef<[u8]>)>,
) -> Bytes {
    let mut payload = bytes::BytesMut::new();
    let mut count = 0i32;
    for (mut single, bytes) in messages {
        let bytes = bytes.as_ref();
        single.payload_size = bytes.len() as i32;
        bytes::BufMut::put_u32(&mut payload, single.encoded_len() as u32);
        let _ = single.encode(&mut payload);
        payload.extend_from_slice(bytes);
        count += 1;
    }
    metadata.num_messages_in_batch = Some(count);
    build_entry(&metadata, &payload)
}

fn unroll_batch(payload: &Bytes, n: u32) -> Result<Vec<UnrolledMessage>, EntryError> {
    let mut out = Vec::with_capacity(n.min(100_000) as usize);
    let mut at = 0usize;
    for batch_index in 0..n {
        if payload.len() < at + 4 {
            return Err(EntryError::Malformed("batch ends before its declared size"));
        }
        let size = be_u32(&payload[at..at + 4]) as usize;
        at += 4;
        if payload.len() < at + size {
            return Err(EntryError::Malformed(
                "single message metadata overruns the batch",
            ));
        }
        let single_raw = payload.slice(at..at + size);
        at += size;
        let single = SingleMessageMetadata::decode(single_raw.clone()).map_err(|source| {
            EntryError::Protobuf {
                what: "single message metadata",
                source,
            }
        })?;
        let len = usize::try_from(single.payload_size)
            .map_err(|_| EntryError::Malformed("negative payload size in batch"))?;
        if payload.len() < at + len {
            return Err(EntryError::Malformed("message payload overruns the batch"));
        }
        out.push(UnrolledMessage {
            batch_index,
            single: Some(single),
            single_raw: Some(single_raw),
            payload: payload.slice(at..at + len),
        });
        at += len;
    }
    Ok(out)
}

fn decompress(metadata: &MessageMetadata, payload: Bytes) -> Result<Bytes, EntryError> {
    let codec = metadata.compression();
    let name = codec.as_str_name();
    let err = |reason: String| EntryError::Decompress {
        codec: name,
        reason,
    };
    let size = metadata.uncompressed_size.unwrap_or(0) as usize;
    if size > MAX_UNCOMPRESSED_SIZE {
        return Err(err(format!(
            "declared uncompressed size {size} exceeds {MAX_UNCOMPRESSED_SIZE}"
        )));
    }
    let out = match codec {
        CompressionType::None => return Ok(payload),
        CompressionType::Lz4 => {
            lz4_flex::block::decompress(&payload, size).map_err(|e| err(e.to_string()))?
        }
        CompressionType::Zlib => {
            let mut out = Vec::with_capacity(size);
            flate2::read::ZlibDecoder::new(&payload[..])
                .take(MAX_UNCOMPRESSED_SIZE as u64 + 1)
                .read_to_end(&mut out)
                .map_err(|e| err(e.to_string()))?;
            out
        }
        CompressionType::Zstd => {
            zstd::bulk::decompress(&payload, size.max(1)).map_err(|e| err(e.to_string()))?
        }
        CompressionType::Snappy => snap::raw::Decoder::new()
            .decompress_vec(&payload)
            .map_err(|e| err(e.to_string()))?,
    };
    if out.len() != size {
        return Err(err(format!(
            "decompressed to {} bytes, metadata says {size}",
            out.len()
        )));
    }
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::frame::build_entry;
    use bytes::{BufMut, BytesMut};

    fn batch(messages: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = BytesMut::new();
        for (key, payload) in messages {
            let single = SingleMessageMetadata {
                partition_key: Some((*key).to_string()),
                payload_size: payload.len() as i32,
                ..Default::default()
            };
            out.put_u32(single.encoded_len() as u32);
            single.encode(&mut out).ok();
            out.extend_from_slice(payload);
        }
        out.to_vec()
    }

    fn compress(codec: CompressionType, raw: &[u8]) -> Vec<u8> {
        crate::protocol::rebuild::compress(codec, raw).unwrap_or_default()
    }

    #[test]
    fn batches_unroll_with_every_codec() {
        let raw = batch(&[("a", b"first"), ("b", b""), ("c", b"third message")]);
        for codec in [
            CompressionType::None,
            CompressionType::Lz4,
            CompressionType::Zlib,
            CompressionType::Zstd,
            CompressionType::Snappy,
        ] {
            let meta = MessageMetadata {
                producer_name: "p".into(),
                sequence_id: 7,
                publish_time: 1,
                num_messages_in_batch: Some(3),
                compression: Some(codec as i32),
                uncompressed_size: Some(raw.len() as u32),
                ..Default::default()
            };
            let entry = build_entry(&meta, &compress(codec, &raw));
            let u = unroll_entry(&entry).unwrap_or_else(|e| panic!("{codec:?}: {e}"));
            assert_eq!(u.batch_size, Some(3));
            let payloads: Vec<&[u8]> = u.messages.iter().map(|m| &m.payload[..]).collect();
            assert_eq!(payloads, vec![&b"first"[..], b"", b"third message"]);
            assert_eq!(
                u.messages[2]
                    .single
                    .as_ref()
                    .and_then(|s| s.partition_key.clone()),
                Some("c".into())
            );
            assert_eq!(
                MessageMetadata::decode(u.metadata_raw.clone()).ok(),
                Some(meta)
            );
        }
    }

    #[test]
    fn broken_entries_are_errors_not_panics() {
        let meta = MessageMetadata {
            num_messages_in_batch: Some(5),
            ..Default::default()
        };
        let entry = build_entry(&meta, &batch(&[("a", b"x")]));
        assert!(unroll_entry(&entry).is_err(), "batch shorter than declared");
        let meta = MessageMetadata {
            compression: Some(CompressionType::Lz4 as i32),
            uncompressed_size: Some(10),
            ..Default::default()
        };
        assert!(unroll_entry(&build_entry(&meta, b"garbage")).is_err());
        assert!(unroll_entry(&Bytes::from_static(&[0, 0, 0, 9, 1])).is_err());
    }
}
