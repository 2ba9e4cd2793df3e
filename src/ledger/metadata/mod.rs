//! The metadata store: topics, their ledgers and each ledger's lifecycle state.
//!
//! # Contract (every implementation must pass `conformance` tests)
//! - **Atomic updates.** Every method is one atomic step: it is applied whole or not at all, and
//!   once it returns `Ok` the change survives a crash of the process (embedded: SQLite with
//!   `synchronous=FULL`).
//! - **Ids.** Topic ids and ledger ids are unique for the life of the store and strictly
//!   increasing in creation order; a ledger id is never reused, even after the ledger is deleted.
//! - **Lifecycle.** A ledger moves only along [`LedgerState::can_become`]:
//!   `Open → Sealed → Offloaded → Deleted`, plus `Sealed → Deleted` (local deletion without a
//!   lake copy, when a topic is deleted), and `Sealed | Offloaded | Deleted → Expired`
//!   (removed by the namespace's retention policy, from the log and the lake). [`MetadataStore::transition_ledger`] is a compare-and-set on the
//!   current state: a transition from the wrong state fails with
//!   [`MetadataError::InvalidTransition`] and changes nothing.
//! - **Cursors** are stored whole per (topic, subscription): a save replaces the previous state
//!   atomically; a read returns the last saved state.
//! - **Rows are kept.** Deleted ledgers stay listed (state `Deleted`) so the full history of a topic
//!   (and what the lake holds of it) can always be explained.
//! - **Listings by name prefix.** [`MetadataStore::list_topics_under`] returns the topics whose
//!   name starts with a prefix, in name order, at a cost that follows what it returns (an index
//!   range, an etcd key range), and [`MetadataStore::get_topic_by_id`] finds one topic by id:
//!   with millions of topics stored, a namespace, a partitioned topic or one topic is found
//!   without walking them all ([`MetadataStore::list_topics`] does walk them).
//! - **Policies blobs** are opaque per scope; [`MetadataStore::replace_policies`] is a
//!   compare-and-set on their bytes, and a store that several processes share reports every
//!   write to each feed of [`MetadataStore::policy_changes`] (contract in [`changes`]).
//! - **Fencing.** A topic's fence epoch only grows ([`MetadataStore::fence_writers`]); a ledger
//!   created, or an open ledger's ensemble changed, with a writer epoch below it is refused in
//!   the same atomic step that would have made the change.
//!
//! The trait is small on purpose so that PostgreSQL and distributed stores can implement it with
//! plain transactions; the SQL in [`sqlite`] is portable apart from the placeholder style, and
//! [`etcd`] implements it with etcd transactions guarded by compares (a cluster's nodes share
//! it).

use std::fmt;
use std::str::FromStr;

use async_trait::async_trait;

mod changes;
mod copies;
mod ensemble;
pub mod etcd;
pub mod memory;
pub mod sqlite;

#[cfg(test)]
mod conformance;

pub use changes::{PolicyChange, PolicyChanges};
pub use copies::CopyChange;
pub use ensemble::EnsembleChange;

/// Identifier of a ledger, unique and increasing across the whole service.
pub type LedgerId = u64;
/// Identifier of a topic (partition) in the metadata store.
pub type TopicId = u64;

/// Lifecycle state of a ledger. Discriminants are persisted: never renumber.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum LedgerState {
    /// Accepting appends.
    Open = 1,
    /// Immutable; entry count, size, time range and checksum recorded.
    Sealed = 2,
    /// Committed to the lake; local copy still present.
    Offloaded = 3,
    /// Local copy removed.
    Deleted = 4,
    /// Removed by retention: gone from the log and (once the lake caught up) from the lake;
    /// never read again.
    Expired = 5,
}

impl LedgerState {
    /// Whether the lifecycle allows moving from `self` to `next`.
    pub fn can_become(self, next: LedgerState) -> bool {
        use LedgerState::*;
        matches!(
            (self, next),
            (Open, Sealed)
                | (Sealed, Offloaded)
                | (Offloaded, Deleted)
                | (Sealed, Deleted)
                | (Sealed | Offloaded | Deleted, Expired)
        )
    }

    /// The persisted discriminant.
    pub fn as_u8(self) -> u8 {
        self as u8
    }

