//! The `ledgerlake` binary: see `ledgerlake --help` and the library docs.
//!
//! The library forbids `unsafe`; the binary holds the one exception, an allocator setting.

fn main() -> anyhow::Result<()> {
    keep_freed_memory();
    ledgerlake::memory::set_release(release_freed_memory);
    ledgerlake::cli::run()
}

/// Hands the free memory malloc keeps back to the kernel (`malloc_trim`): called by the
/// library after it freed much at once (idle topics unloaded), since [`keep_freed_memory`]
/// otherwise keeps it for reuse.
#[cfg(all(target_os = "linux", target_env = "gnu", target_pointer_width = "64"))]
#[allow(unsafe_code)]
fn release_freed_memory() {
    // SAFETY: a plain FFI call with an integer argument; glibc takes its allocator locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu", target_pointer_width = "64")))]
fn release_freed_memory() {}

/// Makes glibc's malloc keep freed memory for reuse instead of handing it back to the kernel.
///
/// The offload builds Arrow batches and Parquet pages of megabytes on several threads and frees
/// them moments later. With glibc's defaults, an allocation above a moving threshold is a fresh
/// `mmap`, and a freed heap top is trimmed, so the kernel faults in and zeroes the next buffer's
/// pages again: about a tenth of the offload's CPU (benches/RESULTS.md, "malloc thresholds").
/// With fixed thresholds, freed memory stays in the process: its resident size stays near its
/// peak (a thread arena's heap, at most 64 MiB, never shrinks: its top would have to reach the
/// trim threshold and exceed the top pad). A parameter the environment already sets
/// (`GLIBC_TUNABLES=glibc.malloc.<name>=…` or glibc's older `MALLOC_<NAME>_` variables) is left
/// as given, e.g. `GLIBC_TUNABLES=glibc.malloc.trim_threshold=0:glibc.malloc.top_pad=0` to give
/// memory back eagerly.
#[cfg(all(target_os = "linux", target_env = "gnu", target_pointer_width = "64"))]
#[allow(unsafe_code)]
fn keep_freed_memory() {
    let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    let settings: [(&str, &str, libc::c_int, libc::c_int); 3] = [
        // 32 MiB is glibc's largest mmap threshold on 64-bit targets.
        (
            "mmap_threshold",
            "MALLOC_MMAP_THRESHOLD_",
            libc::M_MMAP_THRESHOLD,
            32 << 20,
        ),
        (
            "trim_threshold",
            "MALLOC_TRIM_THRESHOLD_",
            libc::M_TRIM_THRESHOLD,
            1 << 30,
        ),
        ("top_pad", "MALLOC_TOP_PAD_", libc::M_TOP_PAD, 64 << 20),
    ];
    for (tunable, variable, param, value) in settings {
        let given = tunables.contains(&format!("glibc.malloc.{tunable}="))
            || std::env::var_os(variable).is_some();
        if !given {
            // SAFETY: a plain FFI call with two integers and no memory to uphold; glibc takes
            // its allocator lock. A refused value leaves glibc's default (best effort).
            unsafe {
                libc::mallopt(param, value);
            }
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu", target_pointer_width = "64")))]
fn keep_freed_memory() {}
