//! The expert store on a real (synthetic) checkpoint: every expert is read
//! at most once when the cache holds the whole layer, each miss reads
//! exactly one expert's bytes in one coalesced span, and the cache size
//! changes hit rates but never tokens.

mod common;

use moestream::engine::generate::{generate, GenOptions};
use moestream::engine::sampler::SamplingParams;
use moestream::model::{LoadOptions, Model};
use moestream::store::{Lookahead, ScheduleOptions, Variant};
use moestream_io::ReadMode;
use std::path::Path;

fn load(dir: &Path, cache: usize, read_mode: ReadMode, io_reactor: bool) -> Model {
    let opts = LoadOptions {
        expert_cache: cache,
        read_mode,
        io_reactor,
        ..LoadOptions::default()
    };
    Model::load(dir, &opts).unwrap()
}

fn gen(model: &Model) -> moestream::Result<Vec<u32>> {
    let opts = GenOptions {
        max_tokens: 12,
        sampling: SamplingParams::default(),
        ignore_eos: true,
        eos_ids: vec![],
        speculation: Default::default(),
        constraint: None,
        logit_bias: Vec::new(),
    };
    Ok(generate(model, &[5, 6, 7, 8], &opts, |_| Ok(()))?.token_ids)
}

fn run(dir: &Path, cache: usize) -> (Vec<u32>, moestream::store::StoreCounters) {
    let model = load(dir, cache, ReadMode::Buffered, true);
    (gen(&model).unwrap(), model.store.counters())
}

#[test]
fn full_cache_reads_each_expert_at_most_once() {
    let dir = common::tiny_model();
    let (_, c) = run(dir.path(), 4);
    // One MoE layer (layer 0 is dense) with 4 experts.
    assert!(c.misses <= 4, "misses {}", c.misses);
    assert!(c.hits > 0);
    // BF16 expert: 3 matrices of 16 x 32.
    assert_eq!(c.bytes_read, c.misses * 3 * 16 * 32 * 2);
}

#[test]
fn cache_size_changes_hit_rate_not_tokens() {
    let dir = common::tiny_model();
    let (big, cb) = run(dir.path(), 4);
    let (small, cs) = run(dir.path(), 1);
    let (none, cn) = run(dir.path(), 0);
    assert_eq!(big, small);
    assert_eq!(big, none);
    assert!(cs.misses > cb.misses);
    assert_eq!(cn.hits, 0);
    assert!(cb.hit_rate() > cs.hit_rate());
}

#[test]
fn reactor_and_sync_reads_agree_in_every_mode() {
    let dir = common::tiny_model();
    let baseline = load(dir.path(), 1, ReadMode::Buffered, false);
    let want = gen(&baseline).unwrap();
    let want_counts = baseline.store.counters();
    for mode in [
        ReadMode::Direct,
        ReadMode::Buffered,
        ReadMode::Pread,
        ReadMode::Drop,
        ReadMode::Mmap,
    ] {
        for reactor in [false, true] {
            let model = load(dir.path(), 1, mode, reactor);
            if reactor
                && matches!(
                    mode,
                    ReadMode::Direct | ReadMode::Buffered | ReadMode::Pread
                )
            {
                if moestream_io::Reactor::probe().is_ok() {
                    assert!(model.store.uses_reactor(), "{mode}: io_uring is available");
                } else {
                    eprintln!("io_uring unavailable: {mode} falls back to sync reads");
                }
            }
            assert_eq!(gen(&model).unwrap(), want, "{mode} reactor={reactor}");
            let c = model.store.counters();
            assert_eq!(
                (c.hits, c.misses),
                (want_counts.hits, want_counts.misses),
                "{mode} reactor={reactor}: cache behaviour"
            );
            assert_eq!(
                c.bytes_read,
                c.misses * 3 * 16 * 32 * 2,
                "{mode} reactor={reactor}"
            );
        }
    }
}

