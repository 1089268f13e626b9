//! What the scale check costs a streamed expert as it lands
//! (`weights::index::check_finite` over its three parts), against copying
//! the same bytes and reading them at 3 GB/s: a DeepSeek-V3-sized expert
//! (hidden 7168, intermediate 2048) in each GGUF block type and as int4
//! container rows. A measurement, not a test (results/scale-check.md):
//! `cargo test --test scale_check_cost -- --ignored --nocapture`.
use moestream::formats::quant::{QBits, QMatrix};
use moestream::formats::tensor::Mat;
use moestream::kernels::ggml::BlockType;
use std::time::Instant;

/// Evicts the caches: writes a line of every 64 bytes of a large buffer.
fn flush(buf: &mut [u8]) {
    for (i, b) in buf.iter_mut().enumerate().step_by(64) {
        *b = b.wrapping_add(i as u8);
    }
}

/// Prints the best cold (caches flushed) and warm check time of `parts`.
fn time(label: &str, parts: &[(Mat, &str)], bytes: usize, junk: &mut [u8]) {
    let reps = 20;
    let (mut warm, mut cold) = (f64::MAX, f64::MAX);
    for _ in 0..reps {
        flush(junk);
        let t = Instant::now();
        for (m, n) in parts {
            moestream::formats::weights::index::check_finite(n, m).unwrap();
        }
        cold = cold.min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        for (m, n) in parts {
            moestream::formats::weights::index::check_finite(n, m).unwrap();
        }
        warm = warm.min(t.elapsed().as_secs_f64());
    }
    // The read it follows: a copy of the same bytes (memory speed, an upper bound on any read's speed).
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    let mut copy = f64::MAX;
    for _ in 0..5 {
        flush(junk);
        let t = Instant::now();
        dst.copy_from_slice(&src);
        copy = copy.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(&dst);
    println!(
        "{label}: {:.1} MB; check cold {:.0} ns, warm {:.0} ns; memcpy {:.0} ns; read at 3 GB/s {:.0} ns",
        bytes as f64 / 1e6,
        cold * 1e9,
        warm * 1e9,
        copy * 1e9,
        bytes as f64 / 3.0
    );
}

#[test]
#[ignore = "a measurement: run with --ignored --nocapture"]
fn scale_check_cost_per_expert() {
    let mut junk = vec![0u8; 512 << 20];
    let (h, i) = (7168usize, 2048usize);
    let shapes = [(i, h), (i, h), (h, i)];
    for ty in [
        BlockType::Q4_0,
        BlockType::Q4K,
        BlockType::Q6K,
        BlockType::Q8_0,
    ] {
        let mut parts = Vec::new();
        let mut bytes = 0;
        for &(r, c) in &shapes {
            let n = ty.row_bytes(c).unwrap() * r;
            bytes += n;
            let data = vec![0u8; n];
            parts.push((Mat::ggml(ty, r, c, data.into()).unwrap(), "x"));
        }
        time(ty.name(), &parts, bytes, &mut junk);
    }
    let mut parts = Vec::new();
    let mut bytes = 0;
    for &(r, c) in &shapes {
        let n = QBits::Int4.row_bytes(c) * r;
        bytes += n + 4 * r;
        let q = QMatrix {
            bits: QBits::Int4,
            rows: r,
            cols: c,
            data: vec![0u8; n].into(),
            scales: vec![0.01f32; r].into(),
        };
        parts.push((Mat::quant(q), "x"));
    }
    time("int4 container", &parts, bytes, &mut junk);
}
