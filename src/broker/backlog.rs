//! A subscription's backlog as stats report it: entries and bytes between its oldest
//! unacknowledged entry and the last durable one, their age, and which tier serves them.

use serde::Serialize;

use crate::ledger::{now_ms, LedgerInfo, Position};
use crate::replay::Tier;

/// Stats of one subscription (Pulsar's names where Pulsar has them).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SubscriptionStats {
    /// Exclusive, Shared, Failover or Key_Shared.
    #[serde(rename = "type")]
    pub sub_type: String,
    /// Durable (a consumer's) or not (a reader's).
    pub is_durable: bool,
    /// Connected consumers, in attach order (Pulsar's array of consumer stats).
    pub consumers: Vec<ConsumerStats>,
    /// Entries not yet acknowledged, as Pulsar counts `msgBacklog` (a batch is one entry).
    pub msg_backlog: u64,
    /// Bytes of those entries (whole ledgers exactly, a partly consumed ledger pro rata).
    pub backlog_size: u64,
    /// Seconds since the oldest unacknowledged entry's ledger began (an upper bound of the
    /// oldest unacknowledged message's age); 0 without backlog.
    pub backlog_age_seconds: u64,
    /// Entries dispatched and not acknowledged.
    pub unacked_entries: usize,
    /// Messages in those entries (`unackedMessages`).
    pub unacked_messages: u64,
    /// Shared or Key_Shared dispatch is paused: the subscription's unacknowledged messages
    /// reached `maxUnackedMessagesPerSubscription` (it resumes at half).
    pub blocked_subscription_on_unacked_msgs: bool,
    /// Consumers not sent to because they reached `maxUnackedMessagesPerConsumer`.
    pub blocked_consumers_on_unacked_msgs: usize,
    /// The oldest unacknowledged entry.
    pub mark_delete_next: String,
    /// The same, typed (for backlog quotas).
    #[serde(skip)]
    pub first_unacked: crate::ledger::Position,
    /// The next entry to dispatch.
    pub read_position: String,
    /// The tier holding the next entry to dispatch: `local` or `lake`.
    pub next_read_tier: Tier,
    /// The tier that served the last read.
    pub last_read_tier: Tier,
    /// Consecutive failed reads (retried with backoff), and the last failure.
    pub read_failures: u32,
    /// The last read failure (table, ledger and range for the lake).
    pub last_read_error: Option<String>,
    /// Seconds the subscription has been waiting on the lake without an entry (0: not
    /// waiting).
    pub lake_wait_seconds: u64,
}

/// Who a connection's client is, as the connection learned it (shared by its consumers and
/// producers, for their stats).
#[derive(Debug, Clone, Default)]
pub struct ClientInfo {
    /// The client's address as Pulsar shows it (`/host:port`).
    pub address: String,
    /// The CONNECT's `client_version`.
    pub version: String,
}

