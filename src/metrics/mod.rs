//! What the service measures and how `GET /metrics` shows it (Prometheus text format 0.0.4,
//! through the `prometheus-client` crate).
//!
//! - [`meter`]: the per-topic building blocks ([`meter::Meter`]: counters with a rate over a
//!   sliding window; [`meter::Buckets`]: Pulsar's fixed-bound histograms). The broker keeps
//!   them on each loaded topic and subscription and records into them on the hot path
//!   (atomics only).
//! - [`node`]: ledgerlake's node-wide families (journal fsync latency and group-commit size,
//!   lake commits, replay reads by tier, SQL queries), one set per process.
//! - [`pulsar`]: Pulsar's topic and subscription families, encoded from rows read at scrape
//!   time.
//!
//! A leaf: it imports no other module of the crate, so every layer can record into it.

pub mod meter;
pub mod node;
pub mod pulsar;

pub use node::node;

/// The content type of [`encode`]'s text.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The text of one scrape: the node families, the data directory's volume (when it could be
/// read), then the Pulsar families of `topics`.
pub fn encode(
    topics: pulsar::PulsarFamilies,
    data_dir: Option<node::DataDir>,
) -> Result<String, std::fmt::Error> {
    let mut out = String::with_capacity(4096 + topics.rows.len() * 4096);
    prometheus_client::encoding::prometheus_text::encode(&mut out, node().registry())?;
    let mut registry = prometheus_client::registry::Registry::default();
    if let Some(d) = data_dir {
        registry.register_collector(Box::new(d));
    }
    registry.register_collector(Box::new(topics));
    prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)?;
    Ok(out)
}
