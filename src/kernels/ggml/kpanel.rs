//! The prefill kernel of the K types (Q4_K, Q5_K, Q6_K, Q3_K, Q2_K) on
//! AVX-512 VNNI, for calls of [`ACTS_MIN`] or more activation rows. Each
//! block of weight rows is unpacked once per call (row by row, so the
//! weights stream in order) into panels of 16 rows ([`Panel`]): per
//! super-block, 64 vectors of levels (vector `q` holds activation positions
//! `4q‥4q + 4` of each row, unsigned, in the activation row's order), the
//! sub-block scales as i32 (one vector a run of positions that share a
//! scale), eight vectors of i16 pairs for the
//! `bsums` term, and `d_w`, `dmin_w`. Then [`TILE_ACTS`] activation rows
//! at a time meet the panel: one `vpdpbusd` a level vector and row (the
//! row's four activations broadcast) sums each run exactly, `vpmulld`
//! scales it into the super-block's `P`, eight `vpdpwssd` give the `bsums`
//! term (the mins' `M`, or for Q6_K/Q3_K the bias `Σ bias·sc_j·X_j` that
//! `P` subtracts), and the super-block's two f32 steps follow the twin
//! (`scalar`: `s + (P as f32)·(d_w·d_x)`, `t + (M as f32)·(dmin_w·d_x)`),
//! sixteen weight rows a vector. On AMX (Q4_K/Q5_K from [`AMX_ACTS_MIN`]
//! rows, [`engine`]) one `tdpbsud` sums a run for 16 activation rows at
//! once instead. The integers are exact, so the results are the per-row
//! dots' bits.

use super::avx512::k_levels;
use super::codec::{f16_to_f32, le16, q2_k, q3_k, q4_k, q6_k, scales_k4, scales_q3, QK_K};
use super::scalar::{kmin_pos, ActRow};
use super::{Activations, BlockType};
use crate::kernels::amx::{multiply, Sums, TileConfig};
use crate::kernels::panel512::{load_transposed, PANEL_ROWS};
use crate::kernels::{par_row_blocks_aligned, RowBlock};
use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Fewest activation rows a call takes the panels for: from 12 they
/// matched or beat the per-row dots in every K type and expert shape
/// measured (`bench kernels --compare-tiles`, results/kernels.md); at 8
/// the unpacking costs more than it saves.
const ACTS_MIN: usize = 12;
/// Activation rows one VNNI panel pass serves.
const TILE_ACTS: usize = 8;
/// Fewest activation rows a call takes AMX for (see [`engine`]).
const AMX_ACTS_MIN: usize = 48;
/// Activation rows of one AMX A tile.
const AMX_ROWS: usize = 16;
/// Runs multiplied (one accumulator tile each) before their sums are
/// stored.
const ROUND: usize = 4;
/// Level vectors of one super-block (four positions each).
const QUADS: usize = QK_K / 4;
/// `bsums` pairs of one super-block.
const PAIRS: usize = 8;

/// How a K type's super-block splits into runs of one scale.
#[derive(Clone, Copy)]
struct Shape {
    /// Runs (sub-blocks) a super-block.
    runs: usize,
    /// Level vectors a run.
    quads: usize,
    /// Whether the `bsums` term is the mins' `M` (else a bias `P` drops).
    mins: bool,
}

impl Shape {
    fn of(ty: BlockType) -> Shape {
        match ty {
            BlockType::Q4K | BlockType::Q5K => Shape {
                runs: 8,
                quads: 8,
                mins: true,
            },
            BlockType::Q2K => Shape {
                runs: 16,
                quads: 4,
                mins: true,
            },
            BlockType::Q6K | BlockType::Q3K => Shape {
                runs: 16,
                quads: 4,
                mins: false,
            },
            _ => unreachable!("{}: not a K type", ty.name()),
        }
    }
}

/// Whether a call of `n` activation rows of `ty` weights runs here.
pub(super) fn takes(ty: BlockType, n: usize) -> bool {
    super::tiled::tiled()
        && n >= ACTS_MIN
        && matches!(
            ty,
            BlockType::Q4K | BlockType::Q5K | BlockType::Q6K | BlockType::Q3K | BlockType::Q2K
        )
        && super::simd() == super::Simd::Vnni
}

