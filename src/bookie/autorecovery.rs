//! Autorecovery (issue 19, slice 6; ADR 0011): every node of a cluster looks for sealed ledgers
//! that have fewer copies than their write quorum and makes the missing copies, so a node lost
//! for good (crashed, its disk wiped) costs no ledger its redundancy for long.
//!
//! What counts: a bookie listed by a ledger and advertised by no live member is *missing*; once
//! missing for [`AutoRecoveryConfig::delay`] (as this node has seen it) it is *lost*. A sealed
//! ledger is *under-replicated* when its listed live bookies number fewer than its write quorum,
//! capped at the live bookies (a cluster of two cannot hold three copies); *unrecoverable* when
//! none of them is live. Empty ledgers are left alone.
//!
//! Who does what, the same on every node that sees the same members (no coordinator):
//! - A copy: each under-replicated sealed ledger with no missing-but-not-lost bookie (one that
//!   may come back is waited for) has one target, a live, non-draining bookie the ledger does
//!   not list, picked by ledger id and the current minute (so a target that keeps failing is
//!   replaced). Only the target copies ([`Log::recopy_ledger`]): from the bookies still holding
//!   it, checked against the seal, recorded with one compare-and-set that also drops the lost
//!   bookies.
//! - A drop: lost bookies of a ledger that needs no copy (as many copies as live bookies allow,
//!   no bookie to copy to, or offloaded) are dropped from it by its writer, or when the writer
//!   is not live by a live bookie holding a copy (by ledger id and minute), which takes a lost
//!   writer's place ([`Log::drop_lost_copies`]; the writer offloads the ledger and deletes
//!   local copies).
//! - A striped ledger (ADR 0017) keeps its places: a lost bookie's place becomes vacant when
//!   dropped, and copies fill its empty places (vacant, or held by a lost bookie) one at a
//!   time, the writer's first (a whole copy), then each replica's (its stripe). It wants no
//!   more copies than it has places.
//!
//! Nodes that disagree about the members may both act; the store's compare-and-set lets one
//! change land (a copy is recorded only while the ledger is short of copies) and the other
//! copy is dropped. Every node audits, which costs one listing of the sealed and offloaded
//! ledgers per audit (BookKeeper elects an auditor instead).
//!
//! When: an audit runs when the live bookies change, every tick while this bookie has a task
//! or waits for a missing bookie, every [`ELSEWHERE_TICKS`] ticks while only others have tasks,
//! and otherwise every [`AutoRecoveryConfig::audit_interval`]; a task that failed here is put
//! off (doubling from a tick up to the audit interval). The tick itself only lists the
//! members.
//!
//! Invariant: this node changes nothing while its coordination session is not live, and never
//! copies a ledger it holds already (the log refuses it).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::cluster::membership::{Membership, MembershipError, NodeRecord};
use crate::config::AutoRecoveryConfig;
use crate::coord::SessionState;
use crate::ledger::metadata::VACANT;
use crate::ledger::{now_ms, LedgerRecord, LedgerState, Log, MetadataError};

/// Longest pause between two looks at the members.
const MAX_TICK: Duration = Duration::from_secs(5);
/// Ticks between two audits while only other bookies have copies or drops to make.
const ELSEWHERE_TICKS: u32 = 6;

/// Why one autorecovery pass stopped.
#[derive(Debug, thiserror::Error)]
pub enum AutoRecoveryError {
    /// Listing the members failed.
    #[error("listing the members: {0}")]
    Members(#[from] MembershipError),
    /// Listing the sealed ledgers failed.
    #[error("listing the sealed ledgers: {0}")]
    Metadata(#[from] MetadataError),
}

/// A sealed ledger the last audit found short of copies.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UnderReplicated {
    /// Ledger id.
    pub ledger: u64,
    /// Its topic's id.
    pub topic_id: u64,
    /// Listed bookies that are live (missing ones not yet lost are not counted).
    pub live_copies: usize,
    /// Copies wanted: the write quorum, at most the live bookies.
    pub wanted_copies: usize,
    /// Listed bookies gone past the delay (to be dropped from the ledger).
    pub lost: Vec<String>,
    /// Listed bookies missing but not yet lost: the copy waits for them.
    pub waiting_for: Vec<String>,
    /// No live bookie holds a copy: it cannot be copied (its entries are lost unless a bookie
    /// listed comes back).
    pub unrecoverable: bool,
    /// The bookie that will copy it (`None`: waiting, unrecoverable, or no live bookie left
    /// that does not hold it).
    pub target: Option<String>,
    /// A striped ledger (ADR 0017): the place the copy fills, vacant or held by a lost bookie
    /// (0: the writer's, a whole copy; `i + 1`: replica `i`'s stripe). One place at a time,
    /// the writer's first, so that readers get a whole copy back first.
    pub place: Option<usize>,
}

/// What falls to this bookie after an audit.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Task {
    /// Copy the ledger here, dropping the lost bookies (into `place`, a striped ledger's).
    Copy {
        ledger: u64,
        lost: Vec<String>,
        place: Option<usize>,
    },
    /// Drop the lost bookies from the ledger (taking a lost writer's place).
    Drop { ledger: u64, lost: Vec<String> },
}

