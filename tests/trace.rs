//! Routing traces and their replay, end to end through the CLI: a run
//! recorded with `--trace` replays, with the run's policy and slots, to
//! exactly the run's hits and misses (every live policy, with and without
//! prefetch); traces of several runs concatenate in one file; tracing
//! never changes tokens; the Parquet columns hold what docs/TRACE.md says.

mod common;

use common::moestream;
use moestream::lab::synth::{self, SynthSpec};
use std::path::Path;

/// A small synthetic model: 3 MoE layers (layer 0 is dense) of 12
/// experts, top-2.
fn model() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = SynthSpec {
        hidden: 32,
        layers: 4,
        experts: 12,
        top_k: 2,
        moe_inter: 16,
        dense_inter: 24,
        heads: 4,
        kv_heads: 2,
        head_dim: 8,
        vocab: 300,
        seed: 11,
    };
    synth::write(dir.path(), &spec).expect("write synthetic model");
    dir
}

/// `run --json` with `extra` flags; (the JSON object, the traced run's id
/// if `--trace` was given).
fn run(dir: &Path, extra: &[&str]) -> (serde_json::Value, Option<String>) {
    let mut args = vec![
        "run",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        "5,9,2,7,11,3",
        "--max-tokens",
        "24",
        "--ignore-eos",
        "--json",
    ];
    args.extend(extra);
    let out = moestream(&args);
    assert!(out.ok, "{}", out.stderr);
    let id = out
        .stderr
        .lines()
        .find_map(|l| l.strip_prefix("trace: recording run "))
        .map(|l| l.split(' ').next().unwrap().to_owned());
    (serde_json::from_str(&out.stdout).unwrap(), id)
}

/// `replay --json` of `trace` with `extra` flags.
fn replay(trace: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["replay", "--trace", trace.to_str().unwrap(), "--json"];
    args.extend(extra);
    let out = moestream(&args);
    assert!(out.ok, "{}", out.stderr);
    serde_json::from_str(&out.stdout).unwrap()
}

fn v_stats(v: &serde_json::Value) -> serde_json::Value {
    v["stats"].clone()
}

fn v_f64(v: &serde_json::Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("{key} in {v}"))
}

fn hits_misses(stats: &serde_json::Value) -> (u64, u64) {
    (
        stats["expert_hits"].as_u64().unwrap(),
        stats["expert_misses"].as_u64().unwrap(),
    )
}

#[test]
fn a_replay_reproduces_the_runs_hits_and_misses() {
    let dir = model();
    let tmp = tempfile::tempdir().unwrap();
    let trace = tmp.path().join("t.parquet");
    let t = trace.to_str().unwrap();
    let (plain, _) = run(dir.path(), &["--expert-cache", "3"]);
    // (policy, slots, prefetch)
    let cases = [
        ("lfru", "3", "off"),
        ("lru", "3", "off"),
        ("lfu", "4", "off"),
        ("least-stale", "2", "off"),
        ("arc", "3", "off"),
        ("lfru", "3", "on"),
        ("arc", "5", "on"),
        ("auto", "3", "off"),
        ("auto", "2", "on"),
    ];
    let mut ids = Vec::new();
    for (policy, slots, prefetch) in cases {
        let flags = [
            "--expert-cache",
            slots,
            "--policy",
            policy,
            "--prefetch",
            prefetch,
            "--trace",
            t,
        ];
        let (v, id) = run(dir.path(), &flags);
        assert_eq!(v["token_ids"], plain["token_ids"], "tracing changed tokens");
        let id = id.expect("the run names its trace run");
        let r = replay(
            &trace,
            &["--run", &id, "--slots", slots, "--policy", policy],
        );
        let o = &r["outcomes"][0];
        let (hits, misses) = hits_misses(&v["stats"]);
        assert_eq!(
            (o["hits"].as_u64().unwrap(), o["misses"].as_u64().unwrap()),
            (hits, misses),
            "{policy} with {slots} slots, prefetch {prefetch}"
        );
        // The guesses in the trace score as the run scored them.
        for variant in ["attn", "output"] {
            let key = format!("recall_{variant}");
            let (ran, traced) = (v_f64(&v_stats(&v), &key), v_f64(&r["routing"], &key));
            assert!((ran - traced).abs() < 1e-9, "{key}: {ran} vs {traced}");
        }
        // The trace's own tiers say the same.
        assert_eq!(r["recorded"]["hits"].as_u64(), Some(hits));
        assert_eq!(r["recorded"]["misses"].as_u64(), Some(misses));
        // The replay's tokens are the run's forwarded tokens (the last
        // sampled token is never forwarded).
        let s = &v["stats"];
        let forwarded = s["prompt_tokens"].as_u64().unwrap() + s["tokens"].as_u64().unwrap() - 1;
        assert_eq!(r["tokens"].as_u64(), Some(forwarded));
        ids.push(id);
    }
    // Every run landed in the one file, in order.
    let all = replay(&trace, &["--slots", "3", "--policy", "lru"]);
    let runs: Vec<String> = all["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(runs, ids);
    // Nothing but the trace is left next to it (part and temp files go).
    let mut names: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["t.parquet", "t.parquet.lock"]);
}

