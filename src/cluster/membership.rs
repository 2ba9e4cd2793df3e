//! Membership: every running node registers itself as an ephemeral key of its coordination
//! session (`nodes/<id>`), so the live nodes are the registered ones, and a node that dies or
//! is cut off drops out when its session's lease runs out.
//!
//! A node's id is its advertised HTTP `host:port`, as Pulsar names brokers
//! (`/admin/v2/brokers/{cluster}` lists them). A node restarted after a crash may find its old
//! registration still standing (the old lease has not expired and no peer ended it yet). When
//! the record names its own bookie id with another start time, it is an earlier process of the
//! data directory this process holds locked ([`crate::dir_lock`]), so it is gone: the node ends
//! that session and registers at once. Any other holder of the id may be a live process: the
//! node waits for it to go, up to twice the session's time-to-live, rather than take its key.
//!
//! Record: `[format 1][JSON]` of [`NodeRecord`] (ADR 0006).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use tokio_util::sync::CancellationToken;

use super::roster::Roster;
use crate::coord::{CoordError, Coordination, Expect};

/// Format byte of a node record.
pub const FORMAT: u8 = 1;
/// Where node records live, relative to the coordination root.
pub const NODES: &str = "nodes/";
/// Where nodes record their verdicts that another node is gone:
/// `suspects/<node id>/<prober id>`, ephemeral on the prober's session, `[format 1][JSON]` of
/// [`Suspicion`].
pub const SUSPECTS: &str = "suspects/";

/// One node's verdict that another is gone, about one registration of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Suspicion {
    /// The version of the registration the verdict is about.
    pub registration: u64,
}

/// What a node tells the others about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRecord {
    /// Advertised HTTP `host:port`: the node's id.
    pub id: String,
    /// `pulsar://host:port` clients connect to.
    pub broker_service_url: String,
    /// `pulsar+ssl://host:port`, when the node serves TLS.
    #[serde(default)]
    pub broker_service_url_tls: Option<String>,
    /// `http://host:port` of the admin API.
    pub web_service_url: String,
    /// `https://host:port` of the admin API, when the node serves HTTPS: admin calls that came
    /// over HTTPS are redirected there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web_service_url_tls: Option<String>,
    /// `host:port` of the PostgreSQL-wire listener, when SQL is on.
    #[serde(default)]
    pub pg_addr: Option<String>,
    /// When the node started (ms since epoch).
    pub started_at_ms: i64,
    /// The ledgerlake version it runs.
    pub version: String,
    /// Bookie id of its log (ADR 0007); empty in records of builds before bookie ids.
    #[serde(default)]
    pub bookie: String,
    /// `host:port` of its bookie listener (node-to-node reads), when it serves one.
    #[serde(default)]
    pub bookie_addr: Option<String>,
    /// Other addresses of the same bookie listener by listener name (through NAT, a load
    /// balancer or a proxy); a node that reaches bookies by one of these names dials it there.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub bookie_listeners: BTreeMap<String, String>,
    /// Its bookie listener speaks TLS (`server.bookie_tls`, ADR 0013): it is dialled over TLS.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bookie_tls: bool,
    /// The node is stopping: it hands its topics over and takes no new ones, while its bookie
    /// still serves reads.
    #[serde(default)]
    pub draining: bool,
}

impl NodeRecord {
    /// The stored form.
    pub fn encode(&self) -> Vec<u8> {
        crate::versioned::encode(FORMAT, self)
    }

    /// Reads the stored form, refusing other format bytes.
    pub fn decode(bytes: &[u8]) -> Result<Self, MembershipError> {
        crate::versioned::decode(FORMAT, "node record", bytes).map_err(MembershipError::Corrupt)
    }
}

/// Errors of membership.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MembershipError {
    /// Another live process holds this node's id.
    #[error("node id {id} is registered by another live process (started at {started_at_ms} ms); is a second node configured with the same advertised HTTP address?")]
    IdInUse {
        /// The id.
        id: String,
        /// When the other registration's node started.
        started_at_ms: i64,
    },
    /// A stored record could not be read.
    #[error("membership: {0}")]
    Corrupt(String),
    /// The coordination store failed.
    #[error(transparent)]
    Coordination(#[from] CoordError),
}

