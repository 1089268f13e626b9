//! The batched integer kernels against the machine's integer peak, both
//! measured in this process (`moestream bench kernels`, results/kernels.md):
//! each repetition runs the peak probe on the hot pool's threads
//! (`kernels::int8::int_peak_probe`: register-only multiply-adds with
//! independent accumulators, VNNI where the CPU has it, else AVX2), then a
//! few calls of one kernel at one shape and batch, so the two alternate
//! under whatever else the machine runs; a row reports the medians and the
//! median of the per-repetition ratios. Multiply-adds (MACs) count
//! `rows · cols · n` a call; an integer op is half a MAC (ops/s = 2 · MAC/s).
//!
//! On a shared machine the wall clock counts the time other work holds
//! the cores; [`KernelBenchConfig::one_thread`] runs both on the calling
//! thread and times them by its CPU time instead.
//!
//! Weights cycle through enough distinct random matrices to fill
//! [`KernelBenchConfig::working_set_bytes`], as the streamed experts of a
//! prefill arrive in fresh buffers; at 32+ rows the kernels are
//! compute-bound, so where the weights come from hardly matters.

use crate::formats::quant::QBits;
use crate::kernels::ggml::{self, BlockType};
use crate::kernels::grouped::{self, GFormat};
use crate::kernels::int8::{int_peak_probe, PeakOp};
use crate::kernels::{self, pool, quant};
use std::hint::black_box;
use std::time::Instant;

/// A weight format the bench runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelFormat {
    /// The container's per-row int4/int8 (`kernels::quant::matmul_int`).
    Int(QBits),
    /// A GGUF block type (`kernels::ggml::matmul`).
    Ggml(BlockType),
    /// A grouped container format (`kernels::grouped::matmul_int`).
    Grouped(GFormat),
}

impl KernelFormat {
    /// `int4`, `int8`, a GGUF type name (`q4_0`, `q4_k`, ...) or a grouped
    /// format (`q4g64`, `q4g32a`, ...).
    pub fn parse(name: &str) -> Option<KernelFormat> {
        match name {
            "int4" => Some(KernelFormat::Int(QBits::Int4)),
            "int8" => Some(KernelFormat::Int(QBits::Int8)),
            _ => BlockType::parse(name)
                .map(KernelFormat::Ggml)
                .or_else(|| GFormat::parse(name).map(KernelFormat::Grouped)),
        }
    }

    /// The name in reports.
    pub fn name(self) -> String {
        match self {
            KernelFormat::Int(b) => format!("int{}", b.bits()),
            KernelFormat::Ggml(t) => t.name().to_lowercase(),
            KernelFormat::Grouped(g) => g.name(),
        }
    }

    /// Weight bytes of a `rows x cols` matrix (scales included), or `None`
    /// where `cols` is not a whole number of the format's blocks.
    fn matrix_bytes(self, rows: usize, cols: usize) -> Option<usize> {
        match self {
            KernelFormat::Int(b) => Some(rows * b.row_bytes(cols)),
            KernelFormat::Ggml(t) => t.row_bytes(cols).map(|rb| rows * rb),
            KernelFormat::Grouped(g) => Some(rows * g.row_bytes(cols)),
        }
    }
}

/// What `moestream bench kernels` measures.
#[derive(Clone, Debug)]
pub struct KernelBenchConfig {
    pub formats: Vec<KernelFormat>,
    /// `(rows, cols)` of the weight matrices.
    pub shapes: Vec<(usize, usize)>,
    /// Activation rows a call.
    pub batches: Vec<usize>,
    /// Alternating repetitions (peak, kernel) a row.
    pub reps: usize,
    /// Bytes of distinct matrices each row cycles through.
    pub working_set_bytes: usize,
    /// Also run the int8/int4 and grouped int4 rows on the VNNI panels
    /// (where AMX is the default) and the 4×4 register tiles (grouped: the
    /// four-row dots), and the Q4_0/Q4_K rows on the per-row dots,
    /// alternating with the default kernel: rows named `int4 (panels)`,
    /// `int4 (tiles)`, `q4g64 (dots)`, `q4_k (per-row)`.
    pub compare_tiles: bool,
    /// Run the kernels and the peak on the calling thread alone, timed by
    /// its CPU time (what a shared machine's preemption does not inflate),
    /// instead of on the pool's threads by the wall clock.
    pub one_thread: bool,
}