#[test]
fn the_columns_hold_what_the_run_did() {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{UInt32Type, UInt64Type};
    let dir = model();
    let tmp = tempfile::tempdir().unwrap();
    let trace = tmp.path().join("t.parquet");
    let (v, _) = run(
        dir.path(),
        &["--expert-cache", "3", "--trace", trace.to_str().unwrap()],
    );
    let s = &v["stats"];
    let forwarded = s["prompt_tokens"].as_u64().unwrap() + s["tokens"].as_u64().unwrap() - 1;
    let batches: Vec<_> = moestream::formats::trace::write::batches(&trace)
        .unwrap()
        .map(|b| b.unwrap())
        .collect();
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    assert_eq!(
        rows as u64,
        forwarded * 3,
        "one row per token and MoE layer"
    );
    let mut bytes = 0;
    let (mut guessed, mut deeper) = (0, 0);
    for b in &batches {
        let col = |n: &str| b.column_by_name(n).unwrap();
        let experts = col("experts").as_list::<i32>();
        let weights = col("weights").as_list::<i32>();
        let read = col("bytes_read").as_list::<i32>();
        let tier = col("tier").as_list::<i32>();
        let read_us = col("read_us").as_list::<i32>();
        let row = col("row").as_primitive::<UInt32Type>().values();
        let layer = col("layer").as_primitive::<UInt32Type>().values();
        let token = col("token").as_primitive::<UInt64Type>().values();
        for i in 0..b.num_rows() {
            assert_eq!(experts.value(i).len(), 2, "top-2");
            let w = weights.value(i);
            let w = w.as_primitive::<arrow_array::types::Float32Type>();
            assert!(w.values().iter().all(|&x| x > 0.0));
            bytes += read
                .value(i)
                .as_primitive::<UInt64Type>()
                .values()
                .iter()
                .sum::<u64>();
            // A hit has no latency; a charged miss has one.
            let tiers = tier.value(i);
            let us = read_us.value(i);
            for k in 0..2 {
                let t = tiers.as_string::<i32>().value(k);
                assert!(["warm", "miss"].contains(&t), "{t}");
                if t == "warm" {
                    assert!(us.is_null(k));
                }
            }
            // Prefill rows (row > 0 or the first forward) have no guess.
            if !col("guess_attn").is_null(i) {
                guessed += 1;
                assert_eq!(row[i], 0);
                assert!(token[i] >= 6, "decode tokens only");
            }
            // The guesses from two decoder layers back: every decode row
            // of a layer with a decoder layer two before it (store layers
            // 2 and 3; layer 0 is dense but guesses too), top-2 each.
            for name in moestream::formats::trace::DEEPER_GUESSES {
                let want = !col("guess_attn").is_null(i) && layer[i] >= 2;
                assert_eq!(!col(name).is_null(i), want, "{name}, layer {}", layer[i]);
                if want {
                    deeper += 1;
                    let g = col(name).as_list::<i32>().value(i);
                    assert_eq!(g.len(), 2, "{name}: top-2");
                }
            }
        }
    }
    assert_eq!(bytes, s["expert_bytes_read"].as_u64().unwrap());
    assert!(guessed > 0, "decode rows carry the lookahead's guesses");
    assert!(deeper > 0, "and the guesses from two layers back");
    // Depth 2 replays on it, reading at least what depth 1 reads.
    let ahead = |prefetch: &str| {
        let t = trace.to_str().unwrap();
        let out = moestream(&[
            "replay",
            "--trace",
            t,
            "--slots",
            "3",
            "--prefetch",
            prefetch,
            "--json",
        ]);
        assert!(out.ok, "{prefetch}: {}", out.stderr);
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        v["outcomes"][0]["prefetch_reads"].as_u64().unwrap()
    };
    for variant in ["attn", "output"] {
        let (one, two) = (
            ahead(&format!("lookahead:{variant}")),
            ahead(&format!("lookahead:{variant}:2")),
        );
        assert!(one > 0 && two >= one, "{variant}: {one} then {two}");
    }
}

