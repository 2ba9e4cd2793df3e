//! One subscription's reader: entries by position, from the local log or the lake.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::Serialize;

use super::stream::{LakeStream, LedgerScan};
use super::{ReplayError, TopicLake};
use crate::ledger::{Entry, LedgerState, Position, ReadError, TopicLog};

/// Longest a read waits for the lake stream before answering [`ReplayError::Pending`].
const PENDING_WAIT: Duration = Duration::from_millis(250);

/// Which tier served a subscription's last read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// The local log (journal segments, tail cache).
    Local,
    /// The lake table.
    Lake,
}

/// Reads a topic partition for one subscription, choosing per range between the local log
/// and the lake. Not shared: the subscription task owns it.
#[derive(Debug)]
pub struct EntryReader {
    log: TopicLog,
    lake: Option<TopicLake>,
    /// Invariant: `None` or positioned at the subscription's next lake read.
    stream: Option<LakeStream>,
    /// Entries recently served from the lake, for redeliveries (bounded by `read_ahead`).
    recent: BTreeMap<Position, Entry>,
    recent_bytes: usize,
    tier: Tier,
    /// Consecutive failed reads (drives the retry backoff).
    failures: u32,
}

impl std::fmt::Debug for LakeStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LakeStream")
            .field("next", &self.next)
            .finish()
    }
}

impl EntryReader {
    /// A reader of `log`, with `lake` for ranges deleted locally (`None`: lake disabled).
    pub fn new(log: TopicLog, lake: Option<TopicLake>) -> Self {
        Self {
            log,
            lake,
            stream: None,
            recent: BTreeMap::new(),
            recent_bytes: 0,
            tier: Tier::Local,
            failures: 0,
        }
    }

    /// The log this reader reads.
    pub fn log(&self) -> &TopicLog {
        &self.log
    }

    /// The tier that served the last read.
    pub fn tier(&self) -> Tier {
        self.tier
    }

    /// Consecutive failed reads.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// How long to wait before retrying after the last read failed.
    pub fn retry_delay(&self) -> Duration {
        let (first, max) = self
            .lake
            .as_ref()
            .map_or((Duration::from_millis(200), Duration::from_secs(30)), |l| {
                (l.config().retry_initial, l.config().retry_max)
            });
        let factor = 1u32 << self.failures.saturating_sub(1).min(16);
        first.saturating_mul(factor).min(max)
    }

    /// Whether it holds nothing of the lake (no stream, no cached entries): nothing for
    /// [`EntryReader::release_idle`] or [`EntryReader::forget_before`] to do.
    pub fn is_idle(&self) -> bool {
        self.stream.is_none() && self.recent.is_empty()
    }

    /// Drops the lake stream (and its read-ahead buffer) if unused for `replay.idle_release`.
    pub fn release_idle(&mut self) {
        let Some(lake) = &self.lake else { return };
        if self
            .stream
            .as_ref()
            .is_some_and(|s| s.last_used.elapsed() >= lake.config().idle_release)
        {
            tracing::debug!(topic = %lake.topic, "dropping an idle lake stream");
            self.stream = None;
        }
    }

    /// The first position at or after `p` that holds an entry, given the topic's ledgers
    /// (positions past a ledger's end and in empty ledgers name the same place).
    fn normalize(&self, p: Position) -> Position {
        normalize_in(&self.log.ledgers(), p)
    }

    /// Whether the lake stream (if any) continues exactly at `from`. Most reads ask for the
    /// stream's own next position; only a differing one needs the ledger list (the end of one
    /// ledger and the start of the next are the same place).
    fn stream_at(&self, from: Position) -> bool {
        match &self.stream {
            None => false,
            Some(s) if s.next == from => true,
            Some(s) => {
                let ledgers = self.log.ledgers();
                normalize_in(&ledgers, s.next) == normalize_in(&ledgers, from)
            }
        }
    }

    /// Whether a durable entry exists at or after `from`.
    fn has_entries_from(&self, from: Position) -> bool {
        let next = self.normalize(from);
        self.log.last_confirmed().is_some_and(|lac| next <= lac)
    }

