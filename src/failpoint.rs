//! Failpoints for crash and fault tests: named places where a test can make the process die
//! abruptly, stall, or see an I/O error.
//!
//! Compiled in debug builds only (the test builds); in release builds [`hit`], [`pause`] and
//! [`io_error`] do nothing. A test sets `LL_FAILPOINTS` in the child's environment, a
//! comma-separated list of `name[@KEY][=ACTION][*TIMES][#SKIP]`:
//! - no action: reaching [`hit`]`(name)` aborts the process at once, as a crash or `kill -9`
//!   would (no destructors, no flushing);
//! - `=sleep(MS)`: reaching [`pause`]`(name, key)` waits MS milliseconds (only when `key`
//!   contains `KEY`, if given), as a slow disk or store would;
//! - `=error`: reaching [`io_error`]`(name)` (or [`io_error_at`]`(name, key)`, only when
//!   `key` contains `KEY`, if given) returns an I/O error, as a failing disk would;
//! - `=panic`: reaching [`panic_at`]`(name, key)` panics (only when `key` contains `KEY`, if
//!   given), as a rare defect in the code around it would; once unless `*TIMES` says
//!   otherwise, so the test sees what recovery does;
//! - `*TIMES`: the point fires TIMES times, then passes again (a store that fails twice,
//!   then answers);
//! - `#SKIP`: the first SKIP times the point is reached it does nothing (crash at the third
//!   seal, fail the twentieth `fdatasync`).
//!
//! The names in use, by the step they break (the fault suite, `tests/faults/`, arms each):
//! - log: `journal.fdatasync` (error), `ledger.read` (error, keyed by topic: a topic whose
//!   stored entries cannot be read), `ledger.seal.record` (error: the store refuses a seal's
//!   record, before it is written; `ledger.seal.answer` (error: after it is written, its
//!   answer lost); both also in recovery's seals), `ledger.seal.after_index`,
//!   `ledger.seal.after_record`,
//!   `ledger.recovery.after_scan`, `ledger.recovery.after_seal`,
//!   `ledger.local_delete.after_record`, `ledger.reclaim.before_sync`;
//! - offload: `offload.before_commit`, `offload.after_commit`, `offload.before_mark`,
//!   `offload.before_delete_local`, `lake.before_catalog_commit` (sleep);
//! - retention and snapshot expiry: `retention.before_commit`, `retention.after_commit`,
//!   `retention.before_catalog_commit` (sleep), `retention.before_file_delete`, `history.before_commit`, `history.after_commit`;
//! - broker: `broker.load_topic` (sleep), `broker.owner.publish` (panic, keyed by topic: a
//!   defect in a topic's owner);
//! - topic deletion: `ops.after_topics_deleted` (sleep: the topics gone, their name's slots
//!   free again), `ops.before_lake_removal` (the log gone, the lake data not yet).

/// What an armed failpoint does.
#[cfg(debug_assertions)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Abort,
    Sleep(u64),
    Error,
    Panic,
}

/// One armed failpoint.
#[cfg(debug_assertions)]
#[derive(Debug)]
struct Armed {
    name: String,
    /// `Some(substring)`: only keys containing it.
    key: Option<String>,
    action: Action,
    /// Hits that pass before the point fires.
    skip: u64,
    /// Hits that fire, after the skipped ones (`None`: every one).
    times: Option<u64>,
    /// Invariant: counts every hit of this point with a matching key, fired or not.
    hits: std::sync::atomic::AtomicU64,
}

#[cfg(debug_assertions)]
impl Armed {
    /// Counts a hit; true when this one fires.
    fn fires(&self) -> bool {
        let n = self.hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        n >= self.skip && self.times.is_none_or(|t| n - self.skip < t)
    }
}

#[cfg(debug_assertions)]
fn armed() -> &'static [Armed] {
    use std::sync::OnceLock;
    static ARMED: OnceLock<Vec<Armed>> = OnceLock::new();
    ARMED.get_or_init(|| {
        std::env::var("LL_FAILPOINTS")
            .map(|v| v.split(',').filter_map(parse).collect())
            .unwrap_or_default()
    })
}

#[cfg(debug_assertions)]
fn parse(entry: &str) -> Option<Armed> {
    let entry = entry.trim();
    if entry.is_empty() {
        return None;
    }
    let (entry_body, skip) = match entry.rsplit_once('#') {
        Some((body, n)) => (body, n.parse().ok()?),
        None => (entry, 0),
    };
    let (entry_body, times) = match entry_body.rsplit_once('*') {
        Some((body, n)) => (body, Some(n.parse().ok()?)),
        None => (entry_body, None),
    };
    let (point, action) = match entry_body.split_once('=') {
        Some((p, a)) => (p, Some(a)),
        None => (entry_body, None),
    };
    let action = match action {
        None => Action::Abort,
        Some("error") => Action::Error,
        Some("panic") => Action::Panic,
        Some(a) => match a.strip_prefix("sleep(").and_then(|r| r.strip_suffix(')')) {
            Some(ms) => Action::Sleep(ms.parse().ok()?),
            None => {
                eprintln!("failpoint {entry}: unknown action (use sleep(MS), error or panic)");
                return None;
            }
        },
    };
    let (name, key) = match point.split_once('@') {
        Some((n, k)) => (n.to_string(), Some(k.to_string())),
        None => (point.to_string(), None),
    };
    // A panic is a rare defect: once, unless told otherwise.
    let times = times.or((action == Action::Panic).then_some(1));
    Some(Armed {
        name,
        key,
        action,
        skip,
        times,
        hits: Default::default(),
    })
}

