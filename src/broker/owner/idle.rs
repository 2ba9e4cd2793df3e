//! The owner's idle timer: unloading an idle topic (`broker.unload_idle_after`) and deleting
//! an inactive one (inactive-topic policies, Pulsar's semantics). One timer per loaded topic,
//! re-armed only when it fires or the policies change; commands just note the time.
//!
//! Invariants:
//! - A topic whose inactive-topic rule would delete it once its duration passes is not
//!   unloaded before: it is deleted then (the rule is only applied to loaded topics, as
//!   Pulsar applies it).
//! - The owner only asks; the broker (unload, under the topic's slot lock, asking again
//!   through `UnloadIfIdle`) and the operations layer (a deletion refused while clients are
//!   attached) decide.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{IdleAsk, Owner};
use crate::broker::subscription::SubscriptionCommand;
use crate::config::InactiveTopicDeleteMode;

/// The timer's period when neither idleness nor inactivity is watched (a policy change arms
/// it anew), and its shortest one.
const NO_WATCH: Duration = Duration::from_secs(3600);
const SHORTEST: Duration = Duration::from_secs(1);

impl Owner {
    /// Whether no client is attached or waiting and no backlog check runs.
    pub(super) fn is_idle(&self) -> bool {
        self.producers.is_empty()
            && self.waiting.is_empty()
            && self.topic.limits.attached() == 0
            && self.check.is_none()
    }

    /// Idle, and for the whole idle period (appends in flight are the caller's to check).
    pub(super) fn idle_enough(&self) -> bool {
        self.is_idle()
            && self
                .idle
                .as_ref()
                .and_then(|i| i.after)
                .is_some_and(|after| self.last_busy.elapsed() >= after)
    }

    /// How often the timer looks: the shorter of the idle period and the inactive duration.
    pub(super) fn idle_period(&self) -> Duration {
        let idle = self.idle.as_ref().and_then(|i| i.after);
        let inactive = self.policies.inactive.map(|r| r.after);
        match (idle, inactive) {
            (None, None) => NO_WATCH,
            (a, b) => a
                .into_iter()
                .chain(b)
                .min()
                .unwrap_or(NO_WATCH)
                .max(SHORTEST),
        }
    }

    /// The timer fired: asks to be deleted (inactive) or unloaded (idle) when due. Returns
    /// when to look again.
    pub(super) async fn idle_tick(&mut self, appends_empty: bool) -> Instant {
        let now = Instant::now();
        let period = self.idle_period();
        if !appends_empty || !self.is_idle() {
            self.last_busy = now;
        }
        let unattached = appends_empty && self.is_idle();
        if let Some(rule) = self.policies.inactive {
            if unattached && self.inactive(rule.mode).await {
                let due = self.last_publish + rule.after;
                if now >= due {
                    self.ask(IdleAsk::Delete);
                    return now + period;
                }
                // Deleted once the duration passes: kept loaded until then.
                return due;
            }
        }
        if unattached && self.idle_enough() {
            // The broker answers through `UnloadIfIdle`; should the topic still be here after
            // another period (it became busy), it asks again.
            self.ask(IdleAsk::Unload);
            return now + period;
        }
        // The idle period counts from the last client; an inactive rule is looked at every
        // period whatever it.
        match self.idle.as_ref().and_then(|i| i.after) {
            Some(after) => (self.last_busy + after)
                .min(now + period)
                .max(now + SHORTEST),
            None => now + period,
        }
    }

    /// Whether the mode's condition on subscriptions holds (producers and consumers are the
    /// caller's to check).
    async fn inactive(&self, mode: InactiveTopicDeleteMode) -> bool {
        let mut durable = self.subscriptions.values().filter(|s| s.durable);
        match mode {
            InactiveTopicDeleteMode::NoSubscriptions => durable.next().is_none(),
            InactiveTopicDeleteMode::SubscriptionsCaughtUp => {
                for s in durable {
                    match s.ask(SubscriptionCommand::Stats).await {
                        Some(st) if st.msg_backlog == 0 && st.consumers.is_empty() => {}
                        _ => return false,
                    }
                }
                true
            }
        }
    }

    /// Asks the broker (nothing when the owner was started without a queue: tests).
    pub(super) fn ask(&self, what: IdleAsk) {
        if let Some(i) = &self.idle {
            let _ = i.ask.send((Arc::downgrade(&self.topic), what));
        }
    }
}
