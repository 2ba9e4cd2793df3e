//! One offload pass over one table: the topics with work that write to it (one for a topic's
//! own table, any number for a namespace's shared table), planned, written and committed
//! together, then local deletion, retention, snapshot expiry and the orphan sweep.
//!
//! Invariants:
//! - The caller holds the table's writer lock for the whole pass.
//! - A shared table's slices come topic by topic (sorted by topic, then partition, starting at
//!   a partition that turns with every pass so a capped pass starves no topic), so the writers
//!   close one topic's files before the next topic's start ([`crate::lake::commit`]).
//! - Requests, status and progress stay per base topic ([`TableSlot`]); what a shared commit
//!   did as a whole (its snapshot, its state) is recorded on every topic that took part.
//! - In a shared table, a topic whose ledger cannot be read fails alone: the pass commits the
//!   other topics without it, and it sits out the table's passes for a rest that doubles
//!   with each failure (5 s to 5 min) unless a request names it. A fault that hits every
//!   topic it tries fails the pass as a whole and rests no topic.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};

use super::schedule::Tables;
use super::{lock, plan, Inner, OffloadError, OffloadState, TableSlot};
use crate::lake::commit::{self, LedgerSlice, WriteOptions};
use crate::lake::naming::TopicTable;
use crate::lake::typed::{self, PayloadCodec};
use crate::lake::LakeError;
use crate::ledger::{now_ms, LedgerState, TopicLog};
use crate::naming::TopicName;
use crate::policies::EffectivePolicies;
use crate::schema as topic_schema;
use iceberg::TableIdent;

/// The table a pass writes: its identifier, and whether it is a namespace's shared table.
#[derive(Debug, Clone)]
pub(super) struct PassTable {
    pub ident: TableIdent,
    pub shared: bool,
}

/// A topic with work: its base name and its partitions' indexes and names.
pub(super) type TopicWork = (TopicName, Vec<(i32, String)>);

/// One topic of a pass.
pub(super) struct PassTopic {
    pub base: TopicName,
    partitions: Vec<(i32, String)>,
    pub slot: Arc<TableSlot>,
    /// The manual request this pass serves, if one was pending.
    ticket: Option<u64>,
}

/// One partition of a pass, as read.
pub(super) struct PassLog {
    /// Index of its topic in the pass's topics.
    pub topic_index: usize,
    /// The `topic` column in a shared table.
    topic: Option<Arc<str>>,
    pub partition: i32,
    pub log: TopicLog,
    /// Whether a request asked for everything (the open ledger is sealed first).
    manual: bool,
}

impl Inner {
    /// `tables` (base topic → partitions) grouped by the table they write to. A topic whose
    /// policies cannot be read is left for the next tick.
    pub(super) async fn group_by_table(&self, tables: Tables) -> Vec<(PassTable, Vec<TopicWork>)> {
        let mut groups: BTreeMap<String, (PassTable, Vec<TopicWork>)> = BTreeMap::new();
        for (_, (base, partitions)) in tables {
            match self.table_of(&base).await {
                Ok(TopicTable { ident, topic }) => {
                    let table = PassTable {
                        shared: topic.is_some(),
                        ident,
                    };
                    groups
                        .entry(table.ident.to_string())
                        .or_insert_with(|| (table, Vec::new()))
                        .1
                        .push((base, partitions));
                }
                Err(e) => tracing::warn!(topic = %base, error = %e, "offload: no table for topic"),
            }
        }
        groups.into_values().collect()
    }

