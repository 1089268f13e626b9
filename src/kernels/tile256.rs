//! The AVX2 register tiles shared by the int8 and int4 batched dots
//! (`int8::avx2::dot_block`, `int4::avx2::dot_block`): tiles of 2 weight
//! rows × 2 activation rows, row and batch tails taking narrower tiles. The
//! formats differ only in a tile's inner loop ([`Tile256::tile`]) and in the
//! correction each sum gets.

/// Weight rows, and activation rows, of the main tile.
pub(crate) const TILE: usize = 2;

/// One weight format's tile.
pub(crate) trait Tile256 {
    /// The sums of weight rows `r0..r0 + R` (`row_bytes` each) with
    /// activation rows `t0..t0 + T` (`stride` apart).
    ///
    /// # Safety
    /// The CPU must support AVX2; the format's layout holds and the rows of
    /// the tile exist.
    unsafe fn tile<const R: usize, const T: usize>(
        w: &[u8],
        row_bytes: usize,
        x: &[i8],
        stride: usize,
        r0: usize,
        t0: usize,
    ) -> [[i32; T]; R];
}

/// `out[t·rows + r]` = `correct(t, sum)` of each tile sum of weight row `r`
/// with activation row `t`, for `n` activation rows.
///
/// # Safety
/// The CPU must support AVX2; the format's layout and shapes hold:
/// `out.len() == rows·n`, `w` holds `rows` rows and `x` `n` rows.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn dot_block<S: Tile256>(
    w: &[u8],
    row_bytes: usize,
    x: &[i8],
    stride: usize,
    n: usize,
    out: &mut [i32],
    correct: impl Fn(usize, i32) -> i32,
) {
    if n == 0 {
        return;
    }
    let rows = out.len() / n;
    debug_assert!(out.len() == rows * n && w.len() == rows * row_bytes);
    for r in (0..rows).step_by(TILE) {
        for t in (0..n).step_by(TILE) {
            // SAFETY: rows r.. and activation rows t.. of the tile exist
            // (the arms pick the tile that fits); the caller's layout contract.
            let acc = unsafe {
                match (rows - r >= TILE, n - t >= TILE) {
                    (true, true) => S::tile::<2, 2>(w, row_bytes, x, stride, r, t),
                    (true, false) => pad(S::tile::<2, 1>(w, row_bytes, x, stride, r, t)),
                    (false, true) => pad(S::tile::<1, 2>(w, row_bytes, x, stride, r, t)),
                    (false, false) => pad(S::tile::<1, 1>(w, row_bytes, x, stride, r, t)),
                }
            };
            for (dr, row) in acc.iter().enumerate().take(rows - r) {
                for (dt, &a) in row.iter().enumerate().take(n - t) {
                    out[(t + dt) * rows + r + dr] = correct(t + dt, a);
                }
            }
        }
    }
}

/// A narrower tile's sums in a 2×2 array (the rest unused).
fn pad<const R: usize, const T: usize>(acc: [[i32; T]; R]) -> [[i32; TILE]; TILE] {
    std::array::from_fn(|r| std::array::from_fn(|t| if r < R && t < T { acc[r][t] } else { 0 }))
}
