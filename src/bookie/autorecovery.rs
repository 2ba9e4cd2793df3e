//! Autorecovery (issue 19, slice 6; ADR 0011): every node of a cluster looks for sealed ledgers
//! that have fewer copies than their write quorum and makes the missing copies, so a node lost
//! for good (crashed, its disk wiped) costs no ledger its redundancy for long.
//!
//! What counts: a bookie listed by a sealed ledger and advertised by no live member is
//! *missing*; once missing for [`AutoRecoveryConfig::delay`] (as this node has seen it) it is
//! *lost*. A sealed ledger is *under-replicated* when its listed bookies that are not lost
//! number fewer than its write quorum, capped at the live bookies (a cluster of two cannot
//! hold three copies). It is *recoverable now* when none of its listed bookies is missing but
//! not yet lost (one that may come back is waited for).
//!
//! Who copies: each under-replicated ledger has one target, the same on every node that sees
//! the same members — a live, non-draining bookie the ledger does not list, picked by ledger
//! id and the current minute (so a target that keeps failing is replaced). Only the target
//! copies ([`Log::recopy_ledger`]): from the bookies still holding it, checked against the
//! seal, recorded with one compare-and-set that drops the lost bookies. Two nodes that
//! disagree about the members at worst both copy; one compare-and-set wins, the other copy is
//! dropped. No node coordinates the others (BookKeeper elects an auditor; here every node
//! audits, which costs one listing of the sealed ledgers per audit).
//!
//! When: an audit runs when a bookie disappears from the members, every tick while the last
//! audit found work (or missing bookies) and otherwise every
//! [`AutoRecoveryConfig::audit_interval`]; the tick itself only lists the members.
//!
//! Invariant: this node never copies while its coordination session is not live, and never
//! copies a ledger it holds already (the log refuses it).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::cluster::membership::{Membership, MembershipError, NodeRecord};
use crate::config::AutoRecoveryConfig;
use crate::coord::SessionState;
use crate::ledger::{now_ms, LedgerRecord, LedgerState, Log, MetadataError};

/// Longest pause between two looks at the members.
const MAX_TICK: Duration = Duration::from_secs(5);

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
    /// The bookie that will copy it (`None`: no live bookie left that does not hold it).
    pub target: Option<String>,
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
    /// Copies this node started and dropped since it started.
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
    /// The last audit's findings.
    last_audit_ms: i64,
    sealed_ledgers: usize,
    under: Vec<UnderReplicated>,
    copies_made: u64,
    bytes_copied: u64,
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

    /// One tick: looks at the members, audits when due, and copies the ledgers this bookie is
    /// the target of. Returns how many copies it made.
    pub async fn pass(&self) -> Result<usize, AutoRecoveryError> {
        let nodes = self.membership.nodes().await?;
        if !self.audit_due(&nodes) {
            return Ok(0);
        }
        let sealed = self
            .log
            .metadata()
            .ledgers_in_states(&[LedgerState::Sealed])
            .await?;
        let mine = self.audit(&nodes, &sealed);
        let mut made = 0;
        for (ledger, lost) in mine {
            if self.copy(ledger, &lost).await {
                made += 1;
            }
        }
        Ok(made)
    }

    /// Records the live bookies; whether an audit is due (a bookie left, or it is time).
    fn audit_due(&self, nodes: &[NodeRecord]) -> bool {
        let live: HashSet<String> = nodes
            .iter()
            .filter(|n| n.bookie_addr.is_some())
            .map(|n| n.bookie.clone())
            .collect();
        let mut s = self.state();
        let left = s.live.iter().any(|b| !live.contains(b));
        s.live = live;
        left || s.next_audit.is_none_or(|at| Instant::now() >= at)
    }

    /// Finds the under-replicated ledgers among `sealed`, records them, and returns those
    /// this bookie should copy now, each with the lost bookies to drop.
    fn audit(&self, nodes: &[NodeRecord], sealed: &[LedgerRecord]) -> Vec<(u64, Vec<String>)> {
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
        let listed: HashSet<&str> = sealed.iter().flat_map(|l| l.bookies()).collect();
        s.missing_since
            .retain(|b, _| !live.contains(b) && listed.contains(b.as_str()));
        for b in listed
            .iter()
            .filter(|b| !live.contains(**b) && !b.is_empty())
        {
            s.missing_since.entry(b.to_string()).or_insert(now);
        }
        let lost = |b: &str| {
            s.missing_since
                .get(b)
                .is_some_and(|at| now.duration_since(*at) >= self.config.delay)
        };
        let mut under = Vec::new();
        let mut mine = Vec::new();
        for l in sealed {
            let finding = assess(l, &live, &targets, minute, &lost);
            let Some(f) = finding else { continue };
            if f.waiting_for.is_empty() && f.target.as_deref() == Some(me.as_str()) {
                mine.push((l.id, f.lost.clone()));
            }
            under.push(f);
        }
        let pending = !under.is_empty() || !s.missing_since.is_empty();
        s.next_audit = Some(
            now + if pending {
                self.tick()
            } else {
                self.config.audit_interval
            },
        );
        s.last_audit_ms = now_ms();
        s.sealed_ledgers = sealed.len();
        crate::metrics::node::node()
            .ledgers_under_replicated
            .set(under.len() as i64);
        // Said when the count changes, not at every audit while waiting.
        if under.len() != s.under.len() || !mine.is_empty() {
            tracing::info!(
                under_replicated = under.len(),
                copying_here = mine.len(),
                "autorecovery audit: sealed ledgers short of copies"
            );
        }
        s.under = under;
        mine
    }

    /// Copies `ledger` here; whether the copy was made and recorded.
    async fn copy(&self, ledger: u64, lost: &[String]) -> bool {
        let metrics = crate::metrics::node::node();
        match self.log.recopy_ledger(ledger, lost).await {
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
                true
            }
            Err(e) => {
                metrics.rereplication_failures.inc();
                tracing::warn!(ledger, error = %e, "autorecovery could not copy a ledger here");
                let mut s = self.state();
                s.failures += 1;
                s.last_error = Some(format!("ledger {ledger}: {e}"));
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
            failures: s.failures,
            last_error: s.last_error.clone(),
        }
    }
}

