//! The node-to-node bookie protocol: how one node reads the ledgers another node's bookie holds.
//!
//! A connection carries length-prefixed frames (a 4-byte big-endian length, then that many
//! bytes, at most [`MAX_FRAME`]). Each frame is
//! `[version 2][kind][request id: u64][body][crc32c of everything before it: u32]`, all
//! integers big-endian, strings as `u16` length + UTF-8. A request names a topic and a ledger;
//! the response carries the same request id. Kinds: requests `0x01` read entries, `0x02` last
//! confirmed, `0x03` add entry (a replicated ledger's writer to its replicas, ADR 0010),
//! `0x04` sealed, `0x05` fence, `0x06` hello (credentials, ADR 0012); responses `0x81`
//! entries, `0x82` last confirmed, `0x83` added, `0x84` fenced, `0x85` welcome, `0xFF` error.
//!
//! Invariants:
//! - A frame whose version, checksum, kind or body does not parse is refused as a whole
//!   ([`BookieWireError`]); the peer closes that connection, nothing else.
//! - Decoding never allocates more than the frame holds: counts are checked against the bytes
//!   left before anything is reserved; a listener's framing refuses a declared length above
//!   [`MAX_REQUEST_FRAME`] before reserving it.
//! - Entries in a response are in ascending entry order, dense from the first one asked for.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio_util::codec::LengthDelimitedCodec;

/// Version byte of every frame of this protocol (2 added adds and seals, ADR 0010; nodes of
/// version 1 and 2 do not talk to each other).
pub const VERSION: u8 = 2;
/// Largest frame accepted: one response of entries stops growing at the reader's byte budget
/// ([`READ_BUDGET`]) but always carries at least one entry, which may be as large as the
/// largest message a broker accepts.
pub const MAX_FRAME: usize = 160 << 20;
/// Payload bytes a serving bookie puts in one entries response (at least one entry).
pub const READ_BUDGET: u32 = 4 << 20;

const KIND_READ: u8 = 0x01;
const KIND_LAST_CONFIRMED: u8 = 0x02;
const KIND_ADD: u8 = 0x03;
const KIND_SEALED: u8 = 0x04;
const KIND_FENCE: u8 = 0x05;
const KIND_HELLO: u8 = 0x06;
const KIND_ENTRIES: u8 = 0x81;
const KIND_CONFIRMED: u8 = 0x82;
const KIND_ADDED: u8 = 0x83;
const KIND_FENCED: u8 = 0x84;
const KIND_WELCOME: u8 = 0x85;
const KIND_ERROR: u8 = 0xFF;
/// Version + kind + request id before the body; checksum after it.
const HEAD: usize = 1 + 1 + 8;
const TAIL: usize = 4;

/// Largest request frame a bookie accepts besides an added entry's payload: requests are a
/// topic name (at most 64 KiB) and a few integers. The framing layer reserves a frame's
/// declared length as soon as it reads it, so a listener must never accept the answers' limit.
pub const MAX_REQUEST_FRAME: usize = (64 << 10) + 64;

/// The framing codec of the client side of a bookie connection (answers up to [`MAX_FRAME`]).
pub fn codec() -> LengthDelimitedCodec {
    framing(MAX_FRAME)
}

/// The framing codec of a bookie's listener: requests up to [`MAX_REQUEST_FRAME`] plus
/// `max_entry` bytes (the largest entry the log accepts, which an add carries).
pub fn request_codec(max_entry: usize) -> LengthDelimitedCodec {
    framing(MAX_REQUEST_FRAME + max_entry)
}

fn framing(max: usize) -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .length_field_length(4)
        .max_frame_length(max)
        .new_codec()
}