/// Whether `holder`, registered under `me`'s id, is an earlier process of `me`'s data
/// directory: the same bookie id, another start. The service holds the directory's lock
/// ([`crate::dir_lock`]) before it joins, so that process is gone.
fn predecessor(holder: &NodeRecord, me: &NodeRecord) -> bool {
    !me.bookie.is_empty() && holder.bookie == me.bookie && holder.started_at_ms != me.started_at_ms
}

/// A registration: its key, the record, and the version it was written at.
pub type Registration = (String, NodeRecord, u64);

/// Where and how this node reaches a peer's bookie listener.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BookieAddr {
    /// `host:port` dialled.
    pub addr: String,
    /// The listener speaks TLS.
    pub tls: bool,
}

impl std::fmt::Display for BookieAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.tls { "tls://" } else { "" };
        write!(f, "{scheme}{}", self.addr)
    }
}

/// This node's registration, and the view of the others.
#[derive(Debug)]
pub struct Membership {
    /// Invariant: `me` is registered as an ephemeral key of this session until `leave`.
    coord: Arc<dyn Coordination>,
    me: NodeRecord,
    /// The listener name this node dials the other nodes' bookies by (`None`: their bound
    /// addresses).
    bookie_listener: Option<String>,
    /// The registrations followed by a watch once [`Membership::follow`] started it: the
    /// views below read it instead of listing the store (they list while it does not follow).
    roster: std::sync::OnceLock<Arc<Roster<NodeRecord>>>,
    /// When [`Self::find_bookie`] last listed the store for a bookie the copy lacked: a bookie
    /// gone for good (still named by ledgers) is listed for at most every [`MISS_RELIST`].
    missed: std::sync::Mutex<HashMap<String, std::time::Instant>>,
}

/// How often [`Membership::find_bookie`] lists the store for one bookie the copy lacks.
const MISS_RELIST: Duration = Duration::from_secs(2);

