//! llama.cpp's GGUF block types (Q4_0, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K;
//! Q5_0, Q5_1, IQ4_NL, IQ4_XS in `ext`), run as they are stored:
//! [`dequantize_row`] (ggml's, bit for bit), [`matmul`] on the integer
//! block dots, and an encoder ([`quantize_row`]) for tests and synthetic
//! files. Block layouts live in `codec`.
//!
//! Activations follow ggml's `vec_dot_type` so results track llama.cpp's:
//! - Q4_0, Q8_0 and `ext`'s types (Q5_0, Q5_1, IQ4_NL, IQ4_XS) meet Q8_0
//!   activations, quantized like ggml's x86
//!   `quantize_row_q8_0`: per 32 values `d = amax / 127` rounded to f16 (the
//!   dot uses the f16 value, as ggml does), `q = round(x · 127 / amax)` half
//!   to even;
//! - the K types meet Q8_K activations, ggml's `quantize_row_q8_K_ref`: per
//!   256 values `d = max / −127` with `max` the (signed) value of largest
//!   magnitude, `q = nearest_int(x / d)`, and `bsums` per 16 values.
//!
//! Each activation row is quantized once per [`matmul`] call. A row's dot is
//! exact integer sums per block (sub-block) combined in f32 by a fixed
//! sequence of operations (see `scalar`), so the scalar twin, AVX2 and
//! AVX-512 VNNI give the same bits, and threading never changes a result.
//!
//! Error against the f32 product of the dequantized weights `ŵ` (each `ŵ
//! = a − b`: the scale part `d·sc·q` and the min part `dmin·m`), with `e_c`
//! the activation rounding of value `c` (Q8_K: `|d_x|/2`; Q8_0: `d/2 +
//! 127·|d − d16|` with `d = amax/127` and `d16` its f16) and `ρ = (nb +
//! 12)·2^-23` for `nb` blocks a row (the f32 steps: one product and one sum
//! a block and lane, four reduction levels, ggml's own rounding of `ŵ`):
//! `|y − Σ_c ŵ_c·x_c| ≤ Σ_c |ŵ_c|·e_c + ρ·Σ_c (|a_c| + |b_c|)·(|x_c| +
//! e_c)`; against the quantized activation `x̃` only the `ρ` term is left.
//! The tests check both.
//!
//! `ext`'s types go to `ext` at these doors (its files build on `codec`,
//! `scalar`, `avx2` and `avx512`, which do not know it).
//!
//! Prefill: the K types from 12 activation rows on
//! AVX-512 VNNI run in unpacked 16-row panels (`kpanel`); Q4_0/Q4_K on
//! AVX2 in repacked tiles (`tiled`). Both give the dots' bits.
//!
//! Dispatch, picked once: the AVX-512 VNNI dots (`vpdpbusd`/`vpdpwssd`)
//! and AVX-512 activation quantizers where `cpu::isa` reports VNNI (and the
//! CPU has AVX2 and F16C, which they also use); else the AVX2 dots (also on
//! AVX-512 without VNNI, or under `MOESTREAM_ISA=avx2|avx512`) with the
//! scalar quantizers; else the scalar twins.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod codec;
mod ext;
#[cfg(target_arch = "x86_64")]
mod kpanel;
mod scalar;
#[cfg(test)]
mod tests;
mod tile;
#[cfg(target_arch = "x86_64")]
mod tile_avx2;
#[cfg(test)]
mod tile_tests;
mod tiled;

#[cfg(target_arch = "x86_64")]
use super::cpu::{self, Isa};
use super::par_row_blocks;
pub use codec::{KMinBlock, SymBlock};
use codec::{QK, QK_K};
use scalar::ActRow;
use std::cell::RefCell;
use std::sync::OnceLock;
pub use tiled::{set_tiled, tiled};

/// A GGUF block type this engine runs directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlockType {
    Q4_0,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
    Q3K,
    Q2K,
    Q5_0,
    Q5_1,
    IQ4NL,
    IQ4XS,
}

