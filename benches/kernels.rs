//! Kernel throughput, as weight bytes streamed per second (decode is
//! memory-bandwidth bound); compare with the machine's measured read
//! bandwidth (`moestream::lab::bench::mem::read_bandwidth`, results/kernels.md).
//!
//! - `f32_matvec`: the original f32 group — one matrix the size of a small
//!   expert and one GLM-5 expert matrix, scalar twin against SIMD.
//! - `{f32,int8,int4}_matmul`: `rows x cols` at GLM-5 (2048x6144, 6144x2048)
//!   and Qwen3-30B-A3B (768x2048, 2048x768) expert shapes, batch 1/4/16
//!   (int8/int4: 1/2/4/8/16).
//!   Each iteration uses the next of enough distinct matrices that the
//!   working set is >= 256 MiB (8x this machine's 32 MiB L3), so the weights
//!   really come from memory. Throughput = packed bytes + scales per call.
//!   int8/int4 run the integer path (`kernels::quant::matmul_int`);
//!   `int4_float_path` is the `--no-int-dot` path for comparison.
//! - `ggml_{q4_0,q8_0,q4_k,q5_k,q6_k,q3_k,q2_k}`: the GGUF block types
//!   (`kernels::ggml::matmul`, activations quantized per call as ggml does)
//!   at the Qwen3-30B-A3B expert shapes (768x2048, 2048x768) and 6144x2048,
//!   batch 1/4, cycling through >= 256 MiB of matrices. Throughput = block
//!   bytes per call (scales included).
//! - `grouped_{q4g64,q4g64a,q3g64,q2g64,...}`: the grouped container
//!   formats (`kernels::grouped::matmul_int`) at the Qwen3-30B-A3B expert
//!   shapes and 6144x2048, batch 1/4, cycling through >= 256 MiB of
//!   matrices of random levels and small finite f16 parameters.
//!   Throughput = packed bytes + f16 parameters per call.
//! - `decode_sequence`: 24 back-to-back Qwen3 expert matvecs (8 experts x
//!   gate/up 768x2048 + down 2048x768, int4) under each `Threading`, from
//!   memory (a fresh set of experts per iteration) and from cache (one set).
//!
//! - `vnni_peak`: the machine's `vpdpbusd` peak
//!   (`kernels::int8::vnni_peak_probe`, twelve independent register-only
//!   chains) on 1 thread and on the hot pool's 2+ threads, in elements =
//!   multiply-adds (64 per zmm `vpdpbusd`): what the batched integer
//!   matmuls are compared against.
//!
//! - `attention`: one batch of `attn::ROWS_MAX` (16) query rows of a
//!   128-dimension head over 2,048 cached positions on one thread: the
//!   scores against a key panel and the weighted sum of values (contiguous,
//!   as `attend_rows` copies them), in elements = multiply-adds; compare
//!   with the f32 FMA peak (`f32_fma_peak`, 16 independent zmm chains).
//!
//! `MOESTREAM_BENCH_THREADING=single` runs the matmul groups on that
//! threading instead of the hot pool; `MOESTREAM_SPIN_US` sets the pool's
//! idle spin.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use moestream::formats::quant::QBits;
use moestream::kernels::attn;
use moestream::kernels::f32::{dot, dot_scalar, matvec};
use moestream::kernels::ggml::{self, BlockType};
use moestream::kernels::grouped::{self, GFormat};
use moestream::kernels::int8::{vnni_peak_probe, PEAK_MACS_PER_STEP};
use moestream::kernels::quant::{matmul_float, matmul_int};
use moestream::kernels::{f32 as kf32, pool, set_threading, Threading};

fn weights(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 2654435761) % 1000) as f32 / 1000.0 - 0.5)
        .collect()
}

fn bench_matvec(c: &mut Criterion) {
    let mut g = c.benchmark_group("f32_matvec");
    for (rows, cols) in [(256usize, 512usize), (2048, 6144)] {
        let w = weights(rows * cols);
        let x = weights(cols);
        let mut y = vec![0f32; rows];
        g.throughput(Throughput::Bytes((rows * cols * 4) as u64));
        g.bench_with_input(
            BenchmarkId::new("dispatched", format!("{rows}x{cols}")),
            &(),
            |b, _| b.iter(|| matvec(black_box(&w), rows, cols, black_box(&x), &mut y)),
        );
        g.bench_with_input(
            BenchmarkId::new("scalar_rows", format!("{rows}x{cols}")),
            &(),
            |b, _| {
                b.iter(|| {
                    for (r, yr) in y.iter_mut().enumerate() {
                        *yr = dot_scalar(black_box(&w[r * cols..(r + 1) * cols]), black_box(&x));
                    }
                })
            },
        );
        g.bench_with_input(
            BenchmarkId::new("simd_rows", format!("{rows}x{cols}")),
            &(),
            |b, _| {
                b.iter(|| {
                    for (r, yr) in y.iter_mut().enumerate() {
                        *yr = dot(black_box(&w[r * cols..(r + 1) * cols]), black_box(&x));
                    }
                })
            },
        );
    }
    g.finish();
}

