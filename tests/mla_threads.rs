//! MLA attention (DeepSeek-V3, GLM-5 with DSA's selection) spreads its
//! query rows over the kernel pool during a prefill; each row's
//! arithmetic is the one it has on one thread, so the pool changes no bit
//! of the logits, on the explicit and on the absorbed path. This file
//! holds one test: the threading switch is process-wide.

mod common;

use moestream::engine::generate::evaluate;
use moestream::kernels::{set_threading, Threading};
use moestream::model::mla::MlaMode;
use moestream::model::{LoadOptions, Model};

const POSITIONS: usize = 600;

#[test]
fn mla_attention_on_the_kernel_pool_gives_one_threads_bits() {
    for family in ["deepseek_v3", "glm_moe_dsa"] {
        let dir = common::long_fixture(family, POSITIONS);
        for mla in [MlaMode::Explicit, MlaMode::Absorb] {
            let opts = LoadOptions {
                pin_history: false,
                mla,
                ..LoadOptions::default()
            };
            let model = Model::load(dir.path(), &opts).unwrap();
            let ids = common::spread_ids(POSITIONS, model.cfg.vocab_size);
            set_threading(Threading::Pool);
            let pooled = evaluate(&model, &ids).unwrap().logits;
            set_threading(Threading::Single);
            let single = evaluate(&model, &ids).unwrap().logits;
            set_threading(Threading::Pool);
            assert_eq!(pooled.len(), single.len());
            let differ = pooled
                .iter()
                .zip(&single)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(differ, 0, "{family}, {mla:?}: logits differ");
            assert!(pooled.iter().all(|v| v.is_finite()), "{family}, {mla:?}");
        }
    }
}
