//! What this process uses: CPU time (`getrusage`) and memory (`/proc/self/status`).

use nix::sys::resource::{UsageWho, getrusage};
use nix::sys::time::TimeValLike;

/// User plus system CPU time of this process so far, in microseconds (0 if unknown).
pub(crate) fn cpu_us() -> u64 {
    getrusage(UsageWho::RUSAGE_SELF).map_or(0, |u| {
        let us = u.user_time().num_microseconds() + u.system_time().num_microseconds();
        u64::try_from(us).unwrap_or(0)
    })
}

/// A `kB` field of `/proc/self/status` (`VmRSS`, `VmHWM`), in KiB (0 if unknown).
pub(crate) fn status_kib(field: &str) -> u64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    status
        .lines()
        .find_map(|line| {
            let rest = line.strip_prefix(field)?.strip_prefix(':')?;
            rest.trim().trim_end_matches("kB").trim().parse().ok()
        })
        .unwrap_or(0)
}

/// The resident set now, KiB.
pub(crate) fn rss_kib() -> u64 {
    status_kib("VmRSS")
}

/// The largest resident set so far, KiB.
pub(crate) fn peak_rss_kib() -> u64 {
    status_kib("VmHWM")
}
