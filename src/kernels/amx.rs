//! The AMX-INT8 kernel of the int8 and int4 batched dots for many
//! activation rows (prefill: `int8::dot_block` and `int4::dot_block` from
//! `kernels::PANEL_ACTS_MIN` rows, where [`super::cpu::amx`] says the CPU
//! and the kernel allow it). A tile multiply (`tdpbsud`) takes 16
//! activation rows × 64 bytes (signed) against a 16 × 64-byte tile whose
//! row `q` holds bytes `4q..4q + 4` of each of 16 weight rows (unsigned):
//! exactly one step of a `kernels::panel512` panel, so the weights are
//! repacked by the panel kernel's own code ([`panel512::with_panels`]) and
//! the activations are read where they lie. Four accumulator tiles hold 2
//! activation groups × 2 panels (32 × 32 sums); each step loads two
//! activation tiles and two weight tiles for four multiplies.
//!
//! The sums are the same exact wrapping `i32` sums as every other
//! version's: `Σ x·(w + BIAS)` from the tiles, less `BIAS·Σx`, so the
//! results equal the scalar twins bit for bit.
//!
//! Tiles are a per-thread state that Linux hands out on request
//! ([`request_tiles`], once per process); a call configures them, uses
//! them and releases them, so no other code on the thread ever sees them.

use super::panel512::{self, PanelFormat, PANEL_ROWS};
use std::arch::asm;
use std::arch::x86_64::*;

/// Activation rows of one tile (its rows).
const GROUP_ROWS: usize = 16;
/// Bytes of one tile row: one step of activations and of panel vectors.
const STEP_BYTES: usize = 64;

/// `ldtilecfg`'s 64-byte operand (palette 1). Tiles 0–3 accumulate
/// (activation group `a`, panel `g`) in tile `2a + g`; tiles 4 and 5 are
/// the two activation groups, 6 and 7 the two panels' weights.
#[repr(C, align(64))]
pub(crate) struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

impl TileConfig {
    /// Activation groups of `m0` and `m1` rows (`m1` may be 0: tiles 2, 3
    /// and 5 are then left unconfigured and must not be used).
    fn new(m0: usize, m1: usize) -> TileConfig {
        TileConfig::shaped(&[
            (0, m0, STEP_BYTES),
            (1, m0, STEP_BYTES),
            (2, m1, STEP_BYTES),
            (3, m1, STEP_BYTES),
            (4, m0, STEP_BYTES),
            (5, m1, STEP_BYTES),
            (6, 16, STEP_BYTES),
            (7, 16, STEP_BYTES),
        ])
    }

    /// The tiles of [`multiply`]: accumulators 0‥3 of `m` rows, A tiles
    /// 4 and 5 of `m` rows of `k` bytes, B tiles 6 and 7 of `k / 4` rows
    /// of 64 bytes.
    pub(crate) fn multiply(m: usize, k: usize) -> TileConfig {
        TileConfig::shaped(&[
            (0, m, 64),
            (1, m, 64),
            (2, m, 64),
            (3, m, 64),
            (4, m, k),
            (5, m, k),
            (6, k / 4, 64),
            (7, k / 4, 64),
        ])
    }

    /// Tiles `(tile, rows, bytes a row)`; those of 0 rows and the ones not
    /// named are left unconfigured (touching one faults).
    pub(crate) fn shaped(tiles: &[(usize, usize, usize)]) -> TileConfig {
        let mut c = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        for &(t, m, b) in tiles {
            if m > 0 {
                c.rows[t] = m as u8;
                c.colsb[t] = b as u16;
            }
        }
        c
    }

    /// Loads this configuration (`ldtilecfg`).
    ///
    /// # Safety
    /// The CPU must support AMX-TILE and this process hold the tile
    /// permission ([`request_tiles`]).
    pub(crate) unsafe fn load(&self) {
        // SAFETY: the caller's contract; `self` is a valid palette-1
        // configuration of 64 bytes.
        unsafe { asm!("ldtilecfg [{0}]", in(reg) self, options(nostack)) };
    }
}

/// Linux's permission for this process to use the AMX tile data
/// (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`): `true` once
/// granted.
pub(crate) fn request_tiles() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: the syscall takes two integers and touches no memory of ours.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