impl Task {
    fn ledger(&self) -> u64 {
        match self {
            Task::Copy { ledger, .. } | Task::Drop { ledger, .. } => *ledger,
        }
    }
}

/// A bookie listed by a sealed ledger that no live member advertises.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MissingBookie {
    /// Bookie id.
    pub bookie: String,
    /// How long this node has seen it missing.
    pub missing_for_ms: u64,
    /// Missing past the delay: its copies are made again elsewhere.
    pub lost: bool,
}

/// What `GET /admin/v2/autorecovery` answers.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AutoRecoveryStatus {
    /// Whether this node runs autorecovery.
    pub enabled: bool,
    /// [`AutoRecoveryConfig::delay`] in ms.
    pub delay_ms: u64,
    /// This node's bookie id.
    pub bookie: String,
    /// Live bookies at the last audit.
    pub live_bookies: usize,
    /// Bookies listed by sealed ledgers and gone, at the last audit.
    pub missing_bookies: Vec<MissingBookie>,
    /// Under-replicated sealed ledgers at the last audit.
    pub under_replicated: Vec<UnderReplicated>,
    /// When the last audit ran (ms since epoch; 0: none yet).
    pub last_audit_ms: i64,
    /// Sealed ledgers the last audit looked at.
    pub sealed_ledgers: usize,
    /// Copies this node made and recorded since it started.
    pub copies_made: u64,
    /// Payload bytes of those copies.
    pub bytes_copied: u64,
    /// Ledgers this node dropped lost bookies from without a copy (as many copies as live
    /// bookies allow, or in the lake), taking a lost writer's place.
    pub lost_dropped: u64,
    /// Copies and drops this node started and failed since it started.
    pub failures: u64,
    /// The last failure, if any.
    pub last_error: Option<String>,
}

/// What the audits remember between ticks.
#[derive(Debug, Default)]
struct State {
    /// Bookies of live members at the last tick.
    live: HashSet<String>,
    /// Since when each bookie listed by a sealed ledger has been missing, as seen here.
    /// Invariant: holds no bookie of a live member.
    missing_since: HashMap<String, Instant>,
    /// When the next audit is due (`None`: at the next tick).
    next_audit: Option<Instant>,
    /// Ledgers whose copy or drop failed here: not tried again before `.0`; `.1` doubles
    /// with each failure (from the tick up to the audit interval).
    /// Invariant: holds only ledgers the last audit gave this bookie a task for.
    backoff: HashMap<u64, (Instant, Duration)>,
    /// The last audit's findings.
    last_audit_ms: i64,
    sealed_ledgers: usize,
    under: Vec<UnderReplicated>,
    copies_made: u64,
    bytes_copied: u64,
    lost_dropped: u64,
    failures: u64,
    last_error: Option<String>,
}

/// This node's autorecovery.
#[derive(Debug)]
pub struct AutoRecovery {
    log: Arc<Log>,
    membership: Arc<Membership>,
    config: AutoRecoveryConfig,
    state: Mutex<State>,
}

