//! The writer's side of a replicated ledger (ADR 0010, ADR 0016): which of its bookies made
//! which entries durable, when an entry has reached its ack quorum, and which bookies the next
//! entry goes to while a failed replica is replaced.
//!
//! The writer's own journal is one bookie of the ensemble and gets every entry. Each replica
//! gets the entries of its [`Stripe`] (ADR 0017; every entry unless the ledger is striped), in
//! order, over one connection ([`super::ReplicaSource::add`]): entry `e` goes to its *write
//! set*, the journal and the replicas [`Stripes::write_set`] names. An entry is acknowledged
//! to the producer, and becomes visible to readers, once `ack_quorum` bookies of its write set
//! made it durable, and so did every earlier entry.
//!
//! Invariants (under the state's lock):
//! - A member's `durable` only grows; it holds every entry of its stripe below `durable`, and
//!   `durable` is the first entry of its stripe it does not hold yet (each bookie confirms in
//!   order: the journal acknowledges in write order, a replica answers adds in order).
//!   Answers are matched by [`MemberId`], never by place: a replaced bookie's late answers
//!   count for nobody. A replica's stripe is its place's, and its replacement's.
//! - `confirmed` only grows, and each entry below it is durable on at least `ack_quorum`
//!   bookies of its write set; from a member's failure on, only members that did not fail
//!   count towards it. Every waiting receipt below it has been answered `Ok`.
//! - A failed member gets no later entry of the ledger (its copy stays a prefix of its
//!   stripe); once some entry's write set has fewer than `ack_quorum` live members (a member
//!   still catching up is not), every waiting and later entry fails.
//! - A member that joined by an ensemble change gets the entries of its stripe below `from`
//!   from this journal's copy and every later one in id order: entries routed while that copy
//!   is sent wait in its queue, and it becomes [`Status::Live`] only with an empty queue, under
//!   the lock that routes entries.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use tokio::sync::{oneshot, watch};

use super::error::AppendError;
use super::metadata::LedgerId;
use super::stripe::{Stripe, Stripes};
use super::Position;

/// Answers one producer once its entry is confirmed or failed.
pub(crate) type Receipt = oneshot::Sender<Result<Position, AppendError>>;

/// Names one bookie's membership of one ledger's ensemble: a bookie that replaces another gets
/// a new id (the journal is id 0).
pub(crate) type MemberId = u32;

/// An entry for a replica: id, publish time, payload.
pub(crate) type Routed = (u64, i64, Bytes);

/// How many failed replicas one ledger replaces before it rolls instead.
pub(crate) const MAX_REPLACEMENTS: u32 = 3;

/// What [`Quorum::replica_failed`] made of a member's failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The caller is to put another bookie in its place ([`Quorum::join`]).
    Replace,
    /// It is left out for good: no replacement (too few left, one under way, or the limit).
    LeftOut,
    /// It was joining in another's place: the replacement under way deals with it
    /// ([`Quorum::replace_again`]).
    Joining,
    /// Not news: the member had failed already, or is no longer one.
    Known,
}

#[derive(Debug)]
enum Status {
    Live,
    /// Gets nothing more; counts no more towards confirmations.
    Failed,
    /// Joined by an ensemble change; its earlier entries are being sent from this journal,
    /// and these later ones wait for them.
    CatchingUp(Vec<Routed>),
}

#[derive(Debug)]
struct Member {
    id: MemberId,
    /// Shared, so that routing an entry costs no copy of the name.
    bookie: Arc<str>,
    /// The entries it gets: every one for the journal, its place's for a replica.
    stripe: Stripe,
    durable: u64,
    status: Status,
}

#[derive(Debug)]
struct State {
    /// Index 0 is this node's journal (it never fails here: a failed journal stops the whole
    /// node), then the replicas in the ledger record's order: member `i` is at replica place
    /// `i - 1` of `stripes`.
    members: Vec<Member>,
    stripes: Stripes,
    confirmed: u64,
    /// Entries registered so far: ids `0..submitted`.
    submitted: u64,
    /// Receipts not answered yet, by entry id, ascending.
    waiting: VecDeque<(u64, Receipt)>,
    /// Set once the quorum can no longer be reached.
    broken: Option<Arc<str>>,
    /// A failed member is being replaced: the ledger does not roll for it meanwhile.
    replacing: bool,
    /// Replacements started so far (at most [`MAX_REPLACEMENTS`]).
    replacements: u32,
    /// Bookies replaced in this ledger (a stale copy there would refuse a new one).
    former: Vec<String>,
    next_id: MemberId,
}