/// Working set each shape group cycles through (>= 4x the LLC).
const WORKING_SET_BYTES: usize = 256 << 20;
const SHAPES: [(usize, usize); 4] = [(2048, 6144), (6144, 2048), (768, 2048), (2048, 768)];
const BATCHES: [usize; 3] = [1, 4, 16];
/// Batches of the integer groups: decode, verify blocks and batched serving.
const INT_BATCHES: [usize; 5] = [1, 2, 4, 8, 16];

use moestream::lab::bench::kernels::{finite_scales, random_bytes as bytes};

/// One packed matrix as the kernels see it.
struct Packed {
    data: Vec<u8>,
    scales: Vec<f32>,
}

/// Enough distinct packed `(rows, cols)` matrices to fill the working set.
fn packed_set(bits: QBits, rows: usize, cols: usize) -> Vec<Packed> {
    let per = rows * bits.row_bytes(cols) + rows * 4;
    (0..WORKING_SET_BYTES.div_ceil(per))
        .map(|k| Packed {
            data: bytes(rows * bits.row_bytes(cols), k as u64 + 1),
            scales: (0..rows).map(|r| 1e-3 * (1 + r % 7) as f32).collect(),
        })
        .collect()
}

fn bench_f32_matmul(c: &mut Criterion) {
    set_threading(threading_from_env());
    let mut g = c.benchmark_group("f32_matmul");
    for (rows, cols) in SHAPES {
        let per = rows * cols * 4;
        let mats: Vec<Vec<f32>> = (0..WORKING_SET_BYTES.div_ceil(per))
            .map(|k| {
                bytes(rows * cols, k as u64 + 7)
                    .iter()
                    .map(|&b| b as f32 / 256.0 - 0.5)
                    .collect()
            })
            .collect();
        g.throughput(Throughput::Bytes(per as u64));
        for n in BATCHES {
            let x = weights(n * cols);
            let mut y = vec![0f32; n * rows];
            let mut i = 0;
            g.bench_function(BenchmarkId::new(format!("{rows}x{cols}"), n), |b| {
                b.iter(|| {
                    i = (i + 1) % mats.len();
                    kf32::matmul(&mats[i], rows, cols, black_box(&x), n, &mut y)
                })
            });
        }
    }
    g.finish();
}

fn bench_quant_matmul(c: &mut Criterion, bits: QBits, float_path: bool) {
    let name = match (bits, float_path) {
        (QBits::Int8, false) => "int8_matmul",
        (QBits::Int4, false) => "int4_matmul",
        (QBits::Int4, true) => "int4_float_path",
        _ => unreachable!("not benched"),
    };
    let run = if float_path { matmul_float } else { matmul_int };
    set_threading(threading_from_env());
    let mut g = c.benchmark_group(name);
    let shapes: &[(usize, usize)] = if float_path { &SHAPES[..1] } else { &SHAPES };
    let batches: &[usize] = if float_path { &BATCHES } else { &INT_BATCHES };
    for &(rows, cols) in shapes {
        let mats = packed_set(bits, rows, cols);
        g.throughput(Throughput::Bytes(
            (rows * bits.row_bytes(cols) + rows * 4) as u64,
        ));
        for &n in batches {
            let x = weights(n * cols);
            let mut y = vec![0f32; n * rows];
            let mut i = 0;
            g.bench_function(BenchmarkId::new(format!("{rows}x{cols}"), n), |b| {
                b.iter(|| {
                    i = (i + 1) % mats.len();
                    let m = &mats[i];
                    run(
                        bits,
                        &m.data,
                        &m.scales,
                        rows,
                        cols,
                        black_box(&x),
                        n,
                        &mut y,
                    )
                })
            });
        }
    }
    g.finish();
}

fn bench_int8(c: &mut Criterion) {
    bench_quant_matmul(c, QBits::Int8, false)
}

fn bench_int4(c: &mut Criterion) {
    bench_quant_matmul(c, QBits::Int4, false)
}

fn bench_int4_float(c: &mut Criterion) {
    bench_quant_matmul(c, QBits::Int4, true)
}

