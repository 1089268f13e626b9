//! Tests of the repacked, tiled Q4_0/Q4_K dots and the K panels: the twins against the
//! per-row twin, the AVX2 tiles against the twins bit for bit (every tile
//! width, rows and blocks with tails), and `matmul` through the tiled path
//! against the per-row dots.

use super::tests::{prepared, random_weights, same, Rng};
use super::tile::{self, Acts40, Acts4k, Packed, TILE_ACTS};
use super::*;

const TYPES: [BlockType; 2] = [BlockType::Q4_0, BlockType::Q4K];

/// Column counts with odd and even block counts (Q4_0: lone last blocks).
fn cols_of(ty: BlockType) -> &'static [usize] {
    match ty {
        BlockType::Q4_0 => &[32, 64, 96, 160, 768, 2080],
        _ => &[256, 512, 768, 1280],
    }
}

/// Activations with one row at full scale of both signs (every level
/// against ±127) and one all zero.
fn activations(cols: usize, n: usize, seed: u64) -> Vec<f32> {
    let mut x = Rng::new(seed).floats(n * cols, 2.0);
    for (i, v) in x[..cols].iter_mut().enumerate() {
        *v = if i % 3 == 0 { -1e4 } else { 1e4 };
    }
    if n > 2 {
        x[cols..2 * cols].fill(0.0);
    }
    x
}

/// Each tiled twin and (where the CPU has it) each AVX2 tile width against
/// the per-row twin `scalar::vec_dot`, for every weight row and activation row.
fn check(ty: BlockType, w: &[u8], rows: usize, cols: usize, acts: &Activations, n: usize) {
    let rb = ty.row_bytes(cols).unwrap();
    let mut p = Packed::default();
    p.pack(ty, w, rb);
    let (mut a40, mut a4k) = (Acts40::default(), Acts4k::default());
    match ty {
        BlockType::Q4_0 => a40.prepare(acts, n, cols / 32),
        _ => a4k.prepare(acts, n, cols / 256),
    }
    for r in 0..rows {
        let pr = p.row(r);
        let want: Vec<f32> = (0..n)
            .map(|t| scalar::vec_dot(ty, &w[r * rb..(r + 1) * rb], &acts.row(t)))
            .collect();
        for (t, &want) in want.iter().enumerate() {
            let twin = match ty {
                BlockType::Q4_0 => tile::dot_q4_0(&pr, &a40.group(t / TILE_ACTS), t % TILE_ACTS),
                _ => tile::dot_q4_k(&pr, &a4k.group(t / TILE_ACTS), t % TILE_ACTS),
            };
            assert!(
                same(twin, want),
                "{} {rows}x{cols} row {r} act {t}: tiled twin {twin} vs per-row {want}",
                ty.name()
            );
        }
        #[cfg(target_arch = "x86_64")]
        if cpu::has_avx2() {
            check_avx2(ty, &pr, (&a40, &a4k), &want, r);
        }
    }
}

/// The AVX2 tile over every group of activation rows (the padding rows
/// of the last group are not compared).
#[cfg(target_arch = "x86_64")]
fn check_avx2(
    ty: BlockType,
    pr: &tile::PackedRow,
    (a40, a4k): (&Acts40, &Acts4k),
    want: &[f32],
    r: usize,
) {
    for g in 0..want.len().div_ceil(TILE_ACTS) {
        // SAFETY: the caller saw AVX2.
        let got = unsafe {
            match ty {
                BlockType::Q4_0 => tile_avx2::q4_0(pr, &a40.group(g)),
                _ => tile_avx2::q4_k(pr, &a4k.group(g)),
            }
        };
        for (i, &w) in want[g * TILE_ACTS..].iter().take(TILE_ACTS).enumerate() {
            let t = g * TILE_ACTS + i;
            assert!(
                same(got[i], w),
                "{} row {r} act {t}: avx2 {} vs twin {w}",
                ty.name(),
                got[i]
            );
        }
    }
}

#[test]
fn tiled_dots_equal_the_per_row_twin() {
    for ty in TYPES {
        for &cols in cols_of(ty) {
            for (rows, n) in [(1, 1), (3, 5), (7, 9)] {
                let seed = (cols * 31 + rows) as u64;
                let w = random_weights(ty, rows, cols, seed);
                let acts = prepared(ty, cols, &activations(cols, n, seed + 1), n);
                check(ty, &w, rows, cols, &acts, n);
            }
        }
    }
}

