//! The AVX-512 VNNI register tiles shared by the int8 and int4 batched
//! dots (`int8::dot_block`, `int4::dot_block`): tiles of 4 weight rows × 4
//! activation rows, each weight vector loaded (and unpacked) once for four
//! activation rows and each activation vector feeding four weight rows; row
//! and batch tails take narrower tiles. The two formats differ only in one
//! step ([`TileStep`]): how 64 weight bytes become unsigned `vpdpbusd`
//! operands and which activation bytes they meet.

use std::arch::x86_64::*;
use std::marker::PhantomData;

/// Weight rows of the main tile.
pub(crate) const TILE_ROWS: usize = 4;
/// Activation rows of the main tile.
pub(crate) const TILE_ACTS: usize = 4;

/// One weight format's inner step of a tile.
pub(crate) trait TileStep {
    /// The offset that makes every weight unsigned (`vpdpbusd` multiplies
    /// unsigned bytes by signed ones): a tile's sums are `Σ (w + BIAS)·x`,
    /// and `BIAS·Σx` is taken off each.
    const BIAS: i32;
    /// Bytes of an activation row per 64 weight bytes.
    const X_PER_STEP: usize;

    /// Adds weight bytes `i..i + 64` (those enabled by `m`) of R rows at
    /// `pw` (`row_bytes` apart) times the matching activation bytes of T
    /// rows at `px` (`stride` apart) into `acc`.
    ///
    /// # Safety
    /// The CPU must support AVX-512F, AVX-512BW and AVX-512 VNNI; `m`
    /// enables only bytes `i..row_bytes` of each weight row, `i <
    /// row_bytes`, and `pw`/`px` point at R whole weight rows and T whole
    /// activation rows laid out as the format's `dot_block` requires.
    #[allow(clippy::too_many_arguments)] // one register step: no struct to pass
    unsafe fn step<const R: usize, const T: usize>(
        acc: &mut [[__m512i; T]; R],
        pw: *const u8,
        row_bytes: usize,
        px: *const i8,
        stride: usize,
        i: usize,
        m: __mmask64,
    );
}

/// `out[t·rows + r]` = `Σ (w[r] + S::BIAS)·x[t] − S::BIAS·xsum[t]` for weight
/// rows of `row_bytes` bytes and `n = xsum.len()` activation rows of
/// `stride` bytes, in tiles (see the module docs).
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512BW and AVX-512 VNNI; `stride` is a
/// multiple of `S::X_PER_STEP` and holds `row_bytes.div_ceil(64)` steps of
/// it; `x.len() == n·stride` laid out as the format requires, zero past
/// its columns; `w.len() == rows·row_bytes` and `out.len() == rows·n` for
/// some `rows`; `xsum[t] == Σ x[t, :]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn dot_block<S: TileStep>(
    w: &[u8],
    row_bytes: usize,
    x: &[i8],
    stride: usize,
    xsum: &[i32],
    out: &mut [i32],
) {
    let n = xsum.len();
    debug_assert!(
        stride.is_multiple_of(S::X_PER_STEP)
            && stride >= row_bytes.div_ceil(64) * S::X_PER_STEP
            && x.len() == n * stride
    );
    if n == 0 {
        return;
    }
    let rows = out.len() / n;
    debug_assert!(out.len() == rows * n && w.len() == rows * row_bytes);
    let tiles = Tiles::<S> {
        w,
        row_bytes,
        x,
        stride,
        xsum,
        step: PhantomData,
    };
    let mut r = 0;
    while r + TILE_ROWS <= rows {
        // SAFETY: rows r..r + 4 exist; the caller's layout contract.
        unsafe { tiles.row_group::<TILE_ROWS>(r, out) };
        r += TILE_ROWS;
    }
    for r in r..rows {
        // SAFETY: row r exists; the caller's layout contract.
        unsafe { tiles.row_group::<1>(r, out) };
    }
}

/// The operands of one [`dot_block`] call.
struct Tiles<'a, S> {
    w: &'a [u8],
    row_bytes: usize,
    x: &'a [i8],
    stride: usize,
    xsum: &'a [i32],
    step: PhantomData<S>,
}