    /// Parses a persisted discriminant.
    pub fn from_u8(v: u8) -> Option<LedgerState> {
        match v {
            1 => Some(LedgerState::Open),
            2 => Some(LedgerState::Sealed),
            3 => Some(LedgerState::Offloaded),
            4 => Some(LedgerState::Deleted),
            5 => Some(LedgerState::Expired),
            _ => None,
        }
    }
}

impl fmt::Display for LedgerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LedgerState::Open => "open",
            LedgerState::Sealed => "sealed",
            LedgerState::Offloaded => "offloaded",
            LedgerState::Deleted => "deleted",
            LedgerState::Expired => "expired",
        })
    }
}

impl FromStr for LedgerState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "open" => Ok(LedgerState::Open),
            "sealed" => Ok(LedgerState::Sealed),
            "offloaded" => Ok(LedgerState::Offloaded),
            "deleted" => Ok(LedgerState::Deleted),
            "expired" => Ok(LedgerState::Expired),
            other => Err(format!("unknown ledger state '{other}'")),
        }
    }
}

/// A topic (or one partition of a partitioned topic) known to the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicRecord {
    /// Store-assigned id.
    pub id: TopicId,
    /// Full topic name, e.g. `persistent://public/default/orders-partition-0`.
    pub name: String,
    /// Creation time (ms since epoch).
    pub created_at_ms: i64,
}

/// What sealing records about a ledger. Its serde form is part of the etcd ledger record
/// (ADR 0006): renaming a field changes that format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SealInfo {
    /// Number of entries (entry ids are `0..entry_count`).
    pub entry_count: u64,
    /// Sum of payload bytes.
    pub size_bytes: u64,
    /// Smallest publish time, `None` when empty.
    pub min_publish_ms: Option<i64>,
    /// Largest publish time, `None` when empty.
    pub max_publish_ms: Option<i64>,
    /// Last segment holding an entry of the ledger (first segment when empty).
    pub last_segment: u32,
    /// CRC32C chained over the record CRCs of every entry, in order.
    pub checksum: u32,
}

/// A place of a sealed striped ledger (ADR 0017) that no bookie holds. Never a bookie id.
/// - As its `bookie`: no bookie holds the ledger whole (its writer was gone when it was taken
///   over, or was lost since); readers merge the stripes.
/// - As one of its `replicas`: that place's stripe is short (the replica failed during
///   writes, did not answer the takeover's fence or could not be completed, or was lost).
///
/// Autorecovery fills vacant places one at a time, the writer's first
/// ([`LedgerRecord::places`]).
pub const VACANT: &str = "-";

/// A ledger and its lifecycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerRecord {
    /// Ledger id.
    pub id: LedgerId,
    /// Owning topic.
    pub topic_id: TopicId,
    /// Current state.
    pub state: LedgerState,
    /// Lower bound of the segments holding its entries.
    pub first_segment: u32,
    /// Seal information; `Some` once sealed.
    pub seal: Option<SealInfo>,
    /// Creation time.
    pub created_at_ms: i64,
    /// Time of the last state change.
    pub state_changed_at_ms: i64,
    /// Where the lake holds it (set on offload), e.g. a table and snapshot.
    pub offload_ref: Option<String>,
    /// Bookie id of the node whose log holds its entries (ADR 0007). Empty in ledgers written
    /// before bookies had ids: those are held by the one node of an embedded store. For a
    /// replicated ledger (ADR 0010): the writer's bookie.
    pub bookie: String,
    /// The other bookies of a replicated ledger's ensemble (ADR 0010), each holding a copy of
    /// every entry the writer sent it. Invariant: once the ledger is sealed, each bookie listed
    /// here holds every entry `0..entry_count` (the writer drops a bookie that failed before it
    /// seals), or for a striped ledger every entry of its place's stripe; a striped ledger's
    /// place that holds less is [`VACANT`]. Empty for an unreplicated ledger.
    pub replicas: Vec<String>,
    /// How many bookies (the writer's included) made an entry durable before it was
    /// acknowledged; 1 for an unreplicated ledger.
    pub ack_quorum: u8,
    /// How many copies the ledger is meant to have (the namespace's write quorum when it was
    /// created; ADR 0011): autorecovery copies a sealed ledger until it has that many again,
    /// as far as live bookies allow. 0 in records from before ADR 0011: as many as it lists.
    pub write_quorum: u8,
    /// How many replicas each entry goes to besides the writer's bookie (ADR 0017: entry `e`
    /// goes to those from replica place `e mod replicas` on; [`LedgerRecord::stripes`]). 0:
    /// every replica gets every entry (whole copies), as in every record from before ADR 0017.
    /// Set when the namespace's write quorum is below the ledger's ensemble.
    pub stripe_width: u8,
}

