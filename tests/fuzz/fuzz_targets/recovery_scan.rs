//! Arbitrary bytes after a valid segment header, scanned by recovery as the newest segment
//! (durable floor from the first byte): found entries or a corruption error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&floor_byte, rest)) = data.split_first() else {
        return;
    };
    let Ok(dir) = tempfile::tempdir() else { return };
    let mut image = ledgerlake::ledger::record::encode_segment_header(1).to_vec();
    image.extend_from_slice(rest);
    let path = ledgerlake::ledger::segment::segment_path(dir.path(), 1);
    if std::fs::write(path, &image).is_err() {
        return;
    }
    let floor = 16 + u64::from(floor_byte) * rest.len() as u64 / 255;
    let _ = ledgerlake::ledger::scan_segments_for_tests(dir.path(), &[1, 2, 3], floor, 4096);
});
