//! The prefill kernels of the grouped int4 matmul (from
//! `kernels::PANEL_ACTS_MIN` activation rows): the block's weight rows are
//! repacked by the panel code (`panel512::with_packed` with [`Levels4`]: 16
//! rows a panel, unsigned levels 0‥15 in column order, vector `q` holding
//! columns `4q‥4q + 4` of every row) and each group's exact `Σ u·x` for 16
//! weight rows at a time is then folded into the defined eight f32 lanes
//! (module `grouped`): lane `g mod 8` of each pair takes `fma(d_g, S,
//! lane)` (and the min's fma), sixteen weight rows a vector, so the results
//! equal the scalar twin bit for bit. Two engines ([`Engine`]) get `S`:
//! - AMX (`cpu::amx()`): 16 activation rows (an A tile, read where they
//!   lie) meet a group's 64-byte B tiles in `tdpbsud`, whatever order the
//!   tile sums in; four groups at a time go to four accumulator tiles
//!   before their sums are stored, and a round is folded after the next
//!   round's multiplies are issued;
//! - AVX-512 VNNI: [`VNNI_ROWS`] activation rows a register tile, one
//!   `vpdpbusd` a panel vector, each group's sums landing in registers.

use super::{GFormat, LANES};
use crate::kernels::amx::{multiply, Sums, TileConfig};
use crate::kernels::panel512::{self, PanelFormat, PANEL_ROWS};
use std::arch::asm;
use std::arch::x86_64::*;

/// Activation rows of one A tile.
const TILE_ROWS: usize = 16;
/// Columns of one panel step (64 bytes of packed int4).
const STEP_COLS: usize = 128;
/// Columns of one tile multiply at most (64 bytes of activations).
const K_MAX: usize = 64;
/// Groups multiplied before their sums are stored (one accumulator tile
/// each).
const ROUND: usize = 4;

/// Grouped int4 levels as panel vectors: vector `q` holds columns `4q‥4q +
/// 4` of each of the panel's 16 rows, unsigned.
pub(crate) struct Levels4;

impl PanelFormat for Levels4 {
    const BIAS: i32 = 0;
    const X_PER_STEP: usize = STEP_COLS;

    /// Dword `j` of a 64-byte step is bytes `4j‥4j + 4` of chunk `j / 4`:
    /// its low nibbles are quad `8(j / 4) + j mod 4` of the step's 128
    /// columns, its high nibbles the quad four after.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn pack_step(
        pw: *const u8,
        row_bytes: usize,
        rows: usize,
        c: usize,
        m: __mmask64,
        out: *mut __m512i,
    ) {
        let nib = _mm512_set1_epi8(15);
        // SAFETY: the trait's contract: `m` enables only bytes of the rows.
        let t = unsafe { panel512::load_transposed(pw, row_bytes, rows, 64 * c, m) };
        for (j, v) in t.into_iter().enumerate() {
            let q = 8 * (j / 4) + j % 4;
            // SAFETY: `out` has room for 32 vectors (X_PER_STEP / 4); q + 4 < 32.
            unsafe {
                out.add(q).write(_mm512_and_si512(v, nib));
                out.add(q + 4)
                    .write(_mm512_and_si512(_mm512_srli_epi16::<4>(v), nib));
            }
        }
    }
}

/// The int8 activation rows of one product, as `grouped::matmul_int`
/// prepared them: `n` rows of `stride = groups · group` levels, zero past
/// the columns, and `groups` sums a row.
#[derive(Clone, Copy)]
pub(super) struct Rows<'a> {
    pub x: &'a [i8],
    pub stride: usize,
    pub xs: &'a [i32],
    pub groups: usize,
}

impl Rows<'_> {
    /// The activation rows.
    fn n(&self) -> usize {
        self.xs.len() / self.groups.max(1)
    }
}

/// The kernel that multiplies the panels (the same bits either way).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Engine {
    /// AMX-INT8 tile multiplies, one a group.
    Amx,
    /// AVX-512 VNNI: 16 weight rows a register, [`VNNI_ROWS`] activation
    /// rows a tile, each group's sums landing in registers.
    Vnni,
}

/// Activation rows of the VNNI register tile.
const VNNI_ROWS: usize = 8;