impl Membership {
    /// Registers `me`, waiting up to `wait` for a stale registration of the same id (a crashed
    /// predecessor whose lease has not run out yet) to go.
    pub async fn join(
        coord: Arc<dyn Coordination>,
        me: NodeRecord,
        wait: Duration,
    ) -> Result<Self, MembershipError> {
        let key = format!("{NODES}{}", me.id);
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match coord.put(&key, &me.encode(), Expect::Absent, true).await {
                Ok(_) => {
                    return Ok(Membership {
                        coord,
                        me,
                        bookie_listener: None,
                        roster: std::sync::OnceLock::new(),
                        missed: Default::default(),
                    })
                }
                Err(CoordError::Conflict { .. }) => {
                    let (holder, version) = match coord.get(&key).await? {
                        Some(v) => (NodeRecord::decode(&v.value)?, v.version),
                        None => continue,
                    };
                    if predecessor(&holder, &me) {
                        // An earlier process of this data directory, which this one now
                        // holds locked: it is gone, and its session goes with it.
                        let ended = coord.end_session_of(&key, Expect::Version(version)).await;
                        match ended {
                            Ok(true) => {
                                tracing::info!(id = %me.id, started_at_ms = holder.started_at_ms,
                                    "ended the session of this node's previous process");
                                continue;
                            }
                            // Gone meanwhile: register now.
                            Err(CoordError::Conflict { .. }) => continue,
                            // A record without a session (written by hand): wait, as for
                            // any other holder. A failed end is retried after the wait.
                            Ok(false) => {}
                            Err(e) => tracing::warn!(error = %e,
                                "ending the previous process's session failed; retrying"),
                        }
                    }
                    if tokio::time::Instant::now() >= deadline {
                        return Err(MembershipError::IdInUse {
                            id: me.id,
                            started_at_ms: holder.started_at_ms,
                        });
                    }
                    tracing::info!(id = %me.id, "waiting for an earlier registration of this node to expire");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Dials the other nodes' bookies at the addresses they advertise under `listener`, where
    /// they advertise one (Pulsar's `internalListenerName`).
    pub fn reach_bookies_by(mut self, listener: Option<String>) -> Self {
        self.bookie_listener = listener;
        self
    }

    /// Where this node dials `node`'s bookie, if it serves one.
    pub fn bookie_address(&self, node: &NodeRecord) -> Option<BookieAddr> {
        let named = self
            .bookie_listener
            .as_ref()
            .and_then(|name| node.bookie_listeners.get(name));
        let addr = named.or(node.bookie_addr.as_ref())?;
        Some(BookieAddr {
            addr: addr.clone(),
            tls: node.bookie_tls,
        })
    }

    /// Where this node dials every registered node's bookie, by bookie id.
    pub async fn bookie_addresses(&self) -> Result<HashMap<String, BookieAddr>, MembershipError> {
        let nodes = self.nodes().await?;
        Ok(self.addresses_of(nodes))
    }

    fn addresses_of(&self, nodes: Vec<NodeRecord>) -> HashMap<String, BookieAddr> {
        nodes
            .into_iter()
            .filter_map(|n| Some((self.bookie_address(&n)?, n.bookie)))
            .map(|(addr, bookie)| (bookie, addr))
            .collect()
    }

    /// Where this node dials `bookie` (`None`: no registered node has it, or it serves no
    /// bookie listener). A bookie the followed copy lacks is looked for in a listing too (at
    /// most every [`MISS_RELIST`]): it may have joined a moment ago, before the copy applied
    /// its registration.
    pub async fn find_bookie(&self, bookie: &str) -> Result<Option<BookieAddr>, MembershipError> {
        if let Some(addr) = self.bookie_addresses().await?.remove(bookie) {
            return Ok(Some(addr));
        }
        if !self.is_following() {
            return Ok(None); // That was a listing already.
        }
        {
            let mut missed = self.missed.lock().unwrap_or_else(|p| p.into_inner());
            let now = std::time::Instant::now();
            missed.retain(|_, at| now.duration_since(*at) < MISS_RELIST);
            if missed.contains_key(bookie) {
                return Ok(None);
            }
            missed.insert(bookie.to_string(), now);
        }
        let listed = self.list_registrations().await?;
        let nodes = listed.into_iter().map(|(n, _)| n).collect();
        Ok(self.addresses_of(nodes).remove(bookie))
    }

    /// This node's record.
    pub fn me(&self) -> &NodeRecord {
        &self.me
    }

    /// Every registered node, by id.
    pub async fn nodes(&self) -> Result<Vec<NodeRecord>, MembershipError> {
        let registered = self.registrations().await?;
        Ok(registered.into_iter().map(|(node, _)| node).collect())
    }

    /// Every registered node by key with the version of its registration, and a watch of
    /// every later change under the same prefix (the coordination contract: nothing missed,
    /// nothing twice; list again when it ends).
    pub async fn watch(&self) -> Result<(Vec<Registration>, crate::coord::Watch), MembershipError> {
        let (items, at) = self.coord.list(NODES).await?;
        let nodes = items
            .iter()
            .map(|(k, v)| Ok((k.clone(), NodeRecord::decode(&v.value)?, v.version)))
            .collect::<Result<Vec<_>, MembershipError>>()?;
        Ok((nodes, self.coord.watch(NODES, at).await?))
    }

    /// Follows the registrations by a watch until `stop`, so that the views ([`Self::nodes`],
    /// [`Self::registrations`], [`Self::bookie_addresses`]) read memory instead of listing the
    /// store on every call: placement on every lookup, every ensemble choice and every probe
    /// pass use them. A second call does nothing.
    pub fn follow(self: &Arc<Self>, stop: CancellationToken) {
        self.roster.get_or_init(|| {
            let me = Arc::downgrade(self);
            let list_and_watch = move || {
                let me = me.upgrade();
                async move {
                    match me {
                        Some(me) => me.watch().await,
                        // Dropped: nothing is left to follow for.
                        None => std::future::pending().await,
                    }
                }
            };
            Roster::start(list_and_watch, NodeRecord::decode, stop)
        });
    }

    /// Whether the views read the followed copy now (else they list the store).
    pub(crate) fn is_following(&self) -> bool {
        self.roster.get().is_some_and(|r| r.is_following())
    }

    /// Wakes after each change of the followed copy (`None` until [`Self::follow`]): a
    /// follower that reads [`Self::nodes`] when woken sees at least that change.
    pub fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.roster.get().map(|r| r.subscribe())
    }

    /// Every registered node with the version of its registration, in id order: the followed
    /// copy when there is one ([`Self::follow`]), else a listing.
    pub async fn registrations(&self) -> Result<Vec<(NodeRecord, u64)>, MembershipError> {
        match self.roster.get().and_then(|r| r.current()) {
            Some(copy) => Ok(copy),
            None => self.list_registrations().await,
        }
    }

    /// Every registered node with the version of its registration, as the store lists them now.
    pub async fn list_registrations(&self) -> Result<Vec<(NodeRecord, u64)>, MembershipError> {
        let (items, _) = self.coord.list(NODES).await?;
        items
            .iter()
            .map(|(_, v)| Ok((NodeRecord::decode(&v.value)?, v.version)))
            .collect()
    }

    /// Ends the session of node `id`, registered at `version`, whose process is known to be
    /// gone: its registration and every topic it owned go at once. `false`: that registration
    /// is no longer there (it left, expired, or was ended by another node).
    pub async fn expel(&self, id: &str, version: u64) -> Result<bool, MembershipError> {
        let key = format!("{NODES}{id}");
        match self
            .coord
            .end_session_of(&key, Expect::Version(version))
            .await
        {
            Ok(ended) => Ok(ended),
            Err(CoordError::Conflict { .. }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Records this node's verdict that node `id`, registered at `version`, is gone; whether a
    /// majority of the registered nodes other than `id` that are not stopping (this one
    /// included) now holds that verdict about that registration (stopping nodes no longer
    /// probe). One node alone (whose own network may be what fails)
    /// ends nobody's session unless it is the only other node.
    pub async fn suspect(&self, id: &str, version: u64) -> Result<bool, MembershipError> {
        let prefix = format!("{SUSPECTS}{id}/");
        let verdict = Suspicion {
            registration: version,
        };
        let mine = format!("{prefix}{}", self.me.id);
        let bytes = crate::versioned::encode(FORMAT, &verdict);
        self.coord.put(&mine, &bytes, Expect::Any, true).await?;
        // Listed now, not read from the followed copy: a copy that has not seen a node join
        // would count too few voters, and one node alone could end another's session.
        let voters: Vec<String> = self
            .list_registrations()
            .await?
            .into_iter()
            .filter(|(n, _)| n.id != id && !n.draining)
            .map(|(n, _)| n.id)
            .collect();
        let (votes, _) = self.coord.list(&prefix).await?;
        let agreeing = votes
            .iter()
            .filter(|(key, v)| {
                let decoded: Result<Suspicion, _> =
                    crate::versioned::decode(FORMAT, "suspicion", &v.value);
                let prober = key.strip_prefix(prefix.as_str()).unwrap_or_default();
                decoded.is_ok_and(|d| d == verdict) && voters.iter().any(|n| n == prober)
            })
            .count();
        Ok(agreeing > voters.len() / 2)
    }

    /// Withdraws this node's verdict about node `id` (it answers again, or it is gone).
    pub async fn unsuspect(&self, id: &str) -> Result<(), MembershipError> {
        let key = format!("{SUSPECTS}{id}/{}", self.me.id);
        self.coord.delete(&key, Expect::Any).await?;
        Ok(())
    }

    /// The state of the session this node is registered under.
    pub fn session(&self) -> tokio::sync::watch::Receiver<crate::coord::SessionState> {
        self.coord.session()
    }

    /// Marks this node as stopping in its registration (it stays registered: its bookie still
    /// serves reads); placement on every node then sends no topic here.
    pub async fn drain(&self) -> Result<(), MembershipError> {
        let record = NodeRecord {
            draining: true,
            ..self.me.clone()
        };
        let key = format!("{NODES}{}", self.me.id);
        self.coord
            .put(&key, &record.encode(), Expect::Any, true)
            .await?;
        Ok(())
    }

    /// Leaves the cluster: the session ends and the registration goes at once.
    pub async fn leave(&self) -> Result<(), MembershipError> {
        Ok(self.coord.close().await?)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::coord::memory::MemoryCoordination;
    use proptest::prelude::*;

    /// A record of node `id` for tests (bookie `bookie-<id>`).
    pub(crate) fn record(id: &str) -> NodeRecord {
        NodeRecord {
            id: id.into(),
            broker_service_url: format!("pulsar://{id}"),
            broker_service_url_tls: None,
            web_service_url: format!("http://{id}"),
            web_service_url_tls: None,
            pg_addr: Some("127.0.0.1:5433".into()),
            started_at_ms: 7,
            version: "0.1.0".into(),
            bookie: format!("bookie-{id}"),
            bookie_addr: Some(format!("bookie-addr-of-{id}")),
            bookie_listeners: BTreeMap::new(),
            bookie_tls: false,
            draining: false,
        }
    }

    proptest! {
        #[test]
        fn node_records_round_trip(id in ".*", tls in proptest::option::of(".*"),
                                   pg in proptest::option::of(".*"), started in any::<i64>(),
                                   bookie_addr in proptest::option::of(".*"),
                                   bookie_listeners in proptest::collection::btree_map(
                                       ".*", ".*", 0..3),
                                   bookie_tls in any::<bool>(),
                                   web_tls in proptest::option::of(".*")) {
            let r = NodeRecord { broker_service_url_tls: tls, pg_addr: pg, started_at_ms: started,
                                 bookie_addr, bookie_listeners, bookie_tls,
                                 web_service_url_tls: web_tls, ..record(&id) };
            let bytes = r.encode();
            prop_assert_eq!(bytes[0], FORMAT);
            prop_assert_eq!(NodeRecord::decode(&bytes).ok(), Some(r));
        }
    }

    #[test]
    fn a_record_without_listeners_reads_as_before_them() {
        // Records of builds before named listeners carry no such field, and records without
        // any are written without it: both builds read each other's.
        let r = record("a:1");
        let json = String::from_utf8_lossy(&r.encode()[1..]).into_owned();
        assert!(
            !json.contains("bookieListeners") && !json.contains("bookieTls"),
            "{json}"
        );
        let mut named = r.clone();
        named
            .bookie_listeners
            .insert("wan".into(), "10.0.0.9:3181".into());
        assert_eq!(NodeRecord::decode(&named.encode()).ok(), Some(named));
        // A later build's field is ignored, as this build's are by the builds before it.
        let later = json.replacen('{', r#"{"aFieldOfALaterBuild":[1],"#, 1);
        let mut bytes = vec![FORMAT];
        bytes.extend_from_slice(later.as_bytes());
        assert_eq!(NodeRecord::decode(&bytes).ok(), Some(r));
    }

    #[tokio::test]
    async fn bookies_are_dialled_at_the_listener_this_node_reaches_them_by(
    ) -> Result<(), MembershipError> {
        let coord = MemoryCoordination::new();
        let session = || -> Arc<dyn Coordination> { Arc::new(coord.new_session()) };
        let mut b = record("b:2");
        b.bookie_listeners
            .insert("wan".into(), "proxy-of-b:9".into());
        let b = Membership::join(session(), b, Duration::ZERO).await?;
        let plain = Membership::join(session(), record("a:1"), Duration::ZERO).await?;
        let addrs = plain.bookie_addresses().await?;
        assert_eq!(addrs["bookie-b:2"].addr, "bookie-addr-of-b:2");
        let c = Membership::join(session(), record("c:3"), Duration::ZERO)
            .await?
            .reach_bookies_by(Some("wan".into()));
        let addrs = c.bookie_addresses().await?;
        // Named where the peer advertises the name, bound address where it does not.
        assert_eq!(addrs["bookie-b:2"].addr, "proxy-of-b:9");
        assert_eq!(addrs["bookie-a:1"].addr, "bookie-addr-of-a:1");
        let mut tls = b.me().clone();
        tls.bookie_tls = true;
        let via = c.bookie_address(&tls).map(|a| a.to_string());
        assert_eq!(via.as_deref(), Some("tls://proxy-of-b:9"));
        Ok(())
    }

    fn ids(nodes: Vec<NodeRecord>) -> Vec<String> {
        nodes.into_iter().map(|n| n.id).collect()
    }

    /// (id, draining) of each registration the followed copy holds (`None`: not following).
    fn followed(m: &Membership) -> Option<Vec<(String, bool)>> {
        let copy = m.roster.get()?.current()?;
        Some(copy.into_iter().map(|(n, _)| (n.id, n.draining)).collect())
    }

    /// Waits (up to 2 s) until the followed copy holds `want`.
    async fn settled(m: &Membership, want: &[(&str, bool)]) -> Result<(), String> {
        let want: Vec<(String, bool)> = want.iter().map(|(i, d)| (i.to_string(), *d)).collect();
        for _ in 0..200 {
            if followed(m).as_ref() == Some(&want) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Err(format!("followed {:?}, wanted {want:?}", followed(m)))
    }

    #[tokio::test]
    async fn followed_registrations_track_joins_drains_and_leaves(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let coord = MemoryCoordination::new();
        let session = || -> Arc<dyn Coordination> { Arc::new(coord.new_session()) };
        let me = Arc::new(Membership::join(session(), record("a:1"), Duration::ZERO).await?);
        let stop = CancellationToken::new();
        me.follow(stop.clone());
        settled(&me, &[("a:1", false)]).await?;
        let b = Membership::join(session(), record("b:2"), Duration::ZERO).await?;
        settled(&me, &[("a:1", false), ("b:2", false)]).await?;
        b.drain().await?;
        settled(&me, &[("a:1", false), ("b:2", true)]).await?;
        // The copy is what the store lists, versions included (an expel at them must match).
        assert_eq!(me.registrations().await?, me.list_registrations().await?);
        b.leave().await?;
        settled(&me, &[("a:1", false)]).await?;
        assert_eq!(ids(me.nodes().await?), vec!["a:1"]);
        stop.cancel();
        for _ in 0..200 {
            if followed(&me).is_none() {
                // Not following: the views list the store again.
                let c = Membership::join(session(), record("c:3"), Duration::ZERO).await?;
                assert_eq!(ids(me.nodes().await?), vec!["a:1", "c:3"]);
                c.leave().await?;
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Err("a stopped copy still answers".into())
    }

    #[test]
    fn other_formats_are_refused() {
        let mut bytes = record("a:1").encode();
        bytes[0] = 2;
        assert!(NodeRecord::decode(&bytes).is_err());
        assert!(NodeRecord::decode(&[]).is_err());
    }

    #[tokio::test]
    async fn nodes_see_each_other_and_a_leaver_goes() -> Result<(), MembershipError> {
        let a_coord = MemoryCoordination::new();
        let b_coord: Arc<dyn Coordination> = Arc::new(a_coord.new_session());
        let a = Membership::join(Arc::new(a_coord), record("a:1"), Duration::ZERO).await?;
        let b = Membership::join(b_coord, record("b:2"), Duration::ZERO).await?;
        assert_eq!(ids(b.nodes().await?), vec!["a:1", "b:2"]);
        a.leave().await?;
        assert_eq!(ids(b.nodes().await?), vec!["b:2"]);
        Ok(())
    }

    #[tokio::test]
    async fn a_second_live_node_with_the_same_id_is_refused() -> Result<(), MembershipError> {
        let first = MemoryCoordination::new();
        let second: Arc<dyn Coordination> = Arc::new(first.new_session());
        let _a = Membership::join(Arc::new(first), record("a:1"), Duration::ZERO).await?;
        let wait = Duration::from_millis(600);
        let started = tokio::time::Instant::now();
        // Another data directory (another bookie id), started later: maybe a live process.
        let other = NodeRecord {
            bookie: "bookie-elsewhere".into(),
            started_at_ms: 8,
            ..record("a:1")
        };
        let refused = Membership::join(second, other, wait).await;
        assert!(matches!(refused, Err(MembershipError::IdInUse { .. })));
        assert!(
            started.elapsed() >= wait,
            "it waited for a stale registration first"
        );
        Ok(())
    }

    #[tokio::test]
    async fn a_restarted_node_ends_its_predecessors_session_at_once() -> Result<(), MembershipError>
    {
        let first = MemoryCoordination::new();
        let mut old_session = first.session();
        let second: Arc<dyn Coordination> = Arc::new(first.new_session());
        let owner: Arc<dyn Coordination> = Arc::new(first.new_session());
        let crashed = Arc::new(first);
        let _old = Membership::join(crashed.clone(), record("a:1"), Duration::ZERO).await?;
        crashed
            .put("owners/t", b"a:1", Expect::Absent, true)
            .await?;
        let restarted = NodeRecord {
            started_at_ms: 8,
            ..record("a:1")
        };
        let started = tokio::time::Instant::now();
        let joined = Membership::join(second, restarted, Duration::from_secs(30)).await?;
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no wait for the lease"
        );
        assert_eq!(joined.nodes().await?[0].started_at_ms, 8);
        assert_eq!(
            *old_session.borrow_and_update(),
            crate::coord::SessionState::Lost
        );
        assert!(
            owner.get("owners/t").await?.is_none(),
            "what the old process owned went with its session"
        );
        Ok(())
    }
}