#[test]
fn replay_refuses_what_it_cannot_read() {
    let tmp = tempfile::tempdir().unwrap();
    let bogus = tmp.path().join("x.parquet");
    std::fs::write(&bogus, b"not parquet").unwrap();
    let out = moestream(&["replay", "--trace", bogus.to_str().unwrap()]);
    assert!(!out.ok);
    assert!(out.stderr.contains("x.parquet"), "{}", out.stderr);
    let out = moestream(&[
        "replay",
        "--trace",
        bogus.to_str().unwrap(),
        "--policy",
        "mru",
    ]);
    assert!(
        !out.ok && out.stderr.contains("unknown policy `mru`"),
        "{}",
        out.stderr
    );
}

/// One trace row as a test writes it (the columns the replay reads; the
/// rest get plausible values).
#[derive(Clone)]
struct Row {
    run: &'static str,
    token: u64,
    layer: u32,
    row: u32,
    experts: Vec<u32>,
    guess: Option<Vec<u32>>,
    slots: u32,
    n_experts: u32,
    expert_bytes: u64,
}

/// A good decode row of `layer` at `token`: experts 1 and 2 of 8.
fn row_at(token: u64, layer: u32) -> Row {
    Row {
        run: "r",
        token,
        layer,
        row: 0,
        experts: vec![1, 2],
        guess: Some(vec![1, 3]),
        slots: 4,
        n_experts: 8,
        expert_bytes: 1000,
    }
}

/// Writes `rows` as a trace at `path` (through the trace writer, so the
/// file is exactly what `--trace` writes).
fn write_trace(path: &Path, rows: &[Row]) {
    use arrow_array::builder::{
        Float32Builder, ListBuilder, StringBuilder, UInt32Builder, UInt64Builder,
    };
    use arrow_array::{ArrayRef, Float32Array, RecordBatch, StringArray, UInt32Array, UInt64Array};
    use std::sync::Arc;
    let u32s = |f: &dyn Fn(&Row) -> u32| -> ArrayRef {
        Arc::new(UInt32Array::from_iter_values(rows.iter().map(f)))
    };
    let u64s = |f: &dyn Fn(&Row) -> u64| -> ArrayRef {
        Arc::new(UInt64Array::from_iter_values(rows.iter().map(f)))
    };
    let id_list = |f: &dyn Fn(&Row) -> Option<Vec<u32>>| -> ArrayRef {
        let mut b = ListBuilder::new(UInt32Builder::new());
        for r in rows {
            match f(r) {
                Some(v) => {
                    b.values().append_slice(&v);
                    b.append(true);
                }
                None => b.append(false),
            }
        }
        Arc::new(b.finish())
    };
    let per_pick = |f: &dyn Fn(&mut ListBuilder<UInt64Builder>, usize)| -> ArrayRef {
        let mut b = ListBuilder::new(UInt64Builder::new());
        for (i, r) in rows.iter().enumerate() {
            for _ in &r.experts {
                f(&mut b, i);
            }
            b.append(true);
        }
        Arc::new(b.finish())
    };
    let mut weights = ListBuilder::new(Float32Builder::new());
    let mut tiers = ListBuilder::new(StringBuilder::new());
    for r in rows {
        for _ in &r.experts {
            weights.values().append_value(0.5);
            tiers.values().append_value("miss");
        }
        weights.append(true);
        tiers.append(true);
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.run))),
        u64s(&|r| r.token),
        u64s(&|r| r.token),
        u32s(&|r| r.layer),
        u32s(&|r| r.row),
        id_list(&|r| Some(r.experts.clone())),
        Arc::new(weights.finish()),
        Arc::new(Float32Array::from_iter_values(rows.iter().map(|_| 0.1))),
        id_list(&|r| r.guess.clone()),
        id_list(&|r| r.guess.clone()),
        Arc::new(tiers.finish()),
        per_pick(&|b, i| b.values().append_value(rows[i].expert_bytes)),
        per_pick(&|b, _| b.values().append_value(40)),
        u32s(&|r| r.slots),
        u32s(&|r| r.n_experts),
        u64s(&|r| r.expert_bytes),
        id_list(&|_| None),
        id_list(&|_| None),
    ];
    let batch = RecordBatch::try_new(moestream::formats::trace::schema(), columns).unwrap();
    let mut w = moestream::formats::trace::write::TraceWriter::create(path).unwrap();
    w.write(&batch).unwrap();
    w.finish().unwrap();
}

