//! The AVX-512 VNNI panel kernel of the int8 and int4 batched dots for
//! many activation rows (prefill: `int8::dot_block` and `int4::dot_block`
//! from `kernels::PANEL_ACTS_MIN` rows). A block of weight rows is repacked once
//! per call into panels of 16 rows, biased to unsigned bytes
//! ([`PanelFormat`]): vector `q` of a panel holds bytes `4q..4q + 4` of
//! each of its 16 rows (row `l` in 32-bit lane `l`, a 16×16 dword
//! transpose per 64 bytes). A register tile of 2 panels × 12 activation
//! rows then needs one weight load per panel and one 4-byte broadcast per
//! activation row for each `vpdpbusd`, and no horizontal sums at all:
//! lane `l` of an accumulator is weight row `l`'s dot with that activation
//! row. The repack (and for int4 the nibble unpacking) is paid once for
//! every activation row of the call; the sums are the same exact `i32`
//! wrapping sums as every other version's.

use std::arch::x86_64::*;
use std::cell::RefCell;

/// Weight rows of a panel (the 32-bit lanes of a zmm register).
pub(crate) const PANEL_ROWS: usize = 16;
/// Panels of the main tile: blocks of rows are whole multiples of
/// `PANEL_ROWS · TILE_PANELS` where they can be.
pub(crate) const TILE_PANELS: usize = 2;
/// Activation rows of the main tile (24 accumulators).
const TILE_ACTS: usize = 12;

/// One weight format's repack.
pub(crate) trait PanelFormat {
    /// The offset that makes every weight unsigned: the sums are
    /// `Σ (w + BIAS)·x`, and `BIAS·Σx` is taken off each.
    const BIAS: i32;
    /// Bytes of an activation row per 64 weight bytes.
    const X_PER_STEP: usize;

    /// Writes the panel vectors of weight step `c` (weight bytes
    /// `64c..64c + 64` of each row, those enabled by `m`) of the `rows`
    /// (at most 16) rows at `pw` (`row_bytes` apart) to `out`:
    /// `X_PER_STEP / 4` vectors, missing rows as zero lanes.
    ///
    /// # Safety
    /// The CPU must support AVX-512F/BW; `m` enables only bytes
    /// `64c..row_bytes` of each row; `pw` points at `rows` whole rows;
    /// `out` has room for `X_PER_STEP / 4` vectors.
    unsafe fn pack_step(
        pw: *const u8,
        row_bytes: usize,
        rows: usize,
        c: usize,
        m: __mmask64,
        out: *mut __m512i,
    );
}

thread_local! {
    /// This thread's repacked block, reused across calls.
    static PANELS: RefCell<Vec<__m512i>> = const { RefCell::new(Vec::new()) };
}

/// `out[t·rows + r]` = `Σ (w[r] + F::BIAS)·x[t] − F::BIAS·xsum[t]` for weight
/// rows of `row_bytes` bytes and `n = xsum.len()` activation rows of
/// `stride` bytes (see the module docs).
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512BW and AVX-512 VNNI; `stride` is a
/// multiple of `F::X_PER_STEP` and holds `row_bytes.div_ceil(64)` steps of
/// it; `x.len() == n·stride` laid out as the format requires, zero past
/// its columns; `w.len() == rows·row_bytes` and `out.len() == rows·n` for
/// some `rows`; `xsum[t] == Σ x[t, :]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn dot_panels<F: PanelFormat>(
    w: &[u8],
    row_bytes: usize,
    x: &[i8],
    stride: usize,
    xsum: &[i32],
    out: &mut [i32],
) {
    // Quads (4 activation bytes) a row: every panel vector meets one.
    let quads = stride / 4;
    let run = |buf: &[__m512i], rows: usize, out: &mut [i32]| {
        let panels = rows.div_ceil(PANEL_ROWS);
        let op = Operands {
            panels: buf,
            quads,
            x,
            stride,
            xsum,
            rows,
            bias: F::BIAS,
        };
        let mut p = 0;
        while p < panels {
            let g = (panels - p).min(TILE_PANELS);
            // SAFETY: panels p..p + g exist; `op` is the caller's layout.
            unsafe {
                match g {
                    2 => op.panel_group::<2>(p, out),
                    _ => op.panel_group::<1>(p, out),
                }
            }
            p += g;
        }
    };
    // SAFETY: the caller's layout is `with_panels`'s.
    unsafe { with_panels::<F>(w, row_bytes, x, stride, xsum, out, run) }
}

