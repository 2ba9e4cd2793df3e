//! The replica registry's file formats: one small file per copy a bookie holds of another
//! writer's ledger, `<ledger dir>/replicas/<ledger>.rep` (ADR 0010), written durably before the
//! copy's first entry and rewritten when the copy is sealed; and one per ledger a recovering
//! owner fenced here, `<ledger>.fence` (ADR 0014), written durably before the fence is
//! answered, so that the fence outlives a restart of this bookie.
//!
//! Invariant: a record is written whole under a temporary name, synced, renamed and its
//! directory synced; a record that fails its length, magic, version or checksum is refused.
//! An unreadable fence file still fences its ledger (its name says which): a fence is never
//! lost to damage.

use std::path::{Path, PathBuf};

use super::super::metadata::LedgerId;
use super::super::segment::sync_dir;

const MAGIC: &[u8; 4] = b"LLRP";
const VERSION: u8 = 1;
const RECORD_LEN: usize = 4 + 1 + 8 + 4 + 1 + 4 + 8 + 4;

/// One registry file: what this bookie holds of one ledger it replicates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RegistryRecord {
    pub ledger: LedgerId,
    pub first_segment: u32,
    /// `(last segment, entry count)` once the copy is sealed (its index file is durable).
    pub sealed: Option<(u32, u64)>,
}