/// Whether sealed ledger `l` is short of copies, and if so what to do about it: `live` are the
/// live bookies, `targets` those that may take copies (sorted), `lost` tells a lost bookie.
fn assess(
    l: &LedgerRecord,
    live: &HashSet<String>,
    targets: &[String],
    minute: u64,
    lost: &dyn Fn(&str) -> bool,
) -> Option<UnderReplicated> {
    // A ledger from before bookie ids (empty bookie) belongs to a single node.
    if l.bookie.is_empty() {
        return None;
    }
    let listed: Vec<&str> = l.bookies().collect();
    let live_copies = listed.iter().filter(|b| live.contains(**b)).count();
    let wanted = l.wanted_copies().min(live.len());
    if live_copies >= wanted {
        return None;
    }
    let (gone, waiting): (Vec<&str>, Vec<&str>) = listed
        .iter()
        .filter(|b| !live.contains(**b))
        .partition(|b| lost(b));
    let candidates: Vec<&String> = targets
        .iter()
        .filter(|t| !listed.contains(&t.as_str()))
        .collect();
    let target = (!candidates.is_empty()).then(|| {
        candidates[((l.id.wrapping_add(minute)) % candidates.len() as u64) as usize].clone()
    });
    Some(UnderReplicated {
        ledger: l.id,
        topic_id: l.topic_id,
        live_copies,
        wanted_copies: wanted,
        lost: gone.into_iter().map(str::to_string).collect(),
        waiting_for: waiting.into_iter().map(str::to_string).collect(),
        target,
    })
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
        assert!(assess(&l, &live, &strings(&["a", "b", "c", "d"]), 0, &|_| false).is_none());
        // A cluster of two cannot hold three copies: two live copies are all it can have.
        let l = sealed(2, "a", &["b"], 3);
        assert!(assess(&l, &set(&["a", "b"]), &strings(&["a", "b"]), 0, &|_| false).is_none());
    }

    #[test]
    fn a_lost_bookie_is_replaced_by_one_that_does_not_hold_the_ledger() {
        let live = set(&["a", "b", "d"]);
        let l = sealed(7, "a", &["b", "c"], 3);
        let f = assess(&l, &live, &strings(&["a", "b", "d"]), 0, &|b| b == "c").expect("short");
        assert_eq!((f.live_copies, f.wanted_copies), (2, 3));
        assert_eq!(
            (f.lost, f.waiting_for),
            (strings(&["c"]), Vec::<String>::new())
        );
        assert_eq!(f.target.as_deref(), Some("d"));
    }

    #[test]
    fn a_missing_bookie_within_the_delay_is_waited_for() {
        let live = set(&["a", "b", "d"]);
        let l = sealed(7, "a", &["b", "c"], 3);
        let f = assess(&l, &live, &strings(&["a", "b", "d"]), 0, &|_| false).expect("short");
        assert_eq!(f.waiting_for, strings(&["c"]));
        assert!(f.lost.is_empty());
    }

    #[test]
    fn a_ledger_sealed_short_is_copied_at_once_and_targets_turn_with_the_minute() {
        // The writer dropped a failed replica before sealing: nothing is missing.
        let live = set(&["a", "b", "c", "d"]);
        let targets = strings(&["a", "b", "c", "d"]);
        let l = sealed(4, "a", &["b"], 3);
        let picked: HashSet<String> = (0..4)
            .filter_map(|m| assess(&l, &live, &targets, m, &|_| false)?.target)
            .collect();
        assert_eq!(
            picked,
            set(&["c", "d"]),
            "only bookies not holding it, in turn"
        );
    }

    #[test]
    fn a_lost_writer_with_no_bookie_left_to_take_a_copy_has_no_target() {
        let live = set(&["b", "c"]);
        let l = sealed(5, "a", &["b", "c"], 3);
        let f = assess(&l, &live, &strings(&["b", "c"]), 0, &|_| true);
        // Two live bookies, two live copies: as many as the cluster can hold.
        assert!(f.is_none());
        let l = sealed(6, "a", &["b"], 3);
        let f = assess(&l, &live, &strings(&["b", "c"]), 0, &|_| true).expect("short");
        assert_eq!((f.lost, f.target), (strings(&["a"]), Some("c".to_string())));
    }
}
