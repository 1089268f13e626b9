//! The expert store on a real (synthetic) checkpoint: every expert is read
//! at most once when the cache holds the whole layer, each miss reads
//! exactly one expert's bytes in one coalesced span, and the cache size
//! changes hit rates but never tokens.

mod common;

use moestream::generate::{generate, GenOptions};
use moestream::model::{LoadOptions, Model};
use moestream::sampler::SamplingParams;
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
    let want = gen(&load(dir.path(), 1, ReadMode::Buffered, false)).unwrap();
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
                c.bytes_read,
                c.misses * 3 * 16 * 32 * 2,
                "{mode} reactor={reactor}"
            );
        }
    }
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