/// The integer peak on one thread and on the pool's threads.
#[derive(Clone, Debug)]
pub struct PeakReport {
    pub op: PeakOp,
    pub threads: usize,
    /// Median GMAC/s on the calling thread alone.
    pub one_thread_gmacs: f64,
    /// Median GMAC/s on every pool thread.
    pub all_threads_gmacs: f64,
}

/// One kernel at one shape and batch.
#[derive(Clone, Debug)]
pub struct KernelRow {
    pub format: String,
    pub rows: usize,
    pub cols: usize,
    pub n: usize,
    /// Median kernel GMAC/s over the repetitions.
    pub gmacs: f64,
    /// Median peak GMAC/s (all threads) over the same repetitions.
    pub peak_gmacs: f64,
    /// Per repetition: kernel GMAC/s over the peak measured just before.
    pub of_peak: Vec<f64>,
}

impl KernelRow {
    /// Median of [`KernelRow::of_peak`].
    pub fn of_peak_median(&self) -> f64 {
        median(&self.of_peak)
    }
}

/// Probe rounds of one peak chunk (~50 µs of multiply-adds).
const PEAK_CHUNK_STEPS: usize = 1 << 14;
/// Chunks of one peak measurement, per thread.
const PEAK_CHUNKS_PER_THREAD: usize = 32;
/// Multiply-adds one repetition of a kernel aims at (~10 ms near peak).
const KERNEL_MACS_PER_REP: usize = 4_000_000_000;

/// GMAC/s of one peak measurement on `threads` threads (1: the caller).
pub fn peak_gmacs(op: PeakOp, threads: usize) -> f64 {
    let chunks = PEAK_CHUNKS_PER_THREAD * threads;
    let body = |_: usize| {
        black_box(int_peak_probe(
            op,
            PEAK_CHUNK_STEPS,
            black_box(0x0102_0304),
            black_box(-0x0506_0708),
        ));
    };
    let clock = Clock::start(threads == 1);
    if threads == 1 {
        (0..chunks).for_each(body);
    } else {
        pool::run(chunks, &body);
    }
    let macs = chunks * PEAK_CHUNK_STEPS * op.macs_per_step();
    macs as f64 / clock.seconds() / 1e9
}

/// A stopwatch: the calling thread's CPU time (one-thread runs: time the
/// thread spent preempted by other work does not count) or the wall clock.
enum Clock {
    Cpu(f64),
    Wall(Instant),
}

impl Clock {
    fn start(cpu: bool) -> Clock {
        if cpu {
            Clock::Cpu(thread_cpu_seconds())
        } else {
            Clock::Wall(Instant::now())
        }
    }

    fn seconds(&self) -> f64 {
        match self {
            Clock::Cpu(t0) => thread_cpu_seconds() - t0,
            Clock::Wall(t0) => t0.elapsed().as_secs_f64(),
        }
    }
}

/// CPU seconds the calling thread has run (`CLOCK_THREAD_CPUTIME_ID`).
fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a
    // constant every Linux kernel has.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// The peak, `reps` measurements on each thread count.
pub fn peak(op: PeakOp, reps: usize) -> PeakReport {
    let threads = pool::threads();
    let one: Vec<f64> = (0..reps).map(|_| peak_gmacs(op, 1)).collect();
    let all: Vec<f64> = (0..reps).map(|_| peak_gmacs(op, threads)).collect();
    PeakReport {
        op,
        threads,
        one_thread_gmacs: median(&one),
        all_threads_gmacs: median(&all),
    }
}

/// Measures every format × shape × batch of `cfg`, alternating each
/// repetition with a peak measurement. Shapes a format cannot hold
/// (columns not whole blocks) are skipped.
pub fn run(cfg: &KernelBenchConfig, op: PeakOp) -> Vec<KernelRow> {
    let mut out = Vec::new();
    let before = kernels::threading();
    if cfg.one_thread {
        kernels::set_threading(kernels::Threading::Single);
    }
    for &f in &cfg.formats {
        for &(rows, cols) in &cfg.shapes {
            let Some(bytes) = f.matrix_bytes(rows, cols) else {
                continue;
            };
            let mats = matrices(f, rows, cols, cfg.working_set_bytes.div_ceil(bytes).max(2));
            let variants = variants(f, cfg.compare_tiles);
            for &n in &cfg.batches {
                let shape = Shape { rows, cols, n };
                out.extend(measure(f, &mats, shape, &variants, cfg, op));
            }
        }
    }
    set_variant(Variant::Default);
    kernels::set_threading(before);
    out
}

/// One call's shape: `rows x cols` weights, `n` activation rows.
#[derive(Clone, Copy)]
struct Shape {
    rows: usize,
    cols: usize,
    n: usize,
}

