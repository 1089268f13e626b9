//! Grouped integer formats (docs/FORMAT.md, "Grouped formats"): int4, int3
//! and int2 weights with an f16 scale (and, for the asymmetric ones, an f16
//! min) per group of 32, 64 or 128 columns, and their dots with int8
//! activation rows.
//!
//! A row is `groups = ceil(cols / group)` groups (padded columns hold 0 and
//! meet 0 activations); a group is `group / 32` chunks of 32 columns, each
//! packed so that unpacking gives the 32 columns in natural order:
//! - int4: 16 bytes, byte `j` holds column `j` (low nibble) and `j + 16`
//!   (high nibble);
//! - int2: 8 bytes, bits `2k..2k+1` of byte `j` hold column `j + 8k`;
//! - int3: the int2 chunk of the low two bits, then 4 bytes (a little-endian
//!   u32) whose bit `c` is bit 2 of column `c`.
//!
//! A stored level `u` (0..2^b − 1) means `w = d·u + m`: asymmetric formats
//! store `m`, symmetric int4 has `m = −8·d` (`u = q + 8`). The companion
//! holds, per row, the `groups` scales and then (asymmetric) the `groups`
//! mins, as f16 bits.
//!
//! The dot of a weight row with an int8 activation row `x` (padded with
//! zeros to whole groups; `xs[g]` the sum of group `g`'s activations) is
//! defined, for every ISA, on each group's exact integer sum `S[g]`:
//! `Σ u·x` over the group's columns for the formats with a min, `Σ (u − 8)·x`
//! (the signed levels) for symmetric int4. (`|S[g]| ≤ 128·15·127 < 2^24`,
//! so `S[g] as f32` is exact.) Eight f32 lanes start at 0; group after
//! group, lane `g mod 8` takes `fma(d_g, S[g], lane)` and then, with a min,
//! `fma(m_g, xs[g], lane)`; the result is `reduce8(lanes)` with
//! `reduce8(a) = ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))`. Any
//! summation order gives the same `S[g]`, so a kernel is free to get it from
//! `vpdpbusd` lanes, a horizontal sum or an AMX tile; the scalar functions
//! here are the definition, and the SIMD versions are held bit-identical
//! to them by the tests.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod matmul;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod tiles;

pub use matmul::{dequantize_row, matmul, matmul_float, matmul_int, matmul_int_pair};

use super::cpu::{isa, Isa};
use half::f16;
use std::fmt;

/// Columns of one chunk (the unit every packing is defined on).
pub const CHUNK: usize = 32;
/// f32 lanes of the dot's defined order.
pub const LANES: usize = 8;

/// Bits per stored level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GBits {
    Q2,
    Q3,
    Q4,
}

impl GBits {
    pub fn bits(self) -> u32 {
        match self {
            GBits::Q2 => 2,
            GBits::Q3 => 3,
            GBits::Q4 => 4,
        }
    }

    /// Largest stored level, `2^b − 1`.
    pub fn levels_max(self) -> u32 {
        (1 << self.bits()) - 1
    }
}

/// Columns per group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Group {
    G32,
    G64,
    G128,
}

impl Group {
    pub fn cols(self) -> usize {
        match self {
            Group::G32 => 32,
            Group::G64 => 64,
            Group::G128 => 128,
        }
    }

    pub fn from_cols(cols: usize) -> Option<Group> {
        [Group::G32, Group::G64, Group::G128]
            .into_iter()
            .find(|g| g.cols() == cols)
    }
}

/// A grouped format: bits, group size, and whether a min is stored.
/// int3 and int2 always store one (see [`GFormat::new`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GFormat {
    bits: GBits,
    group: Group,
    min: bool,
}

impl GFormat {
    /// Every grouped format, in name order.
    pub fn all() -> Vec<GFormat> {
        let groups = [Group::G32, Group::G64, Group::G128];
        let mut out = Vec::new();
        for bits in [GBits::Q4, GBits::Q3, GBits::Q2] {
            for group in groups {
                for min in [false, true] {
                    out.extend(GFormat::new(bits, group, min));
                }
            }
        }
        out
    }

    /// The format, or `None` for a symmetric int3 or int2 (not defined).
    pub fn new(bits: GBits, group: Group, min: bool) -> Option<GFormat> {
        (min || bits == GBits::Q4).then_some(GFormat { bits, group, min })
    }

    pub fn bits(self) -> GBits {
        self.bits
    }

    pub fn group(self) -> Group {
        self.group
    }

    /// Whether an f16 min is stored per group.
    pub fn has_min(self) -> bool {
        self.min
    }

    /// The name `q{bits}g{group}` with `a` appended for asymmetric int4
    /// (`q4g64`, `q4g64a`, `q3g64`, `q2g128`).
    pub fn name(self) -> String {
        let a = if self.min && self.bits == GBits::Q4 {
            "a"
        } else {
            ""
        };
        format!("q{}g{}{a}", self.bits.bits(), self.group.cols())
    }

