//! Entry index: where each entry of a ledger lives, so reads by (ledger, entry) never scan.
//!
//! While a ledger is open its index lives in memory ([`IndexEntry`] per entry, pushed by the
//! journal thread in entry order). When the ledger is sealed the index is written to
//! `index/<ledger_id>.idx` (atomically: temp file, fsync, rename, fsync of the directory):
//!
//! ```text
//! b"LLIX" | version u8 | reserved [u8;3] | ledger_id u64 | count u64 | IndexEntry*count | crc32c u32
//! IndexEntry (20 bytes): segment u32 | offset u32 | len u32 | publish_time_ms i64
//! ```
//! Little-endian; the trailing CRC32C covers every byte before it. Changing the layout needs a new
//! `INDEX_VERSION` and an ADR in `docs/adr/`.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use bytes::BufMut;

/// Magic bytes of an index file.
pub const INDEX_MAGIC: [u8; 4] = *b"LLIX";
/// Version of the index file layout written by this build.
pub const INDEX_VERSION: u8 = 1;
const INDEX_HEADER_LEN: usize = 24;
const INDEX_ENTRY_LEN: usize = 20;

/// Location and publish time of one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// Segment file holding the record.
    pub segment: u32,
    /// Byte offset of the record header inside the segment.
    pub offset: u32,
    /// Total record length (header + body).
    pub len: u32,
    /// Publish time of the entry (ms since epoch).
    pub publish_time_ms: i64,
}

impl IndexEntry {
    /// Stands for an entry of a striped ledger that this copy does not hold (another replica's
    /// stripe, ADR 0017): length 0, which no record has (its framing alone is longer).
    pub const ABSENT: IndexEntry = IndexEntry {
        segment: 0,
        offset: 0,
        len: 0,
        publish_time_ms: 0,
    };

    /// Whether it stands for an entry this copy does not hold ([`IndexEntry::ABSENT`]).
    pub fn is_absent(&self) -> bool {
        self.len == 0
    }
}

/// Why an index file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum IndexFileError {
    /// Reading or writing the file failed.
    #[error("index file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a valid index for the expected ledger.
    #[error("index file {path} is corrupt: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
}

/// Path of the index file of `ledger_id` under `dir`.
pub fn index_path(dir: &Path, ledger_id: u64) -> PathBuf {
    dir.join(format!("{ledger_id:020}.idx"))
}

/// Encodes an index file image.
pub fn encode_index(ledger_id: u64, entries: &[IndexEntry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(INDEX_HEADER_LEN + entries.len() * INDEX_ENTRY_LEN + 4);
    out.extend_from_slice(&INDEX_MAGIC);
    out.push(INDEX_VERSION);
    out.extend_from_slice(&[0u8; 3]);
    out.put_u64_le(ledger_id);
    out.put_u64_le(entries.len() as u64);
    for e in entries {
        out.put_u32_le(e.segment);
        out.put_u32_le(e.offset);
        out.put_u32_le(e.len);
        out.put_i64_le(e.publish_time_ms);
    }
    let crc = crc32c::crc32c(&out);
    out.put_u32_le(crc);
    out
}

/// Decodes an index file image, checking magic, version, ledger id, length and CRC.
pub fn decode_index(ledger_id: u64, buf: &[u8]) -> Result<Vec<IndexEntry>, String> {
    if buf.len() < INDEX_HEADER_LEN + 4 {
        return Err(format!("file too short ({} bytes)", buf.len()));
    }
    let (body, crc_bytes) = buf.split_at(buf.len() - 4);
    let stored = u32::from_le_bytes([crc_bytes[0], crc_bytes[1], crc_bytes[2], crc_bytes[3]]);
    let computed = crc32c::crc32c(body);
    if stored != computed {
        return Err(format!(
            "checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
        ));
    }
    if body[0..4] != INDEX_MAGIC {
        return Err("bad magic".into());
    }
    if body[4] != INDEX_VERSION {
        return Err(format!("unsupported index version {}", body[4]));
    }
    let read_u64 = |o: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&body[o..o + 8]);
        u64::from_le_bytes(b)
    };
    let found = read_u64(8);
    if found != ledger_id {
        return Err(format!("file is for ledger {found}, expected {ledger_id}"));
    }
    let count = read_u64(16) as usize;
    let expected_len = count
        .checked_mul(INDEX_ENTRY_LEN)
        .and_then(|n| n.checked_add(INDEX_HEADER_LEN));
    if expected_len != Some(body.len()) {
        return Err(format!(
            "declares {count} entries but has {} bytes",
            body.len()
        ));
    }
    let mut entries = Vec::with_capacity(count);
    for chunk in body[INDEX_HEADER_LEN..].chunks_exact(INDEX_ENTRY_LEN) {
        let u32_at =
            |o: usize| u32::from_le_bytes([chunk[o], chunk[o + 1], chunk[o + 2], chunk[o + 3]]);
        let mut t = [0u8; 8];
        t.copy_from_slice(&chunk[12..20]);
        entries.push(IndexEntry {
            segment: u32_at(0),
            offset: u32_at(4),
            len: u32_at(8),
            publish_time_ms: i64::from_le_bytes(t),
        });
    }
    Ok(entries)
}

