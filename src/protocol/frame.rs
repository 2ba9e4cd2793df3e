//! Pulsar frames on the wire: a cheap [`check`] of a buffer for one complete frame, then
//! [`parse`] into the command and, for payload commands, the verified payload.
//!
//! ```text
//! simple:  [u32 total][u32 cmd_size][BaseCommand]
//! payload: [u32 total][u32 cmd_size][BaseCommand][u16 0x0e01][u32 crc32c][u32 meta_size][MessageMetadata][payload]
//! ```
//! Integers are big-endian; `total` excludes itself; the CRC32C covers everything after it.
//! A broker-to-client `[u16 0x0e02][u32 size][BrokerEntryMetadata]` block may precede the
//! checksum; it is skipped when a peer sends it.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;

use super::proto::{BaseCommand, MessageMetadata};

/// Magic number that precedes the payload checksum.
pub const MAGIC_CRC32C: u16 = 0x0e01;
/// Magic number that precedes broker entry metadata.
pub const MAGIC_BROKER_ENTRY_METADATA: u16 = 0x0e02;

/// Why bytes could not be a frame. Any of these closes the connection that sent them (only it).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The declared frame size is above the limit.
    #[error("frame of {size} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Declared size.
        size: usize,
        /// Limit.
        max: usize,
    },
    /// The frame's internal sizes do not add up.
    #[error("malformed frame: {0}")]
    Malformed(&'static str),
    /// The command or metadata protobuf does not decode.
    #[error("malformed protobuf in {what}: {source}")]
    Protobuf {
        /// Which part.
        what: &'static str,
        /// Decoder error.
        #[source]
        source: prost::DecodeError,
    },
    /// The command type names a field that is absent.
    #[error("command {0} is missing its body")]
    MissingBody(&'static str),
    /// Reading the socket failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// A decoded frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    /// The command.
    pub command: BaseCommand,
    /// The payload of SEND/MESSAGE frames.
    pub payload: Option<Payload>,
}

/// The payload part of a frame, kept as the bytes to store: `[0x0e01][crc32c][meta_size][metadata][payload]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Payload {
    /// Decoded metadata.
    pub metadata: MessageMetadata,
    /// Stored form: checksum block + metadata size + metadata + payload, with a correct CRC.
    pub entry: Bytes,
    /// Whether the sender's checksum matched (true when the sender sent none).
    pub checksum_ok: bool,
}

impl Payload {
    /// The message payload bytes (after the metadata).
    pub fn body(&self) -> Bytes {
        let meta_size = read_u32(&self.entry[6..10]) as usize;
        self.entry.slice(10 + meta_size..)
    }
}

fn read_u32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// Length of the first frame in `buf` if it is complete, `None` if more bytes are needed.
pub fn check(buf: &[u8], max_frame: usize) -> Result<Option<usize>, FrameError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let total = read_u32(&buf[0..4]) as usize;
    if total > max_frame {
        return Err(FrameError::TooLarge {
            size: total,
            max: max_frame,
        });
    }
    if total < 4 {
        return Err(FrameError::Malformed(
            "frame shorter than its command size field",
        ));
    }
    Ok((buf.len() >= 4 + total).then_some(4 + total))
}

/// Parses one complete frame (as delimited by [`check`]).
pub fn parse(frame: Bytes) -> Result<Frame, FrameError> {
    if frame.len() < 8 {
        return Err(FrameError::Malformed("frame too short"));
    }
    let cmd_size = read_u32(&frame[4..8]) as usize;
    if 8 + cmd_size > frame.len() {
        return Err(FrameError::Malformed("command size exceeds the frame"));
    }
    let command =
        BaseCommand::decode(&frame[8..8 + cmd_size]).map_err(|source| FrameError::Protobuf {
            what: "command",
            source,
        })?;
    let rest = frame.slice(8 + cmd_size..);
    let payload = if rest.is_empty() {
        None
    } else {
        Some(parse_payload(rest)?)
    };
    Ok(Frame { command, payload })
}

