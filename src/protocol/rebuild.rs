//! Rebuilding a stored entry from what the lake keeps of it: the entry's original
//! `MessageMetadata` bytes, each batched message's original `SingleMessageMetadata` bytes and
//! each message's decompressed payload. The inverse of [`super::entry::unroll_entry`].
//!
//! Invariants:
//! - The metadata bytes are written back exactly as stored (fields we do not model survive:
//!   encryption keys, chunking fields, replication markers, uuid, ...).
//! - The uncompressed payload is byte-identical to the original one; it is compressed again
//!   with the codec the metadata names, and its size must equal `uncompressed_size`, so a
//!   client decompresses exactly the original messages. (The compressed bytes may differ from
//!   the producer's: compressors are not required to be deterministic across libraries.)
//! - Opaque payloads (encrypted, or one chunk of a chunked message) are written back as stored.

use std::io::Write;

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;

use super::entry::{EntryError, MAX_UNCOMPRESSED_SIZE};
use super::frame::MAGIC_CRC32C;
use super::proto::{CompressionType, MessageMetadata};

/// Frames `[magic][crc32c][u32 meta size][metadata][payload]` from raw metadata bytes.
pub fn frame_entry(metadata_raw: &[u8], payload: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(10 + metadata_raw.len() + payload.len());
    out.put_u16(MAGIC_CRC32C);
    out.put_u32(0);
    out.put_u32(metadata_raw.len() as u32);
    out.extend_from_slice(metadata_raw);
    out.extend_from_slice(payload);
    let crc = crc32c::crc32c(&out[6..]);
    out[2..6].copy_from_slice(&crc.to_be_bytes());
    out.freeze()
}

/// Compresses `raw` with `codec` the way Pulsar clients expect to decompress it (LZ4 block,
/// ZLIB stream, ZSTD frame, raw Snappy).
pub fn compress(codec: CompressionType, raw: &[u8]) -> Result<Vec<u8>, EntryError> {
    let err = |reason: String| EntryError::Decompress {
        codec: codec.as_str_name(),
        reason,
    };
    Ok(match codec {
        CompressionType::None => raw.to_vec(),
        CompressionType::Lz4 => lz4_flex::block::compress(raw),
        CompressionType::Zlib => {
            let mut e = flate2::write::ZlibEncoder::new(
                Vec::with_capacity(raw.len() / 2),
                flate2::Compression::default(),
            );
            e.write_all(raw).map_err(|e| err(e.to_string()))?;
            e.finish().map_err(|e| err(e.to_string()))?
        }
        CompressionType::Zstd => zstd::bulk::compress(raw, 3).map_err(|e| err(e.to_string()))?,
        CompressionType::Snappy => snap::raw::Encoder::new()
            .compress_vec(raw)
            .map_err(|e| err(e.to_string()))?,
    })
}

fn parse_metadata(metadata_raw: &[u8]) -> Result<MessageMetadata, EntryError> {
    MessageMetadata::decode(metadata_raw).map_err(|source| EntryError::Protobuf {
        what: "message metadata",
        source,
    })
}

fn finish(
    metadata: &MessageMetadata,
    metadata_raw: &[u8],
    uncompressed: &[u8],
) -> Result<Bytes, EntryError> {
    let codec = metadata.compression();
    if codec != CompressionType::None {
        let declared = metadata.uncompressed_size.unwrap_or(0) as usize;
        if declared != uncompressed.len() {
            return Err(EntryError::Malformed(
                "rebuilt payload size differs from the metadata's uncompressed_size",
            ));
        }
    }
    if uncompressed.len() > MAX_UNCOMPRESSED_SIZE {
        return Err(EntryError::Malformed("rebuilt payload is too large"));
    }
    if codec == CompressionType::None {
        return Ok(frame_entry(metadata_raw, uncompressed));
    }
    Ok(frame_entry(metadata_raw, &compress(codec, uncompressed)?))
}

/// Whether an entry with this metadata keeps its payload as stored (encrypted or chunked).
pub fn is_opaque(metadata: &MessageMetadata) -> bool {
    !metadata.encryption_keys.is_empty() || metadata.num_chunks_from_msg.unwrap_or(0) > 1
}

/// Rebuilds an entry whose payload was kept as stored (encrypted, chunked).
pub fn rebuild_opaque(metadata_raw: &[u8], payload: &[u8]) -> Bytes {
    frame_entry(metadata_raw, payload)
}

/// Rebuilds an unbatched entry from its decompressed payload (`None`: a null value).
pub fn rebuild_single(metadata_raw: &[u8], payload: Option<&[u8]>) -> Result<Bytes, EntryError> {
    let metadata = parse_metadata(metadata_raw)?;
    if is_opaque(&metadata) {
        return Ok(rebuild_opaque(metadata_raw, payload.unwrap_or_default()));
    }
    finish(&metadata, metadata_raw, payload.unwrap_or_default())
}