impl AutoRecovery {
    /// Autorecovery of `log`'s bookie among `membership`'s nodes.
    pub fn new(
        log: Arc<Log>,
        membership: Arc<Membership>,
        config: AutoRecoveryConfig,
    ) -> Arc<AutoRecovery> {
        Arc::new(AutoRecovery {
            log,
            membership,
            config,
            state: Mutex::new(State::default()),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Time between two looks at the members.
    fn tick(&self) -> Duration {
        (self.config.delay / 2).clamp(Duration::from_millis(500), MAX_TICK)
    }

    /// Runs the audits until `stop` (only when enabled).
    pub fn start(self: &Arc<Self>, stop: CancellationToken) {
        if !self.config.enabled {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            let session = me.membership.session();
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(me.tick()) => {}
                }
                if *session.borrow() != SessionState::Live {
                    continue;
                }
                if let Err(e) = me.pass().await {
                    tracing::warn!(error = %e, "autorecovery pass failed");
                }
            }
        });
    }

    /// One tick: looks at the members, audits when due, and does what falls to this bookie
    /// (copies it is the target of; lost bookies to drop from ledgers it holds). Returns how
    /// many copies it made.
    pub async fn pass(&self) -> Result<usize, AutoRecoveryError> {
        let nodes = self.membership.nodes().await?;
        if !self.audit_due(&nodes) {
            return Ok(0);
        }
        let ledgers = self
            .log
            .metadata()
            .ledgers_in_states(&[LedgerState::Sealed, LedgerState::Offloaded])
            .await?;
        let session = self.membership.session();
        let mut made = 0;
        for task in self.audit(&nodes, &ledgers) {
            // A node cut off from the cluster changes nothing more.
            if *session.borrow() != SessionState::Live {
                break;
            }
            match task {
                Task::Copy {
                    ledger,
                    lost,
                    place,
                } => made += usize::from(self.copy(ledger, &lost, place).await),
                Task::Drop { ledger, lost } => self.drop_lost(ledger, &lost).await,
            }
        }
        Ok(made)
    }

    /// Records the live bookies; whether an audit is due (a bookie left or joined, or it is
    /// time).
    fn audit_due(&self, nodes: &[NodeRecord]) -> bool {
        let live: HashSet<String> = nodes
            .iter()
            .filter(|n| n.bookie_addr.is_some())
            .map(|n| n.bookie.clone())
            .collect();
        let mut s = self.state();
        let changed = s.live != live;
        s.live = live;
        changed || s.next_audit.is_none_or(|at| Instant::now() >= at)
    }

    /// Finds the under-replicated ledgers among `ledgers` (sealed and offloaded), records
    /// them, and returns what falls to this bookie.
    fn audit(&self, nodes: &[NodeRecord], ledgers: &[LedgerRecord]) -> Vec<Task> {
        let now = Instant::now();
        let me = self.log.bookie_id().to_string();
        let mut targets: Vec<String> = nodes
            .iter()
            .filter(|n| n.bookie_addr.is_some() && !n.draining)
            .map(|n| n.bookie.clone())
            .collect();
        targets.sort();
        targets.dedup();
        let minute = (now_ms() / 60_000) as u64;
        let mut s = self.state();
        let live = s.live.clone();
        // Missing bookies: first seen now, or since earlier; forgotten once back or unlisted.
        let listed: HashSet<&str> = ledgers
            .iter()
            .filter(|l| l.seal.is_some_and(|s| s.entry_count > 0))
            .flat_map(|l| l.bookies())
            .collect();
        s.missing_since
            .retain(|b, _| !live.contains(b) && listed.contains(b.as_str()));
        for b in listed
            .iter()
            .filter(|b| !live.contains(**b) && !b.is_empty())
        {
            s.missing_since.entry(b.to_string()).or_insert(now);
        }
        let delay = self.config.delay;
        let lost = |b: &str| {
            s.missing_since
                .get(b)
                .is_some_and(|at| now.duration_since(*at) >= delay)
        };
        let (mut under, mut tasks, mut drops) = (Vec::new(), Vec::new(), 0);
        for l in ledgers {
            let a = assess(l, &live, &targets, minute, &lost);
            if let Some((actor, gone)) = a.drop {
                drops += 1;
                if actor == me {
                    tasks.push(Task::Drop {
                        ledger: l.id,
                        lost: gone,
                    });
                }
            }
            if let Some(f) = a.under {
                if f.target.as_deref() == Some(me.as_str()) {
                    // A striped ledger's copy drops only the lost bookie of its place.
                    let lost = match f.place {
                        Some(p) => l
                            .places()
                            .nth(p)
                            .filter(|b| f.lost.iter().any(|x| x == b))
                            .map(str::to_string)
                            .into_iter()
                            .collect(),
                        None => f.lost.clone(),
                    };
                    tasks.push(Task::Copy {
                        ledger: l.id,
                        lost,
                        place: f.place,
                    });
                }
                under.push(f);
            }
        }
        // Tasks that failed lately wait their turn; the others run now.
        let mine: HashSet<u64> = tasks.iter().map(Task::ledger).collect();
        s.backoff.retain(|l, _| mine.contains(l));
        let retry = s
            .backoff
            .values()
            .map(|(at, _)| *at)
            .filter(|at| *at > now)
            .min();
        let backoff = &s.backoff;
        tasks.retain(|t| backoff.get(&t.ledger()).is_none_or(|(at, _)| *at <= now));
        // Audited again at the next tick while this bookie has something to do or waits for a
        // missing bookie; every few ticks while other bookies have (to keep this node's
        // status and gauge current, at a sixth of the cost should theirs keep failing).
        let waiting = s
            .missing_since
            .values()
            .any(|at| now.duration_since(*at) < delay);
        let elsewhere = under.iter().any(|u| u.target.is_some()) || drops > 0;
        let idle = now
            + if elsewhere {
                self.config
                    .audit_interval
                    .min(self.tick() * ELSEWHERE_TICKS)
            } else {
                self.config.audit_interval
            };
        s.next_audit = Some(if waiting || !tasks.is_empty() {
            now + self.tick()
        } else {
            retry.map_or(idle, |r| r.min(idle))
        });
        s.last_audit_ms = now_ms();
        s.sealed_ledgers = ledgers
            .iter()
            .filter(|l| l.state == LedgerState::Sealed)
            .count();
        crate::metrics::node::node()
            .ledgers_under_replicated
            .set(under.len() as i64);
        // Said when the count changes, not at every audit while waiting.
        if under.len() != s.under.len() || !tasks.is_empty() {
            tracing::info!(
                under_replicated = under.len(),
                tasks_here = tasks.len(),
                "autorecovery audit: sealed ledgers short of copies"
            );
        }
        s.under = under;
        tasks
    }