/// The points armed as `name` with `action` for `key` (its `@KEY`, if given, is part of it).
#[cfg(debug_assertions)]
fn armed_for<'a>(
    name: &'a str,
    action: Action,
    key: &'a str,
) -> impl Iterator<Item = &'static Armed> + 'a {
    armed().iter().filter(move |a| {
        a.name == name && a.action == action && a.key.as_deref().is_none_or(|k| key.contains(k))
    })
}

/// Aborts the process if `name` is armed to abort (debug builds only).
#[inline]
pub fn hit(name: &str) {
    #[cfg(debug_assertions)]
    if armed()
        .iter()
        .filter(|a| a.name == name && a.action == Action::Abort)
        .fold(false, |fired, a| a.fires() | fired)
    {
        eprintln!("failpoint {name}: aborting");
        std::process::abort();
    }
    #[cfg(not(debug_assertions))]
    let _ = name;
}

/// An injected I/O error if `name` is armed to fail (debug builds only).
#[inline]
pub fn io_error(name: &str) -> std::io::Result<()> {
    io_error_at(name, "")
}

/// An injected I/O error if `name` is armed to fail for `key` (its `@KEY`, if given, is part
/// of `key`; debug builds only).
#[inline]
pub fn io_error_at(name: &str, key: &str) -> std::io::Result<()> {
    #[cfg(debug_assertions)]
    if armed_for(name, Action::Error, key).fold(false, |fired, a| a.fires() | fired) {
        eprintln!("failpoint {name}: injecting an I/O error");
        return Err(std::io::Error::other(format!("failpoint {name}")));
    }
    #[cfg(not(debug_assertions))]
    let _ = (name, key);
    Ok(())
}

/// Panics if `name` is armed to panic for `key` and this is the hit that fires (debug builds
/// only).
#[inline]
pub fn panic_at(name: &str, key: &str) {
    #[cfg(debug_assertions)]
    if armed_for(name, Action::Panic, key).fold(false, |fired, a| a.fires() | fired) {
        panic!("failpoint {name}: panicking at {key}");
    }
    #[cfg(not(debug_assertions))]
    let _ = (name, key);
}

/// Waits as long as `name` is armed to sleep for `key` (debug builds only).
pub async fn pause(name: &str, key: &str) {
    #[cfg(debug_assertions)]
    {
        let ms: u64 = armed()
            .iter()
            .filter(|a| a.name == name && a.key.as_deref().is_none_or(|k| key.contains(k)))
            .filter_map(|a| match a.action {
                Action::Sleep(ms) if a.fires() => Some(ms),
                _ => None,
            })
            .sum();
        if ms > 0 {
            tracing::warn!(failpoint = name, key, ms, "failpoint: pausing");
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        }
    }
    #[cfg(not(debug_assertions))]
    let _ = (name, key);
}

#[cfg(all(test, debug_assertions))]
mod tests {
    use super::*;

    #[test]
    fn entries_parse() {
        let a = parse("offload.before_commit").expect("abort point");
        assert_eq!(
            (a.name.as_str(), a.key, a.action, a.skip),
            ("offload.before_commit", None, Action::Abort, 0)
        );
        let a = parse(" broker.load_topic@slow-=sleep(2500)").expect("sleep point");
        assert_eq!(
            (a.name.as_str(), a.key.as_deref(), a.action),
            ("broker.load_topic", Some("slow-"), Action::Sleep(2500))
        );
        let a = parse("journal.fdatasync=error#20").expect("error point");
        assert_eq!((a.action, a.skip), (Action::Error, 20));
        let a = parse("ledger.read@ns/bad=error").expect("keyed error point");
        assert_eq!(
            (a.name.as_str(), a.key.as_deref(), a.action),
            ("ledger.read", Some("ns/bad"), Action::Error)
        );
        let a = parse("broker.owner.publish@t-1=panic#3").expect("panic point");
        assert_eq!(
            (a.key.as_deref(), a.action, a.skip),
            (Some("t-1"), Action::Panic, 3)
        );
        assert!(parse("x=sleep(abc)").is_none());
        assert!(parse("x=explode").is_none());
        assert!(parse("x#many").is_none());
        assert!(parse("x=error*often").is_none());
        assert!(parse("").is_none());
    }

    #[test]
    fn skip_lets_the_first_hits_pass() {
        let a = parse("p=error#2").expect("error point");
        assert_eq!(
            (0..5).map(|_| a.fires()).collect::<Vec<_>>(),
            [false, false, true, true, true]
        );
        let a = parse("p=panic#2").expect("panic point");
        assert_eq!(
            (0..5).map(|_| a.fires()).collect::<Vec<_>>(),
            [false, false, true, false, false]
        );
        let a = parse("p=error*2#1").expect("counted error point");
        assert_eq!(
            (0..5).map(|_| a.fires()).collect::<Vec<_>>(),
            [false, true, true, false, false]
        );
    }
}