/// What a node asks a bookie.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BookieRequest {
    /// Entries `first..=last` of `ledger` of `topic`, as many as fit `max_bytes` (at least one).
    ReadEntries {
        /// Full topic (partition) name.
        topic: String,
        /// Ledger id.
        ledger: u64,
        /// First entry id.
        first: u64,
        /// Last entry id (inclusive).
        last: u64,
        /// Payload bytes wanted at most (the first entry is sent whatever its size).
        max_bytes: u32,
    },
    /// How many entries of `ledger` are durable on the bookie, and whether it is still open.
    LastConfirmed {
        /// Full topic (partition) name.
        topic: String,
        /// Ledger id.
        ledger: u64,
    },
    /// Store entry `entry` of replicated `ledger` (the writer sends a ledger's entries to each
    /// replica in order, on one connection); answered once it is durable there.
    AddEntry {
        /// Full topic (partition) name.
        topic: String,
        /// Ledger id.
        ledger: u64,
        /// Entry id.
        entry: u64,
        /// Publish time (ms since epoch).
        publish_time_ms: i64,
        /// The entry's bytes.
        payload: Bytes,
        /// Sent by a node taking the ledger over, to complete a fenced copy (a fenced copy
        /// refuses every other add).
        recovery: bool,
    },
    /// `ledger` was sealed with `count` entries: the replica keeps entries `0..count` as its
    /// sealed copy. Answered `LastConfirmed` with what it kept.
    Sealed {
        /// Full topic (partition) name.
        topic: String,
        /// Ledger id.
        ledger: u64,
        /// Entries of the sealed ledger.
        count: u64,
    },
    /// Refuse every later add of `ledger` (a new owner recovers it) and tell what the copy
    /// holds, all of it durable.
    Fence {
        /// Full topic (partition) name.
        topic: String,
        /// Ledger id.
        ledger: u64,
    },
    /// The connecting node's credentials (a token of a superuser role): the first request on
    /// a bookie whose node requires authentication, answered [`BookieResponse::Welcome`].
    Hello {
        /// The token, as the node would present it on the Pulsar protocol.
        token: String,
    },
}

/// What a fenced copy holds ([`BookieResponse::Fenced`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireCopy {
    /// The segment of the bookie's journal holding the copy's first entry.
    pub first_segment: u32,
    /// Entries held (ids `0..entry_count`).
    pub entry_count: u64,
    /// Payload bytes.
    pub size_bytes: u64,
    /// Publish-time range.
    pub min_publish_ms: Option<i64>,
    /// Publish-time range.
    pub max_publish_ms: Option<i64>,
    /// The segment holding the last entry.
    pub last_segment: u32,
    /// CRC32C chained over the entries' record CRCs.
    pub checksum: u32,
}

/// One entry as a bookie sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireEntry {
    /// Entry id.
    pub entry: u64,
    /// Publish time (ms since epoch).
    pub publish_time_ms: i64,
    /// The stored bytes.
    pub payload: Bytes,
}

/// Why a bookie refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BookieErrorCode {
    /// The bookie does not hold the ledger (never did, or deleted its copy).
    NotHeld,
    /// The first entry asked for is past what the bookie has confirmed.
    NoSuchEntry,
    /// The bookie's copy failed verification.
    Corrupt,
    /// Anything else (I/O, shutting down).
    Unavailable,
    /// The request itself made no sense (e.g. `last < first`).
    BadRequest,
    /// The connection has not presented valid credentials of a superuser role; the bookie
    /// closes it after this answer.
    Unauthorized,
}

impl BookieErrorCode {
    fn to_byte(self) -> u8 {
        match self {
            Self::NotHeld => 1,
            Self::NoSuchEntry => 2,
            Self::Corrupt => 3,
            Self::Unavailable => 4,
            Self::BadRequest => 5,
            Self::Unauthorized => 6,
        }
    }

    fn from_byte(b: u8) -> Result<Self, BookieWireError> {
        Ok(match b {
            1 => Self::NotHeld,
            2 => Self::NoSuchEntry,
            3 => Self::Corrupt,
            4 => Self::Unavailable,
            5 => Self::BadRequest,
            6 => Self::Unauthorized,
            other => return Err(BookieWireError::Malformed(format!("error code {other}"))),
        })
    }
}

