//! Build facts for `moestream --version`: the commit (from git when the
//! source is a checkout, else `MOESTREAM_COMMIT` if set, else `unknown`:
//! a tarball or `cargo install` from crates.io has no .git) and the build
//! profile.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !s.trim().is_empty()).then(|| s.trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-env-changed=MOESTREAM_COMMIT");
    let commit = std::env::var("MOESTREAM_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    // Rebuilt when HEAD moves (a commit, a checkout). A worktree keeps
    // HEAD in its own git dir and the branches in the common one, so ask
    // git for both; only files that exist are named (cargo reruns a build
    // script on every build for a missing one).
    let watch = |path: String| {
        if std::path::Path::new(&path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    };
    if let (Some(dir), Some(common)) = (
        git(&["rev-parse", "--git-dir"]),
        git(&["rev-parse", "--git-common-dir"]),
    ) {
        watch(format!("{dir}/HEAD"));
        watch(format!("{common}/packed-refs"));
        if let Some(head) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watch(format!("{common}/{head}"));
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-env=MOESTREAM_COMMIT={commit}");
    let profile = std::env::var("PROFILE").unwrap_or_else(|_| "unknown".into());
    println!("cargo:rustc-env=MOESTREAM_PROFILE={profile}");
}
