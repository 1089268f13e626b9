//! `moestream bench sweep` on a tiny model with a tiny budget list and no
//! cgroups: one CSV row per run (a refused budget included), with the
//! documented columns, and the SVG and PNG plots.

mod common;

use common::{moestream, tiny_model};
use moestream::lab::budget_sweep::CSV_COLUMNS;

#[test]
fn a_sweep_writes_its_csv_and_both_plots() {
    let model = tiny_model();
    let out_dir = tempfile::tempdir().unwrap();
    let prefix = out_dir.path().join("sweep");
    let out = moestream(&[
        "bench",
        "sweep",
        "--model",
        model.path().to_str().unwrap(),
        "--ram-gb",
        "0.01,0.2,0.3",
        "--io",
        "buffered,direct",
        "--tokens",
        "3",
        "--prompt-ids",
        "1,2,3",
        "--no-cgroup",
        "--out",
        prefix.to_str().unwrap(),
    ]);
    assert!(out.ok, "{}", out.stderr);
    let csv = std::fs::read_to_string(prefix.with_extension("csv")).unwrap();
    let mut rdr = csv::Reader::from_reader(csv.as_bytes());
    let header: Vec<String> = rdr.headers().unwrap().iter().map(String::from).collect();
    assert_eq!(header, CSV_COLUMNS);
    let rows: Vec<csv::StringRecord> = rdr.records().map(|r| r.unwrap()).collect();
    assert_eq!(rows.len(), 6, "{csv}");
    let col = |r: &csv::StringRecord, name: &str| {
        r[CSV_COLUMNS.iter().position(|c| *c == name).unwrap()].to_string()
    };
    for r in &rows {
        assert_eq!(col(r, "cgroup"), "none", "{csv}");
        match col(r, "ram_gb").as_str() {
            "0.01" => {
                assert_eq!(col(r, "outcome"), "refused", "{csv}");
                assert!(col(r, "note").contains("too small"), "{csv}");
            }
            _ => {
                assert_eq!(col(r, "outcome"), "ok", "{csv}");
                assert!(col(r, "note").contains("--no-cgroup"), "{csv}");
                assert!(col(r, "decode_tok_s").parse::<f64>().unwrap() > 0.0);
                assert!(col(r, "mb_per_token").parse::<f64>().unwrap() >= 0.0);
                assert!(col(r, "slots").parse::<usize>().unwrap() > 0);
            }
        }
    }
    let modes: std::collections::BTreeSet<String> =
        rows.iter().map(|r| col(r, "read_mode")).collect();
    assert!(
        modes.contains("buffered") && modes.contains("direct"),
        "{modes:?}"
    );
    let svg = std::fs::read_to_string(prefix.with_extension("svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("RAM budget"), "{svg}");
    let png = std::fs::read(prefix.with_extension("png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert!(out.stdout.contains("wrote"), "{}", out.stdout);
}

#[test]
fn bad_sweep_arguments_are_refused_before_any_run() {
    let model = tiny_model();
    for (budgets, io, needle) in [("0,1", "auto", "--ram-gb 0"), ("1", "fast", "--io fast")] {
        let out = moestream(&[
            "bench",
            "sweep",
            "--model",
            model.path().to_str().unwrap(),
            "--ram-gb",
            budgets,
            "--io",
            io,
            "--no-cgroup",
        ]);
        common::assert_clean_failure(&out, &[needle]);
    }
}
