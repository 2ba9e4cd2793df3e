//! Arbitrary bytes as a cursor state and as an index file: decoding refuses or accepts, never
//! panics, and what it accepts encodes back to the same value.
#![no_main]

use ledgerlake::ledger::cursor::CursorState;
use ledgerlake::ledger::index::{decode_index, encode_index};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(state) = CursorState::decode(data) {
        assert_eq!(CursorState::decode(&state.encode()).ok(), Some(state));
    }
    if let Ok(entries) = decode_index(3, data) {
        assert_eq!(decode_index(3, &encode_index(3, &entries)).ok(), Some(entries));
    }
});