/// Writes the index file for `ledger_id` durably (blocking: call from a blocking thread).
pub fn write_index_file(
    dir: &Path,
    ledger_id: u64,
    entries: &[IndexEntry],
) -> Result<(), IndexFileError> {
    let path = index_path(dir, ledger_id);
    let (tmp, file) = write_temporary(dir, ledger_id, entries)?;
    let io = |source| IndexFileError::Io {
        path: path.clone(),
        source,
    };
    file.sync_all().map_err(io)?;
    drop(file);
    fs::rename(&tmp, &path).map_err(io)?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(io)
}

/// Writes the index files of many ledgers durably (blocking) with two syncs for all of them
/// rather than two per file: every file is written under its temporary name, one `syncfs` of
/// the directory's file system makes them durable, then each is renamed and the directory is
/// fsynced once. Recovery uses it to close every ledger a crash left open. A crash part-way
/// leaves temporary files (stale at the next start) or final files whose bytes are durable:
/// never a final name over bytes that were not synced.
pub fn write_index_files(
    dir: &Path,
    ledgers: &[(u64, std::sync::Arc<[IndexEntry]>)],
) -> Result<(), IndexFileError> {
    let io = |source| IndexFileError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut written = Vec::with_capacity(ledgers.len());
    for (id, entries) in ledgers {
        let (tmp, _closed) = write_temporary(dir, *id, entries)?;
        written.push((tmp, index_path(dir, *id)));
    }
    let d = File::open(dir).map_err(io)?;
    rustix::fs::syncfs(&d).map_err(|e| io(e.into()))?;
    for (tmp, path) in &written {
        fs::rename(tmp, path).map_err(|source| IndexFileError::Io {
            path: path.clone(),
            source,
        })?;
    }
    d.sync_all().map_err(io)
}

/// Writes `ledger_id`'s index image to its temporary file, not synced; returns its path and
/// the open file.
fn write_temporary(
    dir: &Path,
    ledger_id: u64,
    entries: &[IndexEntry],
) -> Result<(PathBuf, File), IndexFileError> {
    let tmp = index_path(dir, ledger_id).with_extension("idx.tmp");
    let image = encode_index(ledger_id, entries);
    let file = File::create(&tmp)
        .and_then(|mut f| f.write_all(&image).map(|()| f))
        .map_err(|source| IndexFileError::Io {
            path: tmp.clone(),
            source,
        })?;
    Ok((tmp, file))
}

/// Removes index files (and unfinished `.idx.tmp` files) of ledgers not in `live`, the
/// leftovers of a crash between recording a ledger's deletion and removing its index (blocking).
/// Returns the ledger ids whose files were removed; other files are left alone.
pub fn remove_stale_index_files(
    dir: &Path,
    live: &std::collections::HashSet<u64>,
) -> std::io::Result<Vec<u64>> {
    let mut removed = Vec::new();
    for dirent in fs::read_dir(dir)? {
        let dirent = dirent?;
        let name = dirent.file_name();
        let Some(name) = name.to_str() else { continue };
        let stem = name
            .strip_suffix(".idx")
            .or_else(|| name.strip_suffix(".idx.tmp"));
        let Some(id) = stem.and_then(|s| s.parse::<u64>().ok()) else {
            continue;
        };
        if live.contains(&id) && name.ends_with(".idx") {
            continue;
        }
        fs::remove_file(dirent.path())?;
        removed.push(id);
    }
    if !removed.is_empty() {
        File::open(dir)?.sync_all()?;
    }
    Ok(removed)
}

