//! Compute kernels. Each format lives in its own folder with the scalar
//! reference (always compiled) beside its SIMD versions; the best version is
//! picked once at run time from the CPU's features ([`cpu`]). [`quant`]
//! drives the int8/int4/int2 dots ([`int8`], [`int4`], [`int2`]) over whole
//! matrices. Every matmul splits its output rows into blocks run by
//! [`par_row_blocks`] on the hot worker pool ([`pool`]); a row's result never
//! depends on the split or the thread, so threading is invisible in the
//! numbers.

pub mod attn;
pub mod bf16;
pub mod cpu;
pub mod f32;
pub mod ggml;
pub mod grouped;
pub mod int2;
pub mod int4;
pub mod int8;
pub mod pool;
pub mod quant;
/// Whether `xsum[t]` is the sum of activation row `t` (rows of `stride`
/// bytes): the batched integer dots' contract, checked in debug builds.
pub(crate) fn xsums_hold(x: &[i8], stride: usize, xsum: &[i32]) -> bool {
    xsum.iter().enumerate().all(|(t, &s)| {
        s == x[t * stride..(t + 1) * stride]
            .iter()
            .map(|&v| i32::from(v))
            .sum::<i32>()
    })
}

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod panel256;
#[cfg(target_arch = "x86_64")]
mod panel512;
#[cfg(target_arch = "x86_64")]
mod race;
#[cfg(target_arch = "x86_64")]
mod tile256;
#[cfg(target_arch = "x86_64")]
mod tile512;

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::atomic::{AtomicU8, Ordering};

/// Below this many multiply-adds a product runs on the calling thread.
const PARALLEL_MACS_MIN: usize = 1 << 18;
/// Weight bytes one block of rows aims at (a few pages: long enough for the
/// prefetchers, short enough to balance two to a few dozen threads).
const BLOCK_BYTES: usize = 16 << 10;

/// Who runs the row blocks of a large product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Threading {
    /// The hot worker pool ([`pool`]): the default.
    Pool,
    /// The calling thread only.
    Single,
}

static THREADING: AtomicU8 = AtomicU8::new(0);

/// Index of the largest logit (first on ties, as torch.argmax).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in logits.iter().enumerate() {
        if *v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Fewest activation rows the int8/int4 batched dots repack their weight
/// block into panels for (AVX-512 VNNI: `kernels::panel512`, and the AMX
/// tiles that read the same panels; AVX2: `kernels::panel256`): below it
/// the repack is not paid back and the register tiles (`tile512`,
/// `tile256`) run.
pub const PANEL_ACTS_MIN: usize = 24;

/// The kernel of the int8/int4 batched dots of [`PANEL_ACTS_MIN`] or more
/// rows. All give the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchKernel {
    /// The AMX-INT8 tiles (`kernels::amx`).
    Amx,
    /// The panels: `kernels::panel512` on AVX-512 VNNI, `kernels::panel256`
    /// on AVX2.
    Panels,
    /// The register tiles, the kernels before the panels: 4×4 on AVX-512
    /// VNNI (`kernels::tile512`), 2×2 on AVX2 (`kernels::tile256`).
    Tiles,
}

/// The int8/int4 format a [`BatchKernel`] is chosen for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchFormat {
    Int8,
    Int4,
}

/// Who picks the [`BatchKernel`] ([`set_batch_kernel`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchChoice {
    /// The default: AMX where [`cpu::amx`] allows it, else the panels
    /// from the batch size on which they ran the format's blocks faster
    /// than the tiles on this CPU, timed once at first use
    /// ([`measured_panels_from`]), and the tiles below it.
    Measured,
    /// AMX where [`cpu::amx`] allows it, else the panels.
    Amx,
    /// The panels, even where AMX is there.
    Panels,
    /// The register tiles.
    Tiles,
}

static BATCH_KERNEL: AtomicU8 = AtomicU8::new(BatchChoice::Measured as u8);

/// Selects the [`BatchKernel`] of every later batched dot (process-wide):
/// a switch for side-by-side measurements (`moestream bench kernels
/// --compare-tiles`) and the twin tests.
pub fn set_batch_kernel(k: BatchChoice) {
    BATCH_KERNEL.store(k as u8, Ordering::Relaxed);
}