/// Pipelining and router-lookahead prefetch (from either state, one or two
/// layers ahead) change no token and no cache decision, in every read mode
/// and submission path; prefetch reads are issued, some are used, and the
/// recall figures are shares.
#[test]
fn pipeline_and_prefetch_change_no_token_in_any_mode() {
    let dir = common::tiny_model();
    let baseline = load(dir.path(), 1, ReadMode::Buffered, false);
    let want = gen(&baseline).unwrap();
    let want_counts = baseline.store.counters();
    let lookaheads = [
        None,
        Some(Lookahead {
            from: Variant::Attn,
            depth: 1,
        }),
        Some(Lookahead {
            from: Variant::Output,
            depth: 1,
        }),
        Some(Lookahead {
            from: Variant::Attn,
            depth: 2,
        }),
    ];
    let mut used = 0;
    for mode in ReadMode::ALL {
        for reactor in [false, true] {
            for pipeline in [false, true] {
                for lookahead in lookaheads {
                    let opts = LoadOptions {
                        expert_cache: 1,
                        read_mode: mode,
                        io_reactor: reactor,
                        schedule: ScheduleOptions {
                            pipeline,
                            lookahead,
                            prefetch_experts: None,
                            recall: pipeline,
                            cache_lean: None,
                        },
                        ..LoadOptions::default()
                    };
                    let model = Model::load(dir.path(), &opts).unwrap();
                    let what =
                        format!("{mode} reactor={reactor} pipeline={pipeline} {lookahead:?}");
                    assert_eq!(gen(&model).unwrap(), want, "{what}");
                    let c = model.store.counters();
                    assert_eq!(
                        (c.hits, c.misses),
                        (want_counts.hits, want_counts.misses),
                        "{what}: cache behaviour"
                    );
                    assert!(c.bytes_read >= c.misses * 3 * 16 * 32 * 2, "{what}");
                    if lookahead.is_some() {
                        assert!(c.prefetch_issued > 0, "{what}: no prefetch issued");
                        assert!(c.prefetch_used <= c.prefetch_issued, "{what}");
                        assert!(c.prefetch_late <= c.prefetch_used, "{what}");
                        used += c.prefetch_used;
                    } else {
                        assert_eq!(c.prefetch_issued, 0, "{what}");
                    }
                    let recall = model.store.recall();
                    for r in recall.iter().flatten().flatten() {
                        assert!((0.0..=1.0).contains(r), "{what}: recall {r}");
                    }
                    // Scored: both variants with `recall`, the prefetching
                    // one with lookahead, none otherwise.
                    let scored = |v: usize| recall.iter().any(|l| l[v].is_some());
                    let want = |v: Variant| pipeline || lookahead.is_some_and(|a| a.from == v);
                    assert_eq!(scored(0), want(Variant::Attn), "{what}");
                    assert_eq!(scored(1), want(Variant::Output), "{what}");
                }
            }
        }
    }
    assert!(used > 0, "no prefetched expert was ever used");
}

#[test]
fn a_shard_truncated_after_load_is_an_error_naming_it_not_garbage() {
    for reactor in [false, true] {
        let dir = common::tiny_model();
        let model = load(dir.path(), 0, ReadMode::Buffered, reactor);
        let shard = common::shard_of(dir.path(), "model.layers.1.mlp.experts.0.gate_proj.weight");
        let len = std::fs::metadata(&shard).unwrap().len();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&shard)
            .unwrap();
        f.set_len(len / 2).unwrap();
        let e = gen(&model).unwrap_err().to_string();
        let file = shard.file_name().unwrap().to_str().unwrap();
        assert!(e.contains(file), "reactor={reactor}: {e}");
    }
}

/// Rewrites every BF16 tensor of `dir`'s shards as F32 (exact widening).
fn widen_checkpoint(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        if path.extension().is_none_or(|x| x != "safetensors") {
            continue;
        }
        let (header, data) = common::read_shard(&path);
        let mut entries: Vec<(String, serde_json::Value)> = header
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| *k != "__metadata__")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        entries.sort_by_key(|(_, v)| v["data_offsets"][0].as_u64().unwrap());
        let mut out_header = serde_json::Map::new();
        let mut out = Vec::new();
        for (name, mut v) in entries {
            let (b, e) = (
                v["data_offsets"][0].as_u64().unwrap() as usize,
                v["data_offsets"][1].as_u64().unwrap() as usize,
            );
            let start = out.len();
            if v["dtype"] == "BF16" {
                for c in data[b..e].chunks_exact(2) {
                    out.extend_from_slice(
                        &f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16)
                            .to_le_bytes(),
                    );
                }
                v["dtype"] = "F32".into();
            } else {
                out.extend_from_slice(&data[b..e]);
            }
            v["data_offsets"] = serde_json::json!([start, out.len()]);
            out_header.insert(name, v);
        }
        common::write_shard(&path, &serde_json::Value::Object(out_header), &out);
    }
}

#[test]
fn bf16_experts_give_bit_identical_logits_to_the_widened_f32_checkpoint() {
    let bf = common::tiny_model();
    let wide = common::tiny_model();
    widen_checkpoint(wide.path());
    let ids = [5u32, 6, 7, 8, 9, 10];
    let a =
        moestream::engine::generate::evaluate(&load(bf.path(), 2, ReadMode::Buffered, true), &ids)
            .unwrap();
    let b = moestream::engine::generate::evaluate(
        &load(wide.path(), 2, ReadMode::Buffered, true),
        &ids,
    )
    .unwrap();
    assert!(a
        .last_logits
        .iter()
        .zip(&b.last_logits)
        .all(|(x, y)| x.to_bits() == y.to_bits()));
    assert_eq!(a.argmax, b.argmax);
    // Kept in BF16, an expert holds half the bytes of its f32 twin.
    let m_bf = load(bf.path(), 2, ReadMode::Buffered, true);
    let m_wide = load(wide.path(), 2, ReadMode::Buffered, true);
    assert_eq!(
        m_bf.store.read(1, 0).unwrap().bytes() * 2,
        m_wide.store.read(1, 0).unwrap().bytes()
    );
}
