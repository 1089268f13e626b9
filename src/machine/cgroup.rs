//! Memory cgroups: the limit this process runs under (`doctor`, `status`
//! compare it with the RAM budget), and fresh groups capped at a budget to
//! run a child in (`bench sweep`), the way scripts/in_cgroup.sh does it.
//! Both hierarchies are handled: cgroup v2 (`memory.max`, `memory.peak`,
//! `memory.events`) and v1 (`memory.limit_in_bytes`,
//! `memory.max_usage_in_bytes`, `memory.oom_control`). The cap includes
//! the page cache, as the kernel accounts it.
//!
//! A group is removed when its [`MemoryGroup`] drops (after its processes
//! have exited; a non-empty group cannot be removed and is left behind).

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = "/sys/fs/cgroup";

/// "No limit" in v1 is a page-rounded i64::MAX; anything this large is
/// no limit.
const UNLIMITED_MIN: u64 = 1 << 60;

/// Which hierarchy a group lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// The memory cgroup of this process and its hierarchy, from
/// /proc/self/cgroup.
fn own_group() -> Option<(Version, PathBuf)> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let v1 = text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then(|| PathBuf::from(format!("{ROOT}/memory{path}")))
    });
    if let Some(dir) = v1.filter(|d| d.join("memory.limit_in_bytes").exists()) {
        return Some((Version::V1, dir));
    }
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = PathBuf::from(format!("{ROOT}{path}"));
    dir.join("memory.max")
        .exists()
        .then_some((Version::V2, dir))
}

fn read_u64(path: &Path) -> Option<u64> {
    let s = std::fs::read_to_string(path).ok()?;
    let s = s.trim();
    if s == "max" {
        return Some(u64::MAX);
    }
    s.parse().ok()
}

/// The memory limit of this process's cgroup and of every group above
/// it (the tightest), in bytes; `None` when there is none.
pub fn memory_limit() -> Option<u64> {
    let (version, mut dir) = own_group()?;
    let file = match version {
        Version::V1 => "memory.limit_in_bytes",
        Version::V2 => "memory.max",
    };
    let root = match version {
        Version::V1 => PathBuf::from(format!("{ROOT}/memory")),
        Version::V2 => PathBuf::from(ROOT),
    };
    let mut tightest = u64::MAX;
    while dir.starts_with(&root) {
        if let Some(l) = read_u64(&dir.join(file)) {
            tightest = tightest.min(l);
        }
        if !dir.pop() {
            break;
        }
    }
    (tightest < UNLIMITED_MIN).then_some(tightest)
}

/// A fresh memory cgroup with a cap, removed on drop.
#[derive(Debug)]
pub struct MemoryGroup {
    dir: PathBuf,
    version: Version,
    limit: u64,
}

impl MemoryGroup {
    /// Creates `name` beside this process's group (v2) or under the v1
    /// memory root, capped at `limit` bytes. An error says why not (no
    /// writable memory controller, not root, …).
    pub fn create(name: &str, limit: u64) -> Result<MemoryGroup> {
        let (version, parent) = match own_group() {
            Some((Version::V2, dir)) => (Version::V2, dir.parent().unwrap_or(&dir).to_path_buf()),
            Some((Version::V1, _)) => (Version::V1, PathBuf::from(format!("{ROOT}/memory"))),
            None => {
                return Err(Error::Request(
                    "no memory cgroup controller is mounted under /sys/fs/cgroup".into(),
                ))
            }
        };
        let dir = parent.join(name);
        std::fs::create_dir(&dir).map_err(|e| Error::file(&dir, e))?;
        let group = MemoryGroup {
            dir,
            version,
            limit,
        };
        let file = match version {
            Version::V1 => "memory.limit_in_bytes",
            Version::V2 => "memory.max",
        };
        let path = group.dir.join(file);
        std::fs::write(&path, limit.to_string()).map_err(|e| Error::file(&path, e))?;
        if version == Version::V1 {
            // Without swap accounting the file is absent; with it, a cap
            // on memory alone would let the group swap instead of failing.
            let _ = std::fs::write(
                group.dir.join("memory.memsw.limit_in_bytes"),
                limit.to_string(),
            );
        }
        Ok(group)
    }

    /// The group's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cap, bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// `program args…` run inside the group: a shell moves itself into it
    /// and then execs the program, so nothing runs outside the cap.
    pub fn command(&self, program: &Path, args: &[String]) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(r#"echo $$ > "$1/cgroup.procs" && shift && exec "$@""#)
            .arg("sh")
            .arg(&self.dir)
            .arg(program)
            .args(args);
        c
    }

    /// The group's peak memory use so far, bytes (v2 needs Linux 5.19).
    pub fn peak_bytes(&self) -> Option<u64> {
        match self.version {
            Version::V1 => read_u64(&self.dir.join("memory.max_usage_in_bytes")),
            Version::V2 => read_u64(&self.dir.join("memory.peak")),
        }
    }

    /// Processes of the group the OOM killer killed.
    pub fn oom_kills(&self) -> Option<u64> {
        let (file, key) = match self.version {
            Version::V1 => ("memory.oom_control", "oom_kill "),
            Version::V2 => ("memory.events", "oom_kill "),
        };
        let text = std::fs::read_to_string(self.dir.join(file)).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse().ok())
    }
}

impl Drop for MemoryGroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_own_limit_is_none_or_positive() {
        // Whatever this machine runs under: no panic, and a found limit is
        // a real one.
        if let Some(l) = memory_limit() {
            assert!(l > 0 && l < UNLIMITED_MIN);
        }
    }

    #[test]
    fn a_group_runs_its_child_under_its_cap_or_says_why_not() {
        let name = format!("moestream-test-{}", std::process::id());
        let g = match MemoryGroup::create(&name, 256 << 20) {
            Ok(g) => g,
            Err(e) => {
                eprintln!("skipped: no memory cgroup can be made here ({e})");
                return;
            }
        };
        let out = g
            .command(Path::new("cat"), &["/proc/self/cgroup".into()])
            .output()
            .unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(&name), "child not in the group: {text}");
        assert_eq!(g.oom_kills().unwrap_or(0), 0);
        let dir = g.dir().to_path_buf();
        drop(g);
        assert!(!dir.exists(), "the group is removed on drop");
    }
}