/// The rows of [`run`] for one format and shape: one per variant (the
/// [`set_variant`] choice), each repetition running the peak and
/// then every variant in turn.
fn measure(
    f: KernelFormat,
    mats: &[Matrix],
    s: Shape,
    variants: &[Variant],
    cfg: &KernelBenchConfig,
    op: PeakOp,
) -> Vec<KernelRow> {
    let x: Vec<f32> = (0..s.n * s.cols).map(activation).collect();
    let mut y = vec![0f32; s.n * s.rows];
    let macs = s.rows * s.cols * s.n;
    let calls = KERNEL_MACS_PER_REP.div_ceil(macs.max(1)).max(1);
    let mut i = 0;
    let mut call = |y: &mut [f32]| {
        i = (i + 1) % mats.len();
        mats[i].matmul(f, s.rows, s.cols, black_box(&x), s.n, y);
    };
    let threads = if cfg.one_thread { 1 } else { pool::threads() };
    let mut rows: Vec<(Vec<f64>, Vec<f64>, Vec<f64>)> = vec![Default::default(); variants.len()];
    for &v in variants {
        set_variant(v);
        call(&mut y); // warm-up: scratch buffers sized, pool awake
    }
    for _ in 0..cfg.reps {
        let p = peak_gmacs(op, threads);
        for (&v, (gmacs, peaks, of_peak)) in variants.iter().zip(rows.iter_mut()) {
            set_variant(v);
            let clock = Clock::start(cfg.one_thread);
            for _ in 0..calls {
                call(&mut y);
            }
            let g = (calls * macs) as f64 / clock.seconds() / 1e9;
            black_box(&y);
            gmacs.push(g);
            peaks.push(p);
            of_peak.push(g / p);
        }
    }
    variants
        .iter()
        .zip(rows)
        .map(|(&v, (gmacs, peaks, of_peak))| KernelRow {
            format: match v {
                Variant::Default => f.name(),
                Variant::Panels => format!("{} (panels)", f.name()),
                Variant::Tiles if matches!(f, KernelFormat::Grouped(_)) => {
                    format!("{} (dots)", f.name())
                }
                Variant::Tiles => format!("{} (tiles)", f.name()),
                Variant::PerRow => format!("{} (per-row)", f.name()),
            },
            rows: s.rows,
            cols: s.cols,
            n: s.n,
            gmacs: median(&gmacs),
            peak_gmacs: median(&peaks),
            of_peak,
        })
        .collect()
}

/// A kernel a bench row runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    /// The default kernels (int8/int4 on the AMX tiles where the CPU has
    /// them, else the measured faster of the panels and the tiles; GGUF
    /// Q4_0/Q4_K on the repacked tiles).
    Default,
    /// int8/int4 on the panels (VNNI or AVX2).
    Panels,
    /// int8/int4 on the register tiles, the kernels before the panels.
    Tiles,
    /// GGUF Q4_0/Q4_K on the per-row dots, before the repacked tiles.
    PerRow,
}

/// The kernels a row of format `f` compares (`compare`: the ones before
/// the default too).
fn variants(f: KernelFormat, compare: bool) -> Vec<Variant> {
    match f {
        _ if !compare => vec![Variant::Default],
        KernelFormat::Int(_) | KernelFormat::Grouped(_) => {
            vec![Variant::Default, Variant::Panels, Variant::Tiles]
        }
        KernelFormat::Ggml(
            BlockType::Q4K | BlockType::Q5K | BlockType::Q6K | BlockType::Q3K | BlockType::Q2K,
        ) => vec![Variant::Default, Variant::Panels, Variant::PerRow],
        KernelFormat::Ggml(BlockType::Q4_0) => vec![Variant::Default, Variant::PerRow],
        KernelFormat::Ggml(_) => vec![Variant::Default],
    }
}

/// Switches the process-wide kernel choices to `v`.
fn set_variant(v: Variant) {
    kernels::set_batch_kernel(match v {
        Variant::Panels => kernels::BatchChoice::Panels,
        Variant::Tiles => kernels::BatchChoice::Tiles,
        Variant::Default | Variant::PerRow => kernels::BatchChoice::Measured,
    });
    ggml::set_tiled(v != Variant::PerRow);
}

/// One weight matrix of the bench.
struct Matrix {
    data: Vec<u8>,
    /// Per-row scales (per-row formats).
    scales: Vec<f32>,
    /// f16 group parameters (grouped formats).
    params: Vec<u16>,
}