    /// The format named `name` (see [`GFormat::name`]).
    pub fn parse(name: &str) -> Option<GFormat> {
        GFormat::all().into_iter().find(|f| f.name() == name)
    }

    /// Groups of a row of `cols` columns.
    pub fn groups(self, cols: usize) -> usize {
        cols.div_ceil(self.group.cols())
    }

    /// Columns of a row padded to whole groups.
    pub fn padded_cols(self, cols: usize) -> usize {
        self.groups(cols) * self.group.cols()
    }

    /// Bytes of one 32-column chunk.
    pub fn chunk_bytes(self) -> usize {
        CHUNK * self.bits.bits() as usize / 8
    }

    /// Bytes of one packed row.
    pub fn row_bytes(self, cols: usize) -> usize {
        self.padded_cols(cols) / CHUNK * self.chunk_bytes()
    }

    /// f16 values of one row's companion: a scale per group, and a min.
    pub fn params_per_row(self, cols: usize) -> usize {
        self.groups(cols) * if self.min { 2 } else { 1 }
    }

    /// Stored bits per weight of a row of `cols` (packed levels and
    /// parameters).
    pub fn bits_per_weight(self, cols: usize) -> f64 {
        let bytes = self.row_bytes(cols) + 2 * self.params_per_row(cols);
        8.0 * bytes as f64 / cols.max(1) as f64
    }
}

impl fmt::Display for GFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// The 32 levels of one packed chunk, in column order.
pub fn unpack_chunk(bits: GBits, chunk: &[u8]) -> [u8; CHUNK] {
    let mut out = [0u8; CHUNK];
    match bits {
        GBits::Q4 => {
            for j in 0..16 {
                out[j] = chunk[j] & 15;
                out[j + 16] = chunk[j] >> 4;
            }
        }
        GBits::Q2 | GBits::Q3 => {
            for (c, o) in out.iter_mut().enumerate() {
                *o = (chunk[c % 8] >> (2 * (c / 8))) & 3;
            }
            if bits == GBits::Q3 {
                let hi = u32::from_le_bytes([chunk[8], chunk[9], chunk[10], chunk[11]]);
                for (c, o) in out.iter_mut().enumerate() {
                    *o |= (((hi >> c) & 1) as u8) << 2;
                }
            }
        }
    }
    out
}

/// Packs 32 levels (each at most `bits.levels_max()`) into one chunk.
pub fn pack_chunk(bits: GBits, levels: &[u8; CHUNK], out: &mut [u8]) {
    match bits {
        GBits::Q4 => {
            for j in 0..16 {
                out[j] = levels[j] | levels[j + 16] << 4;
            }
        }
        GBits::Q2 | GBits::Q3 => {
            out[..8].fill(0);
            for (c, &u) in levels.iter().enumerate() {
                out[c % 8] |= (u & 3) << (2 * (c / 8));
            }
            if bits == GBits::Q3 {
                let hi = (0..CHUNK).fold(0u32, |h, c| h | (((levels[c] >> 2) & 1) as u32) << c);
                out[8..12].copy_from_slice(&hi.to_le_bytes());
            }
        }
    }
}

/// The scale and min of group `g` of a row's companion `params`.
#[inline]
pub fn group_params(f: GFormat, params: &[u16], g: usize) -> (f32, f32) {
    let d = f16::from_bits(params[g]).to_f32();
    let groups = if f.min {
        params.len() / 2
    } else {
        params.len()
    };
    let m = if f.min {
        f16::from_bits(params[groups + g]).to_f32()
    } else {
        -8.0 * d
    };
    (d, m)
}

/// The defined lane reduction (see the module doc).
#[inline]
pub fn reduce8(a: [f32; LANES]) -> f32 {
    ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
}

/// One activation row as the grouped dots take it: int8 levels padded with
/// zeros to whole groups, and the sum of each group.
#[derive(Clone, Copy)]
pub struct ActRow<'a> {
    /// `padded_cols` int8 activations.
    pub x: &'a [i8],
    /// `groups` sums of `x` per group.
    pub xs: &'a [i32],
}