/// `MOESTREAM_BENCH_THREADING=single` runs the matmul groups on that
/// threading instead of the default hot pool.
fn threading_from_env() -> Threading {
    match std::env::var("MOESTREAM_BENCH_THREADING").as_deref() {
        Ok("single") => Threading::Single,
        _ => Threading::Pool,
    }
}

/// Shapes of the GGUF block benches: Qwen3-30B-A3B expert gate/up and down,
/// and a GLM-5-sized one.
const GGML_SHAPES: [(usize, usize); 3] = [(768, 2048), (2048, 768), (6144, 2048)];

/// A `(rows, cols)` matrix of random `ty` blocks whose f16 scales are set
/// to small finite values (random bytes elsewhere are valid levels).
fn ggml_matrix(ty: BlockType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut w = bytes(rows * ty.row_bytes(cols).expect("whole blocks"), seed);
    finite_scales(ty, &mut w);
    w
}

fn bench_ggml(c: &mut Criterion) {
    set_threading(threading_from_env());
    for ty in BlockType::ALL {
        let mut g = c.benchmark_group(format!("ggml_{}", ty.name().to_lowercase()));
        for (rows, cols) in GGML_SHAPES {
            let per = rows * ty.row_bytes(cols).expect("whole blocks");
            let mats: Vec<Vec<u8>> = (0..WORKING_SET_BYTES.div_ceil(per))
                .map(|k| ggml_matrix(ty, rows, cols, k as u64 + 11))
                .collect();
            g.throughput(Throughput::Bytes(per as u64));
            for n in [1usize, 4, 16] {
                let x = weights(n * cols);
                let mut y = vec![0f32; n * rows];
                let mut i = 0;
                g.bench_function(BenchmarkId::new(format!("{rows}x{cols}"), n), |b| {
                    b.iter(|| {
                        i = (i + 1) % mats.len();
                        ggml::matmul(ty, &mats[i], rows, cols, black_box(&x), n, &mut y)
                    })
                });
            }
        }
        g.finish();
    }
}

fn bench_grouped(c: &mut Criterion) {
    set_threading(threading_from_env());
    let only = std::env::var("MOESTREAM_BENCH_FORMATS").unwrap_or_default();
    for f in GFormat::all() {
        if !only.is_empty() && !only.split(',').any(|n| n == f.name()) {
            continue;
        }
        let mut g = c.benchmark_group(format!("grouped_{f}"));
        for (rows, cols) in GGML_SHAPES {
            let (rb, pr) = (rows * f.row_bytes(cols), rows * f.params_per_row(cols));
            let params: Vec<u16> = (0..pr)
                .map(|i| half::f16::from_f32(1e-3 * (1 + i % 7) as f32).to_bits())
                .collect();
            let mats: Vec<Vec<u8>> = (0..WORKING_SET_BYTES.div_ceil(rb + 2 * pr))
                .map(|k| bytes(rb, k as u64 + 21))
                .collect();
            g.throughput(Throughput::Bytes((rb + 2 * pr) as u64));
            for n in [1usize, 4] {
                let x = weights(n * cols);
                let mut y = vec![0f32; n * rows];
                let mut i = 0;
                g.bench_function(BenchmarkId::new(format!("{rows}x{cols}"), n), |b| {
                    b.iter(|| {
                        i = (i + 1) % mats.len();
                        let w = &mats[i];
                        grouped::matmul_int(f, w, &params, rows, cols, black_box(&x), n, &mut y)
                    })
                });
            }
        }
        g.finish();
    }
}

