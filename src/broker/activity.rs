//! What changed since the broker's stats tick last looked. A loaded topic partition whose
//! measures move (an append, a dispatch, an acknowledgement, an expiry) puts itself in a queue,
//! once, through its [`Marker`]; the tick takes the queue and works through those topics and
//! through the ones it still watches ([`Watched`]: rates not yet back at zero, a lag spiral or
//! hot flag not yet cleared), never through every loaded topic. A watched topic that did not
//! change is sampled once a rate step, not every tick. An idle loaded topic costs the tick
//! nothing, and the tick's time follows the traffic, not the number of topics.
//!
//! Invariants:
//! - A marker is in the queue at most once: its `queued` flag is set from the moment it is
//!   pushed until the tick that took it clears it. Anything recorded after that clear queues
//!   the topic again, so no change goes unseen by the next tick.
//! - [`Watched`] holds only topics whose owner still runs (checked by the tick each time,
//!   before it samples any: an unloaded, deleted or handed-over topic's owner has stopped, so
//!   one atomic read tells, and the tick never waits on the broker's loaded index).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::{lock, BrokerTopic};

/// The queue of topics that changed since the tick last took it (one per broker).
#[derive(Debug, Default)]
pub(crate) struct Activity {
    /// Invariant: each marker at most once (see the module's invariants).
    queue: Mutex<Vec<Arc<Marker>>>,
}

impl Activity {
    /// Takes the queued markers and clears their flags: from now on their topics queue again
    /// on their next change.
    pub fn take(&self) -> Vec<Arc<Marker>> {
        let taken = std::mem::take(&mut *lock(&self.queue));
        for m in &taken {
            m.queued.store(false, Ordering::Release);
        }
        taken
    }
}

/// One topic's way into the [`Activity`] queue.
#[derive(Debug)]
pub(crate) struct Marker {
    /// The topic's full name.
    pub key: Arc<str>,
    /// Invariant: set exactly while this marker is queued and not yet taken.
    queued: AtomicBool,
    to: Arc<Activity>,
}

impl Marker {
    /// The marker of topic `key`, queueing into `to`.
    pub fn new(key: &str, to: &Arc<Activity>) -> Arc<Marker> {
        Arc::new(Marker {
            key: key.into(),
            queued: AtomicBool::new(false),
            to: to.clone(),
        })
    }

    /// Notes a change: queues the topic unless it is queued already (one relaxed load on the
    /// hot path when it is).
    pub fn touch(self: &Arc<Self>) {
        if self.queued.load(Ordering::Relaxed) || self.queued.swap(true, Ordering::AcqRel) {
            return;
        }
        lock(&self.to.queue).push(self.clone());
    }
}

/// The topics the stats tick samples, by full name: those that changed, until they are quiet
/// again. Owned by the tick's task.
pub(crate) type Watched = HashMap<Arc<str>, Watch>;

/// One watched topic.
#[derive(Debug)]
pub(crate) struct Watch {
    pub topic: Arc<BrokerTopic>,
    /// A partition's base topic (its partitions' shares are evaluated together).
    pub base: Option<Arc<str>>,
    /// When the tick samples it next ([`crate::metrics::meter::mono_ms`]): at once after a
    /// change, else when its meters are due their next sample (a topic whose traffic stopped
    /// only waits for its rates to reach zero, and a meter needs one sample a step).
    pub next_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topic_is_queued_once_until_taken_and_again_after() {
        let activity = Arc::new(Activity::default());
        let (a, b) = (Marker::new("a", &activity), Marker::new("b", &activity));
        a.touch();
        a.touch();
        b.touch();
        let keys = |v: Vec<Arc<Marker>>| v.iter().map(|m| m.key.to_string()).collect::<Vec<_>>();
        assert_eq!(keys(activity.take()), ["a", "b"]);
        assert!(activity.take().is_empty(), "nothing changed since");
        a.touch();
        assert_eq!(
            keys(activity.take()),
            ["a"],
            "a change after the take queues again"
        );
    }
}
