//! Failpoints for crash and fault tests: named places where a test can make the process die
//! abruptly or stall.
//!
//! Compiled in debug builds only (the test builds); in release builds [`hit`] and [`pause`] do
//! nothing. A test sets `LL_FAILPOINTS` in the child's environment, a comma-separated list of:
//! - `name`: reaching [`hit`]`(name)` aborts the process at once, as a crash or `kill -9` would
//!   (no destructors, no flushing);
//! - `name=sleep(MS)` or `name@KEY=sleep(MS)`: reaching [`pause`]`(name, key)` waits MS
//!   milliseconds (only when `key` contains `KEY`, if given), as a slow disk or store would.

/// One armed failpoint.
#[cfg(debug_assertions)]
#[derive(Debug)]
struct Armed {
    name: String,
    /// `Some(substring)`: only keys containing it.
    key: Option<String>,
    /// `None`: abort; `Some(ms)`: sleep.
    sleep_ms: Option<u64>,
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
    let (point, action) = match entry.split_once('=') {
        Some((p, a)) => (p, Some(a)),
        None => (entry, None),
    };
    let sleep_ms = match action {
        None => None,
        Some(a) => match a.strip_prefix("sleep(").and_then(|r| r.strip_suffix(')')) {
            Some(ms) => Some(ms.parse().ok()?),
            None => {
                eprintln!("failpoint {entry}: unknown action (use sleep(MS))");
                return None;
            }
        },
    };
    let (name, key) = match point.split_once('@') {
        Some((n, k)) => (n.to_string(), Some(k.to_string())),
        None => (point.to_string(), None),
    };
    Some(Armed {
        name,
        key,
        sleep_ms,
    })
}

/// Aborts the process if `name` is armed to abort (debug builds only).
#[inline]
pub fn hit(name: &str) {
    #[cfg(debug_assertions)]
    if armed()
        .iter()
        .any(|a| a.name == name && a.sleep_ms.is_none())
    {
        eprintln!("failpoint {name}: aborting");
        std::process::abort();
    }
    #[cfg(not(debug_assertions))]
    let _ = name;
}

/// Waits as long as `name` is armed to sleep for `key` (debug builds only).
pub async fn pause(name: &str, key: &str) {
    #[cfg(debug_assertions)]
    {
        let ms: u64 = armed()
            .iter()
            .filter(|a| a.name == name && a.key.as_deref().is_none_or(|k| key.contains(k)))
            .filter_map(|a| a.sleep_ms)
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
            (a.name.as_str(), a.key, a.sleep_ms),
            ("offload.before_commit", None, None)
        );
        let a = parse(" broker.load_topic@slow-=sleep(2500)").expect("sleep point");
        assert_eq!(
            (a.name.as_str(), a.key.as_deref(), a.sleep_ms),
            ("broker.load_topic", Some("slow-"), Some(2500))
        );
        assert!(parse("x=sleep(abc)").is_none());
        assert!(parse("x=explode").is_none());
        assert!(parse("").is_none());
    }
}
