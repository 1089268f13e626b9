//! Files that are not what they seem (issue 31): every file a user names
//! is read through one bounded reader and every output written through one
//! safe writer. Each test is named after the fault it proves fixed: a
//! device or FIFO read without end or waited on, an output that destroys
//! its input, a partial file left after the disk fills.

mod common;

use common::{assert_clean_failure, fixture, listing, moestream_bounded, tiny_model};
use std::path::{Path, PathBuf};

fn mkfifo(path: &Path) {
    nix::unistd::mkfifo(path, nix::sys::stat::Mode::S_IRWXU).unwrap();
}

#[test]
fn grammar_schema_prompts_and_predictor_from_dev_zero_are_refused_not_read_forever() {
    let dir = tiny_model();
    let m = dir.path().to_str().unwrap();
    let gen = ["--prompt-ids", "1,2", "--max-tokens", "1"];
    let cases: [&[&str]; 4] = [
        &["--grammar", "/dev/zero"],
        &["--json-schema", "/dev/zero"],
        &["--prompts", "/dev/zero"],
        &["--prefetch", "learned:/dev/zero"],
    ];
    for flags in cases {
        let mut args = vec!["run", "--model", m];
        if flags[0] != "--prompts" {
            args.extend(gen);
        }
        args.extend(flags);
        let out = moestream_bounded(&args, None);
        assert_clean_failure(&out, &["/dev/zero", "not a regular file"]);
    }
}

#[test]
fn a_fifo_named_like_a_gguf_file_is_refused_not_waited_on() {
    let tmp = tempfile::tempdir().unwrap();
    let gguf = tmp.path().join("model.gguf");
    mkfifo(&gguf);
    let g = gguf.to_str().unwrap();
    let out = moestream_bounded(&["run", "--model", g, "--prompt-ids", "1,2"], None);
    assert_clean_failure(&out, &["model.gguf", "not a regular file"]);
}

/// A trace of one short run of the tiny model at `dir`/t.parquet.
fn traced(model: &Path, dir: &Path) -> PathBuf {
    let trace = dir.join("t.parquet");
    let out = moestream_bounded(
        &[
            "run",
            "--model",
            model.to_str().unwrap(),
            "--prompt-ids",
            "5,9,2,7",
            "--max-tokens",
            "8",
            "--ignore-eos",
            "--trace",
            trace.to_str().unwrap(),
        ],
        None,
    );
    assert!(out.ok, "{}", out.stderr);
    trace
}

#[test]
fn replay_and_train_predictor_refuse_to_write_over_their_trace() {
    let model = tiny_model();
    let tmp = tempfile::tempdir().unwrap();
    let trace = traced(model.path(), tmp.path());
    let before = std::fs::read(&trace).unwrap();
    let t = trace.to_str().unwrap();
    let link = tmp.path().join("link.parquet");
    std::fs::hard_link(&trace, &link).unwrap();
    let l = link.to_str().unwrap();
    let cases: [&[&str]; 4] = [
        &["replay", "--trace", t, "--csv", t],
        &["replay", "--trace", t, "--plot", l],
        &["train-predictor", "--trace", t, "--out", t],
        &["train-predictor", "--trace", l, "--out", t],
    ];
    for args in cases {
        let out = moestream_bounded(args, None);
        assert_clean_failure(&out, &["is the input"]);
        assert_eq!(std::fs::read(&trace).unwrap(), before, "{args:?}");
    }
}

#[test]
fn an_output_that_is_a_fifo_or_device_is_refused_and_left_as_it_was() {
    let model = tiny_model();
    let tmp = tempfile::tempdir().unwrap();
    let trace = traced(model.path(), tmp.path());
    let fifo = tmp.path().join("out.csv");
    mkfifo(&fifo);
    let mut outs = vec![fifo];
    // A character device of our own (root only): /dev/full's numbers.
    let full = tmp.path().join("full");
    let dev = nix::sys::stat::makedev(1, 7);
    let kind = nix::sys::stat::SFlag::S_IFCHR;
    if nix::sys::stat::mknod(&full, kind, nix::sys::stat::Mode::S_IRWXU, dev).is_ok() {
        outs.push(full);
    } else {
        eprintln!("skipping the device case: mknod needs root");
    }
    for out_path in outs {
        let o = out_path.to_str().unwrap();
        let out = moestream_bounded(
            &["replay", "--trace", trace.to_str().unwrap(), "--csv", o],
            None,
        );
        assert_clean_failure(&out, &[o, "not a regular file"]);
        let md = std::fs::symlink_metadata(&out_path).unwrap();
        assert!(!md.is_file(), "{o} was replaced by a file");
    }
}

