use super::*;
use proptest::prelude::*;

fn request() -> impl Strategy<Value = BookieRequest> {
    prop_oneof![
        (
            ".{0,40}",
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>()
        )
            .prop_map(|(topic, ledger, first, last, max_bytes)| {
                BookieRequest::ReadEntries {
                    topic,
                    ledger,
                    first,
                    last,
                    max_bytes,
                }
            }),
        (".{0,40}", any::<u64>())
            .prop_map(|(topic, ledger)| BookieRequest::LastConfirmed { topic, ledger }),
        (
            ".{0,40}",
            any::<u64>(),
            any::<u64>(),
            any::<i64>(),
            proptest::collection::vec(any::<u8>(), 0..64),
            any::<bool>()
        )
            .prop_map(|(topic, ledger, entry, publish_time_ms, p, recovery)| {
                BookieRequest::AddEntry {
                    topic,
                    ledger,
                    entry,
                    publish_time_ms,
                    payload: Bytes::from(p),
                    recovery,
                }
            }),
        (".{0,40}", any::<u64>())
            .prop_map(|(topic, ledger)| BookieRequest::Fence { topic, ledger }),
        (".{0,40}", any::<u64>(), any::<u64>()).prop_map(|(topic, ledger, count)| {
            BookieRequest::Sealed {
                topic,
                ledger,
                count,
            }
        }),
        ".{0,400}".prop_map(|token| BookieRequest::Hello { token }),
    ]
}

fn response() -> impl Strategy<Value = BookieResponse> {
    let entry = (
        any::<u64>(),
        any::<i64>(),
        proptest::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(|(entry, publish_time_ms, p)| WireEntry {
            entry,
            publish_time_ms,
            payload: Bytes::from(p),
        });
    let code = prop_oneof![
        Just(BookieErrorCode::NotHeld),
        Just(BookieErrorCode::NoSuchEntry),
        Just(BookieErrorCode::Corrupt),
        Just(BookieErrorCode::Unavailable),
        Just(BookieErrorCode::BadRequest),
        Just(BookieErrorCode::Unauthorized),
    ];
    prop_oneof![
        proptest::collection::vec(entry, 0..8).prop_map(BookieResponse::Entries),
        (any::<u64>(), any::<bool>())
            .prop_map(|(count, open)| BookieResponse::LastConfirmed { count, open }),
        (any::<u64>(), any::<u64>())
            .prop_map(|(ledger, entry)| BookieResponse::Added { ledger, entry }),
        (
            (any::<u32>(), any::<u64>(), any::<u64>()),
            (any::<Option<i64>>(), any::<Option<i64>>()),
            (any::<u32>(), any::<u32>())
        )
            .prop_map(
                |((first_segment, entry_count, size_bytes), (lo, hi), (last, crc))| {
                    BookieResponse::Fenced(WireCopy {
                        first_segment,
                        entry_count,
                        size_bytes,
                        min_publish_ms: lo,
                        max_publish_ms: hi,
                        last_segment: last,
                        checksum: crc,
                    })
                }
            ),
        (code, any::<u64>(), ".{0,60}")
            .prop_map(|(code, available, message)| BookieResponse::error(code, available, message)),
        ".{0,40}".prop_map(|role| BookieResponse::Welcome { role }),
    ]
}

proptest! {
    #[test]
    fn requests_round_trip(id in any::<u64>(), req in request()) {
        let frame = encode_request(id, &req);
        prop_assert_eq!(frame[0], VERSION);
        prop_assert_eq!(decode_request(frame), Ok((id, req)));
    }

    #[test]
    fn responses_round_trip(id in any::<u64>(), resp in response()) {
        prop_assert_eq!(decode_response(encode_response(id, &resp)), Ok((id, resp)));
    }

    #[test]
    fn any_flipped_bit_is_refused(id in any::<u64>(), resp in response(), at in any::<prop::sample::Index>(), bit in 0u8..8) {
        let mut bytes = encode_response(id, &resp).to_vec();
        let i = at.index(bytes.len());
        bytes[i] ^= 1 << bit;
        prop_assert!(decode_response(Bytes::from(bytes)).is_err());
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = decode_request(Bytes::from(bytes.clone()));
        let _ = decode_response(Bytes::from(bytes));
    }
}

/// Re-seals a hand-made frame body with a valid checksum, to reach the field checks.
fn sealed(body: &[u8]) -> Bytes {
    let mut b = BytesMut::from(body);
    let crc = crc32c::crc32c(&b);
    b.put_u32(crc);
    b.freeze()
}

#[test]
fn other_versions_kinds_and_lying_counts_are_refused() {
    let mut frame = encode_request(
        7,
        &BookieRequest::LastConfirmed {
            topic: "t".into(),
            ledger: 1,
        },
    )
    .to_vec();
    frame[0] = 1;
    assert_eq!(
        decode_request(Bytes::from(frame)),
        Err(BookieWireError::Version(1)),
        "a node of the protocol before adds is refused"
    );
    let mut unknown = vec![VERSION, 0x42];
    unknown.extend_from_slice(&7u64.to_be_bytes());
    assert!(matches!(
        decode_request(sealed(&unknown)),
        Err(BookieWireError::Malformed(_))
    ));
    // An entries response claiming four billion entries in a few bytes.
    let mut lying = vec![VERSION, KIND_ENTRIES];
    lying.extend_from_slice(&7u64.to_be_bytes());
    lying.extend_from_slice(&u32::MAX.to_be_bytes());
    assert!(matches!(
        decode_response(sealed(&lying)),
        Err(BookieWireError::Malformed(_))
    ));
    // A request followed by junk.
    let mut trailing = encode_request(
        1,
        &BookieRequest::LastConfirmed {
            topic: "t".into(),
            ledger: 1,
        },
    )
    .to_vec();
    trailing.truncate(trailing.len() - TAIL);
    trailing.push(0);
    assert!(matches!(
        decode_request(sealed(&trailing)),
        Err(BookieWireError::Malformed(_))
    ));
    assert!(decode_request(Bytes::new()).is_err());
}
