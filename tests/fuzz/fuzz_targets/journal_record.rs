//! Arbitrary bytes as journal records and segment headers: decoding returns a record, the end,
//! a request for more bytes or an error, never a panic.
#![no_main]

use ledgerlake::ledger::record::{check_segment_header, decode_record, decode_record_shared};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decode_record(data, 64 * 1024);
    let _ = decode_record_shared(&bytes::Bytes::copy_from_slice(data), 64 * 1024);
    if let Some(header) = data.get(..16) {
        let mut h = [0u8; 16];
        h.copy_from_slice(header);
        let _ = check_segment_header(&h, 1);
    }
});
