//! The service's runtimes of their own (lake, replay, SQL): separate thread pools, at a lower
//! priority where asked, so their work cannot slow the broker.

use super::ServiceError;

/// A runtime of its own (lake, replay, SQL). Dropped, it shuts down in the background: a
/// runtime dropped on an async thread would panic, which is where a startup failing midway
/// (a port taken) drops the ones already started; the startup error must be what is reported.
pub(super) struct OwnRuntime(Option<tokio::runtime::Runtime>);

impl std::ops::Deref for OwnRuntime {
    type Target = tokio::runtime::Runtime;

    fn deref(&self) -> &Self::Target {
        self.0.as_ref().expect("Invariant: Some until dropped")
    }
}

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl std::fmt::Debug for OwnRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OwnRuntime")
    }
}

/// A multi-thread runtime of its own (lake, replay, SQL), so its work cannot slow the broker;
/// with `niceness` above 0 each of its threads (workers and blocking ones) runs at that nice
/// value, so the kernel prefers the broker's threads when both want the CPU.
pub(super) fn own_runtime(
    name: &str,
    threads: usize,
    niceness: i32,
) -> Result<OwnRuntime, ServiceError> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder
        .worker_threads(threads)
        .thread_name(name)
        .enable_all();
    if niceness > 0 {
        builder.on_thread_start(move || lower_thread_priority(niceness));
    }
    builder
        .build()
        .map(|rt| OwnRuntime(Some(rt)))
        .map_err(ServiceError::Runtime)
}

/// Sets the calling thread's nice value (on Linux the nice value belongs to the thread). A
/// failure is logged: the thread still works, only at the service's own priority.
fn lower_thread_priority(niceness: i32) {
    let me = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(me), niceness) {
        tracing::warn!(error = %e, niceness, "could not lower a thread's priority");
    }
}
