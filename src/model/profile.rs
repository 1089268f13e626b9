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

/// CPU seconds (user + system) so far of this process's threads whose
/// name starts with `prefix` (`/proc/self/task/*/comm` and `stat`); 0 if
/// unknown. Threads that already exited are not counted.
pub fn thread_cpu_seconds(prefix: &str) -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    // SAFETY: sysconf reads a constant; it has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let mut sum = 0u64;
    for task in tasks.flatten() {
        let dir = task.path();
        let named = std::fs::read_to_string(dir.join("comm"))
            .is_ok_and(|c| c.trim_end().starts_with(prefix));
        if named {
            sum += std::fs::read_to_string(dir.join("stat"))
                .ok()
                .and_then(|s| cpu_ticks_of_stat(&s))
                .unwrap_or(0);
        }
    }
    sum as f64 / ticks
}

/// utime + stime (clock ticks) of one `/proc/.../stat` line: fields 14
/// and 15, counted after the parenthesized name (which may hold spaces).
fn cpu_ticks_of_stat(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_whitespace().skip(11);
    let utime: u64 = f.next()?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Bytes this process caused to be fetched from storage (`read_bytes` of
/// /proc/self/io), 0 if unknown.
pub fn device_read_bytes() -> u64 {
    moestream_io::device_read_bytes().unwrap_or(0)
}

/// This machine's RAM in bytes (`MemTotal` of /proc/meminfo), if known.
pub fn mem_total_bytes() -> Option<u64> {
    crate::machine::memory::meminfo_bytes("MemTotal")
}

#[cfg(test)]
mod cpu_tests {
    use super::*;

    #[test]
    fn stat_cpu_fields_are_read_after_the_name() {
        let stat = "42 (moe io (x)) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 2 0";
        assert_eq!(cpu_ticks_of_stat(stat), Some(10));
        assert_eq!(cpu_ticks_of_stat("garbage"), None);
    }

    #[test]
    fn a_busy_threads_cpu_time_is_found_by_name() {
        // The thread spins until its own CPU time, read by name, shows; a
        // reader that never finds it fails at the (generous) deadline.
        let found = std::thread::Builder::new()
            .name("cpu-probe-xyz".into())
            .spawn(|| {
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
                let mut x = 0u64;
                while std::time::Instant::now() < deadline {
                    for _ in 0..1_000_000 {
                        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
                    }
                    if thread_cpu_seconds("cpu-probe-xyz") >= 0.05 {
                        return true;
                    }
                }
                false
            })
            .unwrap()
            .join()
            .unwrap();
        assert!(found, "a busy thread's CPU time is counted");
        assert_eq!(thread_cpu_seconds("no-such-thread-name"), 0.0);
    }
}