impl BlockType {
    pub const ALL: [BlockType; 11] = [
        Self::Q4_0,
        Self::Q8_0,
        Self::Q4K,
        Self::Q5K,
        Self::Q6K,
        Self::Q3K,
        Self::Q2K,
        Self::Q5_0,
        Self::Q5_1,
        Self::IQ4NL,
        Self::IQ4XS,
    ];

    /// The GGUF (`ggml_type`) id.
    pub fn ggml_id(self) -> u32 {
        match self {
            Self::Q4_0 => 2,
            Self::Q8_0 => 8,
            Self::Q4K => 12,
            Self::Q5K => 13,
            Self::Q6K => 14,
            Self::Q3K => 11,
            Self::Q2K => 10,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::IQ4NL => 20,
            Self::IQ4XS => 23,
        }
    }

    /// The type with GGUF id `id`, if it is one of ours.
    pub fn from_ggml_id(id: u32) -> Option<BlockType> {
        Self::ALL.into_iter().find(|t| t.ggml_id() == id)
    }

    /// ggml's name for the type.
    pub fn name(self) -> &'static str {
        match self {
            Self::Q4_0 => "Q4_0",
            Self::Q8_0 => "Q8_0",
            Self::Q4K => "Q4_K",
            Self::Q5K => "Q5_K",
            Self::Q6K => "Q6_K",
            Self::Q3K => "Q3_K",
            Self::Q2K => "Q2_K",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::IQ4NL => "IQ4_NL",
            Self::IQ4XS => "IQ4_XS",
        }
    }

    /// The type ggml names `name` (either case: `Q4_K`, `q4_k`).
    pub fn parse(name: &str) -> Option<BlockType> {
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Values per block.
    pub fn block_elems(self) -> usize {
        match self {
            Self::Q4_0 | Self::Q8_0 | Self::Q5_0 | Self::Q5_1 | Self::IQ4NL => QK,
            _ => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            Self::Q4_0 => codec::q4_0::BYTES,
            Self::Q8_0 => codec::q8_0::BYTES,
            Self::Q4K => codec::q4_k::BYTES,
            Self::Q5K => codec::q5_k::BYTES,
            Self::Q6K => codec::q6_k::BYTES,
            Self::Q3K => codec::q3_k::BYTES,
            Self::Q2K => codec::q2_k::BYTES,
            Self::Q5_0 => ext::q5_0::BYTES,
            Self::Q5_1 => ext::q5_1::BYTES,
            Self::IQ4NL => ext::iq4_nl::BYTES,
            Self::IQ4XS => ext::iq4_xs::BYTES,
        }
    }

    /// Bytes of a row of `cols` values; `None` unless whole blocks.
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        cols.is_multiple_of(self.block_elems())
            .then(|| cols / self.block_elems() * self.block_bytes())
    }

    /// `row_bytes(cols)`, asserting whole blocks.
    fn row_bytes_checked(self, cols: usize) -> usize {
        self.row_bytes(cols).unwrap_or_else(|| {
            panic!(
                "{}: {cols} columns is not a whole number of {}-value blocks",
                self.name(),
                self.block_elems()
            )
        })
    }
}

/// ggml's `kvalues_iq4nl`: the sixteen levels of IQ4_NL and IQ4_XS blocks
/// (an index `i` decodes to `d·IQ4_VALUES[i]`).
pub const IQ4_VALUES: [i8; 16] = ext::KVALUES;

/// Exactly ggml's `dequantize_row_*` (same f32 results bit for bit):
/// `bytes` holds `out.len() / block_elems` blocks.
pub fn dequantize_row(ty: BlockType, bytes: &[u8], out: &mut [f32]) {
    let rb = ty.row_bytes_checked(out.len());
    assert_eq!(
        bytes.len(),
        rb,
        "{}: {} bytes for {} values",
        ty.name(),
        bytes.len(),
        out.len()
    );
    if ext::owns(ty) {
        return ext::dequantize_row(ty, bytes, out);
    }
    codec::dequantize_row(ty, bytes, out)
}