/// One super-block of one row, its integer parameters in run order: the
/// run scales, the `bsums` pairs (each against `(bsums[2k], bsums[2k +
/// 1])`), `d_w` and `dmin_w`.
struct RowParams {
    sc: [i32; 16],
    pairs: [[i16; 2]; PAIRS],
    d: [f32; 2],
}

fn row_params(ty: BlockType, blk: &[u8]) -> RowParams {
    let f16 = |at: usize| f16_to_f32(le16(blk, at));
    match ty {
        BlockType::Q4K | BlockType::Q5K => {
            let (sc, m) = scales_k4(&blk[q4_k::SCALES..q4_k::SCALES + 12]);
            // Run r (positions 32r‥) holds the sub-block that the permuted
            // activation layout puts there; the permutation of runs is its
            // own inverse, so `kmin_pos` of run r's start names it.
            RowParams {
                sc: std::array::from_fn(|r| {
                    if r < 8 {
                        sc[kmin_pos(32 * r) / 32] as i32
                    } else {
                        0
                    }
                }),
                pairs: std::array::from_fn(|k| [m[k] as i16; 2]),
                d: [f16(q4_k::D), f16(q4_k::DMIN)],
            }
        }
        BlockType::Q6K | BlockType::Q3K => {
            let (sc, bias, d): ([i8; 16], i16, usize) = if ty == BlockType::Q6K {
                let sc = std::array::from_fn(|j| blk[q6_k::SCALES + j] as i8);
                (sc, 32, q6_k::D)
            } else {
                (scales_q3(&blk[q3_k::SCALES..q3_k::D]), 4, q3_k::D)
            };
            RowParams {
                sc: sc.map(|s| s as i32),
                pairs: std::array::from_fn(|k| {
                    [bias * sc[2 * k] as i16, bias * sc[2 * k + 1] as i16]
                }),
                d: [f16(d), 0.0],
            }
        }
        BlockType::Q2K => {
            let s = &blk[q2_k::SCALES..q2_k::QS];
            RowParams {
                sc: std::array::from_fn(|j| (s[j] & 15) as i32),
                pairs: std::array::from_fn(|k| {
                    [(s[2 * k] >> 4) as i16, (s[2 * k + 1] >> 4) as i16]
                }),
                d: [f16(q2_k::D), f16(q2_k::DMIN)],
            }
        }
        _ => unreachable!("{}: not a K type", ty.name()),
    }
}

/// Up to 16 weight rows unpacked (module doc); rows past the block's are
/// zero.
#[derive(Default)]
struct Panel {
    /// `QUADS` level vectors a super-block.
    lev: Vec<__m512i>,
    /// `runs` scale vectors (i32) a super-block.
    sc: Vec<__m512i>,
    /// `PAIRS` vectors of i16 pairs a super-block.
    pairs: Vec<__m512i>,
    /// `d_w`, `dmin_w` a super-block.
    d: Vec<__m512>,
    /// Each row's levels in activation order, super-block by super-block
    /// (16 rows each).
    scratch: Vec<[u8; QK_K]>,
    /// Each super-block's parameters, row by row.
    staged: Vec<Staged>,
}

/// One super-block's [`RowParams`] of the panel's rows, as lanes.
#[derive(Clone, Copy, Default)]
struct Staged {
    sc: [[i32; PANEL_ROWS]; 16],
    pairs: [[[i16; 2]; PANEL_ROWS]; PAIRS],
    d: [[f32; PANEL_ROWS]; 2],
}