/// `out(t, r0, v)` for every activation row `t` of `a` and every panel of
/// the block (its first row `r0`): `v[i]` is the defined dot
/// (`grouped::dot_scalar`) of packed row `r0 + i` of `w` (`rows` rows of
/// format `f`, `params` their companions) with row `t`, before the
/// activation scale.
///
/// # Safety
/// The CPU must support AVX-512F/BW/VL/VNNI, FMA and F16C, and for
/// `Engine::Amx` AMX-TILE/INT8 with this process holding the tile
/// permission (`kernels::cpu::amx()`); `f` is int4;
/// `w` and `params` hold `rows` whole rows of `a.groups` groups;
/// `a.x.len() == n · a.stride` with `a.stride == a.groups · group` and
/// `a.xs.len() == n · a.groups`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
pub(super) unsafe fn dot_block(
    engine: Engine,
    f: GFormat,
    w: &[u8],
    params: &[u16],
    rows: usize,
    a: Rows<'_>,
    out: &mut impl FnMut(usize, usize, &[f32]),
) {
    let row_bytes = f.row_bytes(a.stride);
    let pack_stride = a.stride.next_multiple_of(STEP_COLS);
    let run = |panels: &[__m512i]| {
        let quads = pack_stride / 4;
        for (p, panel) in panels.chunks_exact(quads).enumerate() {
            let r0 = p * PANEL_ROWS;
            let valid = (rows - r0).min(PANEL_ROWS);
            let scales = Scales::gather(f, &params[r0 * f.params_per_row(a.stride)..], valid, a);
            let op = Panel {
                f,
                panel: panel.as_ptr().cast(),
                scales: &scales,
                a,
            };
            // SAFETY: the caller's contract; `panel` holds the block's
            // panel p with `quads` vectors covering every group.
            unsafe {
                match engine {
                    Engine::Amx => op.run(|t, v| out(t, r0, v), valid),
                    Engine::Vnni => op.run_vnni(|t, v| out(t, r0, v), valid),
                }
            };
        }
    };
    // SAFETY: `pack_stride` is a multiple of 128 columns covering the rows'
    // 64-byte steps; `w` holds `rows` rows (the caller's contract).
    unsafe { panel512::with_packed::<Levels4, ()>(w, row_bytes, rows, pack_stride, run) }
}

/// A panel's scales (and mins) as f32, group by group: `d[g]` lane `l` is
/// row `l`'s scale of group `g`; rows past the panel's are 0.
struct Scales {
    d: Vec<[f32; PANEL_ROWS]>,
    m: Vec<[f32; PANEL_ROWS]>,
}

impl Scales {
    fn gather(f: GFormat, params: &[u16], valid: usize, a: Rows<'_>) -> Scales {
        let groups = a.groups;
        let per_row = f.params_per_row(a.stride);
        let mut s = Scales {
            d: vec![[0.0; PANEL_ROWS]; groups],
            m: vec![[0.0; PANEL_ROWS]; if f.has_min() { groups } else { 0 }],
        };
        for r in 0..valid {
            let row = &params[r * per_row..(r + 1) * per_row];
            for g in 0..groups {
                let (d, m) = super::group_params(f, row, g);
                s.d[g][r] = d;
                if f.has_min() {
                    s.m[g][r] = m;
                }
            }
        }
        s
    }
}

/// One panel against every activation row.
struct Panel<'a> {
    f: GFormat,
    /// The panel's `quads` 64-byte vectors.
    panel: *const u8,
    scales: &'a Scales,
    a: Rows<'a>,
}