impl<S: TileStep> Tiles<'_, S> {
    /// Weight rows `r0..r0 + R` against every activation row, into `out`.
    ///
    /// # Safety
    /// As [`dot_block`], and `r0 + R` is at most the block's row count.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn row_group<const R: usize>(&self, r0: usize, out: &mut [i32]) {
        let n = self.xsum.len();
        let mut t = 0;
        while t + TILE_ACTS <= n {
            // SAFETY: activation rows t..t + 4 exist; the caller's contract.
            unsafe { self.tile::<R, TILE_ACTS>(r0, t, out) };
            t += TILE_ACTS;
        }
        // SAFETY: activation rows t..n exist (the arm picks T = n - t); the
        // caller's contract.
        unsafe {
            match n - t {
                3 => self.tile::<R, 3>(r0, t, out),
                2 => self.tile::<R, 2>(r0, t, out),
                1 => self.tile::<R, 1>(r0, t, out),
                _ => {}
            }
        }
    }

    /// Weight rows `r0..r0 + R` against activation rows `t0..t0 + T`: R×T
    /// vectors of 16 partial sums of biased weights times activations,
    /// reduced into `out[t·rows + r]` less `S::BIAS·Σx`.
    ///
    /// # Safety
    /// As [`Tiles::row_group`], and `t0 + T <= n`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn tile<const R: usize, const T: usize>(&self, r0: usize, t0: usize, out: &mut [i32]) {
        let (rb, stride) = (self.row_bytes, self.stride);
        let pw = self.w[r0 * rb..(r0 + R) * rb].as_ptr();
        let px = self.x[t0 * stride..(t0 + T) * stride].as_ptr();
        let mut acc = [[_mm512_setzero_si512(); T]; R];
        let whole = rb - rb % 64;
        // This tile's share of the next row group's lines (see `Prefetch`).
        let steps = whole / 64;
        let pf = Prefetch::new::<R>(steps, t0 / TILE_ACTS, self.xsum.len().div_ceil(TILE_ACTS));
        for (s, i) in (0..whole).step_by(64).enumerate() {
            pf.step::<R>(pw, rb, s);
            // SAFETY: i + 64 <= row_bytes: whole steps; the caller's contract.
            unsafe { S::step(&mut acc, pw, rb, px, stride, i, !0) };
        }
        if whole < rb {
            let m = (1u64 << (rb - whole)) - 1;
            // SAFETY: the mask enables only bytes whole..row_bytes of each row.
            unsafe { S::step(&mut acc, pw, rb, px, stride, whole, m) };
        }
        let rows = out.len() / self.xsum.len();
        for (k, s) in sums(&acc).into_iter().take(R * T).enumerate() {
            let (r, t) = (r0 + k / T, t0 + k % T);
            out[t * rows + r] = s.wrapping_sub(self.xsum[t].wrapping_mul(S::BIAS));
        }
    }
}

/// Lane `k` of the result is the wrapping sum of the 16 lanes of `v[k]`: a
/// transposing tree (pairs of 32-bit lanes, then 64-bit, then 128-bit
/// halves twice), 15 adds and 30 shuffles for all 16 sums instead of a
/// full reduction per vector.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn reduce16(v: [__m512i; 16]) -> __m512i {
    // Per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3] for each pair (a, b).
    let s1: [__m512i; 8] = std::array::from_fn(|k| {
        let (a, b) = (v[2 * k], v[2 * k + 1]);
        _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b))
    });
    // Per 128-bit lane: one partial sum of each of four vectors, in order.
    let s2: [__m512i; 4] = std::array::from_fn(|k| {
        let (c, d) = (s1[2 * k], s1[2 * k + 1]);
        _mm512_add_epi32(_mm512_unpacklo_epi64(c, d), _mm512_unpackhi_epi64(c, d))
    });
    // Lanes 0-1: vectors 4k..4k+4 (two halves); lanes 2-3: vectors 4k+4...
    let halves = |a: __m512i, b: __m512i| {
        _mm512_add_epi32(
            _mm512_shuffle_i32x4::<0b10_00_10_00>(a, b),
            _mm512_shuffle_i32x4::<0b11_01_11_01>(a, b),
        )
    };
    let s3 = [halves(s2[0], s2[1]), halves(s2[2], s2[3])];
    halves(s3[0], s3[1])
}

/// The 16-lane sums of a tile's accumulators, row-major (`k = r·T + t`;
/// unused entries 0).
#[inline]
#[target_feature(enable = "avx512f")]
fn sums<const R: usize, const T: usize>(acc: &[[__m512i; T]; R]) -> [i32; 16] {
    const { assert!(R * T <= 16) };
    let flat = std::array::from_fn(|k| {
        if k < R * T {
            acc[k / T][k % T]
        } else {
            _mm512_setzero_si512()
        }
    });
    let mut out = [0i32; 16];
    // SAFETY: `out` is 64 writable bytes.
    unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast(), reduce16(flat)) };
    out
}

/// Software prefetch of the next row group's weights (the R rows after
/// the tile's, which this thread's next tiles read), spread over the
/// passes that the tiles make over a row group (one per 4 activation rows):
/// pass `p` of `P` prefetches its share of the group's `R·steps` lines, a
/// few a step, in row-interleaved order (line `l` = row `l % R`, step
/// `l / R`). Each group's weights then stream in from memory while the
/// previous group computes, at the rate the tiles consume them, instead of
/// as R short streams the hardware prefetcher has to discover one by one
/// (or as a burst that overflows the miss buffers).
struct Prefetch {
    /// First line of this pass's share.
    first: usize,
    /// Lines a step.
    per_step: usize,
    /// Lines in the group.
    lines: usize,
}

impl Prefetch {
    fn new<const R: usize>(steps: usize, pass: usize, passes: usize) -> Self {
        let per_step = R.div_ceil(passes.max(1));
        Prefetch {
            first: pass * steps * per_step,
            per_step,
            lines: R * steps,
        }
    }

    /// Prefetches step `s`'s lines of the group after the R rows at `pw`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn step<const R: usize>(&self, pw: *const u8, rb: usize, s: usize) {
        let start = self.first + s * self.per_step;
        for l in start..(start + self.per_step).min(self.lines) {
            let at = (R + l % R) * rb + 64 * (l / R);
            // A prefetch is a hint: it never faults, whatever the address
            // (past the matrix's end included).
            _mm_prefetch::<_MM_HINT_T0>(pw.wrapping_add(at).cast());
        }
    }
}