/// `out[t·rows + r]` = `Σ (w[r] + F::BIAS)·x[t] − F::BIAS·xsum[t]`, as
/// `panel512::dot_panels` computes it, on the AMX tiles.
///
/// # Safety
/// The CPU must support AVX-512F/BW and AMX-TILE/INT8, and this process
/// must hold the tile permission ([`request_tiles`]); the layout is
/// `panel512::dot_panels`'s (`stride` a multiple of `F::X_PER_STEP` and of
/// 64, `x.len() == n·stride` zero past its columns, `w.len() ==
/// rows·row_bytes`, `out.len() == rows·n`, `xsum[t] == Σ x[t, :]`).
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn dot_tiles<F: PanelFormat>(
    w: &[u8],
    row_bytes: usize,
    x: &[i8],
    stride: usize,
    xsum: &[i32],
    out: &mut [i32],
) {
    debug_assert!(stride.is_multiple_of(STEP_BYTES));
    let run = |panels: &[__m512i], rows: usize, out: &mut [i32]| {
        let op = Operands {
            panels: panels.as_ptr().cast(),
            quads: stride / 4,
            x,
            stride,
            xsum,
            rows,
            bias: F::BIAS,
        };
        // SAFETY: the caller's contract (AMX and the tile permission) and
        // the layout `with_panels` checked.
        unsafe { op.run(out) };
    };
    // SAFETY: the caller's layout is `with_panels`'s.
    unsafe { panel512::with_panels::<F>(w, row_bytes, x, stride, xsum, out, run) }
}

/// The repacked weights and the activations of one [`dot_tiles`] call.
struct Operands<'a> {
    /// `rows.div_ceil(16)` panels of `quads` 64-byte vectors.
    panels: *const u8,
    quads: usize,
    x: &'a [i8],
    stride: usize,
    xsum: &'a [i32],
    rows: usize,
    bias: i32,
}