/// The shared start of the panel kernels (this one's and the AMX tiles'):
/// for weight rows of `row_bytes` bytes against the `n = xsum.len()`
/// activation rows of `x`, `out` all zeros when there is nothing to sum,
/// else the block's `rows = out.len() / n` rows repacked into this
/// thread's panel buffer and handed to `f` with `rows` and `out`:
/// `rows.div_ceil(16)` panels of `stride / 4` vectors, vector `q` of a
/// panel pairing with activation bytes `4q..4q + 4`.
///
/// # Safety
/// The CPU must support AVX-512F/BW; the layout is [`dot_panels`]'s.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn with_panels<F: PanelFormat>(
    w: &[u8],
    row_bytes: usize,
    x: &[i8],
    stride: usize,
    xsum: &[i32],
    out: &mut [i32],
    f: impl FnOnce(&[__m512i], usize, &mut [i32]),
) {
    let n = xsum.len();
    if n == 0 || row_bytes == 0 {
        out.fill(0);
        return;
    }
    let rows = out.len() / n;
    debug_assert!(x.len() == n * stride && out.len() == rows * n);
    // SAFETY: the caller's layout is `with_packed`'s.
    unsafe { with_packed::<F, ()>(w, row_bytes, rows, stride, |buf| f(buf, rows, out)) }
}

/// The `rows` weight rows of `w` (`row_bytes` each) repacked into this
/// thread's panel buffer, handed to `f`: `rows.div_ceil(16)` panels of
/// `stride / 4` vectors, vector `q` of a panel pairing with activation
/// bytes `4q..4q + 4` (`F`'s column order), zero past the rows' ends.
///
/// # Safety
/// The CPU must support AVX-512F/BW; `stride` is a multiple of
/// `F::X_PER_STEP` and covers `row_bytes.div_ceil(64)` steps of it;
/// `w.len() == rows·row_bytes`.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn with_packed<F: PanelFormat, R>(
    w: &[u8],
    row_bytes: usize,
    rows: usize,
    stride: usize,
    f: impl FnOnce(&[__m512i]) -> R,
) -> R {
    debug_assert!(stride.is_multiple_of(F::X_PER_STEP) && w.len() == rows * row_bytes);
    debug_assert!(stride / F::X_PER_STEP >= row_bytes.div_ceil(64));
    PANELS.with_borrow_mut(|buf| {
        buf.resize(
            rows.div_ceil(PANEL_ROWS) * (stride / 4),
            _mm512_setzero_si512(),
        );
        // SAFETY: `buf` holds `panels · quads` vectors; the caller's layout.
        unsafe { pack::<F>(w, row_bytes, rows, stride, buf) };
        f(buf)
    })
}

/// Repacks all `rows` rows of `w` into `buf` (`rows.div_ceil(16)` panels of
/// `stride / 4` vectors).
///
/// # Safety
/// As [`dot_panels`]; `buf.len() == rows.div_ceil(16) · stride / 4`.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn pack<F: PanelFormat>(
    w: &[u8],
    row_bytes: usize,
    rows: usize,
    stride: usize,
    buf: &mut [__m512i],
) {
    let (quads, per_step) = (stride / 4, F::X_PER_STEP / 4);
    for (p, panel) in buf.chunks_exact_mut(quads).enumerate() {
        let r0 = p * PANEL_ROWS;
        let valid = (rows - r0).min(PANEL_ROWS);
        let pw = w[r0 * row_bytes..(r0 + valid) * row_bytes].as_ptr();
        for c in 0..stride / F::X_PER_STEP {
            let left = row_bytes.saturating_sub(64 * c);
            let m = if left >= 64 { !0 } else { (1u64 << left) - 1 };
            // SAFETY: the mask enables only bytes 64c..row_bytes of the
            // `valid` rows at `pw`; step c's vectors lie inside `panel`.
            unsafe {
                F::pack_step(
                    pw,
                    row_bytes,
                    valid,
                    c,
                    m,
                    panel[c * per_step..].as_mut_ptr(),
                )
            };
        }
    }
}