/// 24 back-to-back int4 expert matvecs, as one MoE layer of Qwen3-30B-A3B
/// decodes one token (8 experts x gate, up, down).
fn bench_decode_sequence(c: &mut Criterion) {
    let (h, f) = (2048usize, 768usize);
    let bits = QBits::Int4;
    let per_set = 8 * (2 * f * bits.row_bytes(h) + h * bits.row_bytes(f) + (2 * f + h) * 4);
    let sets = WORKING_SET_BYTES.div_ceil(per_set);
    let layers: Vec<Vec<[Packed; 3]>> = (0..sets)
        .map(|s| {
            (0..8)
                .map(|e| {
                    let k = (s * 8 + e) as u64 * 3;
                    let gate = Packed {
                        data: bytes(f * h / 2, k + 1),
                        scales: vec![1e-3; f],
                    };
                    let up = Packed {
                        data: bytes(f * h / 2, k + 2),
                        scales: vec![1e-3; f],
                    };
                    let down = Packed {
                        data: bytes(h * f / 2, k + 3),
                        scales: vec![1e-3; h],
                    };
                    [gate, up, down]
                })
                .collect()
        })
        .collect();
    let x = weights(h);
    let (mut g1, mut u1, mut y) = (vec![0f32; f], vec![0f32; f], vec![0f32; h]);
    let mut g = c.benchmark_group("decode_sequence");
    g.throughput(Throughput::Bytes(per_set as u64));
    for (label, set_count) in [("memory", sets), ("cache", 1)] {
        for t in [Threading::Single, Threading::Pool] {
            let mut i = 0;
            g.bench_function(BenchmarkId::new(label, format!("{t:?}")), |b| {
                set_threading(t);
                b.iter(|| {
                    i = (i + 1) % set_count;
                    for [gate, up, down] in &layers[i] {
                        matmul_int(
                            bits,
                            &gate.data,
                            &gate.scales,
                            f,
                            h,
                            black_box(&x),
                            1,
                            &mut g1,
                        );
                        matmul_int(bits, &up.data, &up.scales, f, h, &x, 1, &mut u1);
                        // The gating product (SiLU left out: not kernel work).
                        for (a, b) in g1.iter_mut().zip(&u1) {
                            *a *= b;
                        }
                        matmul_int(bits, &down.data, &down.scales, h, f, &g1, 1, &mut y);
                    }
                })
            });
        }
    }
    set_threading(Threading::Pool);
    g.finish();
}

/// Probe rounds per thread per iteration: ~1 ms of `vpdpbusd`, long
/// enough that starting the pool's region is noise.
const PEAK_STEPS: usize = 1 << 18;

fn bench_vnni_peak(c: &mut Criterion) {
    if vnni_peak_probe(1, 1, 1).is_none() {
        eprintln!("vnni_peak: no AVX-512 VNNI on this CPU, skipped");
        return;
    }
    let mut g = c.benchmark_group("vnni_peak");
    for threads in [1, pool::threads()] {
        let macs = threads * PEAK_STEPS * PEAK_MACS_PER_STEP;
        g.throughput(Throughput::Elements(macs as u64));
        g.bench_function(BenchmarkId::new("threads", threads), |b| {
            b.iter(|| {
                let body = |_: usize| {
                    black_box(vnni_peak_probe(PEAK_STEPS, black_box(1), black_box(-1)));
                };
                if threads == 1 {
                    body(0)
                } else {
                    pool::run(threads, &body)
                }
            })
        });
    }
    g.finish();
}

fn bench_attention(c: &mut Criterion) {
    let (rows, n, dim) = (attn::ROWS_MAX, 2048, 128);
    let mut g = c.benchmark_group("attention");
    g.throughput(Throughput::Elements((rows * n * dim) as u64));
    let q = weights(rows * dim);
    let offsets: Vec<usize> = (0..rows).map(|r| r * dim).collect();
    let keys = weights(n * dim);
    let mut panel = vec![0f32; attn::panel_len(n, dim)];
    let part = attn::KeyPart {
        keys: &keys,
        stride: dim,
        width: dim,
    };
    attn::fill_panel(&[part], n, &mut panel);
    let mut scores = vec![0f32; rows * n];
    g.bench_function("scores", |b| {
        b.iter(|| {
            let qr = attn::QueryRows {
                q: &q,
                offsets: &offsets,
                dim,
            };
            attn::scores(qr, &panel, 0..n / attn::BLOCK, 0.1, (&mut scores, n));
            black_box(&scores);
        })
    });
    // Rows of weights one block apart from a power of two (as the prefill's
    // scores rows are not): 4 KiB-aliased rows would share L1 sets.
    let ws = n + attn::BLOCK;
    let w: Vec<f32> = weights(rows * ws)
        .iter()
        .map(|v| v.abs() / n as f32)
        .collect();
    let v = weights(n * dim);
    let spans: Vec<_> = (0..rows).map(|r| 0..n - rows + r + 1).collect();
    let mut out = vec![0f32; rows * dim];
    g.bench_function("values", |b| {
        b.iter(|| {
            let wv = attn::Weighted {
                w: &w,
                w_stride: ws,
                v: &v,
                v_stride: dim,
                spans: &spans,
            };
            out.fill(0.0);
            attn::weighted_values(wv, (&mut out, &offsets), dim);
            black_box(&out);
        })
    });
    g.finish();
}

criterion_group!(
    benches,
    bench_attention,
    bench_vnni_peak,
    bench_matvec,
    bench_f32_matmul,
    bench_int8,
    bench_int4,
    bench_int4_float,
    bench_ggml,
    bench_grouped,
    bench_decode_sequence
);
criterion_main!(benches);