/// Reads and validates the index file of `ledger_id` (blocking).
pub fn read_index_file(dir: &Path, ledger_id: u64) -> Result<Vec<IndexEntry>, IndexFileError> {
    let path = index_path(dir, ledger_id);
    let mut buf = Vec::new();
    File::open(&path)
        .and_then(|mut f| f.read_to_end(&mut buf))
        .map_err(|source| IndexFileError::Io {
            path: path.clone(),
            source,
        })?;
    decode_index(ledger_id, &buf).map_err(|reason| IndexFileError::Corrupt { path, reason })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::FileFailurePersistence;

    fn entry() -> impl Strategy<Value = IndexEntry> {
        (any::<u32>(), any::<u32>(), any::<u32>(), any::<i64>()).prop_map(|(s, o, l, t)| {
            IndexEntry {
                segment: s,
                offset: o,
                len: l,
                publish_time_ms: t,
            }
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
            ..ProptestConfig::default()
        })]
        #[test]
        fn index_round_trips(ledger in any::<u64>(), entries in proptest::collection::vec(entry(), 0..200)) {
            let image = encode_index(ledger, &entries);
            prop_assert_eq!(decode_index(ledger, &image).map_err(TestCaseError::fail)?, entries);
        }

        #[test]
        fn index_corruption_detected(entries in proptest::collection::vec(entry(), 1..50),
                                     pos in any::<prop::sample::Index>(), bit in 0u8..8) {
            let mut image = encode_index(3, &entries);
            let i = pos.index(image.len());
            image[i] ^= 1 << bit;
            prop_assert!(decode_index(3, &image).is_err());
        }
    }

    #[test]
    fn file_round_trip_and_wrong_ledger() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let entries = vec![IndexEntry {
            segment: 1,
            offset: 16,
            len: 40,
            publish_time_ms: 5,
        }];
        write_index_file(dir.path(), 9, &entries)?;
        assert_eq!(read_index_file(dir.path(), 9)?, entries);
        fs::copy(index_path(dir.path(), 9), index_path(dir.path(), 10))?;
        assert!(matches!(
            read_index_file(dir.path(), 10),
            Err(IndexFileError::Corrupt { .. })
        ));
        Ok(())
    }

    #[test]
    fn many_files_written_at_once_read_back_and_leave_no_temporary(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let ledgers: Vec<(u64, std::sync::Arc<[IndexEntry]>)> = (1..=50u32)
            .map(|id| {
                let entries: Vec<IndexEntry> = (0..id)
                    .map(|e| IndexEntry {
                        segment: id,
                        offset: e * 64,
                        len: 64,
                        publish_time_ms: i64::from(e),
                    })
                    .collect();
                (u64::from(id), entries.into())
            })
            .collect();
        // A temporary file left by an earlier attempt is overwritten, not appended to.
        fs::write(
            index_path(dir.path(), 7).with_extension("idx.tmp"),
            b"stale bytes",
        )?;
        write_index_files(dir.path(), &ledgers)?;
        for (id, entries) in &ledgers {
            assert_eq!(read_index_file(dir.path(), *id)?, entries.to_vec());
        }
        let names: Vec<String> = fs::read_dir(dir.path())?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<Result<_, _>>()?;
        assert_eq!(names.len(), 50);
        assert!(names.iter().all(|n| n.ends_with(".idx")), "{names:?}");
        Ok(())
    }

    #[test]
    fn stale_index_files_go_live_ones_and_other_files_stay(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        for id in [1, 2, 3] {
            write_index_file(dir.path(), id, &[])?;
        }
        fs::write(index_path(dir.path(), 4).with_extension("idx.tmp"), b"half")?;
        fs::write(dir.path().join("notes.txt"), b"keep")?;
        let live = std::collections::HashSet::from([2u64]);
        let mut removed = remove_stale_index_files(dir.path(), &live)?;
        removed.sort();
        assert_eq!(removed, [1, 3, 4]);
        let mut left: Vec<_> = fs::read_dir(dir.path())?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<Result<_, _>>()?;
        left.sort();
        assert_eq!(left, [format!("{:020}.idx", 2), "notes.txt".to_string()]);
        Ok(())
    }
}