impl RegistryRecord {
    /// `LLRP`, version, ledger, first segment, sealed flag, last segment, count, CRC32C of
    /// everything before it; integers little-endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(RECORD_LEN);
        b.extend_from_slice(MAGIC);
        b.push(VERSION);
        b.extend_from_slice(&self.ledger.to_le_bytes());
        b.extend_from_slice(&self.first_segment.to_le_bytes());
        let (flag, last, count) = match self.sealed {
            Some((last, count)) => (1u8, last, count),
            None => (0, 0, 0),
        };
        b.push(flag);
        b.extend_from_slice(&last.to_le_bytes());
        b.extend_from_slice(&count.to_le_bytes());
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<RegistryRecord, String> {
        if b.len() != RECORD_LEN {
            return Err(format!("{} bytes, expected {RECORD_LEN}", b.len()));
        }
        if &b[..4] != MAGIC || b[4] != VERSION {
            return Err("not a replica registry record of version 1".into());
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        if crc32c::crc32c(&b[..RECORD_LEN - 4]) != u32_at(RECORD_LEN - 4) {
            return Err("checksum mismatch".into());
        }
        let sealed = match b[17] {
            0 => None,
            1 => Some((u32_at(18), u64_at(22))),
            other => return Err(format!("sealed flag {other}")),
        };
        Ok(RegistryRecord {
            ledger: u64_at(5),
            first_segment: u32_at(13),
            sealed,
        })
    }
}

pub(super) fn registry_path(dir: &Path, ledger: LedgerId) -> PathBuf {
    dir.join(format!("{ledger}.rep"))
}

/// Writes `bytes` durably at `path`: a temporary file synced, renamed, the directory synced
/// (blocking).
fn write_durably(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    sync_dir(dir)
}

/// Writes `record` durably under its final name (blocking).
pub(super) fn write_registry(dir: &Path, record: &RegistryRecord) -> std::io::Result<()> {
    write_durably(dir, &registry_path(dir, record.ledger), &record.encode())
}

const FENCE_MAGIC: &[u8; 4] = b"LLFN";
const FENCE_VERSION: u8 = 1;
const FENCE_LEN: usize = 4 + 1 + 8 + 4;

/// A fence file's bytes: `LLFN`, version, ledger (little-endian), CRC32C of what precedes.
pub(crate) fn encode_fence(ledger: LedgerId) -> Vec<u8> {
    let mut b = Vec::with_capacity(FENCE_LEN);
    b.extend_from_slice(FENCE_MAGIC);
    b.push(FENCE_VERSION);
    b.extend_from_slice(&ledger.to_le_bytes());
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// The ledger a fence file's bytes name, or why they cannot be read.
pub(crate) fn decode_fence(b: &[u8]) -> Result<LedgerId, String> {
    if b.len() != FENCE_LEN {
        return Err(format!("{} bytes, expected {FENCE_LEN}", b.len()));
    }
    if &b[..4] != FENCE_MAGIC || b[4] != FENCE_VERSION {
        return Err("not a fence record of version 1".into());
    }
    let mut crc = [0u8; 4];
    crc.copy_from_slice(&b[FENCE_LEN - 4..]);
    if crc32c::crc32c(&b[..FENCE_LEN - 4]) != u32::from_le_bytes(crc) {
        return Err("checksum mismatch".into());
    }
    let mut ledger = [0u8; 8];
    ledger.copy_from_slice(&b[5..13]);
    Ok(u64::from_le_bytes(ledger))
}

pub(super) fn fence_path(dir: &Path, ledger: LedgerId) -> PathBuf {
    dir.join(format!("{ledger}.fence"))
}

/// Records durably that `ledger` is fenced on this bookie (blocking).
pub(super) fn write_fence(dir: &Path, ledger: LedgerId) -> std::io::Result<()> {
    write_durably(dir, &fence_path(dir, ledger), &encode_fence(ledger))
}

/// Removes `ledger`'s fence file, once nothing needs it (blocking); a missing one is fine.
pub(super) fn remove_fence(dir: &Path, ledger: LedgerId) -> std::io::Result<()> {
    match std::fs::remove_file(fence_path(dir, ledger)) {
        Ok(()) => sync_dir(dir),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// The files in `dir` with extension `ext` (blocking).
fn files_ending(dir: &Path, ext: &str) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let path = e?.path();
        if path.extension().and_then(|x| x.to_str()) == Some(ext) {
            out.push(path);
        }
    }
    Ok(out)
}

/// Every ledger fenced on this bookie, by its fence files in `dir` (blocking). A damaged file
/// still fences the ledger its name gives, with an error logged; a file whose name is no
/// ledger id is reported and skipped.
pub(crate) fn read_fences(dir: &Path) -> std::io::Result<Vec<LedgerId>> {
    let mut out = Vec::new();
    for path in files_ending(dir, "fence")? {
        let named = path
            .file_stem()
            .and_then(|s| s.to_str())
            .and_then(|s| s.parse::<LedgerId>().ok());
        let Some(named) = named else {
            tracing::error!(path = %path.display(), "a fence file not named by a ledger id");
            continue;
        };
        out.push(named);
        match decode_fence(&std::fs::read(&path)?) {
            Ok(ledger) if ledger == named => {}
            Ok(other) => {
                tracing::error!(path = %path.display(), other,
                    "a fence file names another ledger; fencing both");
                out.push(other);
            }
            Err(why) => tracing::error!(path = %path.display(), why,
                "an unreadable fence file; its ledger stays fenced"),
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Registers copies recovery keeps of this bookie's own replicated open ledgers (id, first
/// segment), so that they survive another restart before the takeover (blocking).
pub(crate) fn register_own(dir: &Path, own: &[(LedgerId, u32)]) -> std::io::Result<()> {
    for (ledger, first_segment) in own {
        let record = RegistryRecord {
            ledger: *ledger,
            first_segment: *first_segment,
            sealed: None,
        };
        write_registry(dir, &record)?;
    }
    Ok(())
}

/// Every registry record in `dir` (blocking); unreadable files are reported and skipped.
pub(crate) fn read_registry(dir: &Path) -> std::io::Result<Vec<RegistryRecord>> {
    let mut out = Vec::new();
    for path in files_ending(dir, "rep")? {
        match std::fs::read(&path).map(|b| RegistryRecord::decode(&b)) {
            Ok(Ok(r)) => out.push(r),
            Ok(Err(why)) => {
                tracing::error!(path = %path.display(), why, "unreadable replica registry file")
            }
            Err(e) => return Err(e),
        }
    }
    out.sort_by_key(|r| r.ledger);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn registry_records_round_trip(
            ledger in any::<u64>(), first in any::<u32>(),
            sealed in proptest::option::of((any::<u32>(), any::<u64>())),
        ) {
            let r = RegistryRecord { ledger, first_segment: first, sealed };
            let bytes = r.encode();
            prop_assert_eq!(bytes[4], VERSION);
            prop_assert_eq!(RegistryRecord::decode(&bytes), Ok(r));
        }

        #[test]
        fn fence_records_round_trip(ledger in any::<u64>()) {
            let bytes = encode_fence(ledger);
            prop_assert_eq!(bytes[4], FENCE_VERSION);
            prop_assert_eq!(decode_fence(&bytes), Ok(ledger));
        }

        #[test]
        fn damaged_fence_records_are_refused(at in 0usize..FENCE_LEN, bit in 0u8..8) {
            let mut bytes = encode_fence(77);
            bytes[at] ^= 1 << bit;
            prop_assert!(decode_fence(&bytes).is_err());
        }

        #[test]
        fn damaged_registry_records_are_refused(at in 0usize..RECORD_LEN, bit in 0u8..8) {
            let mut bytes = RegistryRecord { ledger: 9, first_segment: 2, sealed: Some((3, 4)) }
                .encode();
            bytes[at] ^= 1 << bit;
            prop_assert!(RegistryRecord::decode(&bytes).is_err());
        }
    }

    #[test]
    fn fences_outlive_damage_and_are_removed_once() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        write_fence(dir.path(), 5)?;
        write_fence(dir.path(), 9)?;
        write_fence(dir.path(), 9)?;
        std::fs::write(fence_path(dir.path(), 12), b"torn")?;
        std::fs::write(dir.path().join("x.fence"), encode_fence(3))?;
        write_registry(
            dir.path(),
            &RegistryRecord {
                ledger: 7,
                first_segment: 1,
                sealed: None,
            },
        )?;
        // The damaged one still fences; the misnamed one fences nothing; the registry is not
        // a fence.
        assert_eq!(read_fences(dir.path())?, vec![5, 9, 12]);
        remove_fence(dir.path(), 9)?;
        remove_fence(dir.path(), 9)?;
        assert_eq!(read_fences(dir.path())?, vec![5, 12]);
        assert_eq!(read_registry(dir.path())?.len(), 1);
        Ok(())
    }
}
