//! A connection's outbound queue, as everything that sends on it sees it: a bounded queue of
//! frames plus a count of the message bytes in it, so that dispatchers can tell whether the
//! connection is writable, as Pulsar asks of Netty's channel.
//!
//! A consumer that grants permits but never reads its socket would otherwise make its
//! subscription wait on a full queue: every other consumer of a Shared subscription stalls
//! behind it, and up to a queue's worth of messages (of up to the largest message size each)
//! stays in memory. Through an [`Outbox`], a dispatcher sends a MESSAGE only while the
//! connection is [`Outbox::writable`] and never waits for room ([`Outbox::try_deliver`]); it
//! waits for [`Outbox::drained`] instead, and serves other consumers meanwhile.
//!
//! Invariants:
//! - `queued` counts the payload bytes of MESSAGE frames queued and not yet written: added when
//!   a frame is queued, subtracted by the connection's writer ([`OutboxReceiver::written`]),
//!   both with [`message_bytes`].
//! - A connection holds at most [`HIGH_WATER`] bytes of messages plus one message, whatever
//!   its permits, and at most [`OVERFLOW_LIMIT`] control frames its queue had no room for.
//! - Frames queued through one [`Outbox`] leave in the order they were given to it, except
//!   that [`Outbox::send`] (a connection's own replies) may pass control frames waiting in the
//!   overflow.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::mpsc::error::{SendError, TrySendError};
use tokio::sync::{mpsc, Notify};

use crate::protocol::command::Outbound;

/// Outbound frames queued per connection before senders wait.
pub const QUEUE_FRAMES: usize = 1024;

/// Message bytes queued on a connection above which it is not writable (Pulsar's channel
/// high-water mark is 64 KiB; a larger mark keeps batches of large messages flowing).
pub const HIGH_WATER: usize = 1 << 20;

/// Frames [`Outbox::send_detached`] keeps for a connection that does not read, at most.
pub const OVERFLOW_LIMIT: usize = 256;

#[derive(Debug, Default)]
struct Shared {
    queued: AtomicUsize,
    drained: Notify,
    /// Frames `send_detached` could not queue at once, in order; one task moves them into the
    /// queue. Invariant: while it is not empty that task runs, and no MESSAGE is queued (none
    /// overtakes them).
    overflow: Mutex<VecDeque<Outbound>>,
    /// Invariant: whether `overflow` is not empty (set and cleared under its lock), so that
    /// the dispatch path checks it without the lock.
    overflowing: AtomicBool,
}

impl Shared {
    fn overflow(&self) -> MutexGuard<'_, VecDeque<Outbound>> {
        self.overflow.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The sending side of one connection's outbound queue.
#[derive(Debug, Clone)]
pub struct Outbox {
    tx: mpsc::Sender<Outbound>,
    shared: Arc<Shared>,
}

/// The writer's side: frames in order, and the count to settle after writing them.
#[derive(Debug)]
pub struct OutboxReceiver {
    /// Frames, in the order they were queued.
    pub rx: mpsc::Receiver<Outbound>,
    shared: Arc<Shared>,
}

/// A new queue.
pub fn outbox() -> (Outbox, OutboxReceiver) {
    let (tx, rx) = mpsc::channel(QUEUE_FRAMES);
    let shared = Arc::new(Shared::default());
    (
        Outbox {
            tx,
            shared: shared.clone(),
        },
        OutboxReceiver { rx, shared },
    )
}

/// The bytes of `o` that count against [`HIGH_WATER`] (a MESSAGE's payload; commands are
/// small and bounded by the frame count).
pub fn message_bytes(o: &Outbound) -> usize {
    match o {
        Outbound::Message(_, payload) => payload.len(),
        Outbound::Command(_) => 0,
    }
}

impl Outbox {
    /// Queues `o`, waiting while the queue is full (commands and receipts: their senders are
    /// paced by the client's own requests).
    pub async fn send(&self, o: Outbound) -> Result<(), SendError<Outbound>> {
        let bytes = message_bytes(&o);
        self.shared.queued.fetch_add(bytes, Ordering::AcqRel);
        self.tx.send(o).await.inspect_err(|_| {
            self.shared.queued.fetch_sub(bytes, Ordering::AcqRel);
        })
    }

    /// Queues `o` without making the caller wait: when the queue is full it joins the
    /// connection's overflow, which one task moves into the queue in order (a dispatcher's
    /// CLOSE_CONSUMER or ACTIVE_CONSUMER_CHANGE must not wait on a client that does not read,
    /// nor be lost or reordered for one that reads slowly). A connection whose overflow already
    /// holds [`OVERFLOW_LIMIT`] frames has not read for that long: `o` is dropped.
    pub fn send_detached(&self, o: Outbound) {
        let mut overflow = self.shared.overflow();
        if !overflow.is_empty() {
            if overflow.len() < OVERFLOW_LIMIT {
                overflow.push_back(o);
            } else {
                tracing::debug!("a connection that does not read: a control frame dropped");
            }
            return;
        }
        let bytes = message_bytes(&o);
        self.shared.queued.fetch_add(bytes, Ordering::AcqRel);
        match self.tx.try_send(o) {
            Ok(()) => {}
            Err(TrySendError::Closed(_)) => {
                self.shared.queued.fetch_sub(bytes, Ordering::AcqRel);
            }
            Err(TrySendError::Full(o)) => {
                self.shared.queued.fetch_sub(bytes, Ordering::AcqRel);
                overflow.push_back(o);
                self.shared.overflowing.store(true, Ordering::Release);
                tokio::spawn(drain_overflow(self.tx.clone(), self.shared.clone()));
            }
        }
    }