/// A consumer's or producer's `connectedSince`: RFC 3339, UTC, milliseconds.
pub(crate) fn timestamp(at: std::time::SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(at).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Stats of one consumer of a subscription (Pulsar's `ConsumerStats` names; the fields it has
/// that this broker does not keep are left out).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerStats {
    /// The name its SUBSCRIBE gave (or the client chose).
    pub consumer_name: String,
    /// Messages per second sent to it (the metrics' rate window).
    pub msg_rate_out: f64,
    /// Bytes per second sent to it.
    pub msg_throughput_out: f64,
    /// Messages sent to it since it attached.
    pub msg_out_counter: u64,
    /// Bytes sent to it since it attached.
    pub bytes_out_counter: u64,
    /// Messages it may still be sent (its FLOW permits).
    pub available_permits: i64,
    /// Messages sent to it and not acknowledged.
    pub unacked_messages: u64,
    /// Not sent to: it reached `maxUnackedMessagesPerConsumer`.
    pub blocked_consumer_on_unacked_msgs: bool,
    /// Its priority level (lower first).
    pub priority_level: i32,
    /// Its client's address (`/host:port`).
    pub address: String,
    /// Its client's version, as its CONNECT gave it.
    pub client_version: String,
    /// When it attached (RFC 3339, UTC).
    pub connected_since: String,
}

/// Entries, bytes and age of the backlog from `first_unacked`, and the tier of `next_read`;
/// `acked_after` entries after `first_unacked` are already acknowledged.
pub(crate) fn backlog(
    ledgers: &[LedgerInfo],
    first_unacked: Position,
    acked_after: u64,
    next_read: Position,
) -> (u64, u64, u64, Tier) {
    let mut entries = 0u64;
    let mut bytes = 0u64;
    let mut oldest: Option<i64> = None;
    let mut tier = Tier::Local;
    let mut tier_found = false;
    for l in ledgers {
        if !tier_found
            && (l.id > next_read.ledger
                || (l.id == next_read.ledger && next_read.entry < l.entry_count))
        {
            tier = if l.from_lake { Tier::Lake } else { Tier::Local };
            tier_found = true;
        }
        let first = match l.id.cmp(&first_unacked.ledger) {
            std::cmp::Ordering::Less => continue,
            std::cmp::Ordering::Equal => first_unacked.entry,
            std::cmp::Ordering::Greater => 0,
        };
        if first >= l.entry_count {
            continue;
        }
        let n = l.entry_count - first;
        entries += n;
        bytes += (u128::from(l.size_bytes) * u128::from(n) / u128::from(l.entry_count)) as u64;
        if oldest.is_none() {
            oldest = l.min_publish_ms;
        }
    }
    let entries = entries.saturating_sub(acked_after);
    let age = match (entries, oldest) {
        (0, _) | (_, None) => 0,
        (_, Some(t)) => (now_ms().saturating_sub(t).max(0) / 1000) as u64,
    };
    (entries, bytes, age, tier)
}

/// What a backlog check found (`owner::quota`), for the topic's owner to act on.
#[derive(Debug)]
pub(crate) struct BacklogVerdict {
    /// The limits the check applied (a verdict on limits no longer in force is dropped).
    pub limits: crate::policies::BacklogLimits,
    /// A hold or exception quota found exceeded, and why.
    pub exceeded: Option<(crate::policies::BacklogPolicy, String)>,
    /// The oldest unacknowledged entry read for the age checks, and its publish time.
    pub age_probe: Option<(Position, i64)>,
}

/// The first entry at or after `p` in `ledgers` (the topic's, in order); `None` when there is
/// none yet.
pub(crate) fn first_entry_from(ledgers: &[LedgerInfo], p: Position) -> Option<Position> {
    ledgers.iter().find_map(|l| {
        let first = match l.id.cmp(&p.ledger) {
            std::cmp::Ordering::Less => return None,
            std::cmp::Ordering::Equal => p.entry,
            std::cmp::Ordering::Greater => 0,
        };
        (first < l.entry_count).then(|| Position::new(l.id, first))
    })
}

/// The entry `n` entries after the first entry at or after `p` (`n = 0`: that entry); `None`
/// when the topic has fewer.
pub(crate) fn nth_entry_from(ledgers: &[LedgerInfo], p: Position, n: u64) -> Option<Position> {
    let mut left = n;
    for l in ledgers {
        let first = match l.id.cmp(&p.ledger) {
            std::cmp::Ordering::Less => continue,
            std::cmp::Ordering::Equal => p.entry,
            std::cmp::Ordering::Greater => 0,
        };
        let here = l.entry_count.saturating_sub(first);
        if left < here {
            return Some(Position::new(l.id, first + left));
        }
        left -= here;
    }
    None
}

/// Every position from the first entry at or after `p` to the last, in order.
pub(crate) fn positions_from(
    ledgers: &[LedgerInfo],
    p: Position,
) -> impl Iterator<Item = Position> + '_ {
    ledgers.iter().flat_map(move |l| {
        let first = match l.id.cmp(&p.ledger) {
            std::cmp::Ordering::Less => l.entry_count,
            std::cmp::Ordering::Equal => p.entry.min(l.entry_count),
            std::cmp::Ordering::Greater => 0,
        };
        (first..l.entry_count).map(move |e| Position::new(l.id, e))
    })
}