    fn lake_for(&self, ledger: u64) -> Result<&TopicLake, ReplayError> {
        self.lake.as_ref().ok_or_else(|| ReplayError::NoLake {
            topic: self.log.name().to_string(),
            ledger,
        })
    }

    /// What the reader is waiting on, for a warning about a subscription that has waited on
    /// the lake for long: its stream (next position, entries buffered, last use) and the free
    /// room of the shared limits (scan slots, topic and broker budgets).
    pub fn describe_wait(&self) -> String {
        let stream = match &self.stream {
            None => "no lake stream".to_string(),
            Some(s) => format!(
                "lake stream at {} with {} entries buffered, last taken {:?} ago, task {}",
                s.next,
                s.buffered(),
                s.last_used.elapsed(),
                if s.finished() { "ended" } else { "running" }
            ),
        };
        match &self.lake {
            None => stream,
            Some(l) => format!(
                "{stream}; scan slots free {}, topic budget free {} B, broker budget free {} B",
                l.replay.inner.scans.available_permits(),
                l.budget.available_permits(),
                l.replay.inner.broker_budget.available_permits()
            ),
        }
    }

    /// Up to `max` entries from `from` (inclusive) in order, crossing ledgers and tiers.
    /// Empty when nothing is durable there yet.
    pub async fn read_from(
        &mut self,
        from: Position,
        max: usize,
    ) -> Result<Vec<Entry>, ReplayError> {
        let result = self.read_from_tiers(from, max).await;
        match &result {
            Ok(_) => self.failures = 0,
            Err(ReplayError::Pending) => {}
            Err(_) => {
                self.failures = self.failures.saturating_add(1);
                self.stream = None;
            }
        }
        result
    }