/// Two MoE layers (1 and 2) of 8 experts, `tokens` decode tokens.
fn good_rows(tokens: u64) -> Vec<Row> {
    (0..tokens)
        .flat_map(|t| [row_at(t, 1), row_at(t, 2)])
        .collect()
}

/// `replay` and `train-predictor` of a trace holding `rows`.
fn replay_and_train(rows: &[Row]) -> [common::Out; 2] {
    let tmp = tempfile::tempdir().unwrap();
    let trace = tmp.path().join("t.parquet");
    write_trace(&trace, rows);
    let t = trace.to_str().unwrap();
    let out = tmp.path().join("p.json");
    [
        moestream(&["replay", "--trace", t, "--slots", "2,trace"]),
        moestream(&[
            "train-predictor",
            "--trace",
            t,
            "--out",
            out.to_str().unwrap(),
        ]),
    ]
}

#[test]
fn a_written_test_trace_replays_and_trains() {
    for out in replay_and_train(&good_rows(40)) {
        assert!(out.ok, "{}", out.stderr);
    }
}

/// Every value of a trace that sizes an allocation or indexes one is
/// range-checked, by name, before it is used: a huge layer, expert count,
/// slot count or token index would have had `replay` and `train-predictor`
/// allocate up to hundreds of GB (or overflow), and an expert id at or over
/// the row's `n_experts` was accepted.
#[test]
fn trace_values_out_of_range_are_refused_by_column() {
    type Break = fn(&mut Row);
    let cases: [(&str, Break); 9] = [
        ("`layer` 4294967294", |r| r.layer = u32::MAX - 1),
        ("`n_experts` 4294967295", |r| r.n_experts = u32::MAX),
        ("`n_experts` 0", |r| r.n_experts = 0),
        ("`experts` holds expert 8,", |r| r.experts = vec![1, 8]),
        ("`experts` holds expert 4000000000", |r| {
            r.experts = vec![4_000_000_000]
        }),
        ("`guess_attn` holds expert 9", |r| r.guess = Some(vec![9])),
        ("`slots` 4294967295", |r| r.slots = u32::MAX),
        ("`token` 18446744073709551615", |r| r.token = u64::MAX),
        ("`expert_bytes` 18446744073709551615", |r| {
            r.expert_bytes = u64::MAX
        }),
    ];
    for (needle, break_row) in cases {
        let mut rows = good_rows(8);
        break_row(&mut rows[5]);
        for out in replay_and_train(&rows) {
            common::assert_clean_failure(&out, &["t.parquet", "row 5", needle]);
        }
    }
}

#[test]
fn a_layer_whose_expert_count_changes_within_a_run_is_refused() {
    let mut rows = good_rows(8);
    rows[6].n_experts = 16;
    for out in replay_and_train(&rows) {
        common::assert_clean_failure(&out, &["row 6", "`n_experts` 16 of layer 1", "gave 8"]);
    }
}

