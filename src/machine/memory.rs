//! The RAM a run may take when the user names no budget: the memory cgroup
//! limit this process runs under, or the machine's MemAvailable, the
//! smaller when both are known, less a margin for what is not planned (the
//! allocator's slack, other processes, the kernel). Pure arithmetic in
//! [`budget_from`], table-tested; [`machine_budget`] reads the machine.

use serde::Serialize;

/// The margin: this share of the figure, and at least [`MARGIN_BYTES_MIN`].
pub const MARGIN_SHARE: f64 = 0.10;
/// The least margin, in bytes.
pub const MARGIN_BYTES_MIN: u64 = 256 << 20;

/// Where the figure came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    CgroupLimit,
    MemAvailable,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::CgroupLimit => "the memory cgroup limit",
            Source::MemAvailable => "MemAvailable",
        }
    }
}

/// The budget a run gets by default.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct MachineBudget {
    /// What the run may plan for: `figure_bytes - margin_bytes`.
    pub bytes: u64,
    pub figure_bytes: u64,
    pub margin_bytes: u64,
    pub source: Source,
}

impl std::fmt::Display for MachineBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::machine::gb;
        write!(
            f,
            "{:.2} GB: {} {:.2} GB less a {:.2} GB margin ({}%, at least {} MiB)",
            gb(self.bytes),
            self.source.name(),
            gb(self.figure_bytes),
            gb(self.margin_bytes),
            (MARGIN_SHARE * 100.0) as u32,
            MARGIN_BYTES_MIN >> 20
        )
    }
}

/// The budget from a cgroup limit and MemAvailable (either unknown);
/// `None` when neither is known or the margin leaves nothing.
pub fn budget_from(cgroup_limit: Option<u64>, available: Option<u64>) -> Option<MachineBudget> {
    let (figure_bytes, source) = match (cgroup_limit, available) {
        (Some(l), Some(a)) if a < l => (a, Source::MemAvailable),
        (Some(l), _) => (l, Source::CgroupLimit),
        (None, Some(a)) => (a, Source::MemAvailable),
        (None, None) => return None,
    };
    let margin_bytes = ((figure_bytes as f64 * MARGIN_SHARE) as u64).max(MARGIN_BYTES_MIN);
    let bytes = figure_bytes.checked_sub(margin_bytes).filter(|&b| b > 0)?;
    Some(MachineBudget {
        bytes,
        figure_bytes,
        margin_bytes,
        source,
    })
}

/// A value of /proc/meminfo (`MemTotal`, `MemAvailable`, …), in bytes.
pub fn meminfo_bytes(key: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .and_then(|kb| kb.checked_mul(1024))
}

/// `MemAvailable` of /proc/meminfo, in bytes.
pub fn mem_available_bytes() -> Option<u64> {
    meminfo_bytes("MemAvailable")
}

/// This machine's default budget, read now.
pub fn machine_budget() -> Option<MachineBudget> {
    budget_from(
        crate::machine::cgroup::memory_limit(),
        mem_available_bytes(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1_000_000_000;

    #[test]
    fn the_smaller_figure_less_the_margin() {
        // (cgroup limit, MemAvailable) -> (bytes, source)
        let table = [
            (
                Some(8 * GB),
                Some(100 * GB),
                Some((7_200_000_000, Source::CgroupLimit)),
            ),
            (
                Some(100 * GB),
                Some(8 * GB),
                Some((7_200_000_000, Source::MemAvailable)),
            ),
            (None, Some(10 * GB), Some((9 * GB, Source::MemAvailable))),
            (Some(10 * GB), None, Some((9 * GB, Source::CgroupLimit))),
            // A small figure keeps the least margin.
            (
                Some(GB),
                None,
                Some((GB - (256 << 20), Source::CgroupLimit)),
            ),
            (Some(200 << 20), None, None),
            (None, None, None),
        ];
        for (i, (limit, avail, want)) in table.into_iter().enumerate() {
            let got = budget_from(limit, avail).map(|b| (b.bytes, b.source));
            assert_eq!(got, want, "row {i}");
        }
        let b = budget_from(Some(10 * GB), None).unwrap();
        assert_eq!(b.bytes + b.margin_bytes, b.figure_bytes);
        assert_eq!(
            b.to_string(),
            "9.00 GB: the memory cgroup limit 10.00 GB less a 1.00 GB margin (10%, at least 256 MiB)"
        );
    }

    #[test]
    fn this_machine_has_a_figure() {
        let avail = mem_available_bytes().expect("/proc/meminfo has MemAvailable");
        let b = machine_budget().expect("a budget on a machine with RAM");
        // MemAvailable moves between the two reads; 256 MiB covers it.
        assert!(b.bytes < b.figure_bytes, "{b}");
        assert!(b.figure_bytes <= avail + (256 << 20), "{b} against {avail}");
    }
}