impl Panel {
    /// Unpacks rows `w` (`rows ≤ 16` whole rows of `nb` super-blocks,
    /// `rb` bytes each).
    ///
    /// # Safety
    /// The CPU must support AVX2 and AVX-512F/BW.
    #[target_feature(enable = "avx2,avx512f,avx512bw")]
    unsafe fn pack(&mut self, ty: BlockType, w: &[u8], rb: usize, rows: usize, nb: usize) {
        let shape = Shape::of(ty);
        let bb = ty.block_bytes();
        self.lev.resize(nb * QUADS, _mm512_setzero_si512());
        self.sc.resize(nb * shape.runs, _mm512_setzero_si512());
        self.pairs.resize(nb * PAIRS, _mm512_setzero_si512());
        self.d.resize(nb * 2, _mm512_setzero_ps());
        self.scratch.resize(nb * PANEL_ROWS, [0; QK_K]);
        self.staged.clear();
        self.staged.resize(nb, Staged::default());
        // Row by row, so each row's bytes stream in order.
        for l in 0..rows {
            let row = &w[l * rb..][..nb * bb];
            for (b, blk) in row.chunks_exact(bb).enumerate() {
                for (i, v) in k_levels(ty, blk).iter().enumerate() {
                    let out = &mut self.scratch[b * PANEL_ROWS + l][64 * i..64 * i + 64];
                    // SAFETY: `out` is 64 writable bytes.
                    unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast(), *v) };
                }
                let (p, st) = (row_params(ty, blk), &mut self.staged[b]);
                st.sc.iter_mut().zip(p.sc).for_each(|(v, s)| v[l] = s);
                st.pairs.iter_mut().zip(p.pairs).for_each(|(v, s)| v[l] = s);
                st.d.iter_mut().zip(p.d).for_each(|(v, s)| v[l] = s);
            }
        }
        for (b, st) in self.staged.iter().enumerate() {
            let rows_b = self.scratch[b * PANEL_ROWS..].as_ptr().cast::<u8>();
            for i in 0..4 {
                // SAFETY: the scratch holds `rows` rows of 256 bytes from
                // `rows_b`; the mask enables bytes 64i‥64i + 64 of each.
                let t = unsafe { load_transposed(rows_b, QK_K, rows, 64 * i, !0) };
                self.lev[b * QUADS + 16 * i..][..16].copy_from_slice(&t);
            }
            let (runs, at) = (shape.runs, b * shape.runs);
            for (v, sc) in self.sc[at..at + runs].iter_mut().zip(&st.sc) {
                // SAFETY: 16 i32.
                *v = unsafe { _mm512_loadu_si512(sc.as_ptr().cast()) };
            }
            for (v, p) in self.pairs[b * PAIRS..][..PAIRS].iter_mut().zip(&st.pairs) {
                // SAFETY: 16 pairs of i16, 64 bytes.
                *v = unsafe { _mm512_loadu_si512(p.as_ptr().cast()) };
            }
            for (v, d) in self.d[2 * b..2 * b + 2].iter_mut().zip(&st.d) {
                // SAFETY: 16 f32.
                *v = unsafe { _mm512_loadu_ps(d.as_ptr()) };
            }
        }
    }

    /// Super-block `b`'s f32 steps for one activation row `a` (its exact
    /// level sums `p` against the panel's rows): the `bsums` term by eight
    /// `vpdpwssd`, then `s`, `t` as the twin adds them.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    fn finish(
        &self,
        shape: Shape,
        b: usize,
        a: &ActRow,
        p: __m512i,
        s: &mut __m512,
        t: &mut __m512,
    ) {
        let mut m = _mm512_setzero_si512();
        let bs = &a.bsums[16 * b..16 * b + 16];
        for (pk, bs) in self.pairs[b * PAIRS..][..PAIRS]
            .iter()
            .zip(bs.chunks_exact(2))
        {
            let pair = (bs[0] as u16 as u32 | (bs[1] as u16 as u32) << 16) as i32;
            m = _mm512_dpwssd_epi32(m, *pk, _mm512_set1_epi32(pair));
        }
        let (dw, dmin) = (self.d[2 * b], self.d[2 * b + 1]);
        let dx = _mm512_set1_ps(a.d[b]);
        let f = _mm512_mul_ps(dw, dx);
        if shape.mins {
            *s = _mm512_add_ps(*s, _mm512_mul_ps(_mm512_cvtepi32_ps(p), f));
            let g = _mm512_mul_ps(dmin, dx);
            *t = _mm512_add_ps(*t, _mm512_mul_ps(_mm512_cvtepi32_ps(m), g));
        } else {
            let p = _mm512_sub_epi32(p, m);
            *s = _mm512_add_ps(*s, _mm512_mul_ps(_mm512_cvtepi32_ps(p), f));
        }
    }

    /// Activation rows `a` against the panel: the dots of each with the
    /// panel's 16 rows, as vectors.
    ///
    /// # Safety
    /// AVX-512F/BW/VNNI; each row of `a` holds `nb` super-blocks, and the
    /// panel was packed for `nb` super-blocks of `shape`'s type.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn tile<const R: usize>(&self, shape: Shape, nb: usize, a: &[ActRow; R]) -> [__m512; R] {
        let mut s = [_mm512_setzero_ps(); R];
        let mut t = s;
        let x: [*const i8; R] = std::array::from_fn(|i| a[i].qs.as_ptr());
        for b in 0..nb {
            let mut p = [_mm512_setzero_si512(); R];
            for r in 0..shape.runs {
                let mut acc = [_mm512_setzero_si512(); R];
                let q0 = b * QUADS + r * shape.quads;
                for q in q0..q0 + shape.quads {
                    let w = self.lev[q];
                    for (acc, x) in acc.iter_mut().zip(&x) {
                        // SAFETY: position 4q‥4q + 4 of the row lies inside its
                        // nb · 256 values (the caller's contract).
                        let v = unsafe { x.add(4 * q).cast::<i32>().read_unaligned() };
                        *acc = _mm512_dpbusd_epi32(*acc, w, _mm512_set1_epi32(v));
                    }
                }
                let sc = self.sc[b * shape.runs + r];
                for (p, acc) in p.iter_mut().zip(acc) {
                    *p = _mm512_add_epi32(*p, _mm512_mullo_epi32(acc, sc));
                }
            }
            for (i, (a, p)) in a.iter().zip(p).enumerate() {
                self.finish(shape, b, a, p, &mut s[i], &mut t[i]);
            }
        }
        std::array::from_fn(|i| _mm512_sub_ps(s[i], t[i]))
    }

    /// Activation rows `t0‥t0 + m` (`m ≤ 16`, rows `cols` apart from `x0`)
    /// against the panel on AMX: each run's exact sums for 16 × 16 pairs
    /// from one `tdpbsud` (A: the rows' run, B: the run's level vectors),
    /// [`ROUND`] runs to four accumulator tiles before their sums are
    /// stored, a round folded (`vpmulld` by its scales into `P`) after the
    /// next round's multiplies are issued; then [`Panel::finish`] row by
    /// row. The dots of row `i` and weight row `l` at `[i][l]`.
    ///
    /// # Safety
    /// AMX-TILE/INT8 with the permission, tiles 0‥7 configured for `m`
    /// rows and `4 · shape.quads` bytes a run; `x0` is row `t0` of `acts`
    /// and rows `t0‥t0 + m` hold `nb · 256` values each.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn amx_tile(
        &self,
        shape: Shape,
        nb: usize,
        acts: &Activations,
        x0: *const i8,
        cols: usize,
        t0: usize,
        m: usize,
    ) -> [[f32; PANEL_ROWS]; AMX_ROWS] {
        let mut s = [_mm512_setzero_ps(); AMX_ROWS];
        let mut t = s;
        let mut sums: [[Sums; ROUND]; 2] =
            std::array::from_fn(|_| std::array::from_fn(|_| Sums([0; 256])));
        let mut step = 0;
        for b in 0..nb {
            let mut p = [_mm512_setzero_si512(); AMX_ROWS];
            let mut stored: Option<usize> = None;
            for round in 0..shape.runs / ROUND {
                for c in 0..ROUND {
                    let q0 = b * QUADS + (round * ROUND + c) * shape.quads;
                    let lev = self.lev[q0..q0 + shape.quads].as_ptr().cast();
                    // SAFETY: the caller's contract: the A tile reads
                    // positions 4·q0‥ of m rows inside the activations, the
                    // B tile `quads` level vectors of the panel.
                    unsafe { multiply(c, true, step % 2, x0.add(4 * q0), cols, lev) };
                    step += 1;
                }
                if let Some(r) = stored {
                    self.fold(shape, b, r, &sums[r % 2], m, &mut p);
                }
                for (c, sums) in sums[round % 2].iter_mut().enumerate() {
                    // SAFETY: tile c is configured and holds run c's sums.
                    unsafe { sums.store(c) };
                }
                stored = Some(round);
            }
            if let Some(r) = stored {
                self.fold(shape, b, r, &sums[r % 2], m, &mut p);
            }
            for i in 0..m {
                self.finish(shape, b, &acts.row(t0 + i), p[i], &mut s[i], &mut t[i]);
            }
        }
        let mut out = [[0f32; PANEL_ROWS]; AMX_ROWS];
        for (o, (s, t)) in out.iter_mut().zip(s.iter().zip(&t)).take(m) {
            // SAFETY: 16 f32 of `o`.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr(), _mm512_sub_ps(*s, *t)) };
        }
        out
    }

    /// Round `round` of super-block `b` from its stored sums (`sums[c]` row
    /// `i`: activation row `i` against the panel's rows) into `p`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn fold(
        &self,
        shape: Shape,
        b: usize,
        round: usize,
        sums: &[Sums; ROUND],
        m: usize,
        p: &mut [__m512i; AMX_ROWS],
    ) {
        for (c, sums) in sums.iter().enumerate() {
            let sc = self.sc[b * shape.runs + round * ROUND + c];
            for (i, p) in p.iter_mut().enumerate().take(m) {
                let row = &sums.0[i * PANEL_ROWS..(i + 1) * PANEL_ROWS];
                // SAFETY: 16 i32 of `row`.
                let v = unsafe { _mm512_loadu_si512(row.as_ptr().cast()) };
                *p = _mm512_add_epi32(*p, _mm512_mullo_epi32(v, sc));
            }
        }
    }
}

