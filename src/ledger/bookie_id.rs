//! The bookie id: the identity of one log's data directory, recorded on every ledger it
//! creates (ADR 0007), the way BookKeeper's cookie ties a bookie to its disks.
//!
//! It is made once, when a data directory is first used, and kept in `<dir>/bookie-id`; it
//! never changes afterwards. A node whose directory was wiped comes back as a new bookie, so
//! the ledgers its old directory held are never mistaken for ones it still has.
//!
//! File format: one line, `ledgerlake-bookie <format> <id>`, format 1, id 32 lowercase hex
//! digits.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::error::OpenError;
use super::segment::sync_dir;

/// Name of the file in the log's directory.
pub const FILE: &str = "bookie-id";
/// Format of the file this build writes and reads.
pub const FORMAT: u8 = 1;
const MAGIC: &str = "ledgerlake-bookie";

/// The text of the file for `id`.
fn encode(id: &str) -> String {
    format!("{MAGIC} {FORMAT} {id}\n")
}

/// The id in the file's text.
fn decode(text: &str) -> Result<String, String> {
    let mut words = text.trim_end_matches('\n').split(' ');
    match (words.next(), words.next(), words.next(), words.next()) {
        (Some(MAGIC), Some(f), Some(id), None) if f == FORMAT.to_string() => {
            if id.len() == 32
                && id
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            {
                Ok(id.to_string())
            } else {
                Err(format!("malformed id '{id}'"))
            }
        }
        (Some(MAGIC), Some(f), _, _) => {
            Err(format!("format {f}; this build reads format {FORMAT}"))
        }
        _ => Err("not a ledgerlake bookie id file".into()),
    }
}

/// A fresh random id.
fn fresh() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Reads the bookie id of `dir`, making and syncing one if the directory has none. Blocking:
/// call it off the async workers.
pub fn load_or_create(dir: &Path) -> Result<String, OpenError> {
    let path = dir.join(FILE);
    let io = |path: &PathBuf| {
        let path = path.clone();
        move |source| OpenError::Io { path, source }
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => decode(&text).map_err(|reason| OpenError::Corrupt {
            path: path.clone(),
            offset: 0,
            reason,
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = fresh();
            // Written whole to a temporary name, synced, then renamed: a crash leaves either
            // no file or a complete one.
            let tmp = dir.join(format!("{FILE}.tmp"));
            let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
            f.write_all(encode(&id).as_bytes()).map_err(io(&tmp))?;
            f.sync_all().map_err(io(&tmp))?;
            std::fs::rename(&tmp, &path).map_err(io(&path))?;
            sync_dir(dir).map_err(io(&dir.to_path_buf()))?;
            tracing::info!(bookie = %id, dir = %dir.display(), "new bookie id for this data directory");
            Ok(id)
        }
        Err(e) => Err(io(&path)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn ids_round_trip(n in any::<u128>()) {
            let id = format!("{n:032x}");
            prop_assert_eq!(decode(&encode(&id)), Ok(id));
        }
    }

    #[test]
    fn other_formats_and_garbage_are_refused() {
        let id = fresh();
        assert!(decode(&encode(&id).replace(" 1 ", " 2 ")).is_err());
        assert!(decode("hello").is_err());
        assert!(decode(&format!("{MAGIC} 1 XYZ")).is_err());
        assert!(decode(&format!("{MAGIC} 1 {id} extra")).is_err());
    }

    #[test]
    fn an_id_is_made_once_and_kept() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let a = load_or_create(dir.path())?;
        assert_eq!(load_or_create(dir.path())?, a);
        let other = tempfile::tempdir()?;
        assert_ne!(
            load_or_create(other.path())?,
            a,
            "each directory is its own bookie"
        );
        std::fs::write(dir.path().join(FILE), "garbage")?;
        assert!(matches!(
            load_or_create(dir.path()),
            Err(OpenError::Corrupt { .. })
        ));
        Ok(())
    }
}