impl Panel<'_> {
    /// Tiles of 16 activation rows (a short last one), each through every
    /// group; `out(t, v)` with the dots of row `t` and the panel's `valid`
    /// rows. The tiles are configured here and released at the end.
    ///
    /// # Safety
    /// As [`dot_block`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    unsafe fn run(&self, mut out: impl FnMut(usize, &[f32]), valid: usize) {
        let n = self.a.n();
        let k = self.f.group().cols().min(K_MAX);
        let mut configured = 0;
        for t0 in (0..n).step_by(TILE_ROWS) {
            let m = (n - t0).min(TILE_ROWS);
            if m != configured {
                let cfg = TileConfig::multiply(m, k);
                // SAFETY: AMX-TILE and the permission (the caller's contract).
                unsafe { cfg.load() };
                configured = m;
            }
            // SAFETY: rows t0..t0 + m exist; the tiles are configured for m.
            let v = unsafe { self.tile(t0, m, k) };
            for (i, v) in v.iter().enumerate().take(m) {
                out(t0 + i, &v[..valid]);
            }
        }
        // SAFETY: AMX-TILE; releasing returns the tiles to their initial state.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }

    /// Activation rows `t0‥t0 + m` against the panel: the defined dots
    /// (row `i`, weight row `r` at `[i][r]`). Groups go [`ROUND`] at a time
    /// into the accumulator tiles, so their multiplies run back to back,
    /// then are stored and folded in order.
    ///
    /// # Safety
    /// As [`Panel::run`], tiles 0‥7 configured for `m` rows and `k`
    /// columns a multiply.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    unsafe fn tile(&self, t0: usize, m: usize, k: usize) -> [[f32; PANEL_ROWS]; TILE_ROWS] {
        let (gc, groups, stride) = (self.f.group().cols(), self.a.groups, self.a.stride);
        let mut lanes = [[_mm512_setzero_ps(); LANES]; TILE_ROWS];
        let mut sums: [[Sums; ROUND]; 2] =
            std::array::from_fn(|_| std::array::from_fn(|_| Sums([0; 256])));
        let x0 = self.a.x[t0 * stride..].as_ptr();
        let mut step = 0;
        // The round stored last, folded once the next one's multiplies are
        // under way (a tile store's sums are not at once ready to load).
        let mut stored: Option<(usize, usize)> = None;
        for (r, g0) in (0..groups).step_by(ROUND).enumerate() {
            let round = (groups - g0).min(ROUND);
            for c in 0..round {
                for s in (0..gc).step_by(k) {
                    let col = (g0 + c) * gc + s;
                    // SAFETY: columns col..col + k of rows t0..t0 + m lie
                    // inside the activations; quads col/4.. of the panel
                    // (k/4 vectors) inside the panel; tiles configured (the
                    // caller's contract).
                    unsafe {
                        multiply(
                            c,
                            s == 0,
                            step % 2,
                            x0.add(col),
                            stride,
                            self.panel.add(col * 16),
                        )
                    };
                    step += 1;
                }
            }
            if let Some((g, n)) = stored {
                self.fold_round(g, n, t0, m, &sums[1 - r % 2], &mut lanes);
            }
            for (c, sums) in sums[r % 2].iter_mut().enumerate().take(round) {
                // SAFETY: tile c is configured and holds group g0 + c's sums.
                unsafe { sums.store(c) };
            }
            stored = Some((g0, round));
        }
        if let Some((g, n)) = stored {
            let last = groups.div_ceil(ROUND) - 1;
            self.fold_round(g, n, t0, m, &sums[last % 2], &mut lanes);
        }
        let mut v = [[0f32; PANEL_ROWS]; TILE_ROWS];
        for (v, l) in v.iter_mut().zip(&lanes).take(m) {
            *v = reduce8(l);
        }
        v
    }

    /// Groups `g0‥g0 + n` from their stored sums, in order.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    fn fold_round(
        &self,
        g0: usize,
        n: usize,
        t0: usize,
        m: usize,
        sums: &[Sums; ROUND],
        lanes: &mut [[__m512; LANES]; TILE_ROWS],
    ) {
        for (c, sums) in sums.iter().enumerate().take(n) {
            self.fold(g0 + c, t0, m, sums, lanes);
        }
    }

    /// Group `g`'s sums (`sums` row `i` = activation row `t0 + i` against
    /// the panel's 16 rows) into lane `g mod 8` of each pair.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    fn fold(
        &self,
        g: usize,
        t0: usize,
        m: usize,
        sums: &Sums,
        lanes: &mut [[__m512; LANES]; TILE_ROWS],
    ) {
        let groups = self.a.groups;
        for (i, lanes) in lanes.iter_mut().enumerate().take(m) {
            // SAFETY: row i of the 16 × 16 sums.
            let s = unsafe { _mm512_loadu_si512(sums.0[i * PANEL_ROWS..].as_ptr().cast()) };
            let xs = self.a.xs[(t0 + i) * groups + g];
            self.fold_sums(g, s, xs, &mut lanes[g % LANES]);
        }
    }

    /// One activation row's group `g` (its sums `s` against the panel's 16
    /// rows, its activation sum `xs`) into its lane `g mod 8`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma,f16c")]
    fn fold_sums(&self, g: usize, s: __m512i, xs: i32, lane: &mut __m512) {
        // SAFETY: 16 f32 of each array.
        let d = unsafe { _mm512_loadu_ps(self.scales.d[g].as_ptr()) };
        if self.f.has_min() {
            // SAFETY: 16 f32 of the mins of group g.
            let mv = unsafe { _mm512_loadu_ps(self.scales.m[g].as_ptr()) };
            let v = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), *lane);
            *lane = _mm512_fmadd_ps(mv, _mm512_set1_ps(xs as f32), v);
        } else {
            let s = _mm512_sub_epi32(s, _mm512_set1_epi32(8 * xs));
            *lane = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), *lane);
        }
    }

    /// [`Panel::run`] on VNNI registers: tiles of [`VNNI_ROWS`] activation
    /// rows, then 4, 2 and 1.
    ///
    /// # Safety
    /// As [`dot_block`] (AVX-512 VNNI).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    unsafe fn run_vnni(&self, mut out: impl FnMut(usize, &[f32]), valid: usize) {
        let n = self.a.n();
        let mut t0 = 0;
        while t0 < n {
            let m = match n - t0 {
                r if r >= VNNI_ROWS => VNNI_ROWS,
                r if r >= 4 => 4,
                r if r >= 2 => 2,
                _ => 1,
            };
            // SAFETY: rows t0..t0 + m exist (the caller's contract).
            unsafe {
                match m {
                    VNNI_ROWS => self.vnni_tile::<VNNI_ROWS>(t0, valid, &mut out),
                    4 => self.vnni_tile::<4>(t0, valid, &mut out),
                    2 => self.vnni_tile::<2>(t0, valid, &mut out),
                    _ => self.vnni_tile::<1>(t0, valid, &mut out),
                }
            }
            t0 += m;
        }
    }

    /// Activation rows `t0‥t0 + R` against the panel: each group's `R`
    /// accumulators (16 weight rows each) take one `vpdpbusd` a quad (the
    /// panel vector against the row's four activations broadcast), then
    /// fold; `out(t, v)` for each row.
    ///
    /// # Safety
    /// As [`Panel::run_vnni`]; rows `t0..t0 + R` exist.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")]
    unsafe fn vnni_tile<const R: usize>(
        &self,
        t0: usize,
        valid: usize,
        out: &mut impl FnMut(usize, &[f32]),
    ) {
        let (groups, stride) = (self.a.groups, self.a.stride);
        let quads = self.f.group().cols() / 4;
        let mut lanes = [[_mm512_setzero_ps(); LANES]; R];
        let x: [*const i8; R] = std::array::from_fn(|t| self.a.x[(t0 + t) * stride..].as_ptr());
        for g in 0..groups {
            let mut acc = [_mm512_setzero_si512(); R];
            for q in g * quads..(g + 1) * quads {
                // SAFETY: quad q < groups · group / 4 lies inside the panel
                // and inside each activation row (4q + 4 <= stride).
                unsafe {
                    let w = _mm512_loadu_si512(self.panel.add(64 * q).cast());
                    for (acc, x) in acc.iter_mut().zip(&x) {
                        let v = _mm512_set1_epi32(x.add(4 * q).cast::<i32>().read_unaligned());
                        *acc = _mm512_dpbusd_epi32(*acc, w, v);
                    }
                }
            }
            for (t, (lanes, s)) in lanes.iter_mut().zip(acc).enumerate() {
                let xs = self.a.xs[(t0 + t) * groups + g];
                self.fold_sums(g, s, xs, &mut lanes[g % LANES]);
            }
        }
        for (t, l) in lanes.iter().enumerate() {
            out(t0 + t, &reduce8(l)[..valid]);
        }
    }
}

/// The defined `reduce8` of eight lane vectors, sixteen weight rows at
/// once: `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))` per row.
#[inline]
#[target_feature(enable = "avx512f")]
fn reduce8(l: &[__m512; LANES]) -> [f32; PANEL_ROWS] {
    let r = _mm512_add_ps(
        _mm512_add_ps(_mm512_add_ps(l[0], l[4]), _mm512_add_ps(l[2], l[6])),
        _mm512_add_ps(_mm512_add_ps(l[1], l[5]), _mm512_add_ps(l[3], l[7])),
    );
    let mut v = [0f32; PANEL_ROWS];
    // SAFETY: 16 f32 of `v`.
    unsafe { _mm512_storeu_ps(v.as_mut_ptr(), r) };
    v
}