impl LedgerRecord {
    /// Every bookie holding a copy: the writer's first, then the replicas (a [`VACANT`] place
    /// holds none).
    pub fn bookies(&self) -> impl Iterator<Item = &str> {
        self.places().filter(|b| *b != VACANT)
    }

    /// Its places in order: the writer's (place 0), then each replica's (place `i + 1` is
    /// `replicas[i]`), each a bookie or [`VACANT`].
    pub fn places(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.bookie.as_str()).chain(self.replicas.iter().map(String::as_str))
    }

    /// The entries the copy at place `place` ([`LedgerRecord::places`]) holds: every one at
    /// the writer's place, that replica's stripe at a replica's.
    pub fn stripe_at(&self, place: usize) -> crate::ledger::stripe::Stripe {
        match place.checked_sub(1) {
            Some(replica) if replica < self.replicas.len() => self.stripes().stripe(replica),
            _ => crate::ledger::stripe::Stripe::whole(),
        }
    }

    /// Whether it is striped ([`LedgerRecord::stripe_width`] set): its replicas hold stripes
    /// and keep their places.
    pub fn is_striped(&self) -> bool {
        self.stripe_width != 0
    }

    /// How its entries are spread over its replicas ([`LedgerRecord::stripe_width`]).
    pub fn stripes(&self) -> crate::ledger::stripe::Stripes {
        let replicas = self.replicas.len();
        match self.stripe_width {
            0 => crate::ledger::stripe::Stripes::whole(replicas),
            w => crate::ledger::stripe::Stripes::new(replicas, usize::from(w)),
        }
    }

    /// The entries bookie `bookie`'s copy holds: every one for the writer's bookie (and for a
    /// bookie not listed), its place's stripe for a replica.
    pub fn stripe_of(&self, bookie: &str) -> crate::ledger::stripe::Stripe {
        match self.replicas.iter().position(|b| b == bookie) {
            Some(place) if self.bookie != bookie => self.stripes().stripe(place),
            _ => crate::ledger::stripe::Stripe::whole(),
        }
    }

    /// The copies the ledger is meant to have ([`LedgerRecord::write_quorum`], or for a record
    /// from before it, the bookies it lists).
    pub fn wanted_copies(&self) -> usize {
        match self.write_quorum {
            0 => self.bookies().count(),
            wq => usize::from(wq),
        }
    }
}

/// Where a new ledger's copies go (ADR 0010).
#[derive(Debug, Clone, Copy)]
pub struct Placement<'a> {
    /// The writer's bookie.
    pub bookie: &'a str,
    /// The other bookies of the ensemble (empty: unreplicated).
    pub replicas: &'a [String],
    /// Bookies that must make an entry durable before it is acknowledged (>= 1, at most
    /// `1 + replicas.len()`).
    pub ack_quorum: u8,
    /// Copies the ledger is meant to have ([`LedgerRecord::write_quorum`]); more than
    /// `1 + replicas.len()` when fewer bookies were live than the namespace asks for.
    pub write_quorum: u8,
    /// [`LedgerRecord::stripe_width`] (0: whole copies).
    pub stripe_width: u8,
}

impl<'a> Placement<'a> {
    /// An unreplicated ledger on `bookie`.
    pub fn single(bookie: &'a str) -> Placement<'a> {
        Placement {
            bookie,
            replicas: &[],
            ack_quorum: 1,
            write_quorum: 1,
            stripe_width: 0,
        }
    }
}

/// A state change requested by [`MetadataStore::transition_ledger`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerTransition {
    /// `Open → Sealed`, recording the seal information.
    Seal(SealInfo),
    /// `Open → Sealed` of a replicated ledger, recording the seal information and, in the same
    /// step, where its copies are (ADR 0010): the writer's bookie with the replicas that hold
    /// every entry, or, for a ledger taken over from a writer that is gone, the bookie of the
    /// longest copy (with that copy's first segment) and the others completed from it.
    SealPlaced(Box<PlacedSeal>),
    /// `Sealed → Offloaded`, recording where the lake holds it.
    Offload {
        /// Opaque reference to the lake commit.
        reference: String,
    },
    /// `Offloaded|Sealed → Deleted`.
    Delete,
    /// `Sealed|Offloaded|Deleted → Expired` (retention).
    Expire,
}