#[test]
fn a_replay_csv_or_trace_that_fills_the_disk_leaves_no_partial_file() {
    let model = tiny_model();
    let tmp = tempfile::tempdir().unwrap();
    let trace = traced(model.path(), tmp.path());
    let before = listing(tmp.path());
    let csv = tmp.path().join("r.csv");
    let args = [
        "replay",
        "--trace",
        trace.to_str().unwrap(),
        "--csv",
        csv.to_str().unwrap(),
    ];
    let out = moestream_bounded(&args, Some(0));
    assert_clean_failure(&out, &["r.csv"]);
    assert_eq!(listing(tmp.path()), before, "a partial CSV was left");
    // A traced run whose trace cannot be written: no part or temp file.
    let second = tmp.path().join("second");
    std::fs::create_dir(&second).unwrap();
    let t2 = second.join("t.parquet");
    let m = model.path().to_str().unwrap();
    let args = [
        "run",
        "--model",
        m,
        "--prompt-ids",
        "5,9",
        "--max-tokens",
        "4",
    ];
    let mut args = args.to_vec();
    args.extend(["--trace", t2.to_str().unwrap()]);
    let _ = moestream_bounded(&args, Some(0));
    let left: Vec<String> = listing(&second)
        .into_iter()
        .filter(|n| n != "t.parquet.lock")
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn export_gguf_refuses_to_write_over_its_input() {
    let tmp = tempfile::tempdir().unwrap();
    let copy = common::copy_fixture("qwen3_moe");
    let model = copy.path().to_path_buf();
    let shard = model.join("model-00001-of-00002.safetensors");
    let before = std::fs::read(&shard).unwrap();
    let m = model.to_str().unwrap();
    let out = moestream_bounded(
        &[
            "export-gguf",
            "--model",
            m,
            "--out",
            shard.to_str().unwrap(),
        ],
        None,
    );
    assert_clean_failure(
        &out,
        &["model-00001-of-00002.safetensors", "inside the input"],
    );
    assert_eq!(std::fs::read(&shard).unwrap(), before);
    // A GGUF model exported over itself.
    let gguf = tmp.path().join("q.gguf");
    std::fs::copy(fixture("gguf").join("qwen3moe-Q8_0.gguf"), &gguf).unwrap();
    let before = std::fs::read(&gguf).unwrap();
    let g = gguf.to_str().unwrap();
    let out = moestream_bounded(&["export-gguf", "--model", g, "--out", g], None);
    assert_clean_failure(&out, &["q.gguf", "is the input"]);
    assert_eq!(std::fs::read(&gguf).unwrap(), before);
}

#[test]
fn bench_io_refuses_to_write_its_table_over_a_file_it_reads() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("data.bin");
    std::fs::write(&file, vec![7u8; 1 << 16]).unwrap();
    let f = file.to_str().unwrap();
    let out = moestream_bounded(&["bench", "io", "--file", f, "--csv", f], None);
    assert_clean_failure(&out, &["data.bin", "is the input"]);
    assert_eq!(std::fs::read(&file).unwrap(), vec![7u8; 1 << 16]);
}

#[test]
fn run_trace_and_sweep_out_refuse_to_write_over_the_model() {
    let copy = common::copy_fixture("qwen3_moe");
    let model = copy.path().to_path_buf();
    let m = model.to_str().unwrap();
    // `run --trace` appends to its file: pointed at a shard, it grew it.
    let shard = model.join("model-00001-of-00002.safetensors");
    let before = std::fs::read(&shard).unwrap();
    let out = moestream_bounded(
        &[
            "run",
            "--model",
            m,
            "--prompt-ids",
            "1,2",
            "--max-tokens",
            "1",
            "--trace",
            shard.to_str().unwrap(),
        ],
        None,
    );
    assert_clean_failure(&out, &["--trace", "model-00001-of-00002.safetensors"]);
    assert_eq!(std::fs::read(&shard).unwrap(), before);
    // `bench sweep --out PREFIX` writes PREFIX.csv: here a file of the model.
    let csv = model.join("notes.csv");
    std::fs::write(&csv, b"mine").unwrap();
    let prefix = model.join("notes");
    let out = moestream_bounded(
        &[
            "bench",
            "sweep",
            "--model",
            m,
            "--ram-gb",
            "0.2",
            "--io",
            "buffered",
            "--tokens",
            "2",
            "--prompt-ids",
            "1,2",
            "--no-cgroup",
            "--out",
            prefix.to_str().unwrap(),
        ],
        None,
    );
    assert_clean_failure(&out, &["--out", "notes.csv"]);
    assert_eq!(std::fs::read(&csv).unwrap(), b"mine");
}
