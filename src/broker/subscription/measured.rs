//! What a subscription publishes to its measures: its cursor after every step of its task,
//! its consumers' dispatch rates (sampled at every persist tick, read by their stats) and
//! (Key_Shared) which consumers' hash ranges carry most of the traffic.

use std::sync::atomic::Ordering;

use super::State;
use crate::broker::backlog::ConsumerStats;
use crate::broker::measure::{hot_threshold, is_hot, CursorView};
use crate::protocol::proto::command_subscribe::SubType;

impl State {
    /// Each consumer's stats, in attach order.
    pub(super) fn consumer_stats(&self) -> Vec<ConsumerStats> {
        let window = self.topic.measures.settings.rate_window_ms;
        let per_consumer = self.unacked_limits().0;
        self.consumers
            .iter()
            .map(|c| {
                // The rate before the sample: a sample taken now would be the only one within
                // the window when the last was taken longer ago, and the rate would read 0.
                let rate = c.sent.rate(window);
                c.sent.sample(window);
                let (msgs, bytes) = c.sent.totals();
                ConsumerStats {
                    consumer_name: c.name.clone(),
                    msg_rate_out: rate.msgs,
                    msg_throughput_out: rate.bytes,
                    msg_out_counter: msgs,
                    bytes_out_counter: bytes,
                    // Java ints in Pulsar's stats (a client may send any FLOW).
                    available_permits: c.permits.clamp(0, i64::from(i32::MAX)),
                    unacked_messages: c.gate.unacked.min(i32::MAX as u64),
                    blocked_consumer_on_unacked_msgs: c.gate.blocked(per_consumer),
                    priority_level: c.priority,
                    address: c.client.address.clone(),
                    client_version: c.client.version.clone(),
                    connected_since: crate::broker::backlog::timestamp(c.attached),
                }
            })
            .collect()
    }

    /// Publishes the cursor (positions, unacknowledged messages, pause, consumers) for
    /// metrics; a small lock, no `.await`.
    pub(super) fn publish_cursor(&self) {
        self.measures.publish(CursorView {
            first_unacked: self.first_unacked(),
            acked_after: self.acked.len() as u64,
            read_position: self.read_position,
            unacked_messages: self.gate.unacked,
            blocked: self.gate.blocked(self.unacked_limits().1),
            consumers: self.consumers.len() as u64,
        });
    }

    /// Key_Shared: flags the consumers whose share of the subscription's dispatch rate exceeds
    /// the hot factor times an even share, warning once when one turns hot.
    pub(super) fn check_hot_consumers(&mut self) {
        let settings = self.topic.measures.settings;
        let window = settings.rate_window_ms;
        if settings.enabled {
            // Every type's consumers: their stats read these rates.
            for c in &self.consumers {
                c.sent.sample(window);
            }
        }
        if !settings.enabled || self.sub_type != SubType::KeyShared {
            self.measures.hot_consumers.store(0, Ordering::Relaxed);
            return;
        }
        let rates: Vec<f64> = self
            .consumers
            .iter()
            .map(|c| c.sent.rate(window).msgs)
            .collect();
        let total: f64 = rates.iter().sum();
        let n = self.consumers.len();
        let mut hot_count = 0;
        for (c, rate) in self.consumers.iter_mut().zip(&rates) {
            let share = if total > 0.0 { rate / total } else { 0.0 };
            let hot = is_hot(&settings, share, n, total);
            if hot && !c.hot {
                tracing::warn!(topic = %self.topic.name, subscription = %self.name,
                    consumer = %c.name, share = format!("{share:.3}"),
                    threshold = format!("{:.3}", hot_threshold(&settings, n)), consumer_rate = rate,
                    subscription_rate = total, consumers = n,
                    "hot Key_Shared consumer: its hash range carries most of the traffic");
            }
            c.hot = hot;
            hot_count += u64::from(hot);
        }
        self.measures
            .hot_consumers
            .store(hot_count, Ordering::Relaxed);
    }
}
