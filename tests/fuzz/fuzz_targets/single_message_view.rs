//! Arbitrary bytes as a batched message's `SingleMessageMetadata`: the hand-written view must
//! never panic, and whatever it accepts prost must accept with the same fields.
#![no_main]

use ledgerlake::protocol::single_view::SingleMessageView;
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Ok(view) = SingleMessageView::parse(data) else {
        return;
    };
    let p = ledgerlake::protocol::proto::SingleMessageMetadata::decode(data)
        .expect("the view accepted bytes prost refuses");
    assert_eq!(view.partition_key, p.partition_key.as_deref());
    assert_eq!(view.payload_size, p.payload_size);
    assert_eq!(view.event_time, p.event_time);
    assert_eq!(view.ordering_key, p.ordering_key.as_deref());
    assert!(view
        .properties()
        .eq(p.properties.iter().map(|kv| (kv.key.as_str(), kv.value.as_str()))));
});
