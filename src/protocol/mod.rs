//! The wire protocols: Pulsar's binary protocol and the node-to-node bookie protocol; the only
//! place that touches protocol bytes.
//!
//! - [`proto`]: types generated from `schemas/pulsar/PulsarApi.proto` (our description of the
//!   wire protocol, compatible with Apache Pulsar).
//! - [`frame`]: framing: a cheap check for a complete frame, then parsing into the command and a
//!   checksum-verified payload; encoders for outgoing frames.
//! - [`command`] / [`inbound`]: frames typed into commands (enum codes and sentinel ids decoded
//!   once), and the outbound commands' constructors.
//! - [`bookie`]: the node-to-node bookie protocol (versioned, checksummed frames), typed the
//!   same way.
//! - [`entry`] / [`rebuild`]: stored entries opened and unrolled into messages (batches read in
//!   place through [`single_view`]), and rebuilt from them.
//!
//! Invariant: nothing outside this module reads or writes raw frames; the broker receives typed
//! commands and hands back typed responses.

#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    //! Generated protobuf types of the Pulsar protocol.
    include!(concat!(env!("OUT_DIR"), "/pulsar.proto.rs"));
}

pub mod bookie;
pub mod client;
pub mod codec;
pub mod command;
pub mod entry;
pub mod frame;
pub mod inbound;
pub mod rebuild;
pub mod single_view;