/// The `n`-th entry counted back from the last one (`n = 1`: the last); `None` when the topic
/// has fewer.
pub(crate) fn nth_entry_from_end(ledgers: &[LedgerInfo], n: u64) -> Option<Position> {
    let mut left = n.checked_sub(1)?;
    for l in ledgers.iter().rev() {
        if left < l.entry_count {
            return Some(Position::new(l.id, l.entry_count - 1 - left));
        }
        left -= l.entry_count;
    }
    None
}

/// The position after the last entry (where a skip of the whole backlog lands).
pub(crate) fn end_position(ledgers: &[LedgerInfo]) -> Position {
    ledgers
        .iter()
        .rev()
        .find(|l| l.entry_count > 0)
        .map_or(Position::new(0, 0), |l| Position::new(l.id, l.entry_count))
}

/// The earliest position from which the entries to the end hold at most `max_bytes` (whole
/// ledgers exactly, a ledger cut in part pro rata, as [`backlog`] counts them).
pub(crate) fn position_keeping(ledgers: &[LedgerInfo], max_bytes: u64) -> Position {
    let end = end_position(ledgers);
    let mut room = max_bytes;
    let mut keep_from = end;
    for l in ledgers.iter().rev().filter(|l| l.entry_count > 0) {
        if l.size_bytes <= room {
            room -= l.size_bytes;
            keep_from = Position::new(l.id, 0);
            continue;
        }
        // Part of this ledger fits: as many of its last entries as the average size allows.
        let per_entry = l.size_bytes.div_ceil(l.entry_count).max(1);
        let kept = (room / per_entry).min(l.entry_count);
        if kept == 0 {
            break;
        }
        return Position::new(l.id, l.entry_count - kept);
    }
    keep_from
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::LedgerState;

    #[test]
    fn positions_for_eviction() {
        let ledgers = [
            ledger(1, LedgerState::Deleted, 10, 1000),
            ledger(2, LedgerState::Sealed, 10, 100),
            ledger(3, LedgerState::Open, 4, 40),
            ledger(4, LedgerState::Open, 0, 0),
        ];
        assert_eq!(position_keeping(&ledgers, 0), Position::new(3, 4));
        assert_eq!(position_keeping(&ledgers, 60), Position::new(2, 8));
        assert_eq!(position_keeping(&ledgers, 140), Position::new(2, 0));
        assert_eq!(position_keeping(&ledgers, 440), Position::new(1, 7));
        assert_eq!(position_keeping(&ledgers, 10_000), Position::new(1, 0));
        let (_, bytes, _, _) = backlog(&ledgers, Position::new(1, 7), 0, Position::new(1, 7));
        assert!(bytes <= 440);
        assert_eq!(
            first_entry_from(&ledgers, Position::new(1, 10)),
            Some(Position::new(2, 0))
        );
        assert_eq!(first_entry_from(&ledgers, Position::new(3, 4)), None);
    }

    #[test]
    fn counting_entries_across_ledgers() {
        let ledgers = [
            ledger(1, LedgerState::Deleted, 10, 1000),
            ledger(2, LedgerState::Sealed, 0, 0),
            ledger(3, LedgerState::Open, 4, 40),
        ];
        let at = |l, e| Some(Position::new(l, e));
        assert_eq!(nth_entry_from(&ledgers, Position::new(1, 0), 0), at(1, 0));
        assert_eq!(nth_entry_from(&ledgers, Position::new(1, 8), 2), at(3, 0));
        assert_eq!(nth_entry_from(&ledgers, Position::new(1, 8), 5), at(3, 3));
        assert_eq!(nth_entry_from(&ledgers, Position::new(1, 8), 6), None);
        assert_eq!(nth_entry_from(&ledgers, Position::new(2, 0), 0), at(3, 0));
        assert_eq!(nth_entry_from_end(&ledgers, 1), at(3, 3));
        assert_eq!(nth_entry_from_end(&ledgers, 5), at(1, 9));
        assert_eq!(nth_entry_from_end(&ledgers, 14), at(1, 0));
        assert_eq!(nth_entry_from_end(&ledgers, 15), None);
        assert_eq!(nth_entry_from_end(&ledgers, 0), None);
        assert_eq!(end_position(&ledgers), Position::new(3, 4));
        let from: Vec<_> = positions_from(&ledgers, Position::new(1, 8)).collect();
        assert_eq!(from.len(), 6);
        assert_eq!(from[1..3], [Position::new(1, 9), Position::new(3, 0)]);
    }

    fn ledger(id: u64, state: LedgerState, entries: u64, bytes: u64) -> LedgerInfo {
        LedgerInfo {
            id,
            state,
            entry_count: entries,
            size_bytes: bytes,
            min_publish_ms: Some(now_ms() - 10_000),
            max_publish_ms: Some(now_ms()),
            from_lake: state == LedgerState::Deleted,
        }
    }

    #[test]
    fn backlog_spans_tiers() {
        let ledgers = [
            ledger(1, LedgerState::Deleted, 10, 1000),
            ledger(2, LedgerState::Sealed, 10, 100),
            ledger(3, LedgerState::Open, 4, 40),
        ];
        let (n, bytes, age, tier) = backlog(&ledgers, Position::new(1, 5), 2, Position::new(1, 7));
        assert_eq!(n, 5 + 10 + 4 - 2);
        assert_eq!(bytes, 500 + 100 + 40);
        assert!(age >= 9);
        assert_eq!(tier, Tier::Lake);
        let (_, _, _, tier) = backlog(&ledgers, Position::new(1, 5), 0, Position::new(1, 10));
        assert_eq!(
            tier,
            Tier::Local,
            "the end of a deleted ledger is the next local one"
        );
        let (n, _, age, _) = backlog(&ledgers, Position::new(3, 4), 0, Position::new(3, 4));
        assert_eq!((n, age), (0, 0));
        // An offloaded ledger: read locally where this node holds it whole, from the lake
        // where it does not (another bookie's, or striped).
        let mut offloaded = ledgers.clone();
        offloaded[1].state = LedgerState::Offloaded;
        let (_, _, _, tier) = backlog(&offloaded, Position::new(2, 0), 0, Position::new(2, 3));
        assert_eq!(tier, Tier::Local);
        offloaded[1].from_lake = true;
        let (_, _, _, tier) = backlog(&offloaded, Position::new(2, 0), 0, Position::new(2, 3));
        assert_eq!(tier, Tier::Lake);
    }
}

/// A subscription waiting on the lake this long without an entry is logged (once per wait).
const LONG_LAKE_WAIT: std::time::Duration = std::time::Duration::from_secs(15);

/// How long a subscription's reads have only been waiting on the lake.
#[derive(Debug, Default)]
pub(crate) struct LakeWait {
    /// Since when, and whether that wait was reported. Reset by every read that returns.
    since: Option<(std::time::Instant, bool)>,
}

impl LakeWait {
    /// Notes one read (`pending`: it only waited on the lake). Returns the wait so far once,
    /// when it first exceeds the reporting threshold.
    pub fn note(&mut self, pending: bool) -> Option<std::time::Duration> {
        if !pending {
            self.since = None;
            return None;
        }
        let (since, reported) = self.since.get_or_insert((std::time::Instant::now(), false));
        if *reported || since.elapsed() < LONG_LAKE_WAIT {
            return None;
        }
        *reported = true;
        Some(since.elapsed())
    }

    /// Seconds of the current wait (0 when not waiting).
    pub fn seconds(&self) -> u64 {
        self.since.map_or(0, |(since, _)| since.elapsed().as_secs())
    }
}