/// Element index of the first element whose block scale (f16 `d` / `dmin`)
/// is NaN or Inf, if any (`bytes` is whole blocks).
pub fn first_non_finite(ty: BlockType, bytes: &[u8]) -> Option<usize> {
    assert_eq!(
        bytes.len() % ty.block_bytes(),
        0,
        "{}: partial block",
        ty.name()
    );
    if ext::owns(ty) {
        return ext::first_non_finite(ty, bytes);
    }
    codec::first_non_finite(ty, bytes)
}

/// A valid encoder: ggml's `quantize_row_*_ref` for Q4_0, Q8_0, Q5_0 and
/// Q5_1, a
/// simpler scale search with a stated error bound for the K types and the
/// IQ4 types (see `codec`, `ext`). `out` holds `x.len() / block_elems` blocks.
pub fn quantize_row(ty: BlockType, x: &[f32], out: &mut [u8]) {
    let rb = ty.row_bytes_checked(x.len());
    assert_eq!(
        out.len(),
        rb,
        "{}: {} bytes for {} values",
        ty.name(),
        out.len(),
        x.len()
    );
    if ext::owns(ty) {
        return ext::quantize_row(ty, x, out);
    }
    codec::quantize_row(ty, x, out)
}

/// A planned block, as [`pack_block`] writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Planned {
    /// Q8_0: f16 bits of `d`, value `i` decodes to `d·qs[i]`.
    Q8_0 { d: u16, qs: [i8; 32] },
    /// Q4_K or Q5_K.
    KMin(KMinBlock),
    /// Q2_K.
    KMin16(KMinBlock<16>),
    /// Q6_K or Q3_K.
    Sym(SymBlock),
    /// Q5_0: f16 bits of `d`, levels 0..=31 (value `i` decodes to
    /// `(levels[i] − 16)·d`).
    Q5_0 { d: u16, levels: [u8; 32] },
    /// Q5_1: f16 bits of `d` and `m`, levels 0..=31 (`levels[i]·d + m`).
    Q5_1 { d: u16, m: u16, levels: [u8; 32] },
    /// IQ4_NL: f16 bits of `d`, indices 0..16 into ggml's `kvalues_iq4nl`
    /// (value `i` decodes to `d·kvalues[idx[i]]`).
    Iq4Nl { d: u16, idx: [u8; 32] },
    /// IQ4_XS: f16 bits of `d`, eight sub-block scales −32..=31, indices
    /// (`d·sc[i / 32]·kvalues[idx[i]]`).
    Iq4Xs { d: u16, sc: [i8; 8], idx: [u8; 256] },
}