#[test]
fn many_runs_naming_a_high_layer_are_refused_before_their_tables_are_allocated() {
    let limit = moestream::formats::trace::read::LAYER_TABLES_MAX;
    let layer = moestream::formats::trace::read::LAYERS_MAX - 1;
    let runs = limit / layer as usize + 1;
    let names: Vec<&'static str> = (0..runs)
        .map(|i| &*Box::leak(format!("run{i}").into_boxed_str()))
        .collect();
    let rows: Vec<Row> = names
        .iter()
        .map(|&run| Row {
            run,
            ..row_at(0, layer)
        })
        .collect();
    for out in replay_and_train(&rows) {
        common::assert_clean_failure(&out, &[&format!("more than {limit} layers")]);
    }
}

#[test]
fn train_predictor_refuses_a_layer_too_wide_for_a_predictor() {
    let n = moestream::formats::config::EXPERTS_MAX as u32;
    let rows: Vec<Row> = good_rows(8)
        .into_iter()
        .map(|r| Row { n_experts: n, ..r })
        .collect();
    let [replayed, trained] = replay_and_train(&rows);
    assert!(replayed.ok, "{}", replayed.stderr);
    let max = moestream::store::predictor::EXPERTS_MAX;
    let needle = format!("layer 1 has {n} experts; a predictor holds at most {max}");
    common::assert_clean_failure(&trained, &["t.parquet", &needle]);
}

/// `run` of the synthetic model with `--prefetch learned:FILE`, FILE
/// holding `predictor` (as JSON).
fn run_learned(predictor: &serde_json::Value) -> common::Out {
    let dir = model();
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("p.json");
    std::fs::write(&file, predictor.to_string()).unwrap();
    let learned = format!("learned:{}", file.display());
    moestream(&[
        "run",
        "--model",
        dir.path().to_str().unwrap(),
        "--prompt-ids",
        "5,9,2",
        "--max-tokens",
        "4",
        "--prefetch",
        &learned,
    ])
}

/// A blank predictor of layer 2 after layer 1 (12 experts each, k 2).
fn predictor_json() -> serde_json::Value {
    let n = 12;
    serde_json::json!({
        "version": moestream::store::predictor::VERSION,
        "layers": [{
            "layer": 2, "prev_layer": 1, "n_experts": n, "n_prev": n, "k": 2,
            "bias": vec![0.0; n], "from_layer": vec![0.0; n * n],
            "from_token": vec![0.0; n * n], "guess": 0.0
        }]
    })
}

#[test]
fn a_learned_predictor_runs_and_its_faults_are_refused_by_field() {
    let ok = run_learned(&predictor_json());
    assert!(ok.ok, "{}", ok.stderr);
    type Break = fn(&mut serde_json::Value);
    let cases: [(&str, Break); 6] = [
        // Parses to +inf as an f32.
        ("`bias` element 3 is not finite", |p| {
            p["bias"][3] = 1e39.into()
        }),
        ("`from_token` element 0 is not finite", |p| {
            p["from_token"][0] = (-1e300).into()
        }),
        ("`guess` inf is not finite", |p| p["guess"] = 1e39.into()),
        ("k 13 is outside 1..=12", |p| p["k"] = 13.into()),
        ("k 0 is outside 1..=12", |p| p["k"] = 0.into()),
        // A scorer of no experts for a layer the model lacks: accepted
        // (its shapes agree with its counts), it indexed the store's
        // per-layer state out of bounds at the first decode token.
        ("0 experts (12 before it)", |p| {
            p["layer"] = 1_000_000.into();
            p["n_experts"] = 0.into();
            p["k"] = 0.into();
            p["bias"] = serde_json::json!([]);
            p["from_layer"] = serde_json::json!([]);
            p["from_token"] = serde_json::json!([]);
        }),
    ];
    for (needle, break_it) in cases {
        let mut p = predictor_json();
        break_it(&mut p["layers"][0]);
        common::assert_clean_failure(&run_learned(&p), &["p.json", "field `layers`", needle]);
    }
    let mut p = predictor_json();
    let again = p["layers"][0].clone();
    p["layers"].as_array_mut().unwrap().push(again);
    common::assert_clean_failure(&run_learned(&p), &["layer 2 appears twice"]);
}