impl Operands<'_> {
    /// Every pair of activation groups against every pair of panels; the
    /// tiles are configured for each pair's group sizes (the last pair
    /// may be short) and released at the end.
    ///
    /// # Safety
    /// As [`dot_tiles`].
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn run(&self, out: &mut [i32]) {
        let n = self.xsum.len();
        let panels = self.rows.div_ceil(PANEL_ROWS);
        let mut configured = (0, 0);
        for t0 in (0..n).step_by(2 * GROUP_ROWS) {
            let m0 = (n - t0).min(GROUP_ROWS);
            let m1 = (n - t0 - m0).min(GROUP_ROWS);
            if configured != (m0, m1) {
                // SAFETY: AMX-TILE and the permission (the caller's contract).
                unsafe { TileConfig::new(m0, m1).load() };
                configured = (m0, m1);
            }
            for p in (0..panels).step_by(2) {
                // SAFETY: activation rows t0..t0 + m0 + m1 and panels p..
                // p + 2 (or p alone) exist; the tiles are configured so.
                unsafe {
                    match (m1 > 0, p + 1 < panels) {
                        (true, true) => self.block::<true, true>(t0, p, out),
                        (true, false) => self.block::<true, false>(t0, p, out),
                        (false, true) => self.block::<false, true>(t0, p, out),
                        (false, false) => self.block::<false, false>(t0, p, out),
                    }
                }
            }
        }
        // SAFETY: AMX-TILE; releasing returns the tiles to their initial state.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }

    /// Activation groups at `t0` (and `t0 + 16` with `A2`) against panel
    /// `p` (and `p + 1` with `G2`): zero the accumulators, multiply every
    /// step, write the sums.
    ///
    /// # Safety
    /// As [`Operands::run`]: the tiles are configured for these groups.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn block<const A2: bool, const G2: bool>(&self, t0: usize, p: usize, out: &mut [i32]) {
        let (sx, sw) = (self.stride, STEP_BYTES);
        let x0 = self.x[t0 * sx..].as_ptr();
        let w0 = self.panels.wrapping_add(p * self.quads * STEP_BYTES);
        // SAFETY: for every asm! below, AMX-TILE/INT8 and configured tiles (the
        // caller's contract); loads read whole tile rows inside the
        // activation rows (steps · 64 = stride bytes each) and the panels.
        unsafe {
            // Only the configured tiles: touching one left out faults.
            asm!("tilezero tmm0", options(nostack, nomem));
            if G2 {
                asm!("tilezero tmm1", options(nostack, nomem));
            }
            if A2 {
                asm!("tilezero tmm2", options(nostack, nomem));
                if G2 {
                    asm!("tilezero tmm3", options(nostack, nomem));
                }
            }
            for s in 0..self.stride / STEP_BYTES {
                let xa = x0.add(s * STEP_BYTES);
                let wa = w0.add(s * GROUP_ROWS * STEP_BYTES);
                asm!("tileloadd tmm4, [{p} + {s}*1]", p = in(reg) xa, s = in(reg) sx, options(nostack, readonly));
                asm!("tileloadd tmm6, [{p} + {s}*1]", p = in(reg) wa, s = in(reg) sw, options(nostack, readonly));
                asm!("tdpbsud tmm0, tmm4, tmm6", options(nostack, nomem));
                if G2 {
                    let wb = wa.add(self.quads * STEP_BYTES);
                    asm!("tileloadd tmm7, [{p} + {s}*1]", p = in(reg) wb, s = in(reg) sw, options(nostack, readonly));
                    asm!("tdpbsud tmm1, tmm4, tmm7", options(nostack, nomem));
                }
                if A2 {
                    let xb = xa.add(GROUP_ROWS * sx);
                    asm!("tileloadd tmm5, [{p} + {s}*1]", p = in(reg) xb, s = in(reg) sx, options(nostack, readonly));
                    asm!("tdpbsud tmm2, tmm5, tmm6", options(nostack, nomem));
                    if G2 {
                        asm!("tdpbsud tmm3, tmm5, tmm7", options(nostack, nomem));
                    }
                }
            }
        }
        let mut sums = Sums([0; GROUP_ROWS * PANEL_ROWS]);
        let groups = if A2 { 2 } else { 1 };
        for a in 0..groups {
            for g in 0..if G2 { 2 } else { 1 } {
                // SAFETY: tile 2a + g is configured and holds this block's sums.
                unsafe { sums.store(2 * a + g) };
                let t = t0 + a * GROUP_ROWS;
                let m = (self.xsum.len() - t).min(GROUP_ROWS);
                // SAFETY: rows t..t + m exist; panel p + g exists.
                unsafe { self.write(&sums, t, m, p + g, out) };
            }
        }
    }

    /// Writes `m` rows of one accumulator tile's sums (panel `p`,
    /// activation rows from `t`) to `out`, less the bias correction; only
    /// the panel's real weight rows.
    ///
    /// # Safety
    /// The CPU must support AVX-512F; rows `t..t + m` and panel `p` exist.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn write(&self, sums: &Sums, t: usize, m: usize, p: usize, out: &mut [i32]) {
        let r0 = p * PANEL_ROWS;
        let lanes = (self.rows - r0).min(PANEL_ROWS);
        let mask: __mmask16 = ((1u32 << lanes) - 1) as u16;
        for i in 0..m {
            let corr = _mm512_set1_epi32(self.xsum[t + i].wrapping_mul(self.bias));
            // SAFETY: row i of the 16 × 16 sums.
            let v = unsafe { _mm512_loadu_si512(sums.0[i * PANEL_ROWS..].as_ptr().cast()) };
            let o = &mut out[(t + i) * self.rows + r0..][..lanes];
            // SAFETY: the mask writes only the `lanes` elements of `o`.
            unsafe {
                _mm512_mask_storeu_epi32(o.as_mut_ptr().cast(), mask, _mm512_sub_epi32(v, corr))
            };
        }
    }
}

/// One accumulator tile's sums, 16 rows of 16 `i32`.
#[repr(C, align(64))]
pub(crate) struct Sums(pub(crate) [i32; GROUP_ROWS * PANEL_ROWS]);

impl Sums {
    /// Stores accumulator tile `tile` (0–3) here.
    ///
    /// # Safety
    /// AMX-TILE, and tile `tile` is configured.
    #[inline]
    pub(crate) unsafe fn store(&mut self, tile: usize) {
        let (p, s) = (self.0.as_mut_ptr(), PANEL_ROWS * 4);
        // SAFETY: the caller's contract; a configured tile has at most 16
        // rows of 64 bytes, which `self` holds.
        unsafe {
            match tile {
                0 => {
                    asm!("tilestored [{p} + {s}*1], tmm0", p = in(reg) p, s = in(reg) s, options(nostack))
                }
                1 => {
                    asm!("tilestored [{p} + {s}*1], tmm1", p = in(reg) p, s = in(reg) s, options(nostack))
                }
                2 => {
                    asm!("tilestored [{p} + {s}*1], tmm2", p = in(reg) p, s = in(reg) s, options(nostack))
                }
                _ => {
                    asm!("tilestored [{p} + {s}*1], tmm3", p = in(reg) p, s = in(reg) s, options(nostack))
                }
            }
        }
    }
}