fn parse_payload(mut rest: Bytes) -> Result<Payload, FrameError> {
    if rest.len() >= 2 && u16::from_be_bytes([rest[0], rest[1]]) == MAGIC_BROKER_ENTRY_METADATA {
        if rest.len() < 6 {
            return Err(FrameError::Malformed("broker entry metadata cut short"));
        }
        let size = read_u32(&rest[2..6]) as usize;
        if 6 + size > rest.len() {
            return Err(FrameError::Malformed(
                "broker entry metadata exceeds the frame",
            ));
        }
        rest.advance(6 + size);
    }
    let (checked, stored) =
        if rest.len() >= 6 && u16::from_be_bytes([rest[0], rest[1]]) == MAGIC_CRC32C {
            (rest.slice(6..), Some(read_u32(&rest[2..6])))
        } else {
            (rest.clone(), None)
        };
    if checked.len() < 4 {
        return Err(FrameError::Malformed("payload without metadata size"));
    }
    let meta_size = read_u32(&checked[0..4]) as usize;
    if 4 + meta_size > checked.len() {
        return Err(FrameError::Malformed("metadata size exceeds the frame"));
    }
    let metadata = MessageMetadata::decode(&checked[4..4 + meta_size]).map_err(|source| {
        FrameError::Protobuf {
            what: "message metadata",
            source,
        }
    })?;
    let computed = crc32c::crc32c(&checked);
    let checksum_ok = stored.is_none_or(|s| s == computed);
    let entry = match stored {
        Some(s) if s == computed => rest,
        _ => {
            let mut b = BytesMut::with_capacity(6 + checked.len());
            b.put_u16(MAGIC_CRC32C);
            b.put_u32(computed);
            b.extend_from_slice(&checked);
            b.freeze()
        }
    };
    Ok(Payload {
        metadata,
        entry,
        checksum_ok,
    })
}

/// Builds the stored/sent form of a message from its metadata and payload.
pub fn build_entry(metadata: &MessageMetadata, payload: &[u8]) -> Bytes {
    let meta_len = metadata.encoded_len();
    let mut body = BytesMut::with_capacity(4 + meta_len + payload.len());
    body.put_u32(meta_len as u32);
    // Encoding into a buffer with enough capacity cannot fail.
    let _ = metadata.encode(&mut body);
    body.extend_from_slice(payload);
    let mut out = BytesMut::with_capacity(6 + body.len());
    out.put_u16(MAGIC_CRC32C);
    out.put_u32(crc32c::crc32c(&body));
    out.extend_from_slice(&body);
    out.freeze()
}

/// Appends a simple command frame to `out`.
pub fn encode_command(command: &BaseCommand, out: &mut BytesMut) {
    let cmd_len = command.encoded_len();
    out.reserve(8 + cmd_len);
    out.put_u32((4 + cmd_len) as u32);
    out.put_u32(cmd_len as u32);
    let _ = command.encode(out);
}

/// Appends a payload command frame (`entry` is the stored form, checksum block included).
pub fn encode_payload_command(command: &BaseCommand, entry: &[u8], out: &mut BytesMut) {
    let cmd_len = command.encoded_len();
    out.reserve(8 + cmd_len + entry.len());
    out.put_u32((4 + cmd_len + entry.len()) as u32);
    out.put_u32(cmd_len as u32);
    let _ = command.encode(out);
    out.extend_from_slice(entry);
}

/// Where the metadata of a stored entry (`[0x0e01][crc][meta_size][metadata][payload]`, the
/// checksum block optional) lies: the byte range of the metadata; the payload follows it.
pub fn entry_metadata_range(entry: &[u8]) -> Result<std::ops::Range<usize>, FrameError> {
    let start = if entry.len() >= 6 && u16::from_be_bytes([entry[0], entry[1]]) == MAGIC_CRC32C {
        6
    } else {
        0
    };
    let body = &entry[start..];
    if body.len() < 4 {
        return Err(FrameError::Malformed("entry without metadata size"));
    }
    let meta_size = read_u32(&body[0..4]) as usize;
    if 4 + meta_size > body.len() {
        return Err(FrameError::Malformed("metadata size exceeds the entry"));
    }
    Ok(start + 4..start + 4 + meta_size)
}

/// The metadata of a stored entry.
pub fn entry_metadata(entry: &[u8]) -> Result<MessageMetadata, FrameError> {
    let range = entry_metadata_range(entry)?;
    MessageMetadata::decode(&entry[range]).map_err(|source| FrameError::Protobuf {
        what: "message metadata",
        source,
    })
}

/// Messages in a stored entry: `num_messages_in_batch`, or 1 for an unbatched message.
pub fn entry_message_count(entry: &[u8]) -> u32 {
    entry_metadata(entry)
        .ok()
        .and_then(|m| m.num_messages_in_batch)
        .map_or(1, |n| n.max(1) as u32)
}

/// The key Key_Shared dispatch routes a stored entry by: its ordering key, else its partition
/// key, else empty.
pub fn entry_routing_key(entry: &[u8]) -> Vec<u8> {
    match entry_metadata(entry) {
        Ok(m) => m
            .ordering_key
            .or_else(|| m.partition_key.map(String::into_bytes))
            .unwrap_or_default(),
        Err(_) => Vec::new(),
    }
}
