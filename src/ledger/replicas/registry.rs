//! The replica registry's file format (ADR 0010): one small file per copy a bookie holds of
//! another writer's ledger, `<ledger dir>/replicas/<ledger>.rep`, written durably before the
//! copy's first entry and rewritten when the copy is sealed.
//!
//! Invariant: a record is written whole under a temporary name, synced, renamed and its
//! directory synced; a record that fails its length, magic, version or checksum is refused.

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

/// Writes `record` durably under its final name (blocking).
pub(super) fn write_registry(dir: &Path, record: &RegistryRecord) -> std::io::Result<()> {
    let path = registry_path(dir, record.ledger);
    let tmp = path.with_extension("rep.tmp");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&record.encode())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, &path)?;
    sync_dir(dir)
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
    for e in std::fs::read_dir(dir)? {
        let path = e?.path();
        if path.extension().and_then(|x| x.to_str()) != Some("rep") {
            continue;
        }
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
        fn damaged_registry_records_are_refused(at in 0usize..RECORD_LEN, bit in 0u8..8) {
            let mut bytes = RegistryRecord { ledger: 9, first_segment: 2, sealed: Some((3, 4)) }
                .encode();
            bytes[at] ^= 1 << bit;
            prop_assert!(RegistryRecord::decode(&bytes).is_err());
        }
    }
}