/// What a bookie answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BookieResponse {
    /// Entries, dense and ascending from the first asked for.
    Entries(Vec<WireEntry>),
    /// Entries `0..count` of the ledger are durable on the bookie.
    LastConfirmed {
        /// Durable entries.
        count: u64,
        /// Whether the ledger is still being written.
        open: bool,
    },
    /// Entry `entry` of `ledger` is durable on the bookie.
    Added {
        /// Ledger id.
        ledger: u64,
        /// Entry id.
        entry: u64,
    },
    /// The copy is fenced; what it holds.
    Fenced(WireCopy),
    /// The connection is authenticated (or the bookie requires no credentials).
    Welcome {
        /// The role the credentials name (empty when none were required).
        role: String,
    },
    /// The request failed.
    Error {
        /// Why.
        code: BookieErrorCode,
        /// For [`BookieErrorCode::NoSuchEntry`]: entries the ledger has; else 0.
        available: u64,
        /// For people.
        message: String,
    },
}

impl BookieResponse {
    /// A refusal.
    pub fn error(code: BookieErrorCode, available: u64, message: impl Into<String>) -> Self {
        BookieResponse::Error {
            code,
            available,
            message: message.into(),
        }
    }
}

/// A frame that is not a valid message of this protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BookieWireError {
    /// Another protocol version.
    #[error("bookie frame of protocol version {0}, this node speaks {VERSION}")]
    Version(u8),
    /// The checksum did not match.
    #[error("bookie frame checksum mismatch")]
    Checksum,
    /// The frame ended early, carried trailing bytes or held an invalid field.
    #[error("malformed bookie frame: {0}")]
    Malformed(String),
}

/// A request with its id, as framed.
pub fn encode_request(request_id: u64, req: &BookieRequest) -> Bytes {
    let mut b = head(match req {
        BookieRequest::ReadEntries { .. } => KIND_READ,
        BookieRequest::LastConfirmed { .. } => KIND_LAST_CONFIRMED,
        BookieRequest::AddEntry { .. } => KIND_ADD,
        BookieRequest::Sealed { .. } => KIND_SEALED,
        BookieRequest::Fence { .. } => KIND_FENCE,
        BookieRequest::Hello { .. } => KIND_HELLO,
    });
    b.put_u64(request_id);
    match req {
        BookieRequest::ReadEntries {
            topic,
            ledger,
            first,
            last,
            max_bytes,
        } => {
            put_str(&mut b, topic);
            b.put_u64(*ledger);
            b.put_u64(*first);
            b.put_u64(*last);
            b.put_u32(*max_bytes);
        }
        BookieRequest::LastConfirmed { topic, ledger } => {
            put_str(&mut b, topic);
            b.put_u64(*ledger);
        }
        BookieRequest::AddEntry {
            topic,
            ledger,
            entry,
            publish_time_ms,
            payload,
            recovery,
        } => {
            put_str(&mut b, topic);
            b.put_u64(*ledger);
            b.put_u64(*entry);
            b.put_i64(*publish_time_ms);
            b.put_u8(u8::from(*recovery));
            b.put_u32(payload.len() as u32);
            b.put_slice(payload);
        }
        BookieRequest::Sealed {
            topic,
            ledger,
            count,
        } => {
            put_str(&mut b, topic);
            b.put_u64(*ledger);
            b.put_u64(*count);
        }
        BookieRequest::Fence { topic, ledger } => {
            put_str(&mut b, topic);
            b.put_u64(*ledger);
        }
        BookieRequest::Hello { token } => put_str(&mut b, token),
    }
    seal(b)
}

/// A response with its id, as framed.
pub fn encode_response(request_id: u64, resp: &BookieResponse) -> Bytes {
    let mut b = head(match resp {
        BookieResponse::Entries(_) => KIND_ENTRIES,
        BookieResponse::LastConfirmed { .. } => KIND_CONFIRMED,
        BookieResponse::Added { .. } => KIND_ADDED,
        BookieResponse::Fenced(_) => KIND_FENCED,
        BookieResponse::Welcome { .. } => KIND_WELCOME,
        BookieResponse::Error { .. } => KIND_ERROR,
    });
    b.put_u64(request_id);
    match resp {
        BookieResponse::Entries(entries) => {
            b.put_u32(entries.len() as u32);
            for e in entries {
                b.put_u64(e.entry);
                b.put_i64(e.publish_time_ms);
                b.put_u32(e.payload.len() as u32);
                b.put_slice(&e.payload);
            }
        }
        BookieResponse::LastConfirmed { count, open } => {
            b.put_u64(*count);
            b.put_u8(u8::from(*open));
        }
        BookieResponse::Added { ledger, entry } => {
            b.put_u64(*ledger);
            b.put_u64(*entry);
        }
        BookieResponse::Fenced(c) => {
            b.put_u32(c.first_segment);
            b.put_u64(c.entry_count);
            b.put_u64(c.size_bytes);
            put_opt_i64(&mut b, c.min_publish_ms);
            put_opt_i64(&mut b, c.max_publish_ms);
            b.put_u32(c.last_segment);
            b.put_u32(c.checksum);
        }
        BookieResponse::Welcome { role } => put_str(&mut b, role),
        BookieResponse::Error {
            code,
            available,
            message,
        } => {
            b.put_u8(code.to_byte());
            b.put_u64(*available);
            put_str(&mut b, message);
        }
    }
    seal(b)
}

