//! Segment files: creation (header, preallocation, directory fsync), listing, positional reads
//! through a bounded cache of open handles, and deletion.
//!
//! Invariant: records never span two segments; a segment other than the newest was fsynced and
//! trimmed to its written length before the next one was created.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::record::{encode_segment_header, SEGMENT_HEADER_LEN};

/// Path of segment `id` under `dir`.
pub fn segment_path(dir: &Path, id: u32) -> PathBuf {
    dir.join(format!("{id:010}.seg"))
}

/// Ids of the segment files in `dir`, ascending. Other files are ignored.
pub fn list_segments(dir: &Path) -> io::Result<Vec<u32>> {
    let mut ids = Vec::new();
    for entry in fs::read_dir(dir)? {
        let name = entry?.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(stem) = name.strip_suffix(".seg") {
            if let Ok(id) = stem.parse::<u32>() {
                ids.push(id);
            }
        }
    }
    ids.sort_unstable();
    Ok(ids)
}

/// fsyncs a directory so that created, renamed or removed names in it are durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Creates segment `id`, writes its header, preallocates `prealloc` bytes (so that later
/// `fdatasync` calls need not update the file size) and makes the file and its name durable.
pub fn create_segment(dir: &Path, id: u32, prealloc: u64) -> io::Result<File> {
    let path = segment_path(dir, id);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    file.write_all(&encode_segment_header(id))?;
    if prealloc > SEGMENT_HEADER_LEN {
        preallocate(&file, prealloc)?;
    }
    file.sync_all()?;
    sync_dir(dir)?;
    Ok(file)
}

/// Reserves `len` bytes for `file`, extending its size; the new range reads as zeros.
fn preallocate(file: &File, len: u64) -> io::Result<()> {
    match rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), 0, len) {
        Ok(()) => Ok(()),
        // Filesystems without fallocate: a sparse extension still reads as zeros.
        Err(rustix::io::Errno::OPNOTSUPP) | Err(rustix::io::Errno::NOSYS) => file.set_len(len),
        Err(e) => Err(e.into()),
    }
}

/// A bounded cache of read-only segment handles for positional reads.
///
/// Invariant: at most `max_open` handles are held; the number of open files does not grow with
/// the number of topics or ledgers.
#[derive(Debug)]
pub struct SegmentReaders {
    dir: PathBuf,
    max_open: usize,
    open: Mutex<HashMap<u32, Arc<File>>>,
}

impl SegmentReaders {
    /// A cache over the segments in `dir`.
    pub fn new(dir: PathBuf, max_open: usize) -> Self {
        Self {
            dir,
            max_open: max_open.max(1),
            open: Mutex::new(HashMap::new()),
        }
    }

    /// Directory of the segments.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn handle(&self, id: u32) -> io::Result<Arc<File>> {
        if let Some(f) = self.lock().get(&id) {
            return Ok(f.clone());
        }
        let f = Arc::new(File::open(segment_path(&self.dir, id))?);
        let mut open = self.lock();
        if open.len() >= self.max_open {
            // Evict the oldest segment: newer segments serve live reads.
            if let Some(oldest) = open.keys().min().copied() {
                open.remove(&oldest);
            }
        }
        open.insert(id, f.clone());
        Ok(f)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Arc<File>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads exactly `len` bytes at `offset` of segment `id` (blocking).
    pub fn read_at(&self, id: u32, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let f = self.handle(id)?;
        let mut buf = vec![0u8; len];
        f.read_exact_at(&mut buf, offset)?;
        Ok(buf)
    }

    /// Drops the cached handle of `id` (before deleting the file).
    pub fn forget(&self, id: u32) {
        self.lock().remove(&id);
    }
}

/// Name of the clean-shutdown marker in the segment directory.
const CLEAN_MARKER: &str = "clean-shutdown";
const CLEAN_MAGIC: [u8; 4] = *b"LLCS";
const CLEAN_VERSION: u8 = 1;

/// Records that segment `segment` was fsynced and trimmed to `offset` by a clean shutdown:
/// `b"LLCS" | version u8 | segment u32 | offset u64 | crc32c u32` (little-endian).
pub fn write_clean_marker(dir: &Path, segment: u32, offset: u64) -> io::Result<()> {
    let mut image = Vec::with_capacity(21);
    image.extend_from_slice(&CLEAN_MAGIC);
    image.push(CLEAN_VERSION);
    image.extend_from_slice(&segment.to_le_bytes());
    image.extend_from_slice(&offset.to_le_bytes());
    let crc = crc32c::crc32c(&image);
    image.extend_from_slice(&crc.to_le_bytes());
    let tmp = dir.join(format!("{CLEAN_MARKER}.tmp"));
    let mut f = File::create(&tmp)?;
    f.write_all(&image)?;
    f.sync_all()?;
    fs::rename(&tmp, dir.join(CLEAN_MARKER))?;
    sync_dir(dir)
}

/// The clean-shutdown marker, if present and valid: (segment, durable end offset).
pub fn read_clean_marker(dir: &Path) -> Option<(u32, u64)> {
    let image = fs::read(dir.join(CLEAN_MARKER)).ok()?;
    if image.len() != 21 || image[0..4] != CLEAN_MAGIC || image[4] != CLEAN_VERSION {
        return None;
    }
    let crc = u32::from_le_bytes(image[17..21].try_into().ok()?);
    if crc32c::crc32c(&image[..17]) != crc {
        return None;
    }
    let segment = u32::from_le_bytes(image[5..9].try_into().ok()?);
    let offset = u64::from_le_bytes(image[9..17].try_into().ok()?);
    Some((segment, offset))
}

/// Removes the clean-shutdown marker (once a new segment has been started).
pub fn remove_clean_marker(dir: &Path) -> io::Result<()> {
    match fs::remove_file(dir.join(CLEAN_MARKER)) {
        Ok(()) => sync_dir(dir),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_marker_round_trips_and_rejects_damage() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        assert_eq!(read_clean_marker(dir.path()), None);
        write_clean_marker(dir.path(), 7, 123_456)?;
        assert_eq!(read_clean_marker(dir.path()), Some((7, 123_456)));
        let path = dir.path().join(CLEAN_MARKER);
        let mut image = fs::read(&path)?;
        image[10] ^= 1;
        fs::write(&path, image)?;
        assert_eq!(read_clean_marker(dir.path()), None);
        remove_clean_marker(dir.path())?;
        remove_clean_marker(dir.path())?;
        assert!(!path.exists());
        Ok(())
    }
}