/// Writes `p` as one `ty` block into `out` (`ty.block_bytes()` bytes).
/// Panics when `p` is not a plan of `ty` or a level, scale or min does not
/// fit its field (a programmer error of the quantizer).
pub fn pack_block(ty: BlockType, p: &Planned, out: &mut [u8]) {
    assert_eq!(out.len(), ty.block_bytes(), "{}: one block", ty.name());
    match (ty, p) {
        (BlockType::Q8_0, Planned::Q8_0 { d, qs }) => codec::pack_q8_0(*d, qs, out),
        (BlockType::Q4K | BlockType::Q5K, Planned::KMin(b)) => {
            let nmax = if ty == BlockType::Q4K { 15 } else { 31 };
            assert!(b.levels.iter().all(|&l| l <= nmax), "{}: levels", ty.name());
            assert!(b.sc.iter().chain(&b.m).all(|&s| s < 64), "6-bit scales");
            if ty == BlockType::Q4K {
                codec::pack_q4_k(b, out)
            } else {
                codec::pack_q5_k(b, out)
            }
        }
        (BlockType::Q6K, Planned::Sym(b)) => {
            assert!(b.levels.iter().all(|&l| l < 64), "Q6_K: levels");
            codec::pack_q6_k(b, out)
        }
        (BlockType::Q3K, Planned::Sym(b)) => {
            assert!(b.levels.iter().all(|&l| l < 8), "Q3_K: levels");
            assert!(b.sc.iter().all(|s| (-32..32).contains(s)), "Q3_K: scales");
            codec::pack_q3_k(b, out)
        }
        (BlockType::Q2K, Planned::KMin16(b)) => {
            assert!(b.levels.iter().all(|&l| l < 4), "Q2_K: levels");
            assert!(b.sc.iter().chain(&b.m).all(|&s| s < 16), "4-bit scales");
            codec::pack_q2_k(b, out)
        }
        (BlockType::Q5_0, Planned::Q5_0 { d, levels }) => {
            assert!(levels.iter().all(|&l| l < 32), "Q5_0: levels");
            ext::pack_q5(out, ext::q5_0::QH, ext::q5_0::QS, levels);
            out[ext::q5_0::D..ext::q5_0::D + 2].copy_from_slice(&d.to_le_bytes());
        }
        (BlockType::Q5_1, Planned::Q5_1 { d, m, levels }) => {
            assert!(levels.iter().all(|&l| l < 32), "Q5_1: levels");
            ext::pack_q5(out, ext::q5_1::QH, ext::q5_1::QS, levels);
            out[ext::q5_1::D..ext::q5_1::D + 2].copy_from_slice(&d.to_le_bytes());
            out[ext::q5_1::M..ext::q5_1::M + 2].copy_from_slice(&m.to_le_bytes());
        }
        (BlockType::IQ4NL, Planned::Iq4Nl { d, idx }) => {
            assert!(idx.iter().all(|&i| i < 16), "IQ4_NL: indices");
            ext::pack_iq4_nl(*d, idx, out)
        }
        (BlockType::IQ4XS, Planned::Iq4Xs { d, sc, idx }) => {
            assert!(idx.iter().all(|&i| i < 16), "IQ4_XS: indices");
            assert!(sc.iter().all(|s| (-32..32).contains(s)), "IQ4_XS: scales");
            ext::pack_iq4_xs(*d, sc, idx, out)
        }
        _ => panic!("{}: a plan of another type", ty.name()),
    }
}

/// `Y[t, r] = W[r, :] · X[t, :]` for a row-major `(rows, cols)` matrix of
/// `ty` blocks (`w.len() == rows · row_bytes`), `n` activation rows `x (n,
/// cols)` into `y (n, rows)`. Quantizes each activation row once per call
/// the way ggml's `vec_dot_type` does, then integer block dots; row blocks
/// run through [`par_row_blocks`] (each activation row meets a whole block
/// of weight rows, a few pages that stay in L2); Q4_0 and Q4_K calls of
/// many rows repack each block once and run it in tiles (`tiled`, AVX2),
/// and the K types' calls of many rows on AVX-512 VNNI run in panels
/// (`kpanel`).
/// Bit-identical on every ISA.
pub fn matmul(
    ty: BlockType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
) {
    let rb = ty.row_bytes_checked(cols);
    assert_eq!(
        w.len(),
        rows * rb,
        "{}: weight bytes for {rows}x{cols}",
        ty.name()
    );
    assert_eq!(x.len(), n * cols, "activation shape");
    assert_eq!(y.len(), n * rows, "output shape");
    ACTS.with_borrow_mut(|acts| {
        acts.prepare(ty, cols, x, n);
        let acts = &*acts;
        if tiled::takes(ty, n) {
            return tiled::matmul(ty, w, rows, cols, acts, n, y);
        }
        #[cfg(target_arch = "x86_64")]
        if kpanel::takes(ty, n) {
            return kpanel::matmul(ty, w, rows, cols, acts, n, y);
        }
        par_row_blocks(rows, cols, n, rb, y, |blk| {
            // Activation rows in groups of up to `acts_per_pass`, each group
            // one pass over the block's weights.
            let mut t = 0;
            while t < n {
                t += match (n - t).min(acts_per_pass(ty)) {
                    8.. => pass::<8>(ty, w, rb, acts, t, blk),
                    4..=7 => pass::<4>(ty, w, rb, acts, t, blk),
                    3 => pass::<3>(ty, w, rb, acts, t, blk),
                    2 => pass::<2>(ty, w, rb, acts, t, blk),
                    _ => pass::<1>(ty, w, rb, acts, t, blk),
                };
            }
        });
    });
}

