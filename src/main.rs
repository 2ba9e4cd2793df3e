//! The `ledgerlake` binary: see `ledgerlake --help` and the library docs.
//!
//! The library forbids `unsafe`; the binary holds the one exception, an allocator setting.

fn main() -> anyhow::Result<()> {
    keep_freed_memory();
    ledgerlake::cli::run()
}

/// Makes glibc's malloc keep freed memory for reuse instead of handing it back to the kernel.
///
/// The offload builds Arrow batches and Parquet pages of megabytes on several threads and frees
/// them moments later. With glibc's defaults, an allocation above a moving threshold is a fresh
/// `mmap`, and a freed heap top is trimmed, so the kernel faults in and zeroes the next buffer's
/// pages again: about a tenth of the offload's CPU (benches/RESULTS.md, "allocator"). Fixed
/// thresholds keep that memory in the process instead (its resident size stays at its peak, as
/// with jemalloc or mimalloc). Malloc settings given in `GLIBC_TUNABLES` win.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn keep_freed_memory() {
    if std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc.")) {
        return;
    }
    /// glibc's largest mmap threshold on 64-bit targets.
    const MMAP_THRESHOLD: libc::c_int = 32 << 20;
    const TRIM_THRESHOLD: libc::c_int = 1 << 30;
    const TOP_PAD: libc::c_int = 64 << 20;
    // SAFETY: `mallopt` only sets parameters of glibc's allocator, under the allocator's own
    // lock; it is called first thing in `main`, before this process starts any thread.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
        libc::mallopt(libc::M_TOP_PAD, TOP_PAD);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_freed_memory() {}
