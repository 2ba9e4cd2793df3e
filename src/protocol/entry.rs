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
use super::single_view::{SingleMessageView, ViewError};

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
    /// A batched message's metadata does not read.
    #[error(transparent)]
    SingleMetadata(#[from] ViewError),
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

/// A stored entry opened: its metadata read and its payload decompressed, messages not yet
/// split out (see [`OpenedEntry::batch`]).
#[derive(Debug, Clone)]
pub struct OpenedEntry {
    /// The entry's metadata.
    pub metadata: MessageMetadata,
    /// Its raw bytes, exactly as stored.
    pub metadata_raw: Bytes,
    /// `num_messages_in_batch` when batched, `None` otherwise.
    pub batch_size: Option<u32>,
    /// The payload is kept as stored, neither decompressed nor unrolled: it is encrypted, or
    /// one chunk of a chunked message (compressed as a whole before chunking).
    pub opaque: bool,
    /// The payload: decompressed, unless `opaque`.
    pub payload: Bytes,
}

/// Opens a stored entry (the checksum is not re-verified: it was checked on SEND and the log
/// checks its own record checksum on read).
pub fn open_entry(entry: &Bytes) -> Result<OpenedEntry, EntryError> {
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
    let payload = if opaque {
        raw
    } else {
        decompress(&metadata, raw)?
    };
    Ok(OpenedEntry {
        metadata,
        metadata_raw,
        batch_size,
        opaque,
        payload,
    })
}

impl OpenedEntry {
    /// The messages of a batch, read in place one at a time; `None` when the entry is one
    /// message (unbatched, or opaque).
    pub fn batch(&self) -> Option<BatchMessages<'_>> {
        match (self.batch_size, self.opaque) {
            (Some(count), false) => Some(BatchMessages {
                payload: &self.payload,
                at: 0,
                next: 0,
                count,
            }),
            _ => None,
        }
    }
}

/// One message of a batch, borrowed from the decompressed payload.
#[derive(Debug, Clone, Copy)]
pub struct BatchMessage<'a> {
    /// Index inside the batch.
    pub batch_index: u32,
    /// Its metadata.
    pub single: SingleMessageView<'a>,
    /// The metadata's bytes, exactly as stored.
    pub single_raw: &'a [u8],
    /// The message's payload.
    pub payload: &'a [u8],
}

/// The messages of a batch payload, `[u32 size][SingleMessageMetadata][payload]` each, checked
/// against the payload's length as they are read.
#[derive(Debug, Clone)]
pub struct BatchMessages<'a> {
    payload: &'a [u8],
    /// Invariant: every byte before `at` belongs to the `next` messages already returned.
    at: usize,
    next: u32,
    count: u32,
}

/// Fewest bytes a well-formed batch record takes: its 4-byte size and a `SingleMessageMetadata`
/// holding at least its required `payload_size` field (tag and one varint byte). Smaller records
/// still parse; [`BatchMessages::capacity_hint`] then underestimates, which costs a reallocation.
const MIN_RECORD_BYTES: usize = 6;

/// Largest capacity hint: a batch that declares more records and breaks early reserves no more
/// (Pulsar clients batch up to 1,000 messages by default).
const MAX_CAPACITY_HINT: usize = 8192;

impl<'a> BatchMessages<'a> {
    /// Records still to read, bounded by what the bytes left can hold when well-formed (the
    /// declared count comes from the producer and may be anything): a capacity for collecting
    /// them that a hostile count cannot inflate.
    pub fn capacity_hint(&self) -> usize {
        let declared = (self.count - self.next) as usize;
        declared
            .min((self.payload.len() - self.at) / MIN_RECORD_BYTES)
            .min(MAX_CAPACITY_HINT)
    }

    fn read(&mut self) -> Result<BatchMessage<'a>, EntryError> {
        let rest = &self.payload[self.at..];
        let Some((size, rest)) = rest.split_first_chunk::<4>() else {
            return Err(EntryError::Malformed("batch ends before its declared size"));
        };
        let size = u32::from_be_bytes(*size) as usize;
        let Some((single_raw, rest)) = rest.split_at_checked(size) else {
            return Err(EntryError::Malformed(
                "single message metadata overruns the batch",
            ));
        };
        let single = SingleMessageView::parse(single_raw)?;
        let len = usize::try_from(single.payload_size)
            .map_err(|_| EntryError::Malformed("negative payload size in batch"))?;
        let Some((payload, _)) = rest.split_at_checked(len) else {
            return Err(EntryError::Malformed("message payload overruns the batch"));
        };
        self.at += 4 + size + len;
        let batch_index = self.next;
        self.next += 1;
        Ok(BatchMessage {
            batch_index,
            single,
            single_raw,
            payload,
        })
    }
}

impl<'a> Iterator for BatchMessages<'a> {
    type Item = Result<BatchMessage<'a>, EntryError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.count {
            return None;
        }
        let read = self.read();
        if read.is_err() {
            // Nothing after a broken record can be trusted.
            self.next = self.count;
        }
        Some(read)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = (self.count - self.next) as usize;
        (0, Some(left))
    }
}

/// Unrolls a stored entry into owned messages (prost-decoded metadata, `Bytes` payloads).
pub fn unroll_entry(entry: &Bytes) -> Result<UnrolledEntry, EntryError> {
    let opened = open_entry(entry)?;
    let messages = match opened.batch() {
        Some(batch) => batch
            .map(|m| {
                let m = m?;
                let single_raw = opened.payload.slice_ref(m.single_raw);
                let single =
                    SingleMessageMetadata::decode(single_raw.clone()).map_err(|source| {
                        EntryError::Protobuf {
                            what: "single message metadata",
                            source,
                        }
                    })?;
                Ok(UnrolledMessage {
                    batch_index: m.batch_index,
                    single: Some(single),
                    single_raw: Some(single_raw),
                    payload: opened.payload.slice_ref(m.payload),
                })
            })
            .collect::<Result<Vec<_>, EntryError>>()?,
        None => vec![UnrolledMessage {
            batch_index: 0,
            single: None,
            single_raw: None,
            payload: opened.payload.clone(),
        }],
    };
    Ok(UnrolledEntry {
        metadata: opened.metadata,
        metadata_raw: opened.metadata_raw,
        batch_size: opened.batch_size,
        opaque: opened.opaque,
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
