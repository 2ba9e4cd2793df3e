//! What topic stats show of each connected producer (Pulsar's `publishers` array of
//! `PublisherStats`): who it is, and the messages and bytes of its durable appends.
//!
//! Invariants:
//! - A [`PublisherMeasure`] is made once per registration (a connection's PRODUCER) and is
//!   that registration's identity throughout: its slot in the topic's owner, each of its SENDs
//!   and the topic's measures ([`super::measure::TopicMeasures::publishers`]) hold the same
//!   one, so its counters hold exactly this registration's durable appends (recorded by the
//!   owner as it settles them, as the topic's `msgRateIn`), never those of an earlier or later
//!   producer of the same name.
//! - With `metrics.enabled` off nothing is recorded (the counters and rates read 0).

use std::sync::Arc;
use std::time::SystemTime;

use serde::Serialize;

use super::backlog::ClientInfo;
use crate::metrics::meter::Meter;

/// One producer registration: who it is and the counters of its durable appends.
#[derive(Debug)]
pub(crate) struct PublisherMeasure {
    /// Its id on its connection.
    pub producer_id: u64,
    /// Its name (the client's or the broker's): the deduplication key.
    pub name: Arc<str>,
    /// The access mode its PRODUCER asked for, as Pulsar names it.
    pub access_mode: &'static str,
    /// Its connection's client.
    pub client: Arc<ClientInfo>,
    /// When it registered.
    pub since: SystemTime,
    /// Messages and bytes of its durable appends (sampled by the stats tick).
    pub appended: Meter,
}

impl PublisherMeasure {
    pub(crate) fn new(
        producer_id: u64,
        name: Arc<str>,
        access_mode: &'static str,
        client: Arc<ClientInfo>,
    ) -> Self {
        Self {
            producer_id,
            name,
            access_mode,
            client,
            since: SystemTime::now(),
            appended: Meter::default(),
        }
    }

    /// Its stats, rates over `window_ms` (the metrics' rate window).
    pub(crate) fn stats(&self, window_ms: u64) -> PublisherStats {
        let rate = self.appended.rate(window_ms);
        let (messages, bytes) = self.appended.totals();
        PublisherStats {
            producer_id: self.producer_id,
            producer_name: self.name.to_string(),
            access_mode: self.access_mode,
            msg_rate_in: rate.msgs,
            msg_throughput_in: rate.bytes,
            average_msg_size: if messages > 0 {
                bytes as f64 / messages as f64
            } else {
                0.0
            },
            msg_in_counter: messages,
            bytes_in_counter: bytes,
            address: self.client.address.clone(),
            client_version: self.client.version.clone(),
            connected_since: super::backlog::timestamp(self.since),
        }
    }
}

/// Stats of one producer: Pulsar's `PublisherStats` names (the fields it has that this broker
/// does not keep are left out), and the counters `msgInCounter` and `bytesInCounter`, which
/// Pulsar's topic stats have and its publisher stats do not.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PublisherStats {
    /// Its id on its connection.
    pub producer_id: u64,
    /// Its name.
    pub producer_name: String,
    /// `Shared`, `Exclusive`, `ExclusiveWithFencing` or `WaitForExclusive`, as its PRODUCER
    /// asked (any mode but `Shared` is alone on the topic; `WaitForExclusive` waits its turn,
    /// the others are refused while another producer is there).
    pub access_mode: &'static str,
    /// Messages per second appended (the metrics' rate window).
    pub msg_rate_in: f64,
    /// Bytes per second appended.
    pub msg_throughput_in: f64,
    /// Bytes per message since it registered.
    pub average_msg_size: f64,
    /// Messages appended since it registered.
    pub msg_in_counter: u64,
    /// Bytes appended since it registered.
    pub bytes_in_counter: u64,
    /// Its client's address (`/host:port`).
    pub address: String,
    /// Its client's version, as its CONNECT gave it.
    pub client_version: String,
    /// When it registered (RFC 3339, UTC).
    pub connected_since: String,
}