    /// Drops the lost bookies from `ledger` (this bookie takes a lost writer's place).
    async fn drop_lost(&self, ledger: u64, lost: &[String]) {
        match self.log.drop_lost_copies(ledger, lost).await {
            Ok(record) => {
                tracing::info!(ledger, ?lost, bookies = ?record.bookies().collect::<Vec<_>>(),
                    "autorecovery dropped lost bookies from a ledger");
                let mut s = self.state();
                s.lost_dropped += 1;
                s.backoff.remove(&ledger);
            }
            Err(e) => {
                tracing::warn!(ledger, error = %e, "autorecovery could not drop lost bookies");
                self.failed(ledger, &e);
            }
        }
    }

    /// Counts a failed task and puts it off: twice as long as last time, from a tick up to
    /// the audit interval.
    fn failed(&self, ledger: u64, e: &dyn std::fmt::Display) {
        let tick = self.tick();
        let cap = self.config.audit_interval.max(tick);
        let mut s = self.state();
        s.failures += 1;
        s.last_error = Some(format!("ledger {ledger}: {e}"));
        let step = s
            .backoff
            .get(&ledger)
            .map_or(tick, |(_, step)| (*step * 2).min(cap));
        s.backoff.insert(ledger, (Instant::now() + step, step));
    }

    /// Copies `ledger` here; whether the copy was made and recorded.
    async fn copy(&self, ledger: u64, lost: &[String], place: Option<usize>) -> bool {
        let metrics = crate::metrics::node::node();
        tracing::info!(ledger, ?lost, ?place, "autorecovery copying a ledger here");
        match self.log.recopy_ledger(ledger, lost, place).await {
            Ok(done) => {
                metrics.ledgers_rereplicated.inc();
                metrics.rereplicated_bytes.inc_by(done.bytes);
                tracing::info!(ledger, entries = done.entries, bytes = done.bytes, ?lost,
                    bookies = ?done.record.bookies().collect::<Vec<_>>(),
                    "autorecovery copied an under-replicated ledger here");
                let mut s = self.state();
                s.copies_made += 1;
                s.bytes_copied += done.bytes;
                s.under.retain(|u| u.ledger != ledger);
                s.backoff.remove(&ledger);
                true
            }
            Err(e) => {
                metrics.rereplication_failures.inc();
                tracing::warn!(ledger, error = %e, "autorecovery could not copy a ledger here");
                self.failed(ledger, &e);
                false
            }
        }
    }