#[test]
fn tiled_dots_equal_the_twin_at_extreme_levels() {
    for ty in TYPES {
        let cols = cols_of(ty)[2];
        let (rows, n) = (4, 6);
        let mut w = random_weights(ty, rows, cols, 5);
        // Row 0 every level 15, row 1 every level 0 (scales as drawn).
        let (at, bb) = match ty {
            BlockType::Q4_0 => (2, 18),
            _ => (16, 144),
        };
        for (i, blk) in w.chunks_exact_mut(bb).enumerate() {
            let row = i / (ty.row_bytes(cols).unwrap() / bb);
            if row < 2 {
                blk[at..].fill(if row == 0 { 0xFF } else { 0x00 });
            }
        }
        let acts = prepared(ty, cols, &activations(cols, n, 9), n);
        check(ty, &w, rows, cols, &acts, n);
    }
}

/// `matmul` through the tiled path (on, forced) against the per-row twin.
#[test]
fn tiled_matmul_equals_the_per_row_dots() {
    for ty in TYPES {
        for (rows, cols, n) in [
            (5, cols_of(ty)[3], 8),
            (33, 768, 11),
            (301, 2048, 9),
            (64, 2048, 30),
        ] {
            let w = random_weights(ty, rows, cols, (rows + cols + n) as u64);
            let x = activations(cols, n, n as u64);
            matmul_is_the_twin(ty, &w, rows, cols, &x, n);
        }
    }
}

/// `matmul` of the K types from 12 activation rows (the AVX-512 VNNI
/// panels where the CPU has them, and the AMX tiles from 48 rows unless
/// the batch-kernel switch asks for the panels) against the per-row
/// twin: panels with short last blocks, tiles with tails, one row at full
/// scale, one all zero, and rows of all-top and all-zero levels.
#[test]
fn k_panel_matmul_equals_the_per_row_twin() {
    const K_TYPES: [BlockType; 5] = [
        BlockType::Q4K,
        BlockType::Q5K,
        BlockType::Q6K,
        BlockType::Q3K,
        BlockType::Q2K,
    ];
    use crate::kernels::{set_batch_kernel, BatchChoice};
    for (ty, choice) in K_TYPES
        .into_iter()
        .flat_map(|ty| [(ty, BatchChoice::Measured), (ty, BatchChoice::Panels)])
    {
        set_batch_kernel(choice);
        for (rows, cols, n) in [
            (5, 256, 24),
            (33, 768, 27),
            (301, 2048, 30),
            (16, 512, 25),
            (7, 512, 13),
            (20, 256, 12),
            (33, 768, 50),
            (17, 512, 64),
        ] {
            let mut w = random_weights(ty, rows, cols, (rows * 7 + cols + n) as u64);
            let rb = ty.row_bytes(cols).unwrap();
            // Row 0: every level byte 0xFF; row 1: every level byte 0.
            let bb = ty.block_bytes();
            for (i, blk) in w[..2 * rb].chunks_exact_mut(bb).enumerate() {
                let fill = if i < rb / bb { 0xFF } else { 0x00 };
                for (at, b) in blk.iter_mut().enumerate() {
                    if level_byte(ty, at) {
                        *b = fill;
                    }
                }
            }
            let x = activations(cols, n, n as u64 + 3);
            matmul_is_the_twin(ty, &w, rows, cols, &x, n);
        }
    }
    set_batch_kernel(BatchChoice::Measured);
}

/// Whether byte `at` of a `ty` super-block holds levels (not scales).
fn level_byte(ty: BlockType, at: usize) -> bool {
    match ty {
        BlockType::Q4K => at >= 16,
        BlockType::Q5K => at >= 16,
        BlockType::Q6K => at < 192,
        BlockType::Q3K => at < 96,
        BlockType::Q2K => (16..80).contains(&at),
        _ => false,
    }
}

/// `matmul` of `x` (`n` rows) by `w` against the per-row twin, element by
/// element.
fn matmul_is_the_twin(ty: BlockType, w: &[u8], rows: usize, cols: usize, x: &[f32], n: usize) {
    let mut y = vec![f32::NAN; n * rows];
    matmul(ty, w, rows, cols, x, n, &mut y);
    let acts = prepared(ty, cols, x, n);
    let rb = ty.row_bytes(cols).unwrap();
    for t in 0..n {
        for r in 0..rows {
            let want = scalar::vec_dot(ty, &w[r * rb..(r + 1) * rb], &acts.row(t));
            let got = y[t * rows + r];
            assert!(
                same(got, want),
                "{} {rows}x{cols} n={n} [{t},{r}]: {got} vs {want}",
                ty.name()
            );
        }
    }
}
