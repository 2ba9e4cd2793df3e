//! Hostile bytes for every decoder of stored or received data (issue 20), as bounded property
//! runs in the test command; the same properties are `cargo fuzz` targets in `tests/fuzz/` for
//! long coverage-guided runs. Each decoder must refuse bad bytes with an error, never panic,
//! and what it accepts must mean what it says (the round trips).
//! - batch payloads: `open_entry` / `unroll_entry` (a Pulsar entry: metadata, then batched
//!   messages);
//! - the single-message view, against prost's decoding of the same bytes;
//! - journal records and segment headers;
//! - the recovery scan over a segment made of arbitrary bytes after a valid prefix;
//! - cursor state and index files.

use bytes::Bytes;
use ledgerlake::ledger::cursor::CursorState;
use ledgerlake::ledger::index::{decode_index, encode_index};
use ledgerlake::ledger::record::{
    check_segment_header, decode_record, encode_record, encode_segment_header, Decoded,
};
use ledgerlake::protocol::entry::{open_entry, unroll_entry};
use ledgerlake::protocol::single_view::SingleMessageView;
use proptest::prelude::*;
use prost::Message;

const CASES: u32 = 20_000;

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, failure_persistence: None,
        ..ProptestConfig::default() })]

    #[test]
    fn batch_payloads_never_panic(data in bytes(512)) {
        let entry = Bytes::from(data);
        let _ = open_entry(&entry);
        let _ = unroll_entry(&entry);
    }

    #[test]
    fn the_single_message_view_reads_what_prost_reads(data in bytes(256)) {
        let view = SingleMessageView::parse(&data);
        let prost = ledgerlake::protocol::proto::SingleMessageMetadata::decode(&data[..]);
        if let Ok(v) = view {
            // Accepted by the view: prost accepts it and agrees on every field.
            let p = prost.map_err(|e| TestCaseError::fail(format!("prost refused: {e}")))?;
            prop_assert_eq!(v.partition_key, p.partition_key.as_deref());
            prop_assert_eq!(v.payload_size, p.payload_size);
            prop_assert_eq!(v.event_time, p.event_time);
            prop_assert_eq!(v.ordering_key, p.ordering_key.as_deref());
            let props: Vec<(String, String)> = v
                .properties()
                .map(|(k, val)| (k.to_string(), val.to_string()))
                .collect();
            let expected: Vec<(String, String)> =
                p.properties.into_iter().map(|kv| (kv.key, kv.value)).collect();
            prop_assert_eq!(props, expected);
        }
    }

    #[test]
    fn journal_records_never_panic_and_valid_ones_round_trip(
        data in bytes(256),
        ledger in any::<u64>(), entry in any::<u64>(), time in any::<i64>(),
        payload in bytes(64),
    ) {
        let _ = decode_record(&data, 128);
        let mut header = [0u8; 16];
        for (h, d) in header.iter_mut().zip(data.iter()) {
            *h = *d;
        }
        let _ = check_segment_header(&header, 1);
        let mut buf = Vec::new();
        encode_record(&mut buf, ledger, entry, time, &payload);
        buf.extend_from_slice(&data);
        match decode_record(&buf, 128) {
            Decoded::Record { record, .. } => {
                prop_assert_eq!((record.ledger_id, record.entry_id), (ledger, entry));
                prop_assert_eq!(record.publish_time_ms, time);
                prop_assert_eq!(&record.payload[..], &payload[..]);
            }
            _ => prop_assert!(false, "a valid record was not decoded"),
        }
    }

    #[test]
    fn cursor_state_never_panics_and_round_trips(data in bytes(256)) {
        if let Ok(state) = CursorState::decode(&data) {
            prop_assert_eq!(CursorState::decode(&state.encode()).ok(), Some(state));
        }
    }

    #[test]
    fn index_files_never_panic_and_round_trip(data in bytes(256), ledger in 0u64..4) {
        if let Ok(entries) = decode_index(ledger, &data) {
            prop_assert_eq!(decode_index(ledger, &encode_index(ledger, &entries)).ok(),
                Some(entries));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None,
        ..ProptestConfig::default() })]

    /// A segment: its header, valid records of ledgers 1 and 2, then arbitrary bytes. The scan
    /// never panics; below the durable floor bad bytes are refused as corruption, above it they
    /// are a torn tail and every valid record before them is found.
    #[test]
    fn the_recovery_scan_never_panics(records in 0usize..6, tail in bytes(200),
                                      floor_at_end in any::<bool>()) {
        let dir = tempfile::tempdir().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut image = encode_segment_header(1).to_vec();
        for i in 0..records {
            encode_record(&mut image, 1 + (i as u64 % 2), i as u64 / 2, 7, b"payload");
        }
        let valid_end = image.len() as u64;
        image.extend_from_slice(&tail);
        std::fs::write(ledgerlake::ledger::segment::segment_path(dir.path(), 1), &image)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let floor = if floor_at_end { image.len() as u64 } else { valid_end };
        match ledgerlake::ledger::scan_segments_for_tests(dir.path(), &[1, 2], floor, 1024) {
            Ok(found) => {
                let total: usize = found.iter().map(|(_, n)| n).sum();
                prop_assert!(total >= records, "valid records lost: {found:?} of {records}");
            }
            Err(e) => prop_assert!((floor_at_end && !tail.is_empty()) || total_ok(&e),
                "refused valid bytes, or bytes above the durable floor: {e}"),
        }
    }
}

/// A refusal the scan may make even with a torn tail: entries out of order (arbitrary tail
/// bytes can form a valid record of ledger 1 or 2 with a wrong entry id).
fn total_ok(e: &ledgerlake::ledger::OpenError) -> bool {
    e.to_string().contains("was expected")
}
