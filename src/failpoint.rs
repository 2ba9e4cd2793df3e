//! Failpoints for crash tests: named places where a test can make the process die abruptly.
//!
//! Compiled in debug builds only (the test builds); in release builds [`hit`] is empty. A test
//! sets `LL_FAILPOINTS=name1,name2` in the child's environment; reaching a listed point aborts
//! the process at once, as a crash or `kill -9` would (no destructors, no flushing).

/// Aborts the process if `name` is armed (debug builds only).
#[inline]
pub fn hit(name: &str) {
    #[cfg(debug_assertions)]
    {
        use std::sync::OnceLock;
        static ARMED: OnceLock<Vec<String>> = OnceLock::new();
        let armed = ARMED.get_or_init(|| {
            std::env::var("LL_FAILPOINTS")
                .map(|v| v.split(',').map(|s| s.trim().to_string()).collect())
                .unwrap_or_default()
        });
        if armed.iter().any(|a| a == name) {
            eprintln!("failpoint {name}: aborting");
            std::process::abort();
        }
    }
    #[cfg(not(debug_assertions))]
    let _ = name;
}