    /// Whether a dispatcher may send a MESSAGE now.
    pub fn writable(&self) -> bool {
        self.shared.queued.load(Ordering::Acquire) < HIGH_WATER
            && self.tx.capacity() > 0
            && !self.shared.overflowing.load(Ordering::Acquire)
    }

    /// Queues a MESSAGE without waiting: `Full` when the connection is not writable (the
    /// message is handed back), `Closed` when the connection is gone.
    pub fn try_deliver(&self, o: Outbound) -> Result<(), TrySendError<Outbound>> {
        if self.tx.is_closed() {
            return Err(TrySendError::Closed(o));
        }
        if self.shared.overflowing.load(Ordering::Acquire)
            || self.shared.queued.load(Ordering::Acquire) >= HIGH_WATER
        {
            return Err(TrySendError::Full(o));
        }
        let bytes = message_bytes(&o);
        self.shared.queued.fetch_add(bytes, Ordering::AcqRel);
        self.tx.try_send(o).inspect_err(|_| {
            self.shared.queued.fetch_sub(bytes, Ordering::AcqRel);
        })
    }

    /// Resolves once the writer wrote something after this call began (check
    /// [`Outbox::writable`] again then). Register with `enable` before checking to not miss a
    /// wake-up.
    pub fn drained(&self) -> tokio::sync::futures::Notified<'_> {
        self.shared.drained.notified()
    }

    /// Whether the connection is gone.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// Moves a connection's overflow into its queue, in order, as room appears; ends when the
/// overflow is empty or the connection gone.
async fn drain_overflow(tx: mpsc::Sender<Outbound>, shared: Arc<Shared>) {
    loop {
        let Ok(permit) = tx.reserve().await else {
            shared.overflow().clear();
            shared.overflowing.store(false, Ordering::Release);
            return;
        };
        let mut overflow = shared.overflow();
        let Some(o) = overflow.pop_front() else {
            shared.overflowing.store(false, Ordering::Release);
            return;
        };
        shared.queued.fetch_add(message_bytes(&o), Ordering::AcqRel);
        permit.send(o);
        if overflow.is_empty() {
            shared.overflowing.store(false, Ordering::Release);
            return;
        }
    }
}

/// Resolves when the writer of one of `outs` wrote something, or at once if one of them is
/// writable (or gone) already; never for none.
pub async fn any_drained(outs: Vec<Outbox>) {
    let mut waits: Vec<_> = outs.iter().map(|o| Box::pin(o.drained())).collect();
    for w in &mut waits {
        w.as_mut().enable();
    }
    if waits.is_empty() {
        return std::future::pending().await;
    }
    if outs.iter().any(|o| o.writable() || o.is_closed()) {
        return;
    }
    futures::future::select_all(waits).await;
}

impl OutboxReceiver {
    /// The next frame, counted as written at once (a reader that does not batch its writes).
    pub async fn recv(&mut self) -> Option<Outbound> {
        let o = self.rx.recv().await?;
        self.written(message_bytes(&o));
        Some(o)
    }

    /// The writer wrote frames holding `bytes` message bytes: they no longer count, and whoever
    /// waits for room is woken.
    pub fn written(&self, bytes: usize) {
        if bytes > 0 {
            self.shared.queued.fetch_sub(bytes, Ordering::AcqRel);
        }
        self.shared.drained.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::command;

    fn message(bytes: usize) -> Outbound {
        command::message(
            1,
            command::message_id(1, 0, -1, None),
            0,
            Vec::new(),
            bytes::Bytes::from(vec![0u8; bytes]),
        )
    }

    #[test]
    fn a_queued_frame_is_small() {
        // Every connection's queue allocates a block of frames when it is made: an unboxed
        // command made an idle connection cost ~65 KiB.
        let command = std::mem::size_of::<crate::protocol::proto::BaseCommand>();
        let frame = std::mem::size_of::<Outbound>();
        assert!(
            frame <= 64,
            "{frame} bytes a frame (a command is {command})"
        );
    }

    #[tokio::test]
    async fn control_frames_wait_in_order_and_messages_do_not_pass_them() {
        let (out, mut rx) = outbox();
        while out.try_deliver(message(10)).is_ok() {}
        for id in 1..=3 {
            out.send_detached(command::close_consumer(id));
        }
        assert!(!out.writable());
        assert!(matches!(
            out.try_deliver(message(10)),
            Err(TrySendError::Full(_))
        ));
        let mut closes = Vec::new();
        while closes.len() < 3 {
            match rx.recv().await.expect("a frame") {
                Outbound::Message(..) => assert!(closes.is_empty(), "a message after a close"),
                Outbound::Command(c) => closes.push(c.close_consumer.map(|c| c.consumer_id)),
            }
        }
        assert_eq!(closes, vec![Some(1), Some(2), Some(3)]);
        assert!(out.writable());
    }

    #[tokio::test]
    async fn a_connection_that_is_not_read_stops_being_writable_and_recovers() {
        let (out, mut rx) = outbox();
        let mut sent = 0;
        while out.writable() {
            out.try_deliver(message(100_000)).expect("writable");
            sent += 1;
        }
        // At most the high-water mark plus one message.
        assert!(sent * 100_000 <= HIGH_WATER + 100_000, "{sent}");
        assert!(matches!(
            out.try_deliver(message(10)),
            Err(TrySendError::Full(_))
        ));
        let waiting = out.drained();
        tokio::pin!(waiting);
        waiting.as_mut().enable();
        let first = rx.rx.recv().await.expect("a frame");
        rx.written(message_bytes(&first));
        waiting.await;
        assert!(out.writable());
        drop(rx);
        assert!(matches!(
            out.try_deliver(message(10)),
            Err(TrySendError::Closed(_))
        ));
    }
}
