//! config.json: parsed and validated; an accepted config builds its RoPE
//! tables (where absurd values used to panic).
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    if let Ok(cfg) = moestream::config::ModelConfig::from_json(Path::new("config.json"), &v) {
        let _ = moestream::model::rope::Rope::new(&cfg.rope);
    }
});