/// The current [`set_batch_kernel`] choice.
pub fn batch_choice() -> BatchChoice {
    match BATCH_KERNEL.load(Ordering::Relaxed) {
        0 => BatchChoice::Measured,
        1 => BatchChoice::Amx,
        2 => BatchChoice::Panels,
        _ => BatchChoice::Tiles,
    }
}

/// The kernel format `f`'s batched dots of `n` activation rows (at least
/// [`PANEL_ACTS_MIN`]) run now, by the [`set_batch_kernel`] choice; AMX
/// only where the CPU (and the `MOESTREAM_ISA` cap) has it.
pub fn batch_kernel(f: BatchFormat, n: usize) -> BatchKernel {
    match BATCH_KERNEL.load(Ordering::Relaxed) {
        0 | 1 if cpu::amx() => BatchKernel::Amx,
        0 => match measured_panels_from(f) {
            Some(from) if n >= from => BatchKernel::Panels,
            _ => BatchKernel::Tiles,
        },
        1 | 2 => BatchKernel::Panels,
        _ => BatchKernel::Tiles,
    }
}

/// The fewest activation rows from which the panels run format `f`'s
/// blocks faster than the tiles on this CPU (`kernels::race`; `None`: at
/// no batch raced), timed once per process and format: some 20 ms on the
/// first batched dot.
pub fn measured_panels_from(f: BatchFormat) -> Option<usize> {
    use std::sync::OnceLock;
    static FROM: [OnceLock<Option<usize>>; 2] = [OnceLock::new(), OnceLock::new()];
    match f {
        BatchFormat::Int8 => *FROM[0].get_or_init(int8::race_panels_and_tiles),
        BatchFormat::Int4 => *FROM[1].get_or_init(int4::race_panels_and_tiles),
    }
}

/// Selects who runs the row blocks of every later product (process-wide).
pub fn set_threading(t: Threading) {
    THREADING.store(t as u8, Ordering::Relaxed);
}

/// The current [`Threading`].
pub fn threading() -> Threading {
    match THREADING.load(Ordering::Relaxed) {
        0 => Threading::Pool,
        _ => Threading::Single,
    }
}

/// A block of output rows of `Y (n, rows)` that one task owns: it may write
/// `Y[t, r]` for every `t < n` and `r` in [`RowBlock::rows`], nothing else.
pub struct RowBlock<'a> {
    y: *mut f32,
    rows_total: usize,
    n: usize,
    range: Range<usize>,
    _y: PhantomData<&'a mut [f32]>,
}

impl RowBlock<'_> {
    /// The weight rows of this block.
    pub fn rows(&self) -> Range<usize> {
        self.range.clone()
    }

    /// `Y[t, r] = v`.
    #[inline]
    pub fn set(&mut self, t: usize, r: usize, v: f32) {
        assert!(
            t < self.n && self.range.contains(&r),
            "write outside the block"
        );
        // SAFETY: `y` points at `n * rows_total` floats (checked in
        // `par_row_blocks`) and t < n, r < rows_total; blocks own disjoint row
        // ranges, so no other task writes this element while the `&mut [f32]`
        // behind `y` is lent out.
        unsafe { *self.y.add(t * self.rows_total + r) = v };
    }

    /// `Y[t, rows()]`: this block's part of output row `t`.
    #[inline]
    pub fn out_row(&mut self, t: usize) -> &mut [f32] {
        assert!(t < self.n, "write outside the block");
        // SAFETY: `y` points at `n * rows_total` floats (checked in
        // `par_row_blocks`), t < n and the range lies within rows_total; blocks
        // own disjoint row ranges, so no other task touches these elements
        // while the `&mut [f32]` behind `y` is lent out, and `&mut self` keeps
        // this borrow unique within the block.
        unsafe {
            let start = self.y.add(t * self.rows_total + self.range.start);
            std::slice::from_raw_parts_mut(start, self.range.len())
        }
    }
}

/// Raw output pointer shared by the blocks of one product.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: the blocks of one product write disjoint elements (see `RowBlock`),
// and `par_row_blocks` holds the `&mut` borrow until every block is done.
unsafe impl Sync for OutPtr {}
// SAFETY: as for `Sync`.
unsafe impl Send for OutPtr {}