impl State {
    fn member(&mut self, id: MemberId) -> Option<&mut Member> {
        self.members.iter_mut().find(|m| m.id == id)
    }

    fn failed(&self) -> bool {
        self.members
            .iter()
            .any(|m| matches!(m.status, Status::Failed))
    }

    /// The fewest live members any entry's write set has: live members are neither failed
    /// nor still catching up (one catching up cannot confirm a new entry before it holds every
    /// earlier one of its stripe, which may take long).
    fn live(&self) -> usize {
        let live = |e: u64| {
            self.members
                .iter()
                .filter(|m| matches!(m.status, Status::Live) && m.stripe.holds(e))
                .count()
        };
        // Write sets repeat with the entry's residue.
        (0..self.stripes.positions() as u64)
            .map(live)
            .min()
            .unwrap_or(0)
    }

    /// How many members that did not fail hold entry `entry`.
    fn holding(&self, entry: u64) -> usize {
        self.members
            .iter()
            .filter(|m| !matches!(m.status, Status::Failed))
            .filter(|m| m.stripe.holds(entry) && m.durable > entry)
            .count()
    }

    /// The confirmed count the members that did not fail reach from `confirmed` on: the first
    /// entry, from there, that fewer than `ack_quorum` of them hold.
    fn reach(&self, ack_quorum: usize) -> u64 {
        let mut count = self.confirmed;
        while count < self.submitted && self.holding(count) >= ack_quorum {
            count += 1;
        }
        count
    }

    /// Whether the members that did not fail hold every entry below `count` at the ack
    /// quorum. Checked per residue: a member holds a prefix of its stripe, so of the entries
    /// below `count` with one residue, the last is held by the fewest.
    fn hold_below(&self, count: u64, ack_quorum: usize) -> bool {
        let m = self.stripes.positions() as u64;
        (0..m.min(count)).all(|r| self.holding(r + (count - 1 - r) / m * m) >= ack_quorum)
    }
}

/// The replication state of one open ledger this node writes.
#[derive(Debug)]
pub(crate) struct Quorum {
    ledger: LedgerId,
    ack_quorum: usize,
    state: Mutex<State>,
    /// Bumped whenever a bookie holds more, a member fails, joins or goes live, or the quorum
    /// breaks, for the waits below.
    progress: watch::Sender<u64>,
}

