//! Kernel throughput: f32 matrix-vector products over weights the size of a
//! small expert matrix and of a GLM-5 expert matrix (6144 × 2048), scalar
//! twin against the dispatched SIMD kernel. Throughput is weight bytes per
//! second (decode is memory-bandwidth bound); compare with the machine's
//! measured memory bandwidth (~27–37 GB/s on 2 threads here).

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use moestream::kernels::f32::{dot, dot_scalar, matvec};

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

criterion_group!(benches, bench_matvec);
criterion_main!(benches);