/// What [`LedgerTransition::SealPlaced`] records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacedSeal {
    /// The seal information.
    pub seal: SealInfo,
    /// The ledger's bookie from now on.
    pub bookie: String,
    /// Its other bookies, each holding every entry.
    pub replicas: Vec<String>,
    /// Where `bookie`'s copy starts in its journal.
    pub first_segment: u32,
}

impl PlacedSeal {
    /// Applies the placement to `l` (the seal is the caller's part).
    pub(crate) fn place(&self, l: &mut LedgerRecord) {
        l.seal = Some(self.seal);
        l.bookie = self.bookie.clone();
        l.replicas = self.replicas.clone();
        l.first_segment = self.first_segment;
    }
}

impl LedgerTransition {
    /// The state this transition leads to.
    pub fn target(&self) -> LedgerState {
        match self {
            LedgerTransition::Seal(_) | LedgerTransition::SealPlaced(_) => LedgerState::Sealed,
            LedgerTransition::Offload { .. } => LedgerState::Offloaded,
            LedgerTransition::Delete => LedgerState::Deleted,
            LedgerTransition::Expire => LedgerState::Expired,
        }
    }

    /// The one rule every store applies, under its compare-and-set: refused with
    /// `InvalidTransition` unless `l`'s state may become the target; then the record as the
    /// transition leaves it.
    pub(crate) fn apply(&self, l: &mut LedgerRecord, now_ms: i64) -> Result<(), MetadataError> {
        let to = self.target();
        if !l.state.can_become(to) {
            return Err(MetadataError::InvalidTransition {
                ledger: l.id,
                from: l.state,
                to,
            });
        }
        match self {
            LedgerTransition::Seal(info) => l.seal = Some(*info),
            LedgerTransition::SealPlaced(p) => p.place(l),
            LedgerTransition::Offload { reference } => l.offload_ref = Some(reference.clone()),
            LedgerTransition::Delete | LedgerTransition::Expire => {}
        }
        l.state = to;
        l.state_changed_at_ms = now_ms;
        Ok(())
    }
}