/// Tile multiplies into accumulator tile `c` (0‥3), zeroed first when
/// `zero`: A = the activation rows at `x` (`stride` apart) into tile 4 + `ab`,
/// B = the panel vectors at `b` (64 bytes apart) into tile 6 + `ab`
/// (alternating operand tiles let a load overlap the previous multiply).
///
/// # Safety
/// AMX-TILE/INT8 with tiles 0‥7 configured; the tile loads read inside the
/// activations and the panel.
#[inline]
pub(crate) unsafe fn multiply(
    c: usize,
    zero: bool,
    ab: usize,
    x: *const i8,
    stride: usize,
    b: *const u8,
) {
    macro_rules! step {
        ($c:literal, $a:literal, $b:literal) => {
            // SAFETY: the caller's contract.
            unsafe {
                asm!(concat!("tileloadd tmm", $a, ", [{p} + {s}*1]"), p = in(reg) x, s = in(reg) stride, options(nostack, readonly));
                asm!(concat!("tileloadd tmm", $b, ", [{p} + {s}*1]"), p = in(reg) b, s = in(reg) 64usize, options(nostack, readonly));
                if zero {
                    asm!(concat!("tilezero tmm", $c), options(nostack, nomem));
                }
                asm!(concat!("tdpbsud tmm", $c, ", tmm", $a, ", tmm", $b), options(nostack, nomem));
            }
        };
    }
    match (c, ab) {
        (0, 0) => step!("0", "4", "6"),
        (0, _) => step!("0", "5", "7"),
        (1, 0) => step!("1", "4", "6"),
        (1, _) => step!("1", "5", "7"),
        (2, 0) => step!("2", "4", "6"),
        (2, _) => step!("2", "5", "7"),
        (3, 0) => step!("3", "4", "6"),
        _ => step!("3", "5", "7"),
    }
}

/// `steps` rounds of four independent register-only tile multiplies
/// (`tdpbssd`, 16 × 16 × 64 multiply-adds each): the machine's AMX-INT8 peak (results/kernels.md). Returns a
/// sum of the accumulators so nothing is optimized away.
///
/// # Safety
/// AMX-TILE/INT8 and the tile permission ([`request_tiles`]).
pub(crate) unsafe fn peak(steps: usize, a: i8, b: i8) -> i32 {
    let cfg = TileConfig::new(16, 16);
    let (av, bv) = ([a; 1024], [b; 1024]);
    let mut sums = Sums([0; 256]);
    // SAFETY: the caller's contract; the loads read 16 rows of 64 bytes of
    // `av`/`bv`, the store writes 16 × 64 bytes of `sums`.
    unsafe {
        asm!("ldtilecfg [{0}]", in(reg) &cfg, options(nostack));
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack, nomem)
        );
        let s = STEP_BYTES;
        asm!("tileloadd tmm4, [{p} + {s}*1]", "tileloadd tmm5, [{p} + {s}*1]", p = in(reg) av.as_ptr(), s = in(reg) s, options(nostack, readonly));
        asm!("tileloadd tmm6, [{p} + {s}*1]", "tileloadd tmm7, [{p} + {s}*1]", p = in(reg) bv.as_ptr(), s = in(reg) s, options(nostack, readonly));
        for _ in 0..steps {
            asm!(
                "tdpbssd tmm0, tmm4, tmm6",
                "tdpbssd tmm1, tmm4, tmm7",
                "tdpbssd tmm2, tmm5, tmm6",
                "tdpbssd tmm3, tmm5, tmm7",
                options(nostack, nomem)
            );
        }
        sums.store(0);
        asm!("tilerelease", options(nostack, nomem));
    }
    sums.0.iter().fold(0i32, |s, &v| s.wrapping_add(v))
}
