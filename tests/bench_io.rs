//! `moestream bench io` end to end through the binary: a small sweep over a
//! temp file prints one table row per cell, writes a CSV with a header and
//! one line per cell (replacing an existing file) and an SVG; bad input
//! fails with a message naming the file or directory.

mod common;

use common::moestream;

fn data_file(dir: &std::path::Path, name: &str, len: usize) -> std::path::PathBuf {
    let path = dir.join(name);
    let data: Vec<u8> = (0..len).map(|i| (i * 131 + i / 4099) as u8).collect();
    std::fs::write(&path, data).unwrap();
    path
}

#[test]
fn sweeps_a_file_and_writes_csv_and_svg() {
    let dir = tempfile::tempdir().unwrap();
    let file = data_file(dir.path(), "data.bin", 1 << 20);
    let csv = dir.path().join("sweep.csv");
    let svg = dir.path().join("sweep.svg");
    std::fs::write(&csv, "stale line that must go\n").unwrap();
    let out = moestream(&[
        "bench",
        "io",
        "--file",
        file.to_str().unwrap(),
        "--sizes-mib",
        "0.015625,0.0625",
        "--depths",
        "1,2",
        "--seconds",
        "0.02",
        "--reads-max",
        "40",
        "--csv",
        csv.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert!(out.ok, "stderr: {}", out.stderr);
    let rows: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| {
            ["direct", "buffered", "drop", "mmap", "pread"]
                .iter()
                .any(|m| l.starts_with(m))
        })
        .collect();
    assert_eq!(rows.len(), 5 * 2 * 2, "stdout:\n{}", out.stdout);
    assert!(out.stdout.starts_with("mode"), "{}", out.stdout);
    assert!(out.stdout.contains("best per mode:"), "{}", out.stdout);
    let text = std::fs::read_to_string(&csv).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], moestream_io::CSV_HEADER);
    assert_eq!(lines.len(), 1 + 20, "{text}");
    assert!(!text.contains("stale"));
    for line in &lines[1..] {
        let f: Vec<&str> = line.split(',').collect();
        let reads: u64 = f[6].parse().unwrap();
        let depth: u64 = f[5].parse().unwrap();
        let gbs: f64 = f[8].parse().unwrap();
        assert!(reads >= depth && reads <= 40 && gbs > 0.0, "{line}");
        assert!(["16384", "65536"].contains(&f[3]), "{line}");
    }
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.trim_end().ends_with("</svg>"));
    assert_eq!(
        plot.matches("<polyline").count(),
        2 * 5,
        "2 depths x 5 modes"
    );
}

#[test]
fn a_block_larger_than_every_file_fails_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = data_file(dir.path(), "short.bin", 64 << 10);
    let out = moestream(&[
        "bench",
        "io",
        "--file",
        file.to_str().unwrap(),
        "--sizes-mib",
        "1",
        "--seconds",
        "0.01",
    ]);
    assert!(!out.ok);
    assert!(out.stderr.contains("short.bin"), "{}", out.stderr);
}

#[test]
fn a_model_directory_without_safetensors_fails_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    data_file(dir.path(), "notes.bin", 8192);
    let out = moestream(&["bench", "io", "--model", dir.path().to_str().unwrap()]);
    assert!(!out.ok);
    assert!(
        out.stderr.contains(dir.path().to_str().unwrap()),
        "{}",
        out.stderr
    );
    let out = moestream(&["bench", "io", "--file", "x", "--depths", "0"]);
    assert!(!out.ok && out.stderr.contains("--depths"), "{}", out.stderr);
    let out = moestream(&["bench", "io", "--file", "x", "--modes", "fast"]);
    assert!(!out.ok && out.stderr.contains("fast"), "{}", out.stderr);
}

#[test]
fn a_model_directory_reads_its_safetensors_files() {
    let dir = tempfile::tempdir().unwrap();
    data_file(dir.path(), "a.safetensors", 96 << 10);
    data_file(dir.path(), "b.safetensors", 40 << 10);
    data_file(dir.path(), "ignored.bin", 10);
    let out = moestream(&[
        "bench",
        "io",
        "--model",
        dir.path().to_str().unwrap(),
        "--modes",
        "buffered,pread",
        "--sizes-mib",
        "0.0625",
        "--depths",
        "2",
        "--seconds",
        "0.01",
    ]);
    assert!(out.ok, "stderr: {}", out.stderr);
    assert!(out.stderr.contains("2 file(s)"), "{}", out.stderr);
    assert_eq!(
        out.stdout
            .lines()
            .filter(|l| l.starts_with("buffered") || l.starts_with("pread"))
            .count(),
        2,
        "{}",
        out.stdout
    );
}
