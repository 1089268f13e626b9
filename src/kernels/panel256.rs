//! The AVX2 panel kernel of the int8 and int4 batched dots for many
//! activation rows (prefill: `int8::dot_block` and `int4::dot_block` from
//! `kernels::PANEL_ACTS_MIN` rows, on CPUs without AVX-512 VNNI). The
//! 256-bit sibling of `kernels::panel512`: a block of weight rows is
//! repacked once per call into panels of 8 rows, vector `q` of a panel
//! holding weight bytes `4q..4q + 4` (in the order the activations meet
//! them) of each of its 8 rows, row `l` in 32-bit lane `l` (an 8×8 dword
//! transpose per 32 bytes). A register tile of panels × activation rows
//! then needs one weight load per panel and one 4-byte broadcast per
//! activation row for each product, and no horizontal sums: lane `l` of an
//! accumulator is weight row `l`'s dot with that activation row.
//!
//! The formats differ in the tile's products ([`PanelFormat::tile`]):
//! int4's unsigned nibbles meet the activations in `vpmaddubsw` alone and
//! sum in 16-bit lanes for 8 quads before one `vpmaddwd` widens them;
//! int8 keeps the sign trick of its per-row dots. The sums are the same
//! exact `i32` wrapping sums as every other version's.

use std::arch::x86_64::*;
use std::cell::RefCell;

/// Weight rows of a panel (the 32-bit lanes of a ymm register).
pub(crate) const PANEL_ROWS: usize = 8;
/// Weight bytes of a row one repack step covers.
const STEP_BYTES: usize = 64;

/// One weight format's repack and products.
pub(crate) trait PanelFormat {
    /// Activation bytes a row meets per [`STEP_BYTES`] weight bytes.
    const X_PER_STEP: usize;
    /// Panels (1 or 2), and activation rows (4 or 6), of the main tile.
    const TILE: (usize, usize);

    /// Writes the `X_PER_STEP / 4` panel vectors of one weight step from
    /// `t`, the step's two 32-byte halves of the panel's 8 rows, each
    /// transposed by dwords ([`transpose8`]: `t[h][j]` holds bytes
    /// `32h + 4j..32h + 4j + 4` of every row).
    ///
    /// # Safety
    /// The CPU must support AVX2; `out` has room for `X_PER_STEP / 4`
    /// vectors.
    unsafe fn pack_step(t: [[__m256i; 8]; 2], out: *mut __m256i);

    /// The sums of `G` panels (`pw`, `quads` vectors apart) with `T`
    /// activation rows (`px`, `stride` bytes apart): lane `l` of `[g][t]`
    /// is row `l` of panel `g` against row `t`, without the correction.
    ///
    /// # Safety
    /// The CPU must support AVX2; the panels hold `quads` vectors each,
    /// `quads` is a multiple of 8, and each activation row `4·quads` bytes.
    unsafe fn tile<const G: usize, const T: usize>(
        pw: *const __m256i,
        quads: usize,
        px: *const i8,
        stride: usize,
    ) -> [[__m256i; T]; G];

    /// The correction of the sums with activation row sum `xsum`.
    fn correct(xsum: i32) -> i32;
}

thread_local! {
    /// This thread's repacked block, reused across calls.
    static PANELS: RefCell<Vec<__m256i>> = const { RefCell::new(Vec::new()) };
}

/// `out[t·rows + r]` = the format's dot of weight row `r` (`row_bytes`
/// bytes each, `rows = out.len() / n`) with activation row `t` of `x`
/// (`n = xsum.len()` rows of `stride` bytes), corrected by
/// [`PanelFormat::correct`] of `xsum[t]`.
///
/// # Safety
/// The CPU must support AVX2; `stride` is a multiple of `F::X_PER_STEP`
/// and holds `row_bytes.div_ceil(64)` steps of it; `x.len() == n·stride`
/// laid out as the format requires, zero past its columns; `w.len() ==
/// rows·row_bytes`, `out.len() == rows·n`; `xsum[t]` is what the format's
/// correction needs of row `t`.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn dot_panels<F: PanelFormat>(
    w: &[u8],
    row_bytes: usize,
    x: &[i8],
    stride: usize,
    xsum: &[i32],
    out: &mut [i32],
) {
    let n = xsum.len();
    if n == 0 || row_bytes == 0 {
        out.fill(0);
        return;
    }
    let rows = out.len() / n;
    debug_assert!(stride.is_multiple_of(F::X_PER_STEP) && x.len() == n * stride);
    debug_assert!(w.len() == rows * row_bytes && out.len() == rows * n);
    let quads = stride / 4;
    PANELS.with_borrow_mut(|buf| {
        buf.resize(rows.div_ceil(PANEL_ROWS) * quads, _mm256_setzero_si256());
        // SAFETY: `buf` holds `panels · quads` vectors; the caller's layout.
        unsafe { pack::<F>(w, row_bytes, rows, stride, buf) };
        let op = Operands {
            panels: buf,
            quads,
            x,
            stride,
            xsum,
            rows,
        };
        let (g_main, _) = F::TILE;
        let panels = rows.div_ceil(PANEL_ROWS);
        let mut p = 0;
        while p < panels {
            let g = (panels - p).min(g_main);
            // SAFETY: panels p..p + g exist; `op` is the caller's layout.
            unsafe {
                match g {
                    2.. => op.panel_group::<F, 2>(p, out),
                    _ => op.panel_group::<F, 1>(p, out),
                }
            }
            p += g;
        }
    })
}