/// Activation rows one weight pass serves at most, measured per type on
/// this machine's AVX-512 (results/kernels.md): Q4_K/Q5_K keep 4 (8 spill
/// their two accumulators a row and ran 25% slower), Q6_K gains to 8, Q8_0
/// is flat past 4, and Q4_0 runs one activation row a pass (its unpacking
/// is two instructions; sharing it ran slower). Q3_K takes Q6_K's 8 (one
/// accumulator a row) and Q2_K Q4_K's 4 (two), by their register use, not
/// measured.
fn acts_per_pass(ty: BlockType) -> usize {
    match ty {
        // `ext`'s types run as Q4_0 does (one activation row a pass).
        BlockType::Q4_0
        | BlockType::Q5_0
        | BlockType::Q5_1
        | BlockType::IQ4NL
        | BlockType::IQ4XS => 1,
        BlockType::Q4K | BlockType::Q5K | BlockType::Q2K => 4,
        BlockType::Q8_0 | BlockType::Q6K | BlockType::Q3K => 8,
    }
}

/// Activation rows `t0..t0 + N` against the weight rows of `blk`, one
/// [`dot_rows_n`] call per [`ROWS_PER_CALL`] rows; returns `N`. Every
/// weight block is loaded and unpacked once for the `N` rows (prefill,
/// verify, batches).
fn pass<const N: usize>(
    ty: BlockType,
    w: &[u8],
    rb: usize,
    acts: &Activations,
    t0: usize,
    blk: &mut super::RowBlock<'_>,
) -> usize {
    let a: [ActRow; N] = std::array::from_fn(|t| acts.row(t0 + t));
    let rs = blk.rows();
    let mut out = [[0f32; N]; ROWS_PER_CALL];
    for r0 in rs.clone().step_by(ROWS_PER_CALL) {
        let r1 = (r0 + ROWS_PER_CALL).min(rs.end);
        let out = &mut out[..r1 - r0];
        dot_rows_n(ty, &w[r0 * rb..r1 * rb], &a, out);
        for (r, o) in (r0..r1).zip(out.iter()) {
            for (t, &v) in o.iter().enumerate() {
                blk.set(t0 + t, r, v);
            }
        }
    }
    N
}

/// Weight rows one [`dot_rows_n`] call covers (its results live on the stack).
const ROWS_PER_CALL: usize = 64;

thread_local! {
    /// The caller's quantized activations, reused across calls.
    static ACTS: RefCell<Activations> = RefCell::new(Activations::default());
}

/// `n` activation rows quantized for one weight type (see [`ActRow`]).
#[derive(Default)]
pub(crate) struct Activations {
    ty: Option<BlockType>,
    cols: usize,
    /// Per row: blocks, `bsums` entries, `c8` entries.
    nb: usize,
    nbs: usize,
    nc8: usize,
    qs: Vec<i8>,
    d: Vec<f32>,
    bsums: Vec<i16>,
    c8: Vec<i32>,
    tmp: Vec<i8>,
}

