//! The expert store on a real (synthetic) checkpoint: every expert is read
//! at most once when the cache holds the whole layer, each miss reads
//! exactly one expert's bytes in one coalesced span, and the cache size
//! changes hit rates but never tokens.

mod common;

use moestream::generate::{generate, GenOptions};
use moestream::model::{LoadOptions, Model};
use moestream::sampler::SamplingParams;

fn run(dir: &std::path::Path, cache: usize) -> (Vec<u32>, moestream::store::StoreCounters) {
    let model = Model::load(
        dir,
        &LoadOptions {
            expert_cache: cache,
            ..LoadOptions::default()
        },
    )
    .unwrap();
    let opts = GenOptions {
        max_tokens: 12,
        sampling: SamplingParams::default(),
        ignore_eos: true,
        eos_ids: vec![],
    };
    let g = generate(&model, &[5, 6, 7, 8], &opts, |_| Ok(())).unwrap();
    (g.token_ids, model.store.counters())
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