/// Repacks all `rows` rows of `w` into `buf` (`rows.div_ceil(8)` panels of
/// `stride / 4` vectors).
///
/// # Safety
/// As [`dot_panels`]; `buf.len() == rows.div_ceil(8) · stride / 4`.
#[target_feature(enable = "avx2")]
unsafe fn pack<F: PanelFormat>(
    w: &[u8],
    row_bytes: usize,
    rows: usize,
    stride: usize,
    buf: &mut [__m256i],
) {
    let (quads, per_step) = (stride / 4, F::X_PER_STEP / 4);
    for (p, panel) in buf.chunks_exact_mut(quads).enumerate() {
        let r0 = p * PANEL_ROWS;
        let valid = (rows - r0).min(PANEL_ROWS);
        let w = &w[r0 * row_bytes..(r0 + valid) * row_bytes];
        for c in 0..stride / F::X_PER_STEP {
            let t = load_step(w, row_bytes, valid, c);
            // SAFETY: step c's `per_step` vectors lie inside `panel`.
            unsafe { F::pack_step(t, panel[c * per_step..].as_mut_ptr()) };
        }
    }
}

/// Step `c` of the `rows` (at most 8) rows of `w` (`row_bytes` each): its
/// two 32-byte halves transposed by dwords, bytes past a row's end and rows
/// past `rows` zero.
#[inline]
#[target_feature(enable = "avx2")]
fn load_step(w: &[u8], row_bytes: usize, rows: usize, c: usize) -> [[__m256i; 8]; 2] {
    let at = STEP_BYTES * c;
    let take = row_bytes.saturating_sub(at).min(STEP_BYTES);
    let mut halves = [[_mm256_setzero_si256(); 8]; 2];
    for l in 0..rows {
        let src = &w[l * row_bytes + at.min(row_bytes)..][..take];
        let v = if take == STEP_BYTES {
            // SAFETY: `src` holds 64 bytes.
            unsafe {
                [
                    _mm256_loadu_si256(src.as_ptr().cast()),
                    _mm256_loadu_si256(src.as_ptr().add(32).cast()),
                ]
            }
        } else {
            let mut tail = [0u8; STEP_BYTES];
            tail[..take].copy_from_slice(src);
            // SAFETY: `tail` holds 64 bytes.
            unsafe {
                [
                    _mm256_loadu_si256(tail.as_ptr().cast()),
                    _mm256_loadu_si256(tail.as_ptr().add(32).cast()),
                ]
            }
        };
        halves[0][l] = v[0];
        halves[1][l] = v[1];
    }
    halves.map(|h| transpose8(h))
}

/// The 8×8 transpose of dword matrix `r` (`out[j]` lane `l` = `r[l]` lane
/// `j`): 32-bit and 64-bit interleaves within 128-bit lanes, then the
/// 128-bit halves exchanged.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn transpose8(r: [__m256i; 8]) -> [__m256i; 8] {
    // a[2i], a[2i + 1]: rows 2i, 2i + 1 interleaved by dwords (low, high).
    let a: [__m256i; 8] = std::array::from_fn(|k| {
        let (x, y) = (r[k & !1], r[k | 1]);
        if k % 2 == 0 {
            _mm256_unpacklo_epi32(x, y)
        } else {
            _mm256_unpackhi_epi32(x, y)
        }
    });
    // b[4k + m], 128-bit half H: dword 4H + m of rows 4k..4k + 4.
    let b: [__m256i; 8] = std::array::from_fn(|idx| {
        let (k, m) = (idx / 4, idx % 4);
        let (x, y) = (a[4 * k + m / 2], a[4 * k + 2 + m / 2]);
        if m % 2 == 0 {
            _mm256_unpacklo_epi64(x, y)
        } else {
            _mm256_unpackhi_epi64(x, y)
        }
    });
    std::array::from_fn(|j| {
        let (m, high) = (j % 4, j >= 4);
        if high {
            _mm256_permute2x128_si256::<0x31>(b[m], b[4 + m])
        } else {
            _mm256_permute2x128_si256::<0x20>(b[m], b[4 + m])
        }
    })
}

