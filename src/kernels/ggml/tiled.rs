//! The tiled GGUF matmul: which calls take the repacked, tiled Q4_0/Q4_K
//! dots ([`super::tile`], layouts and scalar twins; [`super::tile_avx2`],
//! the AVX2 tiles), and the loop that runs them over a call's row blocks.

use super::tile::{Acts40, Acts4k, Packed, PackedRow, TILE_ACTS, TILE_ACTS_MIN};
use super::{Activations, BlockType};
use crate::kernels::{par_row_blocks, RowBlock};
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};

static TILED: AtomicBool = AtomicBool::new(true);

/// Whether GGUF products of many rows take the repacked kernels (`true`,
/// the default: Q4_0/Q4_K tiles on AVX2 from [`TILE_ACTS_MIN`] rows, the
/// K types' panels on AVX-512 VNNI, `kpanel`) or the per-row dots: a
/// process-wide switch for side-by-side measurements (`moestream bench
/// kernels --compare-tiles`). Both give the same bits.
pub fn set_tiled(on: bool) {
    TILED.store(on, Ordering::Relaxed);
}

/// The current [`set_tiled`] choice.
pub fn tiled() -> bool {
    TILED.load(Ordering::Relaxed)
}

/// Whether a call of `n` activation rows of `ty` weights runs here.
pub(super) fn takes(ty: BlockType, n: usize) -> bool {
    tiled()
        && n >= TILE_ACTS_MIN
        && matches!(ty, BlockType::Q4_0 | BlockType::Q4K)
        && kernel() == Kernel::Avx2
}

/// Which tile kernels run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kernel {
    Scalar,
    Avx2,
}

/// The AVX2 tiles where `matmul` runs its AVX2 dots, else the twins.
fn kernel() -> Kernel {
    #[cfg(target_arch = "x86_64")]
    if super::simd() == super::Simd::Avx2 {
        return Kernel::Avx2;
    }
    Kernel::Scalar
}

thread_local! {
    /// This thread's repacked block of weight rows, reused across calls.
    static PACKED: RefCell<Packed> = RefCell::new(Packed::default());
    /// The caller's activations in the tiled layout (Q4_0 or Q4_K).
    static TILED_ACTS: RefCell<(Acts40, Acts4k)> = RefCell::new(Default::default());
}

/// `matmul`'s tiled path: `acts` holds the call's `n` prepared rows.
pub(super) fn matmul(
    ty: BlockType,
    w: &[u8],
    rows: usize,
    cols: usize,
    acts: &Activations,
    n: usize,
    y: &mut [f32],
) {
    let rb = ty.row_bytes_checked(cols);
    let k = kernel();
    TILED_ACTS.with_borrow_mut(|(a40, a4k)| {
        match ty {
            BlockType::Q4_0 => a40.prepare(acts, n, cols / ty.block_elems()),
            _ => a4k.prepare(acts, n, cols / ty.block_elems()),
        }
        let tiled = (&*a40, &*a4k);
        par_row_blocks(rows, cols, n, rb, y, |blk| {
            PACKED.with_borrow_mut(|p| {
                let rs = blk.rows();
                p.pack(ty, &w[rs.start * rb..rs.end * rb], rb);
                run_block(k, ty, p, tiled, n, blk);
            })
        });
    });
}

/// Every activation row against every row of the repacked block `p`,
/// [`TILE_ACTS`] activation rows a tile, the weight rows inner.
fn run_block(
    k: Kernel,
    ty: BlockType,
    p: &Packed,
    (a40, a4k): (&Acts40, &Acts4k),
    n: usize,
    blk: &mut RowBlock<'_>,
) {
    let rs = blk.rows();
    let mut t0 = 0;
    while t0 < n {
        let m = (n - t0).min(TILE_ACTS);
        for (i, r) in rs.clone().enumerate() {
            let w = p.row(i);
            let mut out = [0f32; TILE_ACTS];
            match ty {
                BlockType::Q4_0 => tile_q4_0(k, &w, a40, t0, &mut out[..m]),
                _ => tile_q4_k(k, &w, a4k, t0, &mut out[..m]),
            }
            for (t, &v) in out[..m].iter().enumerate() {
                blk.set(t0 + t, r, v);
            }
        }
        t0 += m;
    }
}

/// Q4_0 row `w` against activation rows `t0..t0 + out.len()` (`t0` a
/// multiple of [`TILE_ACTS`]).
fn tile_q4_0(k: Kernel, w: &PackedRow, a40: &Acts40, t0: usize, out: &mut [f32]) {
    let a = a40.group(t0 / TILE_ACTS);
    #[cfg(target_arch = "x86_64")]
    if k == Kernel::Avx2 {
        // SAFETY: `Kernel::Avx2` is picked only where the CPU has AVX2.
        let all = unsafe { super::tile_avx2::q4_0(w, &a) };
        out.copy_from_slice(&all[..out.len()]);
        return;
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = super::tile::dot_q4_0(w, &a, i);
    }
}

/// Q4_K row `w` against activation rows `t0..t0 + out.len()` (`t0` a
/// multiple of [`TILE_ACTS`]).
fn tile_q4_k(k: Kernel, w: &PackedRow, a4k: &Acts4k, t0: usize, out: &mut [f32]) {
    let a = a4k.group(t0 / TILE_ACTS);
    #[cfg(target_arch = "x86_64")]
    if k == Kernel::Avx2 {
        // SAFETY: `Kernel::Avx2` is picked only where the CPU has AVX2.
        let all = unsafe { super::tile_avx2::q4_k(w, &a) };
        out.copy_from_slice(&all[..out.len()]);
        return;
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = super::tile::dot_q4_k(w, &a, i);
    }
}