impl Activations {
    /// Quantizes `x (n, cols)` for weights of type `ty`.
    pub(crate) fn prepare(&mut self, ty: BlockType, cols: usize, x: &[f32], n: usize) {
        let (nb, nbs, nc8) = act_lens(ty, cols);
        (self.ty, self.cols) = (Some(ty), cols);
        (self.nb, self.nbs, self.nc8) = (nb, nbs, nc8);
        self.qs.resize(n * cols, 0);
        self.d.resize(n * nb, 0.0);
        self.bsums.resize(n * nbs, 0);
        self.c8.resize(n * nc8, 0);
        self.tmp.resize(cols, 0);
        for t in 0..n {
            let xt = &x[t * cols..(t + 1) * cols];
            let qs = &mut self.qs[t * cols..(t + 1) * cols];
            let d = &mut self.d[t * nb..(t + 1) * nb];
            let bsums = &mut self.bsums[t * nbs..(t + 1) * nbs];
            match ty {
                BlockType::Q8_0 => quantize_q8_0(xt, qs, d),
                BlockType::Q4_0
                | BlockType::Q5_0
                | BlockType::Q5_1
                | BlockType::IQ4NL
                | BlockType::IQ4XS => {
                    quantize_q8_0(xt, &mut self.tmp, d);
                    scalar::split_q4_0(&self.tmp, qs);
                    c8_sums(qs, &mut self.c8[t * nc8..(t + 1) * nc8]);
                }
                BlockType::Q6K | BlockType::Q3K | BlockType::Q2K => quantize_q8_k(xt, qs, d, bsums),
                BlockType::Q4K | BlockType::Q5K => {
                    quantize_q8_k(xt, &mut self.tmp, d, bsums);
                    scalar::permute_kmin(&self.tmp, qs);
                }
            }
        }
    }

    /// Activation row `t`.
    pub(crate) fn row(&self, t: usize) -> ActRow<'_> {
        assert!(self.ty.is_some(), "activations not prepared");
        let slice = |len: usize| t * len..(t + 1) * len;
        ActRow {
            qs: &self.qs[slice(self.cols)],
            d: &self.d[slice(self.nb)],
            bsums: &self.bsums[slice(self.nbs)],
            c8: &self.c8[slice(self.nc8)],
        }
    }
}

/// The entries of an activation row of `cols` values for `ty` weights:
/// scales `d`, `bsums` and `c8` (see [`ActRow`]). Q8_0 activations (Q4_0,
/// Q8_0 and `ext`'s types) have one scale per 32 values, Q8_K ones (the K
/// types) one per 256.
pub(crate) fn act_lens(ty: BlockType, cols: usize) -> (usize, usize, usize) {
    match ty {
        BlockType::Q8_0 => (cols / QK, 0, 0),
        BlockType::Q4_0
        | BlockType::Q5_0
        | BlockType::Q5_1
        | BlockType::IQ4NL
        | BlockType::IQ4XS => (cols / QK, 0, cols / 8),
        BlockType::Q4K | BlockType::Q5K | BlockType::Q6K | BlockType::Q3K | BlockType::Q2K => {
            (cols / QK_K, cols / 16, 0)
        }
    }
}

/// The kernel family [`dot_rows`] runs, picked once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Simd {
    Scalar,
    Avx2,
    Vnni,
}

fn simd() -> Simd {
    static SIMD: OnceLock<Simd> = OnceLock::new();
    *SIMD.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            // The VNNI kernels also use AVX2 and F16C instructions.
            let avx2 = cpu::has_avx2();
            let f16c = is_x86_feature_detected!("f16c");
            match cpu::isa() {
                Isa::Avx512Vnni if avx2 && f16c => return Simd::Vnni,
                Isa::Avx2 | Isa::Avx512 | Isa::Avx512Vnni if avx2 => return Simd::Avx2,
                _ => {}
            }
        }
        Simd::Scalar
    })
}

/// `scalar::quantize_q8_0`, dispatched.
fn quantize_q8_0(x: &[f32], qs: &mut [i8], d: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd() == Simd::Vnni {
        // SAFETY: `simd()` saw AVX2, F16C, AVX-512F/BW and VNNI.
        return unsafe { avx512::quantize_q8_0(x, qs, d) };
    }
    scalar::quantize_q8_0(x, qs, d)
}