/// The repacked weights and the activations of one [`dot_panels`] call.
struct Operands<'a> {
    panels: &'a [__m256i],
    quads: usize,
    x: &'a [i8],
    stride: usize,
    xsum: &'a [i32],
    rows: usize,
}

impl Operands<'_> {
    /// Panels `p0..p0 + G` against every activation row, in tiles of the
    /// format's main width, then 4, 2 and 1 rows.
    ///
    /// # Safety
    /// As [`dot_panels`], and panels `p0..p0 + G` exist.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn panel_group<F: PanelFormat, const G: usize>(&self, p0: usize, out: &mut [i32]) {
        let n = self.xsum.len();
        let (_, t_main) = F::TILE;
        let mut t = 0;
        while t < n {
            let left = n - t;
            // SAFETY: activation rows t..t + T exist (each arm's T fits).
            t += unsafe {
                if t_main == 6 && left >= 6 {
                    self.tile::<F, G, 6>(p0, t, out)
                } else if left >= 4 {
                    self.tile::<F, G, 4>(p0, t, out)
                } else if left >= 2 {
                    self.tile::<F, G, 2>(p0, t, out)
                } else {
                    self.tile::<F, G, 1>(p0, t, out)
                }
            };
        }
    }

    /// Panels `p0..p0 + G` against activation rows `t0..t0 + T`, into
    /// `out`; returns `T`.
    ///
    /// # Safety
    /// As [`Operands::panel_group`], and `t0 + T <= n`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn tile<F: PanelFormat, const G: usize, const T: usize>(
        &self,
        p0: usize,
        t0: usize,
        out: &mut [i32],
    ) -> usize {
        let q = self.quads;
        let pw = self.panels[p0 * q..(p0 + G) * q].as_ptr();
        let px = self.x[t0 * self.stride..(t0 + T) * self.stride].as_ptr();
        // SAFETY: G panels of `quads` vectors at `pw`, T activation rows of
        // `stride = 4·quads` bytes at `px`; quads is a multiple of 8 (the
        // stride a multiple of 32 in every format).
        let acc = unsafe { F::tile::<G, T>(pw, q, px, self.stride) };
        for (g, acc) in acc.iter().enumerate() {
            let r0 = (p0 + g) * PANEL_ROWS;
            let lanes = (self.rows - r0).min(PANEL_ROWS);
            for (t, &a) in acc.iter().enumerate() {
                let corr = _mm256_set1_epi32(F::correct(self.xsum[t0 + t]));
                let v = _mm256_add_epi32(a, corr);
                let o = &mut out[(t0 + t) * self.rows + r0..][..lanes];
                if lanes == PANEL_ROWS {
                    // SAFETY: `o` holds 8 i32.
                    unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast(), v) };
                } else {
                    let mut all = [0i32; PANEL_ROWS];
                    // SAFETY: `all` holds 8 i32.
                    unsafe { _mm256_storeu_si256(all.as_mut_ptr().cast(), v) };
                    o.copy_from_slice(&all[..lanes]);
                }
            }
        }
        T
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose8_moves_every_dword() {
        if !crate::kernels::cpu::has_avx2() {
            eprintln!("skipped: no AVX2 on this CPU");
            return;
        }
        let rows: Vec<u8> = (0..8 * 32).map(|i| (i * 7 + 3) as u8).collect();
        // SAFETY: AVX2 detected above; 8 rows of 32 bytes.
        let r: [__m256i; 8] =
            std::array::from_fn(|l| unsafe { _mm256_loadu_si256(rows[32 * l..].as_ptr().cast()) });
        // SAFETY: AVX2 detected above.
        let t = unsafe { transpose8(r) };
        for (j, v) in t.iter().enumerate() {
            let mut lanes = [0u8; 32];
            // SAFETY: 32 writable bytes.
            unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), *v) };
            for l in 0..8 {
                assert_eq!(
                    lanes[4 * l..4 * l + 4],
                    rows[l * 32 + 4 * j..][..4],
                    "j {j} l {l}"
                );
            }
        }
    }
}