/// Reads a request frame.
pub fn decode_request(frame: Bytes) -> Result<(u64, BookieRequest), BookieWireError> {
    let (kind, id, mut body) = open(frame)?;
    let req = match kind {
        KIND_READ => BookieRequest::ReadEntries {
            topic: get_str(&mut body)?,
            ledger: get_u64(&mut body)?,
            first: get_u64(&mut body)?,
            last: get_u64(&mut body)?,
            max_bytes: get_u32(&mut body)?,
        },
        KIND_LAST_CONFIRMED => BookieRequest::LastConfirmed {
            topic: get_str(&mut body)?,
            ledger: get_u64(&mut body)?,
        },
        KIND_ADD => {
            let topic = get_str(&mut body)?;
            let ledger = get_u64(&mut body)?;
            let entry = get_u64(&mut body)?;
            let publish_time_ms = get_u64(&mut body)? as i64;
            let recovery = match get_u8(&mut body)? {
                0 => false,
                1 => true,
                other => return Err(BookieWireError::Malformed(format!("recovery flag {other}"))),
            };
            let len = get_u32(&mut body)? as usize;
            if body.remaining() < len {
                return Err(truncated());
            }
            BookieRequest::AddEntry {
                topic,
                ledger,
                entry,
                publish_time_ms,
                payload: body.split_to(len),
                recovery,
            }
        }
        KIND_FENCE => BookieRequest::Fence {
            topic: get_str(&mut body)?,
            ledger: get_u64(&mut body)?,
        },
        KIND_SEALED => BookieRequest::Sealed {
            topic: get_str(&mut body)?,
            ledger: get_u64(&mut body)?,
            count: get_u64(&mut body)?,
        },
        KIND_HELLO => BookieRequest::Hello {
            token: get_str(&mut body)?,
        },
        other => {
            return Err(BookieWireError::Malformed(format!(
                "request kind {other:#x}"
            )))
        }
    };
    finish(&body)?;
    Ok((id, req))
}

/// Reads a response frame (entry payloads are slices of the frame, not copies).
pub fn decode_response(frame: Bytes) -> Result<(u64, BookieResponse), BookieWireError> {
    let (kind, id, mut body) = open(frame)?;
    let resp = match kind {
        KIND_ENTRIES => {
            let n = get_u32(&mut body)? as usize;
            // Each entry takes at least 20 bytes: refuse counts the frame cannot hold.
            if n > body.remaining() / 20 {
                return Err(BookieWireError::Malformed(format!("{n} entries")));
            }
            let mut entries = Vec::with_capacity(n);
            for _ in 0..n {
                let entry = get_u64(&mut body)?;
                let publish_time_ms = get_u64(&mut body)? as i64;
                let len = get_u32(&mut body)? as usize;
                if body.remaining() < len {
                    return Err(truncated());
                }
                entries.push(WireEntry {
                    entry,
                    publish_time_ms,
                    payload: body.split_to(len),
                });
            }
            BookieResponse::Entries(entries)
        }
        KIND_CONFIRMED => BookieResponse::LastConfirmed {
            count: get_u64(&mut body)?,
            open: match get_u8(&mut body)? {
                0 => false,
                1 => true,
                other => return Err(BookieWireError::Malformed(format!("open flag {other}"))),
            },
        },
        KIND_FENCED => BookieResponse::Fenced(WireCopy {
            first_segment: get_u32(&mut body)?,
            entry_count: get_u64(&mut body)?,
            size_bytes: get_u64(&mut body)?,
            min_publish_ms: get_opt_i64(&mut body)?,
            max_publish_ms: get_opt_i64(&mut body)?,
            last_segment: get_u32(&mut body)?,
            checksum: get_u32(&mut body)?,
        }),
        KIND_ADDED => BookieResponse::Added {
            ledger: get_u64(&mut body)?,
            entry: get_u64(&mut body)?,
        },
        KIND_WELCOME => BookieResponse::Welcome {
            role: get_str(&mut body)?,
        },
        KIND_ERROR => BookieResponse::Error {
            code: BookieErrorCode::from_byte(get_u8(&mut body)?)?,
            available: get_u64(&mut body)?,
            message: get_str(&mut body)?,
        },
        other => {
            return Err(BookieWireError::Malformed(format!(
                "response kind {other:#x}"
            )))
        }
    };
    finish(&body)?;
    Ok((id, resp))
}