/// The repacked weights and the activations of one [`dot_panels`] call.
struct Operands<'a> {
    panels: &'a [__m512i],
    quads: usize,
    x: &'a [i8],
    stride: usize,
    xsum: &'a [i32],
    rows: usize,
    bias: i32,
}

impl Operands<'_> {
    /// Panels `p0..p0 + G` against every activation row, in tiles of 12,
    /// then 8, 4, 2 and 1 rows.
    ///
    /// # Safety
    /// As [`dot_panels`], and panels `p0..p0 + G` exist.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn panel_group<const G: usize>(&self, p0: usize, out: &mut [i32]) {
        let n = self.xsum.len();
        let mut t = 0;
        while t < n {
            // SAFETY: activation rows t..t + T exist (each arm's T fits).
            t += unsafe {
                match n - t {
                    TILE_ACTS.. => self.tile::<G, TILE_ACTS>(p0, t, out),
                    8..=11 => self.tile::<G, 8>(p0, t, out),
                    4..=7 => self.tile::<G, 4>(p0, t, out),
                    2..=3 => self.tile::<G, 2>(p0, t, out),
                    _ => self.tile::<G, 1>(p0, t, out),
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
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn tile<const G: usize, const T: usize>(
        &self,
        p0: usize,
        t0: usize,
        out: &mut [i32],
    ) -> usize {
        let q = self.quads;
        let pw = self.panels[p0 * q..(p0 + G) * q].as_ptr();
        let px = self.x[t0 * self.stride..(t0 + T) * self.stride].as_ptr();
        let mut acc = [[_mm512_setzero_si512(); T]; G];
        for k in 0..q {
            // SAFETY: k < quads: vector k of each of the G panels, and bytes
            // 4k..4k + 4 of each activation row (stride = 4 · quads).
            unsafe {
                let vw: [__m512i; G] = std::array::from_fn(|g| *pw.add(g * q + k));
                #[allow(clippy::needless_range_loop)] // acc is indexed [g][t]: a register tile
                for t in 0..T {
                    let at = px.add(t * self.stride + 4 * k).cast::<i32>();
                    let vx = _mm512_set1_epi32(at.read_unaligned());
                    for g in 0..G {
                        acc[g][t] = _mm512_dpbusd_epi32(acc[g][t], vw[g], vx);
                    }
                }
            }
        }
        for (g, acc) in acc.iter().enumerate() {
            let r0 = (p0 + g) * PANEL_ROWS;
            let lanes = (self.rows - r0).min(PANEL_ROWS);
            let m: __mmask16 = ((1u32 << lanes) - 1) as u16;
            for (t, &a) in acc.iter().enumerate() {
                let corr = _mm512_set1_epi32(self.xsum[t0 + t].wrapping_mul(self.bias));
                let v = _mm512_sub_epi32(a, corr);
                let o = &mut out[(t0 + t) * self.rows + r0..][..lanes];
                // SAFETY: the mask writes only the `lanes` elements of `o`.
                unsafe { _mm512_mask_storeu_epi32(o.as_mut_ptr().cast(), m, v) };
            }
        }
        T
    }
}

/// The 16 rows' 64-byte vectors at `pw` (`row_bytes` apart; bytes enabled
/// by `m` from byte `i`), rows past `rows` zero, transposed by dwords:
/// vector `j` holds dword `j` of each row, row `l` in lane `l`.
///
/// # Safety
/// The CPU must support AVX-512F/BW; `m` enables only bytes of the `rows`
/// rows at `pw`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn load_transposed(
    pw: *const u8,
    row_bytes: usize,
    rows: usize,
    i: usize,
    m: __mmask64,
) -> [__m512i; 16] {
    let r: [__m512i; 16] = std::array::from_fn(|l| {
        if l < rows {
            // SAFETY: the caller's contract: row l exists, `m` stays inside it.
            unsafe { _mm512_maskz_loadu_epi8(m, pw.add(l * row_bytes + i).cast()) }
        } else {
            _mm512_setzero_si512()
        }
    });
    transpose16(r)
}

/// The 16×16 transpose of dword matrix `r` (`out[j]` lane `l` = `r[l]`
/// lane `j`): 32-bit and 64-bit interleaves within 128-bit lanes, then a
/// 4×4 transpose of the 128-bit lanes.
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose16(r: [__m512i; 16]) -> [__m512i; 16] {
    // a[2i], a[2i+1]: rows 2i, 2i+1 interleaved by dwords (low, high pairs).
    let a: [__m512i; 16] = std::array::from_fn(|k| {
        let (x, y) = (r[k & !1], r[k | 1]);
        if k % 2 == 0 {
            _mm512_unpacklo_epi32(x, y)
        } else {
            _mm512_unpackhi_epi32(x, y)
        }
    });
    // b[4k + m], 128-bit lane L: dword 4L + m of rows 4k..4k + 4.
    let b: [__m512i; 16] = std::array::from_fn(|idx| {
        let (k, m) = (idx / 4, idx % 4);
        let (x, y) = (a[4 * k + m / 2], a[4 * k + 2 + m / 2]);
        if m % 2 == 0 {
            _mm512_unpacklo_epi64(x, y)
        } else {
            _mm512_unpackhi_epi64(x, y)
        }
    });
    let mut out = [_mm512_setzero_si512(); 16];
    for m in 0..4 {
        let (b0, b1, b2, b3) = (b[m], b[4 + m], b[8 + m], b[12 + m]);
        let c0 = _mm512_shuffle_i32x4::<0b01_00_01_00>(b0, b1);
        let c1 = _mm512_shuffle_i32x4::<0b11_10_11_10>(b0, b1);
        let c2 = _mm512_shuffle_i32x4::<0b01_00_01_00>(b2, b3);
        let c3 = _mm512_shuffle_i32x4::<0b11_10_11_10>(b2, b3);
        out[m] = _mm512_shuffle_i32x4::<0b10_00_10_00>(c0, c2);
        out[4 + m] = _mm512_shuffle_i32x4::<0b11_01_11_01>(c0, c2);
        out[8 + m] = _mm512_shuffle_i32x4::<0b10_00_10_00>(c1, c3);
        out[12 + m] = _mm512_shuffle_i32x4::<0b11_01_11_01>(c1, c3);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose16_moves_every_dword() {
        if !crate::kernels::cpu::has_avx512_vnni() {
            eprintln!("skipped: no AVX-512 VNNI on this CPU");
            return;
        }
        let rows: Vec<u8> = (0..16 * 64).map(|i| (i * 7 + 3) as u8).collect();
        // SAFETY: AVX-512F/BW detected above; 16 rows of 64 bytes, full mask.
        let t = unsafe { load_transposed(rows.as_ptr(), 64, 16, 0, !0) };
        for (j, v) in t.iter().enumerate() {
            let mut lanes = [0u8; 64];
            // SAFETY: 64 writable bytes.
            unsafe { _mm512_storeu_si512(lanes.as_mut_ptr().cast(), *v) };
            for l in 0..16 {
                assert_eq!(
                    lanes[4 * l..4 * l + 4],
                    rows[l * 64 + 4 * j..][..4],
                    "j {j} l {l}"
                );
            }
        }
    }
}