/// `scalar::quantize_q8_k`, dispatched.
fn quantize_q8_k(x: &[f32], qs: &mut [i8], d: &mut [f32], bsums: &mut [i16]) {
    #[cfg(target_arch = "x86_64")]
    if simd() == Simd::Vnni {
        // SAFETY: `simd()` saw AVX2, F16C, AVX-512F/BW and VNNI.
        return unsafe { avx512::quantize_q8_k(x, qs, d, bsums) };
    }
    scalar::quantize_q8_k(x, qs, d, bsums)
}

/// `scalar::c8_sums`, dispatched.
fn c8_sums(qs: &[i8], c8: &mut [i32]) {
    #[cfg(target_arch = "x86_64")]
    if simd() == Simd::Vnni {
        // SAFETY: `simd()` saw AVX2, F16C, AVX-512F/BW and VNNI.
        return unsafe { avx512::c8_sums(qs, c8) };
    }
    scalar::c8_sums(qs, c8)
}

/// `out[k]` = the dot of row `k` of `w` (`out.len()` rows of `ty` blocks)
/// with activation row `a`, dispatched (see the module doc).
pub(crate) fn dot_rows(ty: BlockType, w: &[u8], a: &ActRow, out: &mut [f32]) {
    let rb = w.len() / out.len().max(1);
    assert_eq!(w.len(), rb * out.len(), "ggml dot_rows: whole rows");
    if rb == 0 {
        // No rows, or rows of no blocks: every dot is the empty sum.
        out.fill(0.0);
        return;
    }
    a.check(ty, &w[..rb]);
    if ext::owns(ty) {
        return ext::dot_rows(ty, w, a, out);
    }
    #[cfg(target_arch = "x86_64")]
    match simd() {
        // SAFETY: `simd()` saw AVX2, F16C, AVX-512F/BW and VNNI.
        Simd::Vnni => return unsafe { avx512::dot_rows(ty, w, a, out) },
        // SAFETY: `simd()` saw AVX2.
        Simd::Avx2 => return unsafe { avx2::dot_rows(ty, w, a, out) },
        Simd::Scalar => {}
    }
    scalar::dot_rows(ty, w, a, out)
}

/// `out[k][t]` = the dot of row `k` of `w` (`out.len()` rows of `ty`
/// blocks) with activation row `a[t]`: the same bits as [`dot_rows`] row by
/// row. The AVX-512 VNNI dots unpack each weight block once for all `N`;
/// the other ISAs run [`dot_rows`] per activation row.
pub(crate) fn dot_rows_n<const N: usize>(
    ty: BlockType,
    w: &[u8],
    a: &[ActRow; N],
    out: &mut [[f32; N]],
) {
    let rb = w.len() / out.len().max(1);
    assert_eq!(w.len(), rb * out.len(), "ggml dot_rows_n: whole rows");
    if rb == 0 {
        // No rows, or rows of no blocks: every dot is the empty sum.
        out.fill([0.0; N]);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if simd() == Simd::Vnni {
        a.iter().for_each(|a| a.check(ty, &w[..rb]));
        if ext::owns(ty) {
            // SAFETY: `simd()` saw AVX2, F16C, AVX-512F/BW and VNNI.
            return unsafe { ext::avx512::dot_rows_n(ty, w, a, out) };
        }
        // SAFETY: `simd()` saw AVX2, F16C, AVX-512F/BW and VNNI.
        return unsafe { avx512::dot_rows_n(ty, w, a, out) };
    }
    let mut col = [0f32; ROWS_PER_CALL];
    for (t, a) in a.iter().enumerate() {
        for (rows, w) in out
            .chunks_mut(ROWS_PER_CALL)
            .zip(w.chunks(ROWS_PER_CALL * rb))
        {
            let col = &mut col[..rows.len()];
            dot_rows(ty, &w[..rows.len() * rb], a, col);
            for (o, &v) in rows.iter_mut().zip(col.iter()) {
                o[t] = v;
            }
        }
    }
}
