//! Topic ownership: which node serves each topic partition, one at a time.
//!
//! A node owns a topic while the ephemeral key `owners/<topic>` of its coordination session
//! holds its [`NodeRecord`]. It is claimed with a compare-and-set on absence, so of nodes
//! claiming at once exactly one wins; the version of that write is the ownership's **epoch**,
//! strictly greater than every earlier owner's (versions come from one counter of the whole
//! store), which later fences a previous owner's writes. The key goes when the owner releases
//! the topic (unload, delete), stops, or loses its session.
//!
//! Placement of a topic nobody owns: if a bookie still writes an open ledger of it (its owner
//! stopped without sealing it), only that bookie's node can serve it (replication and fencing
//! are later slices of issue 19); otherwise the node a planned move named
//! ([`Ownership::hand_over`], `transfers/<topic>`), if it is live; otherwise the node chosen by
//! rendezvous hashing of the topic over the live nodes, so the partitions of a topic spread and
//! every node picks the same one. Sealed ledgers stay on their bookies and are read from there
//! by whichever node serves the topic. Placement claims nothing; the node claims the topic when
//! it loads it ([`Ownership::acquire`]).
//!
//! Invariants:
//! - `owned` holds a topic only while this session's key for it stands, as far as this node
//!   can know: it is emptied the moment the session is reported lost (before the server can
//!   expire the lease and let another node claim the topic).
//! - A node never claims a topic whose open ledger another bookie writes.
//! - A transfer record is ephemeral on the session of the node that handed the topic over and
//!   is removed by the claim that follows it: it only ever steers the next placement.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::cluster::membership::{Membership, MembershipError, NodeRecord};
use crate::coord::{CoordError, Coordination, Expect, SessionState};

/// Where owner records live, relative to the coordination root.
pub const OWNERS: &str = "owners/";
/// Where planned moves name the next owner, relative to the coordination root.
pub const TRANSFERS: &str = "transfers/";

/// Where a topic is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// This node serves it: owns it (with this epoch), or is to claim it when it loads it.
    Local {
        /// The ownership's epoch; `None` until the topic is loaded here.
        epoch: Option<u64>,
    },
    /// Another node owns it (`owned: true`) or should claim it (`owned: false`).
    Remote {
        /// That node (boxed: a record is large next to `Local`).
        node: Box<NodeRecord>,
        /// Whether it owns the topic already.
        owned: bool,
    },
}

