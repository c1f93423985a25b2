//! Handing memory the allocator keeps back to the system, and keeping an
//! idle process small.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::plan::HugePages;

/// Returns the pages mimalloc holds free to the system now, instead of at
/// the next allocation on the same thread after its purge delay: an idle
/// gateway that has just loaded 10 000 routes would otherwise keep the
/// 30 MiB peak of parsing them resident. Harmless where mimalloc is not
/// the global allocator (tests, benches): its heaps are then empty.
pub fn release_memory() {
    #[allow(unsafe_code)]
    // SAFETY: `mi_collect` has no preconditions; it only walks and purges
    // mimalloc's own heaps.
    unsafe {
        libmimalloc_sys::mi_collect(true)
    }
}

/// Requests answered in one second from which the process counts as
/// busy: then transparent huge pages pay for themselves.
pub const BUSY_PER_SECOND: u64 = 1_000;

/// Whether huge pages are held back (set by `hold_huge_pages`).
static HELD: AtomicBool = AtomicBool::new(false);
/// The answered total at the last look.
static LAST_ANSWERED: AtomicU64 = AtomicU64::new(0);

/// Holds transparent huge pages back until the process is busy. mimalloc
/// asks the kernel for huge pages on its arena, and every thread's first
/// pages then fault in 2 MiB at once: 6 MiB of an idle gateway's
/// resident memory for no gain. A busy one gains (fewer TLB misses, 2 %
/// of a request's CPU measured): [`note_load`] lets them back once
/// requests come at [`BUSY_PER_SECOND`]. Called by the binary before
/// Rust's runtime starts (the setting is the process's: every thread and
/// a child started for an upgrade have it).
pub fn hold_huge_pages() {
    if set_thp_disabled(true) {
        HELD.store(true, Ordering::Relaxed);
    }
}

/// Looked at once a second with the requests answered so far and the
/// active generation's `runtime.huge_pages`: under `Busy` lets huge pages
/// back (once, for good) when the last second was busy; `Never` holds
/// them back again (pages already huge stay so), `Always` lets them back
/// at once.
pub fn note_load(answered: u64, policy: HugePages) {
    let last = LAST_ANSWERED.swap(answered, Ordering::Relaxed);
    let held = HELD.load(Ordering::Relaxed);
    let allow = match policy {
        HugePages::Never => {
            if !held && set_thp_disabled(true) {
                HELD.store(true, Ordering::Relaxed);
            }
            return;
        }
        HugePages::Always => held,
        HugePages::Busy => held && answered.saturating_sub(last) >= BUSY_PER_SECOND,
    };
    if allow && set_thp_disabled(false) {
        HELD.store(false, Ordering::Relaxed);
        tracing::debug!(
            per_second = answered.saturating_sub(last),
            ?policy,
            "transparent huge pages allowed from now on"
        );
    }
}

/// `prctl(PR_SET_THP_DISABLE)`: whether the kernel took it.
fn set_thp_disabled(disabled: bool) -> bool {
    #[cfg(target_os = "linux")]
    {
        #[allow(unsafe_code)]
        // SAFETY: PR_SET_THP_DISABLE takes one integer argument and the
        // rest zero; it changes only how this process's memory is backed.
        let done = unsafe {
            libc::prctl(
                libc::PR_SET_THP_DISABLE,
                libc::c_ulong::from(disabled),
                0 as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
            )
        };
        done == 0
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = disabled;
        false
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// What the kernel says of this process (`THP_enabled` in its status).
    fn thp_enabled() -> Option<bool> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|l| l.starts_with("THP_enabled:"))?;
        Some(line.split_whitespace().nth(1)? == "1")
    }

    #[test]
    fn huge_pages_follow_the_policy() {
        // One test: the setting is the process's.
        hold_huge_pages();
        assert_eq!(thp_enabled(), Some(false));
        note_load(0, HugePages::Busy);
        // A quiet second, then a busy one: allowed from then on.
        note_load(BUSY_PER_SECOND - 1, HugePages::Busy);
        assert_eq!(thp_enabled(), Some(false));
        note_load(3 * BUSY_PER_SECOND, HugePages::Busy);
        assert_eq!(thp_enabled(), Some(true));
        note_load(3 * BUSY_PER_SECOND, HugePages::Busy);
        assert_eq!(thp_enabled(), Some(true), "for good");
        // `never` holds them back again, however busy.
        note_load(10 * BUSY_PER_SECOND, HugePages::Never);
        assert_eq!(thp_enabled(), Some(false));
        note_load(20 * BUSY_PER_SECOND, HugePages::Never);
        assert_eq!(thp_enabled(), Some(false));
        // `always` lets them back in a quiet second.
        note_load(20 * BUSY_PER_SECOND, HugePages::Always);
        assert_eq!(thp_enabled(), Some(true));
    }
}