/// Errors of the metadata store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetadataError {
    /// The ledger does not exist.
    #[error("ledger {0} does not exist")]
    LedgerNotFound(LedgerId),
    /// The topic does not exist.
    #[error("topic id {0} does not exist")]
    TopicNotFound(TopicId),
    /// The ledger is not in the state the transition requires.
    #[error("ledger {ledger}: cannot go from {from} to {to}")]
    InvalidTransition {
        /// Ledger.
        ledger: LedgerId,
        /// Its current state.
        from: LedgerState,
        /// Requested state.
        to: LedgerState,
    },
    /// A writer of an older ownership epoch tried to create a ledger (or fence) after a newer
    /// owner fenced the topic.
    #[error("topic id {topic_id}: writer of epoch {epoch} is fenced (the topic's writers were fenced at epoch {fenced_at})")]
    Fenced {
        /// Topic.
        topic_id: TopicId,
        /// The refused writer's epoch.
        epoch: u64,
        /// The epoch the topic is fenced at.
        fenced_at: u64,
    },
    /// The object exists already, or the change would shrink it.
    #[error("{0}")]
    Conflict(String),
    /// A stored row could not be understood.
    #[error("metadata store holds an invalid value: {0}")]
    Corrupt(String),
    /// The backend failed.
    #[error("metadata store {op} failed: {source}")]
    Backend {
        /// Operation name.
        op: &'static str,
        /// Backend error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Shared rule of [`MetadataStore::set_partitions`].
pub(crate) fn check_partition_change(
    name: &str,
    existing: Option<u32>,
    partitions: u32,
    update: bool,
) -> Result<(), MetadataError> {
    if partitions == 0 {
        return Err(MetadataError::Conflict(format!(
            "{name}: a partitioned topic needs at least one partition"
        )));
    }
    match (existing, update) {
        (Some(n), false) => Err(MetadataError::Conflict(format!(
            "{name} is already partitioned ({n} partitions)"
        ))),
        (None, true) => Err(MetadataError::Conflict(format!(
            "{name} is not a partitioned topic"
        ))),
        (Some(n), true) if partitions < n => Err(MetadataError::Conflict(format!(
            "{name}: partitions can only grow ({n} → {partitions})"
        ))),
        _ => Ok(()),
    }
}

/// The least string greater than every string that starts with `prefix` (names compare
/// bytewise, in SQLite and etcd alike, and UTF-8's byte order is its code points' order):
/// `prefix` with its last character raised by one, dropping trailing characters that cannot be
/// raised. `None` when nothing bounds it (an empty prefix, or one of `char::MAX` only).
pub fn name_range_end(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = (u32::from(last) + 1..=u32::from(char::MAX)).find_map(char::from_u32);
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// The metadata store seam. See the module docs for the contract.
#[async_trait]
pub trait MetadataStore: Send + Sync + fmt::Debug + 'static {
    /// Returns the topic named `name`, creating it if absent.
    async fn get_or_create_topic(
        &self,
        name: &str,
        now_ms: i64,
    ) -> Result<TopicRecord, MetadataError>;

    /// The topic named `name`, if it exists (never creates it).
    async fn get_topic(&self, name: &str) -> Result<Option<TopicRecord>, MetadataError>;

    /// The topic with id `id`, if it exists.
    async fn get_topic_by_id(&self, id: TopicId) -> Result<Option<TopicRecord>, MetadataError>;

    /// All topics, by id. A walk over every topic: callers that know a namespace or a topic
    /// ask [`MetadataStore::list_topics_under`] instead.
    async fn list_topics(&self) -> Result<Vec<TopicRecord>, MetadataError>;

    /// The topic with the least name at or after `name` (bytewise), if any: one probe of the
    /// names' index, so distinct prefixes (the namespaces in use) are found by skipping from
    /// one to the next without listing the topics between.
    async fn first_topic_from(&self, name: &str) -> Result<Option<TopicRecord>, MetadataError>;

    /// The topics whose name starts with `prefix` (bytewise), in name order. Its cost follows
    /// the number of topics listed, not the number stored (an index range, not a walk), so a
    /// namespace's or a partitioned topic's listing stays cheap among millions of topics.
    /// An empty `prefix` lists every topic.
    async fn list_topics_under(&self, prefix: &str) -> Result<Vec<TopicRecord>, MetadataError>;

    /// Deletes everything stored under topic `name`: its record with its ledger records and
    /// cursors, its schema versions and its partitioned-topic count. Refused with `Conflict`
    /// while any of its ledgers is not `deleted` or `expired` (the caller deletes local data
    /// first). A later
    /// `get_or_create_topic` of the same name creates a new topic with a new id. Returns whether
    /// anything of that name existed.
    async fn delete_topic(&self, name: &str) -> Result<bool, MetadataError>;

    /// Creates an unreplicated `Open` ledger held by `bookie`: [`MetadataStore::create_ledger_placed`]
    /// with [`Placement::single`].
    async fn create_ledger(
        &self,
        topic_id: TopicId,
        first_segment: u32,
        bookie: &str,
        now_ms: i64,
        writer_epoch: Option<u64>,
    ) -> Result<LedgerRecord, MetadataError> {
        self.create_ledger_placed(
            topic_id,
            first_segment,
            Placement::single(bookie),
            now_ms,
            writer_epoch,
        )
        .await
    }

    /// Creates an `Open` ledger for `topic_id`, written by `placement.bookie` and copied to
    /// `placement.replicas`, with a fresh id greater than every earlier one. With
    /// `writer_epoch`, refused with [`MetadataError::Fenced`] (and nothing created) when the
    /// topic's writers were fenced at a higher epoch, atomically with the creation; `None` (a
    /// single node, which has no shared epochs) is not checked.
    async fn create_ledger_placed(
        &self,
        topic_id: TopicId,
        first_segment: u32,
        placement: Placement<'_>,
        now_ms: i64,
        writer_epoch: Option<u64>,
    ) -> Result<LedgerRecord, MetadataError>;

    /// The highest ledger id handed out so far (0 before the first). Ids come from one
    /// counter for the whole store: a ledger whose creation completed before this call has an
    /// id at or below the answer, one created after it a higher id (so a topic created after
    /// the call has only higher ledger ids).
    async fn last_ledger_id(&self) -> Result<LedgerId, MetadataError>;

    /// Records that a sealed ledger's copies moved ([`CopyChange::apply`]'s rule), as one
    /// compare-and-set on the ledger record: refused with `Conflict` (nothing changed) when
    /// the ledger is not sealed, does not list a lost bookie or lists the new one already;
    /// `LedgerNotFound` when it does not exist.
    async fn move_ledger_copies(
        &self,
        id: LedgerId,
        change: &CopyChange,
    ) -> Result<LedgerRecord, MetadataError>;

    /// Replaces a failed replica of an open ledger ([`EnsembleChange::apply`]'s rule), as one
    /// compare-and-set on the ledger record: refused with `Conflict` (nothing changed) when the
    /// ledger is not open, does not list `from` as a replica or lists `to` already; with
    /// `writer_epoch`, refused with [`MetadataError::Fenced`] once the topic's writers were
    /// fenced at a higher epoch, atomically with the change (ADR 0016).
    async fn change_ensemble(
        &self,
        id: LedgerId,
        change: &EnsembleChange,
        writer_epoch: Option<u64>,
    ) -> Result<LedgerRecord, MetadataError>;

    /// Fences the writers of `topic_id` below `epoch` (a new owner, before it writes): from
    /// then on `create_ledger` with a lower epoch is refused. Idempotent for the same epoch;
    /// refused with [`MetadataError::Fenced`] when a higher epoch fenced the topic already.
    async fn fence_writers(&self, topic_id: TopicId, epoch: u64) -> Result<(), MetadataError>;

    /// One ledger.
    async fn get_ledger(&self, id: LedgerId) -> Result<Option<LedgerRecord>, MetadataError>;

    /// The records of those of `ids` that exist (one per id given, repeats included), by id:
    /// [`MetadataStore::get_ledger`] of each, which a store may read in fewer requests.
    async fn get_ledgers(&self, ids: &[LedgerId]) -> Result<Vec<LedgerRecord>, MetadataError> {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            out.extend(self.get_ledger(*id).await?);
        }
        out.sort_by_key(|l| l.id);
        Ok(out)
    }

    /// Every ledger of a topic (deleted ones included), by id.
    async fn topic_ledgers(&self, topic_id: TopicId) -> Result<Vec<LedgerRecord>, MetadataError>;

    /// Every ledger in one of `states`, by id.
    async fn ledgers_in_states(
        &self,
        states: &[LedgerState],
    ) -> Result<Vec<LedgerRecord>, MetadataError>;

    /// Moves a ledger along its lifecycle (compare-and-set on the current state).
    async fn transition_ledger(
        &self,
        id: LedgerId,
        transition: LedgerTransition,
        now_ms: i64,
    ) -> Result<LedgerRecord, MetadataError>;

    /// Stores (creates or replaces) the state of a durable subscription's cursor. The state is
    /// an opaque, versioned blob owned by the broker. With `writer_epoch`, the save happens
    /// only while no writer of a higher epoch has fenced the topic ([`Self::fence_writers`]),
    /// checked atomically with the write: otherwise [`MetadataError::Fenced`], and nothing is
    /// stored. So an owner that lost the topic cannot overwrite what its successor loaded
    /// (cursors, and the deduplication snapshot stored as one).
    async fn save_cursor(
        &self,
        topic_id: TopicId,
        subscription: &str,
        state: &[u8],
        now_ms: i64,
        writer_epoch: Option<u64>,
    ) -> Result<(), MetadataError>;

    /// Every cursor of a topic: (subscription, state), by subscription name.
    async fn topic_cursors(
        &self,
        topic_id: TopicId,
    ) -> Result<Vec<(String, Vec<u8>)>, MetadataError>;

    /// Removes a cursor (unsubscribe). Removing an absent cursor is not an error. With
    /// `writer_epoch`, fenced as [`Self::save_cursor`] is: refused once a higher epoch fenced
    /// the topic.
    async fn delete_cursor(
        &self,
        topic_id: TopicId,
        subscription: &str,
        writer_epoch: Option<u64>,
    ) -> Result<(), MetadataError>;

    /// Records that `name` (a full topic name without partition suffix) is partitioned into
    /// `partitions` partitions. Creating fails with [`MetadataError::Conflict`] when it exists
    /// and `update` is false; updating may only increase the count.
    async fn set_partitions(
        &self,
        name: &str,
        partitions: u32,
        update: bool,
    ) -> Result<(), MetadataError>;

    /// The partition count of a partitioned topic, `None` when `name` is not partitioned.
    async fn get_partitions(&self, name: &str) -> Result<Option<u32>, MetadataError>;

    /// Every partitioned topic whose name starts with `prefix`, with its partition count,
    /// ascending by name.
    async fn list_partitioned_topics(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, u32)>, MetadataError>;

    /// Stores schema `version` of topic `topic` (an opaque, versioned blob owned by the broker).
    /// Versions are dense from 0: storing a version that exists, or not the next one, fails
    /// with [`MetadataError::Conflict`] (so concurrent registrations cannot both win).
    async fn add_schema(
        &self,
        topic: &str,
        version: u64,
        schema: &[u8],
    ) -> Result<(), MetadataError>;

    /// Every schema version of `topic`, ascending.
    async fn schemas(&self, topic: &str) -> Result<Vec<(u64, Vec<u8>)>, MetadataError>;

    /// The policies blob stored under `scope` (e.g. `namespace:public/default`), `None` when
    /// none is set. The blob is opaque and versioned by its owner.
    async fn get_policies(&self, scope: &str) -> Result<Option<Vec<u8>>, MetadataError>;

    /// Replaces (or with `None` removes) the policies blob of `scope`.
    async fn set_policies(&self, scope: &str, policies: Option<&[u8]>)
        -> Result<(), MetadataError>;

    /// Stores `policies` under `scope` only if nothing is stored there; `false` (and nothing
    /// changed) when something is. Of concurrent creations exactly one wins.
    async fn create_policies(&self, scope: &str, policies: &[u8]) -> Result<bool, MetadataError>;

    /// Replaces the blob of `scope` with `new` (`None`: removes it) only if the store holds
    /// exactly `expect` there (`None`: nothing); whether it did. The compare-and-set of
    /// read-modify-write updates: of two processes updating one scope from the same read,
    /// exactly one succeeds.
    async fn replace_policies(
        &self,
        scope: &str,
        expect: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool, MetadataError>;

    /// Every `(scope, blob)` whose scope starts with `prefix`, ascending by scope.
    async fn list_policies(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, MetadataError>;

    /// A feed of every later write of a policies blob, by any process sharing the store, for
    /// the caches over them (contract in [`changes`]); `None` when this process is the store's
    /// only user, so caches it writes through stay true (SQLite, whose file the data-dir lock
    /// keeps to one process).
    async fn policy_changes(&self) -> Result<Option<PolicyChanges>, MetadataError> {
        Ok(None)
    }

    /// Waits for writes in flight and releases the store's connections; the service calls it
    /// last, after everything that writes has stopped. Nothing is lost without it (every
    /// method is durable when it returns).
    async fn close(&self) {}
}

/// Opens the store a `metadata.url` names: empty for the embedded default (SQLite at
/// `default_sqlite`), `sqlite:PATH`, or `etcd://host:port[,host:port…][/prefix]`.
pub async fn open(
    url: &str,
    default_sqlite: &std::path::Path,
) -> Result<std::sync::Arc<dyn MetadataStore>, MetadataError> {
    use std::sync::Arc;
    if url.is_empty() {
        Ok(Arc::new(
            sqlite::SqliteMetadataStore::open(default_sqlite).await?,
        ))
    } else if url.starts_with("sqlite:") {
        Ok(Arc::new(sqlite::SqliteMetadataStore::open_url(url).await?))
    } else if url.starts_with("etcd://") {
        Ok(Arc::new(etcd::EtcdMetadataStore::connect(url).await?))
    } else {
        Err(MetadataError::Backend {
            op: "open",
            source: format!("'{url}': expected sqlite:PATH or etcd://host:port").into(),
        })
    }
}