/// Errors of ownership.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OwnershipError {
    /// Another node owns the topic.
    #[error("topic {topic} is served by {} ({})", owner.id, owner.broker_service_url)]
    OwnedElsewhere {
        /// Topic.
        topic: String,
        /// Its owner.
        owner: Box<NodeRecord>,
    },
    /// The bookie writing the topic's unreplicated open ledger is on no live node.
    #[error("topic {topic} is unavailable: its open ledger is written by bookie {bookie}, whose node is not live, and has no replica to take it over from (the namespace's persistence policy: ledger replication)")]
    HolderDown {
        /// Topic.
        topic: String,
        /// The bookie id.
        bookie: String,
    },
    /// Another bookie holds the topic's unoffloaded ledgers: only its node may serve it.
    #[error("topic {topic} must be served by the node of bookie {bookie}, which holds its ledgers not yet in the lake")]
    HeldElsewhere {
        /// Topic.
        topic: String,
        /// The bookie id.
        bookie: String,
    },
    /// A planned move hands the topic to another node, which is to claim it.
    #[error("topic {topic} is being moved to {}", to.id)]
    HandedOver {
        /// Topic.
        topic: String,
        /// The node it moves to.
        to: Box<NodeRecord>,
    },
    /// A planned move named a node that is not live.
    #[error("no live node has id {0} (ids are the nodes' advertised HTTP host:port, as /admin/v2/brokers lists them)")]
    UnknownNode(String),
    /// This node is stopping and hands its topics over.
    #[error("this node is stopping and takes no topic; look the topic up again")]
    Draining,
    /// This node's coordination session ended: it serves no topic.
    #[error("this node lost its coordination session ({0:?}) and serves no topic")]
    SessionEnded(SessionState),
    /// Reading the live nodes failed.
    #[error(transparent)]
    Membership(#[from] MembershipError),
    /// The coordination store failed.
    #[error(transparent)]
    Coordination(#[from] CoordError),
}

/// This node's view of topic ownership.
#[derive(Debug)]
pub struct Ownership {
    coord: Arc<dyn Coordination>,
    membership: Arc<Membership>,
    /// Invariant: see the module docs; topic → epoch.
    owned: Mutex<HashMap<String, u64>>,
    /// Invariant: once set (the node is stopping), no topic is claimed or placed here again.
    draining: std::sync::atomic::AtomicBool,
}

fn owner_key(topic: &str) -> String {
    format!("{OWNERS}{topic}")
}

fn transfer_key(topic: &str) -> String {
    format!("{TRANSFERS}{topic}")
}

/// Rendezvous score of `node` for `topic` (stable across nodes and builds).
fn score(topic: &str, node: &str) -> u64 {
    let a = crc32c::crc32c(topic.as_bytes());
    let b = crc32c::crc32c_append(a, b"\0");
    let b = crc32c::crc32c_append(b, node.as_bytes());
    // Mix both halves so nodes with similar names still spread (splitmix64 finaliser).
    let mut x = (u64::from(a) << 32) | u64::from(b);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Ownership {
    /// Ownership for this node (the one `membership` registered), starting with no topic.
    pub fn new(coord: Arc<dyn Coordination>, membership: Arc<Membership>) -> Arc<Self> {
        let ownership = Arc::new(Ownership {
            coord,
            membership,
            owned: Mutex::new(HashMap::new()),
            draining: std::sync::atomic::AtomicBool::new(false),
        });
        // The moment the session is no longer live, nothing is owned any more.
        let mut session = ownership.coord.session();
        let weak = Arc::downgrade(&ownership);
        tokio::spawn(async move {
            while *session.borrow_and_update() == SessionState::Live {
                if session.changed().await.is_err() {
                    break;
                }
            }
            if let Some(o) = weak.upgrade() {
                let n = o.lock().drain().count();
                tracing::warn!(topics = n, "coordination session ended: serving no topic");
            }
        });
        ownership
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.owned.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The load reports of this node's cluster ([`crate::cluster::load`]).
    pub fn load_board(&self) -> crate::cluster::load::LoadBoard {
        crate::cluster::load::LoadBoard::new(self.coord.clone(), self.membership.clone())
    }

    /// This node's record.
    pub fn me(&self) -> &NodeRecord {
        self.membership.me()
    }

    /// The epoch of `topic` if this node owns it.
    pub fn epoch(&self, topic: &str) -> Option<u64> {
        self.lock().get(topic).copied()
    }

    /// Whether ownership epochs fence writers ([`crate::ledger::MetadataStore::fence_writers`]):
    /// only when they come from a store whose versions outlive this process (etcd). A single
    /// node's in-process epochs restart at 1 and fence nothing (it is the only writer).
    pub fn fences(&self) -> bool {
        self.coord.versions_outlive_processes()
    }

    /// Topics owned now.
    pub fn owned(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// A receiver that sees the session end (the broker stops serving then).
    pub fn session(&self) -> tokio::sync::watch::Receiver<SessionState> {
        self.coord.session()
    }

    fn live(&self) -> Result<(), OwnershipError> {
        match *self.coord.session().borrow() {
            SessionState::Live => Ok(()),
            other => Err(OwnershipError::SessionEnded(other)),
        }
    }

    /// Where `topic` is served. `holder` is the bookie holding its unoffloaded ledgers, if
    /// any. An unowned topic is placed here or on another node, which claims it when it loads
    /// it (so a lookup alone claims nothing: lookups of names never used leave no key).
    /// `authoritative` (another node placed it here) places an unowned topic here whatever
    /// this node would have chosen; two nodes disagreeing (their views of the live nodes
    /// differ) resolve at the claim: one loses and its client looks the topic up again.
    pub async fn place(
        &self,
        topic: &str,
        holder: Option<&str>,
        authoritative: bool,
    ) -> Result<Placement, OwnershipError> {
        if let Some(owned) = self.place_owned(topic).await? {
            return Ok(owned);
        }
        self.place_unowned(topic, holder, authoritative).await
    }

    /// Where `topic` is served when a node owns it (here: no store read; elsewhere: its owner
    /// record); `None` when it is unowned. The holder of its ledgers does not matter then, so
    /// a lookup of an owned topic need not look for it ([`Self::place`]).
    pub async fn place_owned(&self, topic: &str) -> Result<Option<Placement>, OwnershipError> {
        self.live()?;
        if let Some(epoch) = self.epoch(topic) {
            return Ok(Some(Placement::Local { epoch: Some(epoch) }));
        }
        Ok(self.owner(topic).await?.map(|owner| Placement::Remote {
            node: Box::new(owner),
            owned: true,
        }))
    }

    /// [`Self::place`] of a topic [`Self::place_owned`] found unowned.
    pub async fn place_unowned(
        &self,
        topic: &str,
        holder: Option<&str>,
        authoritative: bool,
    ) -> Result<Placement, OwnershipError> {
        let me = self.me();
        let target = match holder {
            None => self.transfer_target(topic).await?,
            Some(_) => None,
        };
        if let Some(node) = target {
            return Ok(if node.id == me.id {
                Placement::Local { epoch: None }
            } else {
                Placement::Remote {
                    node: Box::new(node),
                    owned: false,
                }
            });
        }
        let chosen = match holder {
            Some(b) if b == me.bookie => None,
            Some(b) => {
                let nodes = self.membership.nodes().await?;
                match nodes.into_iter().find(|n| n.bookie == b) {
                    Some(node) => Some(node),
                    None => {
                        return Err(OwnershipError::HolderDown {
                            topic: topic.to_string(),
                            bookie: b.to_string(),
                        })
                    }
                }
            }
            None if authoritative && !self.is_draining() => None,
            None => {
                let draining = self.is_draining();
                let nodes = self.membership.nodes().await?;
                nodes
                    .into_iter()
                    .filter(|n| {
                        let stopping = n.draining || (draining && n.id == me.id);
                        !stopping
                    })
                    .max_by_key(|n| score(topic, &n.id))
                    .filter(|n| n.id != me.id)
            }
        };
        match chosen {
            Some(node) => Ok(Placement::Remote {
                node: Box::new(node),
                owned: false,
            }),
            None => Ok(Placement::Local { epoch: None }),
        }
    }

    /// The node owning `topic`, if any node does.
    pub async fn owner(&self, topic: &str) -> Result<Option<NodeRecord>, OwnershipError> {
        match self.coord.get(&owner_key(topic)).await? {
            Some(v) => Ok(Some(NodeRecord::decode(&v.value)?)),
            None => Ok(None),
        }
    }

    /// Claims `topic` for this node (before it is loaded); its epoch. Refused while another
    /// node owns it or another bookie holds its unoffloaded ledgers (`holder`).
    pub async fn acquire(&self, topic: &str, holder: Option<&str>) -> Result<u64, OwnershipError> {
        self.live()?;
        if let Some(epoch) = self.epoch(topic) {
            return Ok(epoch);
        }
        if self.is_draining() {
            return Err(OwnershipError::Draining);
        }
        let me = self.me().clone();
        if let Some(b) = holder.filter(|b| *b != me.bookie) {
            return Err(OwnershipError::HeldElsewhere {
                topic: topic.to_string(),
                bookie: b.to_string(),
            });
        }
        // A planned move names another live node: only it claims the topic (a client of the
        // old owner that reconnected during the move must not win it back).
        if let Some(target) = self.transfer_target(topic).await? {
            if target.id != me.id {
                return Err(OwnershipError::HandedOver {
                    topic: topic.to_string(),
                    to: Box::new(target),
                });
            }
        }
        let key = owner_key(topic);
        match self
            .coord
            .put(&key, &me.encode(), Expect::Absent, true)
            .await
        {
            Ok(epoch) => {
                self.lock().insert(topic.to_string(), epoch);
                if let Err(e) = self.coord.delete(&transfer_key(topic), Expect::Any).await {
                    tracing::warn!(topic, error = %e, "removing a used transfer record failed");
                }
                // The session may have ended while the claim was in flight.
                if let Err(e) = self.live() {
                    self.lock().remove(topic);
                    return Err(e);
                }
                tracing::debug!(topic, epoch, "topic owned");
                Ok(epoch)
            }
            Err(CoordError::Conflict { .. }) => match self.owner(topic).await? {
                Some(owner) => Err(OwnershipError::OwnedElsewhere {
                    topic: topic.to_string(),
                    owner: Box::new(owner),
                }),
                // Released meanwhile: try again.
                None => Box::pin(self.acquire(topic, holder)).await,
            },
            Err(e) => Err(e.into()),
        }
    }

    /// Names `to` as the next owner of `topic`, which this node is about to release (a
    /// planned move): placement sends it there while `to` is live and this node's session
    /// lasts, until a node claims the topic.
    pub async fn hand_over(&self, topic: &str, to: &NodeRecord) -> Result<(), OwnershipError> {
        self.live()?;
        self.coord
            .put(&transfer_key(topic), &to.encode(), Expect::Any, true)
            .await?;
        Ok(())
    }

    /// The live node a planned move named for `topic`, if any.
    async fn transfer_target(&self, topic: &str) -> Result<Option<NodeRecord>, OwnershipError> {
        let Some(v) = self.coord.get(&transfer_key(topic)).await? else {
            return Ok(None);
        };
        let named = NodeRecord::decode(&v.value)?;
        let live = self.membership.nodes().await?;
        Ok(live.into_iter().find(|n| n.id == named.id && !n.draining))
    }

    /// Every registered node (stopping ones included).
    pub async fn nodes(&self) -> Result<Vec<NodeRecord>, OwnershipError> {
        Ok(self.membership.nodes().await?)
    }

    /// Follows the registrations until `stop` (once; [`Membership::follow`]) and wakes after
    /// each change of what [`Self::nodes`] reads.
    pub fn follow_nodes(
        &self,
        stop: tokio_util::sync::CancellationToken,
    ) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.membership.follow(stop);
        self.membership.changes()
    }

    /// The live node with id `id`, unless it is stopping.
    pub async fn live_node(&self, id: &str) -> Result<Option<NodeRecord>, OwnershipError> {
        let live = self.membership.nodes().await?;
        Ok(live.into_iter().find(|n| n.id == id && !n.draining))
    }

    /// Stops taking topics (the node is stopping): no claim succeeds and placement sends
    /// every unowned topic to another node, here and, once the registration says so, on every
    /// node. Topics owned now stay owned until released.
    pub async fn drain(&self) -> Result<(), OwnershipError> {
        self.draining
            .store(true, std::sync::atomic::Ordering::Release);
        self.membership.drain().await?;
        Ok(())
    }

    fn is_draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Gives `topic` up (after it was unloaded or deleted here).
    pub async fn release(&self, topic: &str) -> Result<(), OwnershipError> {
        let epoch = {
            let mut owned = self.lock();
            let epoch = owned.remove(topic);
            crate::memory::shrink_sparse(&mut owned);
            epoch
        };
        let Some(epoch) = epoch else {
            return Ok(());
        };
        match self
            .coord
            .delete(&owner_key(topic), Expect::Version(epoch))
            .await
        {
            Ok(_) | Err(CoordError::Conflict { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests;