thread_local! {
    /// This thread's unpacked panel, reused across calls.
    static PANEL: RefCell<Panel> = RefCell::new(Panel::default());
}

/// The kernel that multiplies the panels (the same bits either way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Engine {
    /// AMX-INT8: one tile multiply a run for 16 activation rows.
    Amx,
    /// AVX-512 VNNI: [`TILE_ACTS`] activation rows a register tile.
    Vnni,
}

/// AMX for the types of 32-value runs (Q4_K, Q5_K) from [`AMX_ACTS_MIN`]
/// rows, where `cpu::amx` allows it and the batch-kernel switch does not
/// ask for the panels (`BatchChoice::Panels` or `Tiles`: the VNNI ones);
/// else VNNI. (Measured, `bench kernels --compare-tiles`: AMX ran 8–14%
/// faster from 64 rows on Q4_K/Q5_K, even at 16–32; the 16-value runs of
/// Q6_K gained at most 5%, results/kernels.md.)
fn engine(shape: Shape, n: usize) -> Engine {
    use crate::kernels::{batch_choice, cpu, BatchChoice};
    if shape.quads < 8 || n < AMX_ACTS_MIN {
        return Engine::Vnni;
    }
    match batch_choice() {
        BatchChoice::Panels | BatchChoice::Tiles => Engine::Vnni,
        _ if cpu::amx() => Engine::Amx,
        _ => Engine::Vnni,
    }
}