    /// Runs one pass over `table` for `topics` (the caller holds the writer lock) and records
    /// its outcome on each topic's slot.
    pub(super) async fn run_pass(&self, table: &PassTable, topics: Vec<TopicWork>) {
        let mut work: Vec<PassTopic> = topics
            .into_iter()
            .map(|(base, partitions)| {
                let slot = self.slot(&base.to_string());
                // Take the pending manual request (if any) now: this pass serves it.
                let ticket = {
                    let mut m = lock(&slot.manual);
                    let taken = (m.0 > m.1).then_some(m.0);
                    m.1 = m.0;
                    taken
                };
                PassTopic {
                    base,
                    partitions,
                    slot,
                    ticket,
                }
            })
            .collect();
        work.sort_by(|a, b| a.base.local.cmp(&b.base.local));
        let more = match Box::pin(self.pass(table, &work)).await {
            Ok(more) => more,
            Err(e) => {
                tracing::warn!(table = %table.ident, error = %e, "offload pass failed");
                for w in &work {
                    let mut st = lock(&w.slot.status);
                    st.state = OffloadState::Error;
                    st.last_error = Some(e.to_string());
                }
                BTreeSet::new()
            }
        };
        for (index, w) in work.iter().enumerate() {
            match w.ticket {
                // A pass is capped in size: a request for everything stays pending (taken
                // again by the next pass) until nothing is left.
                Some(t) if more.contains(&index) => {
                    let mut m = lock(&w.slot.manual);
                    m.1 = m.1.min(t - 1);
                }
                Some(t) => {
                    w.slot.completed.fetch_max(t, Ordering::AcqRel);
                }
                None => {}
            }
            w.slot.runs.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// One pass over a table. Returns the topics (indexes into `work`) that have eligible
    /// ledgers left for a later pass (a pass commits a bounded amount).
    async fn pass(
        &self,
        table: &PassTable,
        work: &[PassTopic],
    ) -> Result<BTreeSet<usize>, OffloadError> {
        let Some(first) = work.first() else {
            return Ok(BTreeSet::new());
        };
        // A request seals the open ledgers, which only the loaded logs may do; otherwise the
        // pass reads views that load nothing (an unloaded topic stays unloaded).
        let mut logs = Vec::new();
        for (topic_index, w) in work.iter().enumerate() {
            let topic: Option<Arc<str>> = table.shared.then(|| Arc::from(w.base.local.as_str()));
            let manual = w.ticket.is_some();
            let mut partitions = w.partitions.clone();
            partitions.sort();
            for (partition, name) in partitions {
                let log = if manual {
                    Some(self.log.topic(&name).await?)
                } else {
                    self.log.topic_view(&name).await?
                };
                if let Some(log) = log {
                    logs.push(PassLog {
                        topic_index,
                        topic: topic.clone(),
                        partition,
                        log,
                        manual,
                    });
                }
            }
        }
        let any_manual = work.iter().any(|w| w.ticket.is_some());
        let policies = self.policies.effective(&first.base.namespace).await?;
        // Cheap check first: nothing sealed or offloaded anywhere, no request, no retention,
        // and no table that may still hold files of expired ledgers (the views do not list
        // expired ledgers; the scheduler brings such a table at the first tick and when
        // retention is due) → no I/O.
        let leftovers = work
            .iter()
            .any(|w| w.slot.retention_pending.load(Ordering::Acquire));
        let busy = leftovers
            || logs.iter().any(|l| {
                l.log.ledgers().iter().any(|i| {
                    matches!(i.state, LedgerState::Sealed | LedgerState::Offloaded)
                        || (i.state == LedgerState::Deleted && !policies.retention.is_infinite())
                })
            });
        if !busy && !any_manual {
            return Ok(BTreeSet::new());
        }
        let _permit = self
            .slots
            .acquire()
            .await
            .map_err(|_| OffloadError::Stopped)?;
        for l in logs.iter().filter(|l| l.manual) {
            l.log.seal_current().await?;
        }
        // A shared table's topics whose ledgers could not be read lately sit this pass out (a
        // request brings one back at once).
        let resting: BTreeSet<usize> = work
            .iter()
            .enumerate()
            .filter(|(_, w)| table.shared && w.ticket.is_none() && is_resting(&w.slot))
            .map(|(i, _)| i)
            .collect();
        let (slices, mut more) = self.plan_slices(&logs, &policies, &resting).await?;
        let mut loaded = None;
        if !slices.is_empty() {
            let taking_part = work
                .iter()
                .enumerate()
                .filter(|(i, _)| !resting.contains(i))
                .map(|(_, w)| w)
                .collect();
            let left_out;
            (loaded, left_out) = self
                .offload_isolating(table, taking_part, slices, &policies)
                .await?;
            // A topic left out is done with for this pass: its request completes (with the
            // error in its status) rather than bring it straight back past its rest.
            more.retain(|i| !left_out.contains(&work[*i].base.local));
        }
        let by_topic: Vec<(i32, TopicLog)> =
            logs.iter().map(|l| (l.partition, l.log.clone())).collect();
        self.delete_expired(&by_topic, &policies).await?;
        let loaded = match self.apply_retention(table, work, &logs, &policies).await {
            Ok(Some(t)) => Some(t),
            Ok(None) => loaded,
            Err(e) => {
                for w in work {
                    let mut st = lock(&w.slot.status);
                    if st.retention.last_error != e.to_string() {
                        tracing::warn!(topic = %w.base, error = %e, "retention could not remove expired data from the lake");
                    }
                    st.retention.last_error = e.to_string();
                }
                loaded
            }
        };
        let loaded = match loaded {
            Some(t) => self.expire_history(&first.base, t).await,
            None => None,
        };
        self.sweep_orphans(&table.ident, &first.slot, loaded).await;
        let pending = work.iter().any(|w| {
            let m = lock(&w.slot.manual);
            m.0 > m.1
        });
        if !more.is_empty() || pending {
            self.wake.notify_one();
        }
        Ok(more)
    }

    /// The sealed ledgers this pass writes (a bounded amount, topic by topic from a partition
    /// that turns with every pass, each partition's in id order, none of the `resting`
    /// topics), and the topics (indexes) with eligible ones left for a later pass.
    async fn plan_slices(
        &self,
        logs: &[PassLog],
        policies: &EffectivePolicies,
        resting: &BTreeSet<usize>,
    ) -> Result<(Vec<LedgerSlice>, BTreeSet<usize>), OffloadError> {
        let meta = self.log.metadata();
        let now = now_ms();
        let budget = self.config.target_file_size.as_u64().saturating_mul(4);
        let mut slices = Vec::new();
        let mut planned_bytes = 0u64;
        let mut more = BTreeSet::new();
        let start = self.rotation.fetch_add(1, Ordering::Relaxed) % logs.len().max(1);
        let (head, tail) = logs.split_at(start);
        for l in tail.iter().chain(head) {
            let log = &l.log;
            let records = meta.topic_ledgers(log.id()).await?;
            let here = self.log.offloaded_here(&records).await;
            // Other nodes offload or delete the ledgers their bookies hold: keep this view's
            // record of them current (stats, and reads that go to the lake once offloaded),
            // also while the topic rests.
            for r in records.iter().filter(|r| !here.contains(&r.id)) {
                log.set_record(r.clone());
            }
            if resting.contains(&l.topic_index) {
                continue;
            }
            let open_bytes = log
                .ledgers()
                .iter()
                .filter(|i| i.state == LedgerState::Open)
                .map(|i| i.size_bytes)
                .sum();
            // Each bookie's node offloads the ledgers it holds (a topic moved between nodes has
            // sealed ledgers on several bookies), in ledger order: the first ledger another
            // bookie holds stops this node until that node has offloaded it.
            let mut candidates = plan::candidates(&records);
            if let Some(at) = candidates.iter().position(|r| !here.contains(&r.id)) {
                candidates.truncate(at);
            }
            // An older ledger still sealing holds back the newer sealed ones: come back soon.
            let newest = records.iter().map(|r| r.id).max();
            if records
                .iter()
                .any(|r| r.state == LedgerState::Open && Some(r.id) != newest)
            {
                more.insert(l.topic_index);
            }
            // Ledgers of this bookie that hold back another bookie's (the topic moved away) go
            // whatever the thresholds: nothing else would ever offload them.
            let blocking = candidates.last().is_some_and(|last| {
                records
                    .iter()
                    .any(|r| r.id > last.id && !here.contains(&r.id))
            });
            let n = if blocking {
                candidates.len()
            } else {
                plan::eligible(&candidates, open_bytes, policies, now, l.manual)
            };
            for r in candidates.into_iter().take(n) {
                let Some(seal) = r.seal else {
                    // Contract violation of the metadata store: stop this partition here rather
                    // than commit the ledger as empty.
                    tracing::error!(ledger = r.id, "sealed ledger without seal information");
                    break;
                };
                if !slices.is_empty() && planned_bytes + seal.size_bytes > budget {
                    more.insert(l.topic_index);
                    break;
                }
                planned_bytes += seal.size_bytes;
                slices.push(LedgerSlice {
                    topic: l.topic.clone(),
                    partition: l.partition,
                    log: log.clone(),
                    ledger: r.id,
                    entry_count: seal.entry_count,
                    size_bytes: seal.size_bytes,
                });
            }
        }
        Ok((slices, more))
    }

    /// [`Self::offload`] of `slices` for the topics `taking_part`. In a shared table, a topic
    /// whose ledger cannot be read is left out and the others are committed without it: one
    /// topic's failing disk or lost copy does not hold back its namespace. A topic left out is
    /// blamed (its status says why, and it rests a while: [`rest`]) only when the commit
    /// without it succeeds, or when it was the only topic with ledgers to commit; a fault that
    /// hits topic after topic (the node's journal, a shutdown) fails the pass as a whole after
    /// at most [`MAX_LEFT_OUT`] of them, and no topic rests. Returns the table as committed
    /// (`None`: every topic with ledgers was left out) and the topics left out (local names).
    async fn offload_isolating(
        &self,
        table: &PassTable,
        mut taking_part: Vec<&PassTopic>,
        mut slices: Vec<LedgerSlice>,
        policies: &EffectivePolicies,
    ) -> Result<(Option<Table>, BTreeSet<String>), OffloadError> {
        // Each attempt shows its topics as running; those left with nothing to commit get
        // back the state they had.
        let before: HashMap<String, OffloadState> = taking_part
            .iter()
            .map(|w| (w.base.local.clone(), lock(&w.slot.status).state))
            .collect();
        let first_topic = slices.first().and_then(|s| s.topic.clone());
        let alone = slices.iter().all(|s| s.topic == first_topic);
        let mut left_out: Vec<(&PassTopic, String)> = Vec::new();
        let committed = loop {
            let e = match self
                .offload(table, &taking_part, slices.clone(), policies)
                .await
            {
                Ok(t) => break Some(t),
                Err(e) => e,
            };
            let unreadable = match &e {
                OffloadError::Lake(LakeError::Read { ledger, source })
                    if table.shared && left_out.len() < MAX_LEFT_OUT && one_ledgers(source) =>
                {
                    slices
                        .iter()
                        .find(|s| s.ledger == *ledger)
                        .and_then(|s| s.topic.clone())
                }
                _ => None,
            };
            let Some(topic) = unreadable else {
                return Err(e);
            };
            let Some(at) = taking_part.iter().position(|w| *w.base.local == *topic) else {
                return Err(e);
            };
            left_out.push((taking_part.remove(at), e.to_string()));
            slices.retain(|s| s.topic.as_deref() != Some(&*topic));
            if slices.is_empty() {
                if !alone {
                    // Every topic with ledgers failed: not one topic's fault.
                    return Err(e);
                }
                for w in &taking_part {
                    if let Some(state) = before.get(&w.base.local) {
                        lock(&w.slot.status).state = *state;
                    }
                }
                break None;
            }
        };
        let mut names = BTreeSet::new();
        for (w, error) in left_out {
            let wait = rest(&w.slot);
            {
                let mut st = lock(&w.slot.status);
                st.state = OffloadState::Error;
                st.last_error = Some(error.clone());
            }
            w.slot.progress.entries.store(0, Ordering::Relaxed);
            w.slot.progress.bytes.store(0, Ordering::Relaxed);
            tracing::warn!(table = %table.ident, topic = %w.base, error, rest = ?wait,
                "offload: a ledger of the topic could not be read; the table's other topics go on without it");
            names.insert(w.base.local.clone());
        }
        Ok((committed, names))
    }

    async fn offload(
        &self,
        table: &PassTable,
        work: &[&PassTopic],
        slices: Vec<LedgerSlice>,
        policies: &EffectivePolicies,
    ) -> Result<Table, OffloadError> {
        let Some(first) = work.first() else {
            return Err(OffloadError::Stopped);
        };
        for w in work {
            lock(&w.slot.status).state = OffloadState::Running;
        }
        // One commit's progress is shown on the first topic of the pass.
        let progress = first.slot.progress.clone();
        progress.entries.store(0, Ordering::Relaxed);
        progress.bytes.store(0, Ordering::Relaxed);
        let metrics = crate::metrics::node();
        // Every failed attempt counts, also one that could not reach the table (lake down).
        let layout = TopicTable {
            ident: table.ident.clone(),
            topic: table.shared.then(|| first.base.local.clone()),
        };
        let loaded = self
            .lake
            .load_or_create_table_at(&first.base, &layout, policies.lake_partitioning)
            .await
            .inspect_err(|_| {
                metrics.lake_commit_failures.inc();
            })?;
        // A shared table holds the envelope only: its topics' schemas may differ.
        let (loaded, codec) = if table.shared {
            (loaded, None)
        } else {
            self.ensure_typed_columns(&first.base, loaded)
                .await
                .inspect_err(|_| {
                    metrics.lake_commit_failures.inc();
                })?
        };
        let partitioning = table_partitioning(&loaded).unwrap_or(policies.lake_partitioning);
        let options = WriteOptions {
            target_file_size: self.config.target_file_size.as_u64(),
            batch_rows: self.config.batch_rows,
            partitioning,
            payload_codec: codec,
        };
        let topic_of_ledger: HashMap<u64, Option<Arc<str>>> =
            slices.iter().map(|s| (s.ledger, s.topic.clone())).collect();
        let started = Instant::now();
        let (loaded, outcome) =
            match commit::write_and_commit(&self.lake, loaded, slices, &options, &progress).await {
                Ok(done) => {
                    metrics
                        .lake_commit_seconds
                        .observe(started.elapsed().as_secs_f64());
                    done
                }
                Err(e) => {
                    metrics.lake_commit_failures.inc();
                    return Err(e.into());
                }
            };
        let ident = loaded.identifier().to_string();
        let reference = |snapshot: Option<i64>| match snapshot {
            Some(s) => format!("{}:{}@{}", self.lake.catalog_name(), ident, s),
            None => format!("{}:{}@watermark", self.lake.catalog_name(), ident),
        };
        for ledger in &outcome.already_committed {
            self.log.mark_offloaded(*ledger, reference(None)).await?;
        }
        crate::failpoint::hit("offload.before_mark");
        for ledger in &outcome.committed {
            self.log
                .mark_offloaded(*ledger, reference(outcome.snapshot_id))
                .await?;
        }
        if !outcome.committed.is_empty() {
            let secs = started.elapsed().as_secs_f64();
            tracing::info!(table = %ident, topics = work.len(), ledgers = outcome.committed.len(),
                rows = outcome.rows, files = outcome.files, parquet_bytes = outcome.file_bytes,
                bad_payloads = outcome.bad_payloads, seconds = secs, "offloaded");
        }
        for w in work {
            let mine = |l: &&u64| {
                !table.shared
                    || topic_of_ledger
                        .get(l)
                        .is_some_and(|t| t.as_deref() == Some(w.base.local.as_str()))
            };
            // A rest ends with a commit the topic had ledgers in; a topic that failed lately
            // and had none in this one keeps the status that says why.
            let had_ledgers = !table.shared
                || topic_of_ledger
                    .values()
                    .any(|t| t.as_deref() == Some(&*w.base.local));
            if had_ledgers {
                *lock(&w.slot.unreadable) = None;
            } else if lock(&w.slot.unreadable).is_some() {
                continue;
            }
            let mut st = lock(&w.slot.status);
            st.state = OffloadState::Success;
            st.last_error = None;
            st.last_snapshot_id = outcome.snapshot_id.or(st.last_snapshot_id);
            st.committed_ledgers += outcome.committed.iter().filter(mine).count() as u64;
            let (rows, bad) = if table.shared {
                let of_topic = outcome.by_topic.get(w.base.local.as_str());
                of_topic.copied().unwrap_or_default()
            } else {
                (outcome.rows, outcome.bad_payloads)
            };
            st.committed_rows += rows;
            st.bad_payloads += bad;
        }
        Ok(loaded)
    }

    /// Adds the typed columns the topic's schema versions ask for; returns the payload codec.
    async fn ensure_typed_columns(
        &self,
        base: &TopicName,
        table: Table,
    ) -> Result<(Table, Option<PayloadCodec>), OffloadError> {
        let versions = topic_schema::versions(&self.log.metadata(), &base.to_string())
            .await
            .map_err(|e| OffloadError::Schema(e.to_string()))?;
        let Some((codec, wanted)) = typed::topic_codec(&base.to_string(), &versions) else {
            return Ok((table, None));
        };
        let schema = table.metadata().current_schema().clone();
        let missing: Vec<_> = wanted
            .into_iter()
            .filter(|(n, _)| schema.field_by_name(n).is_none())
            .collect();
        let table = if missing.is_empty() {
            table
        } else {
            let names: Vec<String> = missing.iter().map(|(n, _)| n.clone()).collect();
            let tx = Transaction::new(&table);
            let mut update = tx.update_schema();
            for (name, t) in missing {
                update = update.add_column(iceberg::transaction::AddColumn::optional(name, t));
            }
            let tx = update
                .apply(tx)
                .map_err(LakeError::iceberg("adding typed columns"))?;
            let t = self
                .lake
                .commit(tx, &table)
                .await
                .map_err(LakeError::iceberg("committing typed columns"))?;
            tracing::info!(topic = %base, columns = ?names, "lake table schema evolved");
            t
        };
        Ok((table, Some(codec)))
    }
}

/// First rest of a topic whose ledger could not be read in a shared pass; each further failure
/// doubles it, up to [`MAX_REST`].
const REST: Duration = Duration::from_secs(5);
/// Longest rest of a topic whose ledgers keep failing.
const MAX_REST: Duration = Duration::from_secs(300);

/// Topics one pass leaves out before it fails as a whole.
const MAX_LEFT_OUT: usize = 3;

/// Whether a read failure can be one ledger's own (a damaged or missing record or index, a
/// failed read of its file, its copies out of reach) rather than the node's (a shutdown, the
/// metadata store).
fn one_ledgers(e: &crate::ledger::ReadError) -> bool {
    use crate::ledger::ReadError;
    !matches!(e, ReadError::Cancelled | ReadError::Metadata(_))
}

/// Starts (or lengthens) the rest of `slot`'s topic after a read failure; returns its length.
/// A failure long after the last rest ended (more than that rest again) starts over at
/// [`REST`].
fn rest(slot: &TableSlot) -> Duration {
    let mut unreadable = lock(&slot.unreadable);
    let now = Instant::now();
    let wait = match *unreadable {
        Some((until, last)) if now < until + last => (last * 2).min(MAX_REST),
        _ => REST,
    };
    *unreadable = Some((now + wait, wait));
    wait
}

/// Whether `slot`'s topic is resting after a read failure.
fn is_resting(slot: &TableSlot) -> bool {
    lock(&slot.unreadable).is_some_and(|(until, _)| Instant::now() < until)
}

/// The time granularity a table was created with (its default spec's time field), if it is
/// one of ours.
fn table_partitioning(table: &Table) -> Option<crate::config::LakePartitioning> {
    use crate::config::LakePartitioning;
    let spec = table.metadata().default_partition_spec();
    spec.fields().iter().find_map(|f| match f.transform {
        iceberg::spec::Transform::Day => Some(LakePartitioning::Day),
        iceberg::spec::Transform::Hour => Some(LakePartitioning::Hour),
        _ => None,
    })
}
