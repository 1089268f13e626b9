//! `moestream tune` measures, picks and saves a profile keyed by the disk
//! and the model; `--io auto` (the default) then uses it, explicit flags
//! override it, and a broken profile only costs a warning.

mod common;

use std::path::Path;

fn env(cache: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("XDG_CACHE_HOME", cache.display().to_string()),
        ("MOESTREAM_NO_HISTORY", "1".into()),
    ]
}

fn run_in(cache: &Path, args: &[&str]) -> common::Out {
    let e = env(cache);
    let e: Vec<(&str, &str)> = e.iter().map(|(k, v)| (*k, v.as_str())).collect();
    common::moestream_env(args, &e)
}

fn profile_files(cache: &Path) -> Vec<std::path::PathBuf> {
    match std::fs::read_dir(cache.join("moestream/tune")) {
        Ok(d) => d
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect(),
        Err(_) => vec![],
    }
}

#[test]
fn tune_saves_a_profile_that_auto_runs_use() {
    let model = common::tiny_model();
    let dir = model.path().to_str().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let c = cache.path();
    let out = run_in(
        c,
        &[
            "tune",
            "--model",
            dir,
            "--tokens",
            "3",
            "--depths",
            "1,2",
            "--cell-seconds",
            "0.02",
            "--modes-probed",
            "2",
        ],
    );
    assert!(out.ok, "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("best: --io"), "{}", out.stdout);
    // The sweep has a row per mode and depth; direct gets 4 prefetch
    // depths, the sweep's best other mode 2.
    for mode in ["direct", "buffered", "drop", "mmap", "pread"] {
        assert!(out.stdout.contains(mode), "{mode} missing:\n{}", out.stdout);
    }
    let files = profile_files(c);
    assert_eq!(files.len(), 1, "{files:?}");
    let p: serde_json::Value = serde_json::from_slice(&std::fs::read(&files[0]).unwrap()).unwrap();
    assert_eq!(p["probes"].as_array().unwrap().len(), 6);
    assert_eq!(p["disk"].as_array().unwrap().len(), 10);
    let best = p["probes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["decode_tok_s"].as_f64().unwrap())
        .fold(0.0, f64::max);
    let chosen = p["probes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| {
            q["read_mode"] == p["read_mode"]
                && q["pipeline"] == p["pipeline"]
                && q["prefetch"] == p["prefetch"]
        })
        .expect("the choice is one of the probes");
    assert_eq!(
        chosen["decode_tok_s"].as_f64().unwrap(),
        best,
        "the fastest wins"
    );

    // A default run takes the profile's choices.
    let args = [
        "run",
        "--model",
        dir,
        "--prompt-ids",
        "1,2,3",
        "--max-tokens",
        "3",
        "--json",
    ];
    let out = run_in(c, &args);
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stderr.contains("tuned profile"), "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let cfg = &v["config"];
    let want_mode = p["read_mode"].as_str().unwrap();
    assert!(
        cfg["io"] == want_mode || (want_mode == "direct" && cfg["io"] == "buffered"),
        "{cfg} vs {p}"
    );
    assert_eq!(cfg["pipeline"], p["pipeline"]);
    assert_eq!(cfg["prefetch"], p["prefetch"]);
    let tokens = v["token_ids"].clone();

    // Explicit flags win over the profile, and change no token.
    let mut explicit = args.to_vec();
    explicit.extend(["--io", "pread", "--pipeline", "off", "--prefetch", "on"]);
    let out = run_in(c, &explicit);
    assert!(out.ok, "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["config"]["io"], "pread");
    assert_eq!(v["config"]["pipeline"], false);
    assert_eq!(v["config"]["prefetch"], "attn-1");
    assert_eq!(v["token_ids"], tokens);

    // A broken profile is named in a warning; the run goes on with defaults.
    std::fs::write(&files[0], b"{broken").unwrap();
    let out = run_in(c, &args);
    assert!(out.ok, "{}", out.stderr);
    assert!(
        out.stderr.contains("warning") && out.stderr.contains(files[0].to_str().unwrap()),
        "{}",
        out.stderr
    );
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["config"]["io"], "buffered");
    assert_eq!(v["token_ids"], tokens);
}

#[test]
fn tune_dry_run_saves_nothing_and_bad_flags_are_refused() {
    let model = common::tiny_model();
    let dir = model.path().to_str().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let c = cache.path();
    let quick = [
        "tune",
        "--model",
        dir,
        "--tokens",
        "2",
        "--depths",
        "1",
        "--cell-seconds",
        "0.01",
        "--modes-probed",
        "1",
        "--dry-run",
    ];
    let out = run_in(c, &quick);
    assert!(out.ok, "{}", out.stderr);
    assert!(out.stdout.contains("dry run"), "{}", out.stdout);
    assert!(profile_files(c).is_empty());
    // The default grid keeps pipelining on; --full also probes it off.
    let probes_off = |stdout: &str| {
        stdout
            .lines()
            .filter(|l| l.split_whitespace().nth(1) == Some("off") && l.contains('%'))
            .count()
    };
    assert_eq!(probes_off(&out.stdout), 0, "{}", out.stdout);
    let full: Vec<&str> = quick.iter().copied().chain(["--full"]).collect();
    let out = run_in(c, &full);
    assert!(out.ok, "{}", out.stderr);
    assert_eq!(probes_off(&out.stdout), 2, "{}", out.stdout);
    let out = run_in(c, &["tune", "--model", dir, "--tokens", "1"]);
    common::assert_clean_failure(&out, &["--tokens"]);
}