fn head(kind: u8) -> BytesMut {
    let mut b = BytesMut::with_capacity(64);
    b.put_u8(VERSION);
    b.put_u8(kind);
    b
}

fn seal(mut b: BytesMut) -> Bytes {
    let crc = crc32c::crc32c(&b);
    b.put_u32(crc);
    b.freeze()
}

/// Checks version and checksum; returns kind, request id and the body.
fn open(mut frame: Bytes) -> Result<(u8, u64, Bytes), BookieWireError> {
    if frame.len() < HEAD + TAIL {
        return Err(truncated());
    }
    if frame[0] != VERSION {
        return Err(BookieWireError::Version(frame[0]));
    }
    let split = frame.len() - TAIL;
    let stored = u32::from_be_bytes([
        frame[split],
        frame[split + 1],
        frame[split + 2],
        frame[split + 3],
    ]);
    if crc32c::crc32c(&frame[..split]) != stored {
        return Err(BookieWireError::Checksum);
    }
    frame.truncate(split);
    let kind = frame[1];
    frame.advance(2);
    let id = frame.get_u64();
    Ok((kind, id, frame))
}

fn finish(body: &Bytes) -> Result<(), BookieWireError> {
    if body.has_remaining() {
        return Err(BookieWireError::Malformed(format!(
            "{} trailing bytes",
            body.remaining()
        )));
    }
    Ok(())
}

fn truncated() -> BookieWireError {
    BookieWireError::Malformed("frame ends early".into())
}

fn put_str(b: &mut BytesMut, s: &str) {
    // Topic names and messages are far below 64 KiB; a longer one is cut at a char boundary.
    let mut end = s.len().min(u16::MAX as usize);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    b.put_u16(end as u16);
    b.put_slice(&s.as_bytes()[..end]);
}

fn put_opt_i64(b: &mut BytesMut, v: Option<i64>) {
    match v {
        Some(v) => {
            b.put_u8(1);
            b.put_i64(v);
        }
        None => b.put_u8(0),
    }
}

fn get_opt_i64(b: &mut Bytes) -> Result<Option<i64>, BookieWireError> {
    match get_u8(b)? {
        0 => Ok(None),
        1 => Ok(Some(get_u64(b)? as i64)),
        other => Err(BookieWireError::Malformed(format!("option flag {other}"))),
    }
}

fn get_u8(b: &mut Bytes) -> Result<u8, BookieWireError> {
    b.try_get_u8().map_err(|_| truncated())
}

fn get_u32(b: &mut Bytes) -> Result<u32, BookieWireError> {
    b.try_get_u32().map_err(|_| truncated())
}

fn get_u64(b: &mut Bytes) -> Result<u64, BookieWireError> {
    b.try_get_u64().map_err(|_| truncated())
}

fn get_str(b: &mut Bytes) -> Result<String, BookieWireError> {
    let len = b.try_get_u16().map_err(|_| truncated())? as usize;
    if b.remaining() < len {
        return Err(truncated());
    }
    String::from_utf8(b.split_to(len).to_vec())
        .map_err(|_| BookieWireError::Malformed("string is not UTF-8".into()))
}

#[cfg(test)]
mod tests;