/// One call's fixed inputs.
struct Call<'a> {
    shape: Shape,
    nb: usize,
    cols: usize,
    acts: &'a Activations,
    n: usize,
    engine: Engine,
}

/// `matmul`'s K-type prefill path: `acts` holds the call's `n` prepared
/// rows (see [`takes`]).
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
    let nb = cols / QK_K;
    assert!(acts.qs.len() >= n * cols, "K panel: activation rows");
    let shape = Shape::of(ty);
    let call = Call {
        shape,
        nb,
        cols,
        acts,
        n,
        engine: engine(shape, n),
    };
    par_row_blocks_aligned(rows, cols, n, rb, PANEL_ROWS, y, |blk| {
        PANEL.with_borrow_mut(|p| {
            let rs = blk.rows();
            for r0 in rs.clone().step_by(PANEL_ROWS) {
                let valid = (rs.end - r0).min(PANEL_ROWS);
                // SAFETY: `takes` admitted this call only where `simd()` is
                // VNNI (AVX2, AVX-512F/BW/VNNI present); `engine` picks
                // AMX only where `cpu::amx` allows it; every activation
                // row holds `cols` values (asserted above).
                unsafe {
                    p.pack(ty, &w[r0 * rb..(r0 + valid) * rb], rb, valid, nb);
                    match call.engine {
                        Engine::Vnni => run_vnni(p, &call, r0, valid, blk),
                        Engine::Amx => run_amx(p, &call, r0, valid, blk),
                    }
                }
            }
        })
    });
}

