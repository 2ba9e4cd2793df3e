//! Errors of the log, one enum per operation, each with the context needed to act on it.

use std::path::PathBuf;
use std::sync::Arc;

use super::index::IndexFileError;
use super::metadata::{LedgerId, MetadataError};

/// Why an append was not acknowledged. Nothing was acknowledged for the entry; whether its bytes
/// reached the disk is unknown (as with any log: the client retries, deduplication sorts it out).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum AppendError {
    /// The log is shutting down or closed.
    #[error("the log is closed")]
    Closed,
    /// The journal hit an I/O error earlier; it refuses all further appends until restart
    /// (fail-stop: after a failed fsync the state of the page cache is unknown).
    #[error("the journal failed and stopped accepting appends: {0}")]
    JournalFailed(Arc<str>),
    /// The log's volume is (nearly) full or the log passed its local-disk budget; nothing was
    /// written, the client may retry (appends resume when space returns).
    #[error("appends refused: {0}")]
    NoSpace(Arc<str>),
    /// The entry is larger than `ledger.max_entry_size`.
    #[error("entry of {size} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Entry size.
        size: usize,
        /// Configured limit.
        max: usize,
    },
    /// Creating the next ledger failed.
    #[error("could not create a ledger: {0}")]
    Metadata(Arc<MetadataError>),
    /// The topic is being deleted (or was).
    #[error("topic {0} is deleted")]
    TopicDeleted(String),
    /// A replicated ledger can no longer reach its ack quorum (too many of its bookies
    /// failed), or not enough bookies are live for the ensemble the namespace asks for; the
    /// client may retry (the next ledger gets a new ensemble).
    #[error("ledger {ledger}: {why}")]
    Quorum {
        /// Ledger id (0: no ledger could be created).
        ledger: LedgerId,
        /// What went wrong.
        why: Arc<str>,
    },
}

/// Why a read returned no data.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The ledger is not part of this topic.
    #[error("ledger {ledger} does not belong to topic {topic}")]
    UnknownLedger {
        /// Topic name.
        topic: String,
        /// Ledger id.
        ledger: LedgerId,
    },
    /// The entry is past the last confirmed entry of the ledger.
    #[error("entry {ledger}:{entry} does not exist (ledger has {available} confirmed entries)")]
    NoSuchEntry {
        /// Ledger id.
        ledger: LedgerId,
        /// Entry id.
        entry: u64,
        /// Entries available in the ledger.
        available: u64,
    },
    /// The local copy was deleted after offload; read it from the lake.
    #[error("ledger {0} was deleted locally (offloaded)")]
    Deleted(LedgerId),
    /// The ledger is held by another node's bookie, not in the lake yet, and that bookie could
    /// not serve it (no longer a live member, unreachable, or it holds no copy).
    #[error("ledger {ledger} is held by bookie {bookie} on another node, is not offloaded yet, and that bookie could not serve it")]
    Remote {
        /// Ledger id.
        ledger: LedgerId,
        /// The bookie id holding it.
        bookie: String,
    },
    /// Stored bytes failed verification. Never returned as data.
    #[error("corrupt entry {ledger}:{entry} in {} at offset {offset}: {reason}", path.display())]
    Corrupt {
        /// Ledger id.
        ledger: LedgerId,
        /// Entry id.
        entry: u64,
        /// Segment file.
        path: PathBuf,
        /// Byte offset of the record in the file.
        offset: u64,
        /// What failed.
        reason: String,
    },
    /// The ledger's index file is missing or corrupt.
    #[error(transparent)]
    Index(#[from] IndexFileError),
    /// Reading a segment failed.
    #[error("reading {} at offset {offset}: {source}", path.display())]
    Io {
        /// Segment file.
        path: PathBuf,
        /// Offset.
        offset: u64,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The blocking read task was cancelled (shutdown).
    #[error("read cancelled")]
    Cancelled,
    /// Listing the topic's ledgers failed.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
}

/// Why the log could not be opened (recovery failed). The log refuses to start rather than
/// serve a state it cannot vouch for.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// Filesystem access failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// File or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A segment that was fully synced holds bytes that fail verification.
    #[error("corrupt segment {} at offset {offset}: {reason}", path.display())]
    Corrupt {
        /// Segment file.
        path: PathBuf,
        /// Byte offset.
        offset: u64,
        /// What failed.
        reason: String,
    },
    /// The metadata store failed.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    /// Writing an index file while sealing recovered ledgers failed.
    #[error(transparent)]
    Index(#[from] IndexFileError),
    /// The journal thread could not be started.
    #[error("could not start the journal: {0}")]
    Journal(String),
}

/// Why sealing or deleting a ledger failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LifecycleError {
    /// The journal failed before the ledger's entries were durable.
    #[error(transparent)]
    Append(#[from] AppendError),
    /// Writing the index file failed.
    #[error(transparent)]
    Index(#[from] IndexFileError),
    /// The metadata store refused or failed.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    /// Removing local files failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// File.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The ledger is not known to this log.
    #[error("ledger {0} is unknown")]
    UnknownLedger(LedgerId),
    /// A ledger stayed open (its seal did not finish) while its topic was being deleted.
    #[error("ledger {0} is still being sealed; try again")]
    StillOpen(LedgerId),
    /// A blocking task was cancelled (shutdown).
    #[error("cancelled")]
    Cancelled,
}