/// Rebuilds a batch entry from its messages in batch order: each message's raw
/// `SingleMessageMetadata` and decompressed payload (`None`: a null value, stored empty).
pub fn rebuild_batch<'a>(
    metadata_raw: &[u8],
    messages: impl IntoIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
) -> Result<Bytes, EntryError> {
    let metadata = parse_metadata(metadata_raw)?;
    let mut raw = Vec::with_capacity(metadata.uncompressed_size.unwrap_or(0) as usize);
    for (single_raw, payload) in messages {
        raw.put_u32(single_raw.len() as u32);
        raw.extend_from_slice(single_raw);
        raw.extend_from_slice(payload.unwrap_or_default());
    }
    finish(&metadata, metadata_raw, &raw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::entry::{build_batch_entry, unroll_entry};
    use crate::protocol::proto::{KeyValue, SingleMessageMetadata};

    fn metadata(codec: CompressionType) -> MessageMetadata {
        MessageMetadata {
            producer_name: "p".into(),
            sequence_id: 3,
            publish_time: 1_700_000_000_000,
            compression: Some(codec as i32),
            uuid: Some("not modelled".into()),
            ..Default::default()
        }
    }

    /// Compresses the payload of an uncompressed stored entry with `codec`, as a client does.
    fn compressed(entry: &Bytes, codec: CompressionType) -> Bytes {
        let u = unroll_entry(entry).unwrap_or_else(|e| panic!("{e}"));
        let start = 10 + u.metadata_raw.len();
        let raw = &entry[start..];
        let mut m = u.metadata.clone();
        m.compression = Some(codec as i32);
        m.uncompressed_size = Some(raw.len() as u32);
        let body = compress(codec, raw).unwrap_or_else(|e| panic!("{e}"));
        crate::protocol::frame::build_entry(&m, &body)
    }

    #[test]
    fn batches_rebuild_to_the_same_messages_with_every_codec() {
        let singles = (0..5).map(|i| {
            let single = SingleMessageMetadata {
                partition_key: (i % 2 == 0).then(|| format!("k{i}")),
                properties: vec![KeyValue {
                    key: "i".into(),
                    value: i.to_string(),
                }],
                sequence_id: Some(10 + i),
                ..Default::default()
            };
            (single, format!("payload number {i}").into_bytes())
        });
        let plain = build_batch_entry(metadata(CompressionType::None), singles);
        for codec in [
            CompressionType::None,
            CompressionType::Lz4,
            CompressionType::Zlib,
            CompressionType::Zstd,
            CompressionType::Snappy,
        ] {
            let original = if codec == CompressionType::None {
                plain.clone()
            } else {
                compressed(&plain, codec)
            };
            let u = unroll_entry(&original).unwrap_or_else(|e| panic!("{e}"));
            let rebuilt = rebuild_batch(
                &u.metadata_raw,
                u.messages.iter().map(|m| {
                    (
                        m.single_raw.as_deref().unwrap_or_default(),
                        Some(&m.payload[..]),
                    )
                }),
            )
            .unwrap_or_else(|e| panic!("{codec:?}: {e}"));
            if codec == CompressionType::None {
                assert_eq!(
                    rebuilt, original,
                    "uncompressed entries rebuild bit for bit"
                );
            }
            let again = unroll_entry(&rebuilt).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(again, u, "{codec:?}");
        }
    }

    #[test]
    fn single_and_opaque_entries_rebuild_exactly() {
        let m = metadata(CompressionType::None);
        let original = crate::protocol::frame::build_entry(&m, b"hello");
        let u = unroll_entry(&original).unwrap_or_else(|e| panic!("{e}"));
        let rebuilt =
            rebuild_single(&u.metadata_raw, Some(b"hello")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(rebuilt, original);
        let mut enc = metadata(CompressionType::Lz4);
        enc.encryption_keys
            .push(crate::protocol::proto::EncryptionKeys {
                key: "k".into(),
                value: vec![1, 2, 3],
                metadata: vec![],
            });
        let original = crate::protocol::frame::build_entry(&enc, b"\x00ciphertext\xff");
        let u = unroll_entry(&original).unwrap_or_else(|e| panic!("{e}"));
        assert!(u.opaque);
        let rebuilt = rebuild_single(&u.metadata_raw, Some(&u.messages[0].payload))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(rebuilt, original);
    }

    #[test]
    fn a_wrong_payload_size_is_an_error() {
        let mut m = metadata(CompressionType::Lz4);
        m.uncompressed_size = Some(100);
        let raw = m.encode_to_vec();
        assert!(rebuild_single(&raw, Some(b"short")).is_err());
    }
}