impl OutPtr {
    /// The pointer (a method, so closures capture the whole `Sync` wrapper).
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Runs `body(t0, rows)` over `y` (rows of `row_len` floats) in groups of
/// `group` rows (`rows` is rows `t0..`, the last group may be short), one
/// task a group on the current [`Threading`] when the caller's work
/// reaches 2^18 multiply-adds (`macs`), else on the calling thread in
/// order. Each call owns its rows; groups may cost different amounts (the
/// pool hands them out one at a time). For per-row work that is not a
/// weight product (attention over a cache).
pub fn par_row_groups(
    y: &mut [f32],
    (row_len, group): (usize, usize),
    macs: usize,
    body: impl Fn(usize, &mut [f32]) + Sync,
) {
    assert!(
        row_len > 0 && group > 0 && y.len().is_multiple_of(row_len),
        "whole rows"
    );
    let rows = y.len() / row_len;
    let groups = rows.div_ceil(group);
    if macs < PARALLEL_MACS_MIN || groups <= 1 || threading() == Threading::Single {
        for (g, part) in y.chunks_mut(group * row_len).enumerate() {
            body(g * group, part);
        }
        return;
    }
    let out = OutPtr(y.as_mut_ptr());
    pool::run(groups, &|g| {
        let (t0, t1) = (g * group, ((g + 1) * group).min(rows));
        // SAFETY: `t0 < t1 <= rows`, so the rows lie within `y`; the pool
        // runs each `g` once and groups do not overlap, so no two calls
        // share a row, and `y`'s `&mut` borrow is held until `run`
        // returns, after every call.
        let part = unsafe {
            std::slice::from_raw_parts_mut(out.get().add(t0 * row_len), (t1 - t0) * row_len)
        };
        body(t0, part);
    });
}

/// Splits the `rows` output rows of `Y (n, rows)` into blocks of about
/// 16 KiB of weights (`row_bytes` per row) and runs `body` on each, on the
/// current [`Threading`] when `rows · cols · n` reaches 2^18 multiply-adds
/// (else on the calling thread).
pub fn par_row_blocks(
    rows: usize,
    cols: usize,
    n: usize,
    row_bytes: usize,
    y: &mut [f32],
    body: impl Fn(&mut RowBlock<'_>) + Sync,
) {
    par_row_blocks_aligned(rows, cols, n, row_bytes, 1, y, body)
}

/// [`par_row_blocks`] with every block but the last a whole multiple of
/// `rows_multiple` rows (for kernels that work in tiles of that many rows).
pub fn par_row_blocks_aligned(
    rows: usize,
    cols: usize,
    n: usize,
    row_bytes: usize,
    rows_multiple: usize,
    y: &mut [f32],
    body: impl Fn(&mut RowBlock<'_>) + Sync,
) {
    assert_eq!(y.len(), n * rows, "output shape");
    let out = OutPtr(y.as_mut_ptr());
    let parallel = rows * cols * n >= PARALLEL_MACS_MIN;
    let block_rows = if parallel {
        let rows = BLOCK_BYTES.div_ceil(row_bytes.max(1)).max(1);
        rows.next_multiple_of(rows_multiple.max(1))
    } else {
        rows.max(1)
    };
    let blocks = rows.div_ceil(block_rows);
    let run_block = |i: usize| {
        let range = i * block_rows..((i + 1) * block_rows).min(rows);
        body(&mut RowBlock {
            y: out.get(),
            rows_total: rows,
            n,
            range,
            _y: PhantomData,
        });
    };
    match (parallel, threading()) {
        (true, Threading::Pool) => pool::run(blocks, &run_block),
        _ => (0..blocks).for_each(run_block),
    }
}

/// `Y[t, r] = row_dot(r, X[t, :])` for `n` rows of `X` `(n, cols)` into `Y`
/// `(n, rows)`: the shared skeleton of the f32 and BF16 matmuls. Each weight
/// row is streamed once for all `n` inputs; row blocks go to
/// [`par_row_blocks`] (blocks sized as if the weights were f32).
pub fn matmul_rows(
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    row_dot: impl Fn(usize, &[f32]) -> f32 + Sync,
) {
    assert_eq!(x.len(), n * cols);
    par_row_blocks(rows, cols, n, cols * 4, y, |blk| {
        for r in blk.rows() {
            for t in 0..n {
                blk.set(t, r, row_dot(r, &x[t * cols..(t + 1) * cols]));
            }
        }
    });
}
