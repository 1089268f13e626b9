//! Where the time goes: the per-run profile split the stats line prints
//! (expert-disk, expert-matmul, attention, other), and peak RSS.

use std::time::Duration;

/// Accumulated time per stage.
#[derive(Clone, Copy, Debug, Default)]
pub struct Profile {
    pub expert_matmul: Duration,
    pub attention: Duration,
}

/// Peak resident set size of this process in bytes (VmHWM), 0 if unknown.
pub fn peak_rss_bytes() -> u64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Bytes this process caused to be fetched from storage (`read_bytes` of
/// /proc/self/io), 0 if unknown.
pub fn device_read_bytes() -> u64 {
    moestream_io::device_read_bytes().unwrap_or(0)
}

/// This machine's RAM in bytes (`MemTotal` of /proc/meminfo), if known.
pub fn mem_total_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
}