    /// The findings of the last audit and this node's counts.
    pub fn status(&self) -> AutoRecoveryStatus {
        let s = self.state();
        let now = Instant::now();
        let mut missing: Vec<MissingBookie> = s
            .missing_since
            .iter()
            .map(|(b, at)| {
                let missing_for = now.duration_since(*at);
                MissingBookie {
                    bookie: b.clone(),
                    missing_for_ms: missing_for.as_millis() as u64,
                    lost: missing_for >= self.config.delay,
                }
            })
            .collect();
        missing.sort_by(|a, b| a.bookie.cmp(&b.bookie));
        AutoRecoveryStatus {
            enabled: self.config.enabled,
            delay_ms: self.config.delay.as_millis() as u64,
            bookie: self.log.bookie_id().to_string(),
            live_bookies: s.live.len(),
            missing_bookies: missing,
            under_replicated: s.under.clone(),
            last_audit_ms: s.last_audit_ms,
            sealed_ledgers: s.sealed_ledgers,
            copies_made: s.copies_made,
            bytes_copied: s.bytes_copied,
            lost_dropped: s.lost_dropped,
            failures: s.failures,
            last_error: s.last_error.clone(),
        }
    }
}

/// What falls to whom for one ledger.
#[derive(Debug, Default)]
struct Assessment {
    /// A sealed ledger short of copies.
    under: Option<UnderReplicated>,
    /// Lost bookies to drop from the ledger without a copy, and the bookie that does it.
    drop: Option<(String, Vec<String>)>,
}