    async fn read_from_tiers(
        &mut self,
        from: Position,
        max: usize,
    ) -> Result<Vec<Entry>, ReplayError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        // An offload can delete the range between two looks: go round a few times.
        for _ in 0..3 {
            let positioned = self.stream_at(from);
            if !positioned {
                self.stream = None;
                match self.log.read_from(from, max).await {
                    Ok(entries) if entries.is_empty() && self.has_entries_from(from) => {
                        // Nothing read although durable entries exist from here (a ledger
                        // changing state underneath the read): not "caught up"; ask again.
                        tracing::debug!(topic = %self.log.name(), %from, "empty read before the end");
                        return Err(ReplayError::Pending);
                    }
                    Ok(entries) => {
                        if !entries.is_empty() {
                            self.tier = Tier::Local;
                            let bytes: usize = entries.iter().map(|e| e.payload.len()).sum();
                            crate::metrics::node().replay_read(
                                "local",
                                entries.len() as u64,
                                bytes as u64,
                            );
                        }
                        return Ok(entries);
                    }
                    Err(ReadError::Deleted(ledger)) => {
                        let lake = self.lake_for(ledger)?.clone();
                        self.stream = Some(LakeStream::start(lake, self.log.clone(), from));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            let Some(stream) = self.stream.as_mut() else {
                continue;
            };
            // Wait a little only: the subscription task must stay responsive (acks, flow,
            // consumers leaving, shutdown) while a scan starts or budgets are full.
            let Ok(next) = tokio::time::timeout(PENDING_WAIT, stream.recv()).await else {
                return Err(ReplayError::Pending);
            };
            match next {
                None => {
                    // The lake range ended: what follows is local (or was deleted meanwhile).
                    self.stream = None;
                }
                Some(Err(e)) => return Err(e),
                Some(Ok(first)) => {
                    let mut entries = vec![first.entry];
                    while entries.len() < max {
                        match stream.try_recv() {
                            Some(Ok(b)) => entries.push(b.entry),
                            Some(Err(e)) => {
                                // Deliver what arrived; the error comes back on the next read.
                                tracing::debug!(error = %e, "lake stream failed after a run");
                                self.stream = None;
                                break;
                            }
                            None => break,
                        }
                    }
                    if let (Some(s), Some(last)) = (self.stream.as_mut(), entries.last()) {
                        s.next = Position::new(last.position.ledger, last.position.entry + 1);
                    }
                    self.served_from_lake(&entries);
                    return Ok(entries);
                }
            }
        }
        Err(ReplayError::Log(ReadError::Deleted(from.ledger)))
    }

    fn served_from_lake(&mut self, entries: &[Entry]) {
        self.tier = Tier::Lake;
        let Some(lake) = &self.lake else { return };
        let c = &lake.replay.inner.counters;
        c.entries.fetch_add(entries.len() as u64, Ordering::Relaxed);
        let bytes: usize = entries.iter().map(|e| e.payload.len()).sum();
        c.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        crate::metrics::node().replay_read("lake", entries.len() as u64, bytes as u64);
        let limit = lake.config().read_ahead.as_u64() as usize;
        for e in entries {
            self.recent_bytes += e.payload.len();
            if let Some(old) = self.recent.insert(e.position, e.clone()) {
                self.recent_bytes -= old.payload.len();
            }
        }
        while self.recent_bytes > limit {
            let Some((_, old)) = self.recent.pop_first() else {
                break;
            };
            self.recent_bytes -= old.payload.len();
        }
    }

    /// One entry (a redelivery), from whichever tier holds it.
    pub async fn read_entry(&mut self, pos: Position) -> Result<Entry, ReplayError> {
        if let Some(e) = self.recent.get(&pos) {
            return Ok(e.clone());
        }
        match self.log.read_entry(pos).await {
            Ok(e) => Ok(e),
            Err(ReadError::Deleted(ledger)) => {
                let lake = self.lake_for(ledger)?.clone();
                let runner = lake.clone();
                let entry = runner
                    .on_runtime(async move {
                        let found: Result<Option<Entry>, ReplayError> = async {
                            let mut scan = LedgerScan::open(
                                &lake,
                                pos.ledger,
                                pos.entry,
                                u64::MAX,
                                Some(pos.entry),
                            )
                            .await?;
                            Ok(scan.next().await?.unwrap_or_default().pop())
                        }
                        .await;
                        // The table may have changed (or been cached before the ledger's
                        // offload committed): the next read loads it again.
                        if !matches!(found, Ok(Some(_))) {
                            lake.invalidate();
                        }
                        found
                    })
                    .await?;
                let entry = entry.ok_or(ReplayError::Log(ReadError::Deleted(ledger)))?;
                self.served_from_lake(std::slice::from_ref(&entry));
                Ok(entry)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Forgets cached lake entries before `pos` (they were acknowledged).
    pub fn forget_before(&mut self, pos: Position) {
        while let Some(entry) = self.recent.first_entry() {
            if *entry.key() >= pos {
                break;
            }
            self.recent_bytes -= entry.remove().payload.len();
        }
    }

    /// The first entry published at or after `publish_time_ms`, or the position after the
    /// last entry when there is none. Ledgers read from the lake here (deleted locally, or
    /// offloaded and not held whole) are searched in the lake.
    pub async fn find_by_publish_time(
        &self,
        publish_time_ms: i64,
    ) -> Result<Position, ReplayError> {
        for l in self.log.ledgers() {
            let found = match self
                .log
                .first_published_at_or_after(&l, publish_time_ms)
                .await
            {
                Err(ReadError::Deleted(ledger)) => {
                    self.lake_for(ledger)?
                        .first_at_or_after(ledger, publish_time_ms)
                        .await?
                }
                found => found?,
            };
            if let Some(entry) = found {
                return Ok(Position::new(l.id, entry));
            }
        }
        Ok(self.log.last_confirmed().map_or(Position::new(0, 0), |p| {
            Position::new(p.ledger, p.entry + 1)
        }))
    }
}

/// The first position at or after `p` that holds an entry (or is in the open ledger), in
/// `ledgers` (the topic's, in order).
fn normalize_in(ledgers: &[crate::ledger::LedgerInfo], p: Position) -> Position {
    for l in ledgers {
        if l.id < p.ledger {
            continue;
        }
        let first = if l.id == p.ledger { p.entry } else { 0 };
        if first < l.entry_count || l.state == LedgerState::Open {
            return Position::new(l.id, first);
        }
    }
    p
}