/// Every activation row against panel `p` (weight rows `r0‥r0 + valid`)
/// on VNNI registers: tiles of [`TILE_ACTS`] rows, then 4, 2 and 1.
///
/// # Safety
/// AVX-512F/BW/VNNI; `p` packed for the call.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn run_vnni(p: &Panel, call: &Call, r0: usize, valid: usize, blk: &mut RowBlock<'_>) {
    let (shape, nb, cols, acts) = (call.shape, call.nb, call.cols, call.acts);
    let mut t0 = 0;
    while t0 < call.n {
        let m = match call.n - t0 {
            r if r >= TILE_ACTS => TILE_ACTS,
            r if r >= 4 => 4,
            r if r >= 2 => 2,
            _ => 1,
        };
        let mut out = [[0f32; PANEL_ROWS]; TILE_ACTS];
        // SAFETY: the caller's contract; every prepared row holds
        // `nb · 256` values.
        unsafe {
            match m {
                TILE_ACTS => store(
                    &mut out,
                    p.tile::<TILE_ACTS>(shape, nb, &rows(acts, t0, cols)),
                ),
                4 => store(&mut out, p.tile::<4>(shape, nb, &rows(acts, t0, cols))),
                2 => store(&mut out, p.tile::<2>(shape, nb, &rows(acts, t0, cols))),
                _ => store(&mut out, p.tile::<1>(shape, nb, &rows(acts, t0, cols))),
            }
        }
        set_out(blk, &out[..m], t0, r0, valid);
        t0 += m;
    }
}

/// [`run_vnni`] on AMX tiles of 16 activation rows (a short last one); the
/// tiles are configured here and released at the end.
///
/// # Safety
/// AVX-512F/BW/VNNI and AMX-TILE/INT8 with the permission; `p` packed for
/// the call; the activations hold `n · cols` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn run_amx(p: &Panel, call: &Call, r0: usize, valid: usize, blk: &mut RowBlock<'_>) {
    let (shape, cols) = (call.shape, call.cols);
    let k = 4 * shape.quads;
    let mut configured = 0;
    for t0 in (0..call.n).step_by(AMX_ROWS) {
        let m = (call.n - t0).min(AMX_ROWS);
        if m != configured {
            let cfg = TileConfig::multiply(m, k);
            // SAFETY: AMX-TILE and the permission (the caller's contract).
            unsafe { cfg.load() };
            configured = m;
        }
        let x0 = call.acts.qs[t0 * cols..].as_ptr();
        // SAFETY: tiles configured for m rows and k bytes; rows t0‥t0 + m
        // hold `cols` values from x0 (the caller's contract).
        let out = unsafe { p.amx_tile(shape, call.nb, call.acts, x0, cols, t0, m) };
        set_out(blk, &out[..m], t0, r0, valid);
    }
    // SAFETY: AMX-TILE; releasing returns the tiles to their initial state.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// Rows `t0‥` of the output from `out` (weight rows `r0‥r0 + valid`).
fn set_out(blk: &mut RowBlock<'_>, out: &[[f32; PANEL_ROWS]], t0: usize, r0: usize, valid: usize) {
    for (t, o) in out.iter().enumerate() {
        for (l, &v) in o.iter().enumerate().take(valid) {
            blk.set(t0 + t, r0 + l, v);
        }
    }
}

/// Activation rows `t0‥t0 + R`.
fn rows<const R: usize>(acts: &Activations, t0: usize, cols: usize) -> [ActRow<'_>; R] {
    std::array::from_fn(|t| {
        let a = acts.row(t0 + t);
        assert_eq!(a.qs.len(), cols, "K panel: activation length");
        a
    })
}

/// The tile's vectors into the first `R` rows of `out`.
#[inline]
#[target_feature(enable = "avx512f")]
fn store<const R: usize>(out: &mut [[f32; PANEL_ROWS]; TILE_ACTS], v: [__m512; R]) {
    for (o, v) in out.iter_mut().zip(v) {
        // SAFETY: 16 f32 of `o`.
        unsafe { _mm512_storeu_ps(o.as_mut_ptr(), v) };
    }
}