impl Quorum {
    /// The quorum of a new ledger whose entries go to `stripes` of `replicas` besides this
    /// journal.
    pub fn new(
        ledger: LedgerId,
        replicas: Vec<String>,
        ack_quorum: u8,
        stripes: Stripes,
    ) -> Quorum {
        let n = replicas.len() + 1;
        let members = std::iter::once(Arc::from(""))
            .chain(replicas.into_iter().map(Arc::from))
            .zip(0..)
            .map(|(bookie, id)| {
                let stripe = match id {
                    0 => Stripe::whole(),
                    i => stripes.stripe(i as usize - 1),
                };
                Member {
                    id,
                    bookie,
                    durable: stripe.next_from(0),
                    stripe,
                    status: Status::Live,
                }
            })
            .collect();
        Quorum {
            ledger,
            ack_quorum: usize::from(ack_quorum).clamp(1, n),
            state: Mutex::new(State {
                members,
                stripes,
                confirmed: 0,
                submitted: 0,
                waiting: VecDeque::new(),
                broken: None,
                replacing: false,
                replacements: 0,
                former: Vec::new(),
                next_id: n as MemberId,
            }),
            progress: watch::channel(0).0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.progress.send_modify(|p| *p += 1);
    }

    /// Waits until `ready` says something (`None`: the state can no longer change).
    async fn wait_for<T>(&self, mut ready: impl FnMut(&State) -> Option<T>) -> Option<T> {
        let mut progress = self.progress.subscribe();
        loop {
            if let Some(t) = ready(&self.lock()) {
                return Some(t);
            }
            progress.changed().await.ok()?;
        }
    }

    /// Registers entry `entry` (in id order, before it is sent anywhere) and routes it: the
    /// replicas to send it to now. A member catching up queues it instead.
    pub fn register(
        &self,
        entry: u64,
        reply: Receipt,
        publish_time_ms: i64,
        payload: &Bytes,
    ) -> Vec<(MemberId, Arc<str>)> {
        let mut s = self.lock();
        s.submitted = entry + 1;
        if let Some(why) = &s.broken {
            let _ = reply.send(Err(self.error(why)));
            return Vec::new();
        }
        s.waiting.push_back((entry, reply));
        let mut to = Vec::new();
        for m in &mut s.members[1..] {
            if !m.stripe.holds(entry) {
                continue;
            }
            match &mut m.status {
                Status::Live => to.push((m.id, m.bookie.clone())),
                Status::CatchingUp(queue) => queue.push((entry, publish_time_ms, payload.clone())),
                Status::Failed => {}
            }
        }
        to
    }

    /// Whether the ledger should roll so that the next entries get a complete ensemble: the
    /// quorum broke, or a replica failed and is not being replaced.
    pub fn degraded(&self) -> bool {
        let s = self.lock();
        s.broken.is_some() || (s.failed() && !s.replacing)
    }

    /// The journal made entries `0..=entry` durable. Returns the new confirmed count, if it
    /// moved.
    pub fn local_durable(&self, entry: u64) -> Option<u64> {
        self.replica_durable(0, entry)
    }

    /// Member `member` made the entries of its stripe up to `entry` durable (ignored once it
    /// failed or left).
    pub fn replica_durable(&self, member: MemberId, entry: u64) -> Option<u64> {
        let (grew, confirmed) = self.record_durable(member, entry);
        if grew {
            self.bump();
        }
        confirmed
    }

    /// Records that `member` holds the entries of its stripe up to `entry`: whether that is
    /// news, and the new confirmed count if it grew (its receipts sent).
    fn record_durable(&self, member: MemberId, entry: u64) -> (bool, Option<u64>) {
        let mut s = self.lock();
        let Some(m) = s
            .member(member)
            .filter(|m| !matches!(m.status, Status::Failed))
        else {
            return (false, None);
        };
        let next = m.stripe.next_from(entry + 1);
        let grew = m.durable < next;
        if grew {
            m.durable = next;
        }
        // Broken, the ledger ends where it was: entries failed to their producers stay
        // unconfirmed, however many bookies hold them later.
        if s.broken.is_some() {
            return (grew, None);
        }
        let q = s.reach(self.ack_quorum);
        if q <= s.confirmed {
            return (grew, None);
        }
        s.confirmed = q;
        while s.waiting.front().is_some_and(|(e, _)| *e < q) {
            if let Some((e, reply)) = s.waiting.pop_front() {
                let _ = reply.send(Ok(Position::new(self.ledger, e)));
            }
        }
        (grew, Some(q))
    }

    /// Member `member` failed: it gets nothing more of this ledger. When too few live members
    /// are left for the ack quorum, every entry not confirmed yet fails at once (not after a
    /// member catching up would have caught up). Returns [`Failure::Replace`] when the caller
    /// is to replace it ([`Quorum::join`]): no other replacement is under way and fewer than
    /// [`MAX_REPLACEMENTS`] were made; the ledger does not roll for it until
    /// [`Quorum::replacement_ended`]. Else [`Failure::Joining`] for a member joining in
    /// another's place, [`Failure::Known`] when it had failed already, [`Failure::LeftOut`].
    pub fn replica_failed(&self, member: MemberId, why: &str) -> Failure {
        let mut s = self.lock();
        let Some(m) = s
            .member(member)
            .filter(|m| !matches!(m.status, Status::Failed))
        else {
            return Failure::Known;
        };
        let joining = matches!(m.status, Status::CatchingUp(_));
        m.status = Status::Failed;
        let bookie = m.bookie.to_string();
        let left = s.live();
        let replace = !joining
            && left >= self.ack_quorum
            && s.broken.is_none()
            && !s.replacing
            && s.replacements < MAX_REPLACEMENTS;
        if replace {
            s.replacing = true;
            s.replacements += 1;
        }
        drop(s);
        tracing::warn!(
            ledger = self.ledger,
            bookie,
            why,
            replace,
            "a replica of the ledger failed"
        );
        self.bump();
        if left < self.ack_quorum {
            self.break_with(
                format!(
                    "{left} of the bookies an entry goes to are left, fewer than its ack quorum of {} ({bookie} \
                     failed: {why})",
                    self.ack_quorum
                )
                .into(),
            );
        }
        match (replace, joining) {
            (true, _) => Failure::Replace,
            (false, true) => Failure::Joining,
            (false, false) => Failure::LeftOut,
        }
    }

    /// The replacement under way may try another bookie after the one it joined failed
    /// ([`Failure::Joining`]): enough live members are left, the quorum holds and fewer than
    /// [`MAX_REPLACEMENTS`] were made (counted here when true).
    pub fn replace_again(&self) -> bool {
        let mut s = self.lock();
        let again = s.replacing
            && s.live() >= self.ack_quorum
            && s.broken.is_none()
            && s.replacements < MAX_REPLACEMENTS;
        if again {
            s.replacements += 1;
        }
        again
    }

    /// Every bookie this ledger's entries went to: its replicas now (failed ones included),
    /// then those replaced.
    pub fn bookies(&self) -> Vec<String> {
        let s = self.lock();
        s.members[1..]
            .iter()
            .map(|m| m.bookie.to_string())
            .chain(s.former.iter().cloned())
            .collect()
    }

    /// For a striped ledger (ADR 0017): its replicas now, in their places (failed ones
    /// included: a place is never dropped, or the stripes of the places after it would
    /// shift). `None` for whole copies.
    pub fn places(&self) -> Option<Vec<String>> {
        let s = self.lock();
        (!s.stripes.is_whole()).then(|| {
            s.members[1..]
                .iter()
                .map(|m| m.bookie.to_string())
                .collect()
        })
    }

    /// The entries member `member` gets, if it is one.
    pub fn stripe_of(&self, member: MemberId) -> Option<Stripe> {
        self.lock().member(member).map(|m| m.stripe.clone())
    }

    /// The bookie of member `member`, if it is one.
    pub fn bookie_of(&self, member: MemberId) -> Option<String> {
        self.lock().member(member).map(|m| m.bookie.to_string())
    }

    /// Waits until the members that did not fail hold every confirmed entry at the ack quorum,
    /// so that a failed member may leave the ledger's record without an acknowledged entry
    /// being held by too few of those it lists (false: the quorum broke first).
    pub async fn survivors_hold_confirmed(&self) -> bool {
        let ack = self.ack_quorum;
        self.wait_for(|s| match s.broken {
            Some(_) => Some(false),
            None => s.hold_below(s.confirmed, ack).then_some(true),
        })
        .await
        .unwrap_or(false)
    }

    /// Puts `bookie` in failed member `failed`'s place (its record changed already): the new
    /// member's id and `from`: it is to get the entries of its stripe below `from` from this
    /// journal's copy (those of `from` and later queue for it, [`Quorum::take_queued`]). It
    /// takes the failed member's place, so its stripe. `None` when the quorum broke or
    /// `failed` is not a failed member.
    pub fn join(&self, failed: MemberId, bookie: String) -> Option<(MemberId, u64)> {
        let mut s = self.lock();
        if s.broken.is_some() {
            return None;
        }
        let (id, from) = (s.next_id, s.submitted);
        let m = s
            .member(failed)
            .filter(|m| matches!(m.status, Status::Failed))?;
        let stripe = m.stripe.clone();
        let old = std::mem::replace(
            m,
            Member {
                id,
                bookie: Arc::from(bookie),
                durable: stripe.next_from(0),
                stripe,
                status: Status::CatchingUp(Vec::new()),
            },
        );
        s.former.push(old.bookie.to_string());
        s.next_id += 1;
        drop(s);
        self.bump();
        Some((id, from))
    }

    /// The entries queued for member `member` while it caught up, in order; once none are
    /// left, it is live (later entries go to it directly) and this is empty. `None` when it
    /// failed meanwhile or the quorum broke.
    pub fn take_queued(&self, member: MemberId) -> Option<Vec<Routed>> {
        let mut s = self.lock();
        if s.broken.is_some() {
            return None;
        }
        let m = s.member(member)?;
        let out = match &mut m.status {
            Status::Failed => return None,
            Status::Live => Vec::new(),
            Status::CatchingUp(queue) if !queue.is_empty() => std::mem::take(queue),
            Status::CatchingUp(_) => {
                m.status = Status::Live;
                drop(s);
                self.bump();
                return Some(Vec::new());
            }
        };
        Some(out)
    }

    /// Waits until member `member` (0: the journal) holds the entries of its stripe below
    /// `count`: false when it failed or left, or the quorum broke, first.
    pub async fn holds(&self, member: MemberId, count: u64) -> bool {
        self.wait_for(|s| {
            if s.broken.is_some() {
                return Some(false);
            }
            match s.members.iter().find(|m| m.id == member) {
                Some(m) if matches!(m.status, Status::Failed) => Some(false),
                Some(m) => (m.durable >= count).then_some(true),
                None => Some(false),
            }
        })
        .await
        .unwrap_or(false)
    }

    /// A replacement started by [`Quorum::replica_failed`] ended (its member went live, or
    /// none could): a member still catching up is given up (failed), and a replica that failed
    /// and was not replaced now rolls the ledger.
    pub fn replacement_ended(&self) {
        let mut s = self.lock();
        s.replacing = false;
        for m in &mut s.members {
            if matches!(m.status, Status::CatchingUp(_)) {
                m.status = Status::Failed;
            }
        }
        let left = s.live();
        drop(s);
        self.bump();
        if left < self.ack_quorum {
            self.break_with(
                format!(
                    "{left} of the bookies an entry goes to are left, fewer than its ack quorum of {} (a \
                     replacement was given up)",
                    self.ack_quorum
                )
                .into(),
            );
        }
    }

    /// This node's journal failed (fail-stop): entries not confirmed yet fail, and so does
    /// every later one.
    pub fn journal_failed(&self, why: &str) {
        self.break_with(format!("the writer's journal failed: {why}").into());
    }

    fn break_with(&self, why: Arc<str>) {
        let mut s = self.lock();
        if s.broken.is_some() {
            return;
        }
        for (_, reply) in s.waiting.drain(..) {
            let _ = reply.send(Err(self.error(&why)));
        }
        s.broken = Some(why);
        drop(s);
        self.bump();
    }

    fn error(&self, why: &Arc<str>) -> AppendError {
        AppendError::Quorum {
            ledger: self.ledger,
            why: why.clone(),
        }
    }

    /// [`Quorum::settled`], then up to `grace` more until every replica that did not fail
    /// holds every confirmed entry (their answers may still be on the way): a seal lists every
    /// complete copy, and a replica only slow to answer is not left out for autorecovery to
    /// copy again.
    pub async fn settled_complete(
        &self,
        submitted: u64,
        grace: std::time::Duration,
    ) -> (u64, Vec<String>) {
        let (count, _) = self.settled(submitted).await;
        let caught_up = self.wait_for(|s| {
            let behind = s.members[1..]
                .iter()
                .any(|m| !matches!(m.status, Status::Failed) && m.durable < count);
            (s.broken.is_some() || !behind).then_some(())
        });
        let _ = tokio::time::timeout(grace, caught_up).await;
        self.settled(submitted).await
    }

    /// Waits until every entry below `submitted` is confirmed or failed; returns the entries
    /// confirmed and the replicas that did not fail and hold their stripe of them (a failed one
    /// may be out of the record already, after an ensemble change, and drop its copy).
    pub async fn settled(&self, submitted: u64) -> (u64, Vec<String>) {
        let settled = self.wait_for(|s| {
            (s.confirmed >= submitted || s.broken.is_some()).then(|| {
                let count = s.confirmed.min(submitted);
                let complete = s.members[1..]
                    .iter()
                    .filter(|m| !matches!(m.status, Status::Failed) && m.durable >= count)
                    .map(|m| m.bookie.to_string())
                    .collect();
                (count, complete)
            })
        });
        match settled.await {
            Some(done) => done,
            None => (self.lock().confirmed.min(submitted), Vec::new()),
        }
    }
}

#[cfg(test)]
mod tests;