impl Matrix {
    fn matmul(
        &self,
        f: KernelFormat,
        rows: usize,
        cols: usize,
        x: &[f32],
        n: usize,
        y: &mut [f32],
    ) {
        match f {
            KernelFormat::Int(b) => {
                quant::matmul_int(b, &self.data, &self.scales, rows, cols, x, n, y)
            }
            KernelFormat::Ggml(t) => ggml::matmul(t, &self.data, rows, cols, x, n, y),
            KernelFormat::Grouped(g) => {
                grouped::matmul_int(g, &self.data, &self.params, rows, cols, x, n, y)
            }
        }
    }
}

/// `count` distinct random matrices of format `f`.
fn matrices(f: KernelFormat, rows: usize, cols: usize, count: usize) -> Vec<Matrix> {
    let bytes = f.matrix_bytes(rows, cols).expect("checked by the caller");
    (0..count)
        .map(|k| {
            let mut data = random_bytes(bytes, k as u64 + 1);
            if let KernelFormat::Ggml(t) = f {
                finite_scales(t, &mut data);
            }
            let params = match f {
                KernelFormat::Grouped(g) => (0..rows * g.params_per_row(cols))
                    .map(|i| half::f16::from_f32(1e-3 * (1 + i % 7) as f32).to_bits())
                    .collect(),
                _ => Vec::new(),
            };
            Matrix {
                data,
                scales: (0..rows).map(|r| 1e-3 * (1 + r % 7) as f32).collect(),
                params,
            }
        })
        .collect()
}

/// Sets every f16 scale of `ty` blocks to a small finite value (random
/// bytes elsewhere are valid levels).
pub fn finite_scales(ty: BlockType, w: &mut [u8]) {
    let bb = ty.block_bytes();
    let scale_at: &[usize] = match ty {
        BlockType::Q4_0 | BlockType::Q8_0 | BlockType::Q5_0 => &[0],
        BlockType::IQ4NL | BlockType::IQ4XS => &[0],
        BlockType::Q4K | BlockType::Q5K | BlockType::Q5_1 => &[0, 2],
        BlockType::Q6K | BlockType::Q3K => &[bb - 2],
        BlockType::Q2K => &[bb - 4, bb - 2],
    };
    for blk in w.chunks_exact_mut(bb) {
        for &at in scale_at {
            blk[at + 1] = 0x1c | (blk[at + 1] & 0x80); // |d| in [2^-8, 2^-7)
        }
    }
}

/// Cheap deterministic bytes (xorshift64*).
pub fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        out.extend_from_slice(&s.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(n);
    out
}

/// A deterministic activation in [-1, 1).
fn activation(i: usize) -> f32 {
    ((i.wrapping_mul(2_654_435_761) % 2000) as f32) / 1000.0 - 1.0
}

/// Median of a non-empty list.
fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_and_name_round_trip() {
        for name in ["int4", "int8", "q4_0", "q4_k", "q8_0"] {
            let f = KernelFormat::parse(name).expect(name);
            assert_eq!(f.name(), name);
        }
        assert_eq!(KernelFormat::parse("int3"), None);
    }

    #[test]
    fn a_tiny_run_reports_every_row() {
        let Some(op) = PeakOp::detect() else {
            eprintln!("skipped: no AVX2 on this CPU");
            return;
        };
        let cfg = KernelBenchConfig {
            formats: vec![
                KernelFormat::Int(QBits::Int4),
                KernelFormat::Ggml(BlockType::Q4K),
            ],
            shapes: vec![(8, 64), (8, 256)],
            batches: vec![4],
            reps: 1,
            working_set_bytes: 1 << 12,
            compare_tiles: true,
            one_thread: true,
        };
        let rows = run(&cfg, op);
        // Three variants of each int4 row and of Q4_K's (default, VNNI panels, per-row dots);
        // Q4_K blocks are 256 columns, so its 64-column shape is skipped.
        let names: Vec<_> = rows.iter().map(|r| (r.format.as_str(), r.cols)).collect();
        let int4 = ["int4", "int4 (panels)", "int4 (tiles)"];
        let mut want: Vec<_> = [64, 256]
            .iter()
            .flat_map(|&c| int4.iter().map(move |&f| (f, c)))
            .collect();
        want.extend([
            ("q4_k", 256),
            ("q4_k (panels)", 256),
            ("q4_k (per-row)", 256),
        ]);
        assert_eq!(names, want);
        assert!(rows.iter().all(|r| r.gmacs > 0.0 && r.of_peak.len() == 1));
        assert!(peak_gmacs(op, 1) > 0.0);
    }
}