/// Whether ledger `l` (sealed or offloaded) is short of copies or lists lost bookies, and
/// what to do about it: `live` are the live bookies, `targets` those that may take copies
/// (sorted), `lost` tells a lost bookie.
fn assess(
    l: &LedgerRecord,
    live: &HashSet<String>,
    targets: &[String],
    minute: u64,
    lost: &dyn Fn(&str) -> bool,
) -> Assessment {
    // A ledger from before bookie ids (empty bookie) belongs to a single node; an empty one
    // has nothing to keep.
    if l.bookie.is_empty() || l.seal.is_none_or(|s| s.entry_count == 0) {
        return Assessment::default();
    }
    let listed: Vec<&str> = l.bookies().collect();
    let mut holding: Vec<&str> = listed
        .iter()
        .copied()
        .filter(|b| live.contains(*b))
        .collect();
    holding.sort_unstable();
    let (gone, waiting): (Vec<&str>, Vec<&str>) = listed
        .iter()
        .copied()
        .filter(|b| !live.contains(*b))
        .partition(|b| lost(b));
    let gone: Vec<String> = gone.into_iter().map(str::to_string).collect();
    // Drops are made by the writer, or when the writer is not live by a live bookie holding
    // a copy (which takes the writer's place when the writer is lost), by ledger id and
    // minute: one whose copy turns out unusable is replaced the next minute.
    let actor = if live.contains(&l.bookie) {
        Some(l.bookie.clone())
    } else if holding.is_empty() {
        None
    } else {
        let at = l.id.wrapping_add(minute) % holding.len() as u64;
        Some(holding[at as usize].to_string())
    };
    let drop = |gone: Vec<String>| {
        actor
            .clone()
            .filter(|_| !gone.is_empty())
            .map(|a| (a, gone))
    };
    if l.state != LedgerState::Sealed {
        // In the lake: no copy is made, lost bookies are only dropped.
        return Assessment {
            under: None,
            drop: drop(gone),
        };
    }
    // A striped ledger has no more copies than places (its ensemble may have been placed
    // smaller than asked).
    let places = if l.is_striped() {
        l.places().count()
    } else {
        usize::MAX
    };
    let wanted = l.wanted_copies().min(places).min(live.len());
    if holding.len() >= wanted {
        return Assessment {
            under: None,
            drop: drop(gone),
        };
    }
    let candidates: Vec<&String> = targets
        .iter()
        .filter(|t| !listed.contains(&t.as_str()))
        .collect();
    // A striped ledger's places are filled one at a time, the writer's first.
    let place = l
        .is_striped()
        .then(|| {
            l.places()
                .position(|b| b == VACANT || gone.iter().any(|g| g == b))
        })
        .flatten();
    let target = (!holding.is_empty()
        && waiting.is_empty()
        && !candidates.is_empty()
        && (place.is_some() || !l.is_striped()))
    .then(|| candidates[(l.id.wrapping_add(minute) % candidates.len() as u64) as usize].clone());
    // No bookie to copy to: the lost bookies are dropped all the same.
    let drop = match target {
        None if waiting.is_empty() => drop(gone.clone()),
        _ => None,
    };
    Assessment {
        under: Some(UnderReplicated {
            ledger: l.id,
            topic_id: l.topic_id,
            live_copies: holding.len(),
            wanted_copies: wanted,
            lost: gone,
            waiting_for: waiting.into_iter().map(str::to_string).collect(),
            unrecoverable: holding.is_empty(),
            target,
            place,
        }),
        drop,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::metadata::SealInfo;

    fn sealed(id: u64, bookie: &str, replicas: &[&str], wq: u8) -> LedgerRecord {
        LedgerRecord {
            id,
            topic_id: 1,
            state: LedgerState::Sealed,
            first_segment: 0,
            seal: Some(SealInfo {
                entry_count: 3,
                size_bytes: 3,
                min_publish_ms: Some(1),
                max_publish_ms: Some(1),
                last_segment: 0,
                checksum: 0,
            }),
            created_at_ms: 0,
            state_changed_at_ms: 0,
            offload_ref: None,
            bookie: bookie.into(),
            replicas: replicas.iter().map(|r| r.to_string()).collect(),
            ack_quorum: 2,
            write_quorum: wq,
            stripe_width: 0,
        }
    }

    fn set(bookies: &[&str]) -> HashSet<String> {
        bookies.iter().map(|b| b.to_string()).collect()
    }

    fn strings(bookies: &[&str]) -> Vec<String> {
        bookies.iter().map(|b| b.to_string()).collect()
    }

    #[test]
    fn a_ledger_with_its_write_quorum_of_live_copies_is_left_alone() {
        let live = set(&["a", "b", "c", "d"]);
        let l = sealed(1, "a", &["b", "c"], 3);
        let a = assess(&l, &live, &strings(&["a", "b", "c", "d"]), 0, &|_| false);
        assert!(a.under.is_none() && a.drop.is_none());
        // A cluster of two cannot hold three copies: two live copies are all it can have.
        let l = sealed(2, "a", &["b"], 3);
        let a = assess(&l, &set(&["a", "b"]), &strings(&["a", "b"]), 0, &|_| false);
        assert!(a.under.is_none() && a.drop.is_none());
        // An empty ledger has nothing to keep.
        let mut l = sealed(3, "a", &[], 3);
        l.seal = l.seal.map(|s| SealInfo {
            entry_count: 0,
            ..s
        });
        assert!(assess(&l, &live, &strings(&["a", "b"]), 0, &|_| true)
            .under
            .is_none());
    }

    #[test]
    fn a_lost_bookie_is_replaced_by_one_that_does_not_hold_the_ledger() {
        let live = set(&["a", "b", "d"]);
        let l = sealed(7, "a", &["b", "c"], 3);
        let a = assess(&l, &live, &strings(&["a", "b", "d"]), 0, &|b| b == "c");
        let f = a.under.expect("short");
        assert_eq!((f.live_copies, f.wanted_copies), (2, 3));
        assert_eq!(
            (f.lost, f.waiting_for),
            (strings(&["c"]), Vec::<String>::new())
        );
        assert_eq!(f.target.as_deref(), Some("d"));
        assert!(a.drop.is_none(), "the copy drops the lost bookie");
    }

    #[test]
    fn a_missing_bookie_within_the_delay_is_waited_for() {
        let live = set(&["a", "b", "d"]);
        let l = sealed(7, "a", &["b", "c"], 3);
        let a = assess(&l, &live, &strings(&["a", "b", "d"]), 0, &|_| false);
        let f = a.under.expect("short");
        assert_eq!(f.waiting_for, strings(&["c"]));
        assert!(f.lost.is_empty() && f.target.is_none() && a.drop.is_none());
    }

    #[test]
    fn a_ledger_sealed_short_is_copied_at_once_and_targets_turn_with_the_minute() {
        // The writer dropped a failed replica before sealing: nothing is missing.
        let live = set(&["a", "b", "c", "d"]);
        let targets = strings(&["a", "b", "c", "d"]);
        let l = sealed(4, "a", &["b"], 3);
        let picked: HashSet<String> = (0..4)
            .filter_map(|m| assess(&l, &live, &targets, m, &|_| false).under?.target)
            .collect();
        assert_eq!(
            picked,
            set(&["c", "d"]),
            "only bookies not holding it, in turn"
        );
    }

    #[test]
    fn lost_bookies_are_dropped_when_no_copy_is_needed_and_a_live_copy_takes_a_lost_writers_place()
    {
        // Two live bookies, both holding it: as many copies as the cluster can hold; the lost
        // writer is dropped by a live bookie holding a copy, another one the next minute.
        let live = set(&["b", "c"]);
        let l = sealed(5, "a", &["c", "b"], 3);
        let a = assess(&l, &live, &strings(&["b", "c"]), 0, &|_| true);
        assert!(a.under.is_none());
        assert_eq!(a.drop, Some(("c".to_string(), strings(&["a"]))));
        let a = assess(&l, &live, &strings(&["b", "c"]), 1, &|_| true);
        assert_eq!(a.drop, Some(("b".to_string(), strings(&["a"]))));
        // A lost replica, the writer live: the writer drops it.
        let l = sealed(6, "b", &["a", "c"], 3);
        let a = assess(&l, &live, &strings(&["b", "c"]), 0, &|_| true);
        assert_eq!(a.drop, Some(("b".to_string(), strings(&["a"]))));
        // An offloaded ledger is never copied, its lost writer is replaced all the same.
        let mut l = sealed(8, "a", &["c"], 3);
        l.state = LedgerState::Offloaded;
        let a = assess(&l, &live, &strings(&["b", "c"]), 0, &|_| true);
        assert!(a.under.is_none());
        assert_eq!(a.drop, Some(("c".to_string(), strings(&["a"]))));
        // Short of copies with a bookie left to copy to: copied, and the copy drops the lost.
        let l = sealed(9, "a", &["b"], 3);
        let a = assess(&l, &live, &strings(&["b", "c"]), 0, &|_| true);
        let f = a.under.expect("short");
        assert_eq!((f.lost, f.target), (strings(&["a"]), Some("c".to_string())));
        assert!(a.drop.is_none());
    }

    #[test]
    fn a_striped_ledgers_places_are_filled_one_at_a_time_the_writers_first() {
        // A 4/3 ledger: its writer a and replica d lost, its second replica place vacant.
        let live = set(&["b", "c", "e", "f"]);
        let mut l = sealed(11, "a", &["b", VACANT, "d"], 4);
        l.stripe_width = 2;
        let lost = |b: &str| b == "a" || b == "d";
        let a = assess(&l, &live, &strings(&["b", "c", "e", "f"]), 0, &lost);
        let f = a.under.expect("short");
        assert_eq!((f.live_copies, f.wanted_copies), (1, 4));
        assert_eq!((f.place, f.lost), (Some(0), strings(&["a", "d"])));
        assert!(f
            .target
            .is_some_and(|t| ["c", "e", "f"].contains(&t.as_str())));
        // The writer's place filled: the vacant place comes before the lost replica's.
        l.bookie = "e".into();
        let a = assess(&l, &live, &strings(&["b", "c", "e", "f"]), 0, &lost);
        assert_eq!(a.under.expect("short").place, Some(2));
        // As many copies as live bookies: the lost replica is dropped (its place vacated).
        let live = set(&["b", "e"]);
        let a = assess(&l, &live, &strings(&["b", "e"]), 0, &lost);
        assert!(a.under.is_none());
        assert_eq!(a.drop, Some(("e".to_string(), strings(&["d"]))));
    }

    #[test]
    fn a_ledger_no_live_bookie_holds_is_unrecoverable_and_nobody_acts() {
        let live = set(&["b", "c"]);
        let l = sealed(10, "a", &[], 1);
        let a = assess(&l, &live, &strings(&["b", "c"]), 0, &|_| true);
        let f = a.under.expect("short");
        assert!(f.unrecoverable && f.target.is_none());
        assert!(a.drop.is_none());
    }
}
