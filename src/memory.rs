//! Giving freed memory back to the system. The binary decides how — it alone may call the
//! allocator's unsafe functions (the library forbids `unsafe`), and it configures malloc to keep
//! freed memory for reuse, which the offload's buffers need — and installs that with
//! [`set_release`]. The library calls [`release`] after it freed much at once (idle topics
//! unloaded), on the blocking pool and at most once per [`MIN_INTERVAL`] (callers debounce),
//! and a large short-lived buffer (a `/metrics` text) holds a [`ReleaseOnDrop`].
//!
//! Invariant: without an installed release (tests, other binaries), [`release`] does nothing.

use std::sync::OnceLock;
use std::time::Duration;

/// Shortest time between two releases.
pub const MIN_INTERVAL: Duration = Duration::from_secs(30);

static RELEASE: OnceLock<fn()> = OnceLock::new();

/// Installs how freed memory is handed back (once; later calls are ignored).
pub fn set_release(f: fn()) {
    let _ = RELEASE.set(f);
}

/// Hands freed memory back to the system, on the blocking pool (it walks the allocator's
/// heaps). Does nothing when no release is installed.
pub async fn release() {
    if let Some(f) = RELEASE.get().copied() {
        let _ = tokio::task::spawn_blocking(f).await;
    }
}

/// When a release last started (shared by [`ReleaseOnDrop`] guards).
static LAST: std::sync::Mutex<Option<std::time::Instant>> = std::sync::Mutex::new(None);

/// Hands freed memory back when dropped, at most once per [`MIN_INTERVAL`] across guards: held
/// by a large buffer that lives briefly (a `/metrics` text of many topics), so the memory its
/// making took does not stay with the process. Outside a tokio runtime it does nothing.
#[derive(Debug, Default)]
pub struct ReleaseOnDrop;

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let now = std::time::Instant::now();
        {
            let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|t| now.duration_since(t) < MIN_INTERVAL) {
                return;
            }
            *last = Some(now);
        }
        runtime.spawn(release());
    }
}
