//! Feeds arbitrary bytes to the frame decoder, split at an arbitrary point as a socket would
//! deliver them: it must never panic, never allocate beyond the frame limit, and either decode
//! frames, ask for more bytes, or return an error.
#![no_main]

use bytes::BytesMut;
use ledgerlake::protocol::codec::PulsarCodec;
use libfuzzer_sys::fuzz_target;
use tokio_util::codec::Decoder;

fuzz_target!(|data: &[u8]| {
    let split = data.first().map_or(0, |b| *b as usize).min(data.len());
    let mut codec = PulsarCodec::new(64 * 1024);
    let mut buf = BytesMut::from(&data[..split]);
    let mut feed = |buf: &mut BytesMut| loop {
        match codec.decode(buf) {
            Ok(Some(_)) => continue,
            Ok(None) => return true,
            Err(_) => return false,
        }
    };
    if feed(&mut buf) {
        buf.extend_from_slice(&data[split..]);
        feed(&mut buf);
    }
    let _ = ledgerlake::protocol::frame::entry_metadata(data);
});