/// Checks one weight row and `T` activation rows against format `f`.
fn check_row<const T: usize>(f: GFormat, w: &[u8], params: &[u16], acts: &[ActRow<'_>; T]) {
    let groups = params.len() / if f.min { 2 } else { 1 };
    let cols = groups * f.group.cols();
    assert!(
        w.len() == f.row_bytes(cols) && params.len() == f.params_per_row(cols),
        "grouped dot: weight row shape"
    );
    assert!(
        acts.iter()
            .all(|a| a.x.len() == cols && a.xs.len() == groups),
        "grouped dot: activation shape"
    );
}

/// The scalar twin: the defined dot of one weight row (`w`, its companion
/// `params`) with each of `T` activation rows, before the activation scale.
pub fn dot_scalar<const T: usize>(
    f: GFormat,
    w: &[u8],
    params: &[u16],
    acts: [ActRow<'_>; T],
) -> [f32; T] {
    check_row(f, w, params, &acts);
    let (cb, gc) = (f.chunk_bytes(), f.group.cols());
    let mut lanes = [[0f32; LANES]; T];
    for (g, gw) in w.chunks_exact(gc / CHUNK * cb).enumerate() {
        let mut s = [0i32; T];
        for (k, chunk) in gw.chunks_exact(cb).enumerate() {
            let u = unpack_chunk(f.bits, chunk);
            for (s, a) in s.iter_mut().zip(&acts) {
                let x = &a.x[g * gc + k * CHUNK..][..CHUNK];
                *s += u
                    .iter()
                    .zip(x)
                    .map(|(&u, &x)| u as i32 * x as i32)
                    .sum::<i32>();
            }
        }
        for ((lanes, s), a) in lanes.iter_mut().zip(s).zip(&acts) {
            fold_group(f, params, g, s, a.xs[g], &mut lanes[g % LANES]);
        }
    }
    lanes.map(reduce8)
}

/// One group's step of the defined fold: `s` is `Σ u·x` over the group
/// (unsigned levels), `xs` the group's activation sum; `lane` is lane
/// `g mod 8`.
#[inline]
pub fn fold_group(f: GFormat, params: &[u16], g: usize, s: i32, xs: i32, lane: &mut f32) {
    let (d, m) = group_params(f, params, g);
    if f.min {
        *lane = m.mul_add(xs as f32, d.mul_add(s as f32, *lane));
    } else {
        *lane = d.mul_add((s - 8 * xs) as f32, *lane);
    }
}

/// [`dot_scalar`] on the best ISA: AVX-512 VNNI, else AVX2 (with FMA and
/// F16C), else the scalar twin. Bit-identical on every one.
#[inline]
pub fn dot<const T: usize>(
    f: GFormat,
    w: &[u8],
    params: &[u16],
    acts: [ActRow<'_>; T],
) -> [f32; T] {
    check_row(f, w, params, &acts);
    #[cfg(target_arch = "x86_64")]
    match isa() {
        // SAFETY: `isa()` reported AVX-512F/BW/VNNI (VL and F16C come with
        // them on every such CPU, checked by `simd_ok`); shapes checked above.
        Isa::Avx512Vnni if simd_ok() => return unsafe { avx512::dot(f, w, params, acts) },
        Isa::Avx2 | Isa::Avx512 | Isa::Avx512Vnni if simd_ok() => {
            // SAFETY: `isa()` reported AVX2 + FMA; F16C checked by
            // `simd_ok`; shapes checked above.
            return unsafe { avx2::dot(f, w, params, acts) };
        }
        _ => {}
    }
    dot_scalar(f, w, params, acts)
}

/// `out[r]` = [`dot`] of weight row `r` of `w` (`out.len()` packed rows of
/// `f`, `params` their companions, row after row) with one activation row:
/// one dispatch for a block of rows, bit-identical to [`dot`] row by row.
pub fn dot_rows(f: GFormat, w: &[u8], params: &[u16], act: ActRow<'_>, out: &mut [f32]) {
    let rows = out.len();
    if rows == 0 {
        return;
    }
    let (rb, pr) = (w.len() / rows, params.len() / rows);
    assert!(
        w.len() == rows * rb && params.len() == rows * pr,
        "grouped dot_rows: {rows} whole rows"
    );
    check_row(f, &w[..rb], &params[..pr], &[act]);
    #[cfg(target_arch = "x86_64")]
    match isa() {
        // SAFETY: as in `dot`; every row has the checked first row's shape.
        Isa::Avx512Vnni if simd_ok() => return unsafe { avx512::dot_rows(f, w, params, act, out) },
        Isa::Avx2 | Isa::Avx512 | Isa::Avx512Vnni if simd_ok() => {
            // SAFETY: as in `dot`; every row has the checked first row's shape.
            return unsafe { avx2::dot_rows(f, w, params, act, out) };
        }
        _ => {}
    }
    for (r, o) in out.iter_mut().enumerate() {
        let (w, p) = (&w[r * rb..(r + 1) * rb], &params[r * pr..(r + 1) * pr]);
        [*o] = dot_scalar(f, w, p, [act]);
    }
}

/// F16C (for the scales) and, with AVX-512, VL: present beside AVX2 and
/// AVX-512 VNNI on every CPU that has them, but checked, once.
#[cfg(target_arch = "x86_64")]
fn simd_ok() -> bool {
    use std::sync::OnceLock;
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        is_x86_feature_detected!("f16c")
            && (isa() < Isa::Avx512Vnni || is_x86_feature_detected!("avx512vl"))
    })
}
