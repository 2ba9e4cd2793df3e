//! The broker's topic slots: one per topic partition name in use here, each a lock around
//! the loaded topic (or nothing). A slot is made by whatever needs a name's slot (a PRODUCER or
//! SUBSCRIBE that loads the topic, an unload, a deletion) and taken out of the map again as
//! soon as nobody holds it and it holds no topic, so names touched once (topics unloaded for
//! idleness, deleted, a lookup of a topic that could not load) cost nothing afterwards.
//!
//! Invariants:
//! - At most one slot per name is in the map, and every holder of a name's slot got it from
//!   the map: two loads of one name always meet on one lock.
//! - References to a slot are taken and given up only under the map's lock (through
//!   [`SlotHandle`]; the shutdown's clones keep their slots in the map), so the last holder
//!   to let go sees only the map's reference and its own.
//! - A slot leaves the map only under the map's lock, when the map's reference and the
//!   leaving holder's are the only ones and it holds no topic.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{lock, Broker, BrokerTopic};

/// One topic partition's place in the broker: empty until loaded. Its lock is held while the
/// topic loads or is deleted (so nobody sees it half-loaded or half-deleted) and briefly by
/// every PRODUCER and SUBSCRIBE that looks it up.
#[derive(Debug, Default)]
pub(super) struct TopicSlot(pub(super) tokio::sync::Mutex<Option<Arc<BrokerTopic>>>);

/// The slots by full topic name.
pub(super) type Slots = Mutex<HashMap<String, Arc<TopicSlot>>>;

/// A holder's reference to a slot; dropping it takes an empty slot nobody else holds out of
/// the map. Lock guards of the slot borrow this handle, so they are dropped first.
pub(super) struct SlotHandle<'a> {
    slots: &'a Slots,
    key: String,
    /// Invariant: `Some` until the handle is dropped (taken there, under the map's lock).
    slot: Option<Arc<TopicSlot>>,
}

impl std::ops::Deref for SlotHandle<'_> {
    type Target = TopicSlot;

    fn deref(&self) -> &TopicSlot {
        self.slot
            .as_ref()
            .expect("a slot handle holds its slot until dropped")
    }
}

impl Drop for SlotHandle<'_> {
    fn drop(&mut self) {
        let mut slots = lock(self.slots);
        let Some(slot) = self.slot.take() else {
            return;
        };
        // The map's reference and this one: nobody else holds or waits on the slot. This
        // reference goes while the map's lock is held, so of two holders letting go at once
        // the second sees the first gone.
        let alone = Arc::strong_count(&slot) == 2
            && slots.get(&self.key).is_some_and(|s| Arc::ptr_eq(s, &slot));
        if alone && slot.0.try_lock().is_ok_and(|t| t.is_none()) {
            slots.remove(&self.key);
            crate::memory::shrink_sparse(&mut slots);
        }
        drop(slot);
    }
}

/// The slot of topic partition `key` in `slots`, made if it has none.
fn take<'a>(slots: &'a Slots, key: &str) -> SlotHandle<'a> {
    let slot = lock(slots).entry(key.to_string()).or_default().clone();
    SlotHandle {
        slots,
        key: key.to_string(),
        slot: Some(slot),
    }
}

/// The slot of topic partition `key` in `slots` if it has one (none is made).
fn existing<'a>(slots: &'a Slots, key: &str) -> Option<SlotHandle<'a>> {
    let slot = lock(slots).get(key).cloned()?;
    Some(SlotHandle {
        slots,
        key: key.to_string(),
        slot: Some(slot),
    })
}

impl Broker {
    /// The slot of topic partition `key`, made if it has none.
    pub(super) fn slot(&self, key: &str) -> SlotHandle<'_> {
        take(&self.topics, key)
    }

    /// The slot of topic partition `key` if it has one.
    pub(super) fn existing_slot(&self, key: &str) -> Option<SlotHandle<'_>> {
        existing(&self.topics, key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held<'a>(handle: &'a SlotHandle<'_>) -> &'a Arc<TopicSlot> {
        handle.slot.as_ref().expect("held until dropped")
    }

    #[tokio::test]
    async fn an_empty_slot_leaves_the_map_with_its_last_holder() {
        let slots = Slots::default();
        let first = take(&slots, "t");
        let second = take(&slots, "t");
        assert!(
            Arc::ptr_eq(held(&first), held(&second)),
            "one slot per name"
        );
        drop(first);
        assert_eq!(lock(&slots).len(), 1, "another holder still has it");
        drop(second);
        assert!(lock(&slots).is_empty(), "nobody holds it and it is empty");
    }

    #[tokio::test]
    async fn a_slot_someone_waits_on_stays() {
        let slots = Arc::new(Slots::default());
        let holder = take(&slots, "t");
        let guard = holder.0.lock().await;
        let (locked_tx, locked_rx) = tokio::sync::oneshot::channel();
        let waiter = {
            let slots = slots.clone();
            tokio::spawn(async move {
                let handle = take(&slots, "t");
                let _locked = handle.0.lock().await;
                let _ = locked_tx.send(lock(&slots).len());
            })
        };
        // The waiter holds a reference while it waits: dropping the first holder keeps it.
        while Arc::strong_count(held(&holder)) < 3 {
            tokio::task::yield_now().await;
        }
        drop(guard);
        drop(holder);
        assert_eq!(
            locked_rx.await.ok(),
            Some(1),
            "the waiter locked the slot in the map"
        );
        waiter.await.expect("waiter");
        assert!(lock(&slots).is_empty());
    }

    #[test]
    fn holders_letting_go_at_once_leave_no_slot_behind() {
        for _ in 0..200 {
            let slots = Arc::new(Slots::default());
            let barrier = Arc::new(std::sync::Barrier::new(4));
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    let (slots, barrier) = (slots.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        let handle = take(&slots, "t");
                        barrier.wait();
                        drop(handle);
                    })
                })
                .collect();
            for t in threads {
                t.join().expect("thread");
            }
            assert!(lock(&slots).is_empty(), "the last holder took the slot out");
        }
    }

    #[test]
    fn looking_at_an_existing_slot_makes_none() {
        let slots = Slots::default();
        assert!(existing(&slots, "t").is_none());
        assert!(lock(&slots).is_empty());
        let made = take(&slots, "t");
        let seen = existing(&slots, "t").expect("made");
        drop(made);
        assert_eq!(lock(&slots).len(), 1);
        drop(seen);
        assert!(lock(&slots).is_empty());
    }
}
