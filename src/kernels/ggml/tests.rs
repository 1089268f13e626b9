//! Tests of the GGUF block kernels: the type table, hand-built blocks
//! through `dequantize_row`, the encoders' error bounds, the activation
//! quantizers against ggml's rules, every SIMD dot against its scalar twin
//! bit for bit, and `matmul` against the dequantized f32 product within the
//! bound derived in the module doc.

use super::codec::{f16_to_f32, f32_to_f16, nearest_int, scales_k4, scales_q3};
use super::*;
use crate::kernels::{set_threading, threading, Threading};
use proptest::prelude::*;

/// Cheap deterministic values (xorshift64*).
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
    pub(super) fn floats(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.unit() * scale).collect()
    }
}

/// Byte offsets of a block's f16 scales.
fn scale_offsets(ty: BlockType) -> &'static [usize] {
    match ty {
        BlockType::Q4_0 | BlockType::Q8_0 | BlockType::Q5_0 => &[0],
        BlockType::IQ4NL | BlockType::IQ4XS => &[0],
        BlockType::Q4K | BlockType::Q5K | BlockType::Q5_1 => &[0, 2],
        BlockType::Q6K => &[208],
        BlockType::Q3K => &[108],
        BlockType::Q2K => &[80, 82],
    }
}

/// `rows` rows of random blocks whose f16 scales are finite and moderate.
pub(super) fn random_weights(ty: BlockType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut w = rng.bytes(rows * ty.row_bytes(cols).unwrap());
    for blk in w.chunks_exact_mut(ty.block_bytes()) {
        for &at in scale_offsets(ty) {
            let h = f32_to_f16(rng.unit() * 0.01);
            blk[at..at + 2].copy_from_slice(&h.to_le_bytes());
        }
    }
    w
}

pub(super) fn prepared(ty: BlockType, cols: usize, x: &[f32], n: usize) -> Activations {
    let mut a = Activations::default();
    a.prepare(ty, cols, x, n);
    a
}

/// Whether this CPU runs the AVX-512 kernels (whatever `MOESTREAM_ISA` says).
#[cfg(target_arch = "x86_64")]
fn vnni() -> bool {
    cpu::has_avx2() && cpu::has_avx512_vnni() && is_x86_feature_detected!("f16c")
}

/// Equal bits, or both NaN.
pub(super) fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

// ---------------------------------------------------------------- the table

#[test]
fn block_type_table() {
    let table = [
        (BlockType::Q4_0, 2, "Q4_0", 32, 18),
        (BlockType::Q8_0, 8, "Q8_0", 32, 34),
        (BlockType::Q4K, 12, "Q4_K", 256, 144),
        (BlockType::Q5K, 13, "Q5_K", 256, 176),
        (BlockType::Q6K, 14, "Q6_K", 256, 210),
        (BlockType::Q3K, 11, "Q3_K", 256, 110),
        (BlockType::Q2K, 10, "Q2_K", 256, 84),
        (BlockType::Q5_0, 6, "Q5_0", 32, 22),
        (BlockType::Q5_1, 7, "Q5_1", 32, 24),
        (BlockType::IQ4NL, 20, "IQ4_NL", 32, 18),
        (BlockType::IQ4XS, 23, "IQ4_XS", 256, 136),
    ];
    assert_eq!(BlockType::ALL.len(), table.len());
    for (ty, id, name, elems, bytes) in table {
        assert_eq!((ty.ggml_id(), ty.name()), (id, name));
        assert_eq!(
            (ty.block_elems(), ty.block_bytes()),
            (elems, bytes),
            "{name}"
        );
        assert_eq!(BlockType::from_ggml_id(id), Some(ty));
        assert_eq!(ty.row_bytes(0), Some(0));
        assert_eq!(ty.row_bytes(3 * elems), Some(3 * bytes));
        assert_eq!(ty.row_bytes(elems + 1), None);
        assert_eq!(ty.row_bytes(elems / 2), None);
    }
    for id in [0, 1, 3, 9, 15, 16, 19, 21, 22, 30, 39, u32::MAX] {
        assert_eq!(BlockType::from_ggml_id(id), None, "id {id}");
    }
}

#[test]
fn f16_decoding_is_exact_for_every_value() {
    for h in 0..=u16::MAX {
        let (got, want) = (f16_to_f32(h), half::f16::from_bits(h).to_f32());
        assert!(same(got, want), "{h:#06x}: {got} vs {want}");
    }
}

#[test]
fn nearest_int_rounds_half_to_even() {
    let cases = [
        (0.5, 0),
        (1.5, 2),
        (2.5, 2),
        (-0.5, 0),
        (-1.5, -2),
        (126.5, 126),
        (0.49, 0),
    ];
    for (v, want) in cases {
        assert_eq!(nearest_int(v), want, "{v}");
    }
    for i in -300 * 64..=300 * 64 {
        let v = i as f32 / 64.0;
        assert_eq!(nearest_int(v), v.round_ties_even() as i32, "{v}");
    }
}

/// ggml's `get_scale_min_k4`, one `j` at a time.
fn get_scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

#[test]
fn packed_scales_decode_like_get_scale_min_k4() {
    let mut rng = Rng::new(3);
    for _ in 0..2000 {
        let s = rng.bytes(12);
        let (sc, m) = scales_k4(&s);
        for j in 0..8 {
            assert_eq!((sc[j], m[j]), get_scale_min_k4(j, &s), "{s:?} j={j}");
        }
    }
}

// ---------------------------------------------------- hand-built blocks

#[test]
fn dequantize_hand_built_q4_0() {
    // d = 0.5; byte j: low nibble j, high nibble 15 − j.
    let mut blk = vec![0x00, 0x38];
    blk.extend((0..16u8).map(|j| j | (15 - j) << 4));
    let mut out = [0f32; 32];
    dequantize_row(BlockType::Q4_0, &blk, &mut out);
    for j in 0..16 {
        assert_eq!(out[j], (j as f32 - 8.0) * 0.5);
        assert_eq!(out[16 + j], (7.0 - j as f32) * 0.5);
    }
    assert_eq!((out[0], out[15], out[16], out[31]), (-4.0, 3.5, 3.5, -4.0));
}

#[test]
fn dequantize_hand_built_q8_0() {
    // d = −2; q_i = 9i − 128 (wrapping), covering −128 and 127.
    let mut blk = vec![0x00, 0xC0];
    blk.extend((0..32i32).map(|i| (9 * i - 128) as i8 as u8));
    let mut out = [0f32; 32];
    dequantize_row(BlockType::Q8_0, &blk, &mut out);
    for (i, &v) in out.iter().enumerate() {
        assert_eq!(v, ((9 * i as i32 - 128) as i8) as f32 * -2.0, "{i}");
    }
    assert_eq!((out[0], out[1]), (256.0, 238.0));
}

/// sc = [1, 2, 3, 4, 17, 33, 63, 48], m = [0, 5, 10, 63, 16, 31, 47, 1],
/// packed by hand.
const K4_SCALES: [u8; 12] = [65, 130, 195, 196, 64, 69, 138, 63, 1, 241, 255, 16];
const K4_SC: [u8; 8] = [1, 2, 3, 4, 17, 33, 63, 48];
const K4_M: [u8; 8] = [0, 5, 10, 63, 16, 31, 47, 1];

#[test]
fn dequantize_hand_built_q4_k() {
    // d = 1, dmin = 0.25; byte 32c + l: low nibble l % 16, high 15 − l % 16.
    let mut blk = vec![0x00, 0x3C, 0x00, 0x34];
    blk.extend(K4_SCALES);
    blk.extend((0..128).map(|i| (i % 16) as u8 | (15 - (i % 16) as u8) << 4));
    let mut out = [0f32; 256];
    dequantize_row(BlockType::Q4K, &blk, &mut out);
    for (v, &got) in out.iter().enumerate() {
        let l = (v % 32 % 16) as f32;
        let level = if v % 64 < 32 { l } else { 15.0 - l };
        let j = v / 32;
        assert_eq!(got, K4_SC[j] as f32 * level - 0.25 * K4_M[j] as f32, "{v}");
    }
    assert_eq!((out[0], out[33], out[255]), (0.0, 26.75, -0.25));
}

#[test]
fn dequantize_hand_built_q5_k() {
    // As Q4_K plus qh[l] = 0b1010_0101 (l even) or 0b0101_1010 (l odd).
    let mut blk = vec![0x00, 0x3C, 0x00, 0x34];
    blk.extend(K4_SCALES);
    let qh: Vec<u8> = (0..32)
        .map(|l| if l % 2 == 0 { 0xA5 } else { 0x5A })
        .collect();
    blk.extend(&qh);
    blk.extend((0..128).map(|i| (i % 16) as u8 | (15 - (i % 16) as u8) << 4));
    let mut out = [0f32; 256];
    dequantize_row(BlockType::Q5K, &blk, &mut out);
    for (v, &got) in out.iter().enumerate() {
        let (c, upper, l) = (v / 64, v % 64 >= 32, v % 32);
        let nib = if upper { 15 - l % 16 } else { l % 16 } as u32;
        let bit = (qh[l] as u32 >> (2 * c + upper as usize)) & 1;
        let j = v / 32;
        let want = K4_SC[j] as f32 * (nib + 16 * bit) as f32 - 0.25 * K4_M[j] as f32;
        assert_eq!(got, want, "{v}");
    }
    // Value 0: level 0 + 16 (qh[0] bit 0 set), scale 1, min 0.
    assert_eq!(out[0], 16.0);
}

#[test]
fn dequantize_hand_built_q6_k() {
    // ql[i] = i·7, qh[i] = i·13 (wrapping), scales 3·(j − 8), d = 0.5.
    let mut blk: Vec<u8> = (0..128).map(|i| (i * 7) as u8).collect();
    blk.extend((0..64).map(|i| (i * 13) as u8));
    blk.extend((0..16).map(|j| (3 * (j as i8 - 8)) as u8));
    blk.extend([0x00, 0x38]);
    let mut out = [0f32; 256];
    dequantize_row(BlockType::Q6K, &blk, &mut out);
    for (v, &got) in out.iter().enumerate() {
        let (h, s, l) = (v / 128, v % 128 / 32, v % 32);
        let ql = blk[64 * h + 32 * (s % 2) + l];
        let nib = if s < 2 { ql & 15 } else { ql >> 4 } as i32;
        let top = ((blk[128 + 32 * h + l] >> (2 * s)) & 3) as i32;
        let sc = 3 * (v as i32 / 16 - 8);
        assert_eq!(got, 0.5 * sc as f32 * (nib + 16 * top - 32) as f32, "{v}");
    }
    // Value 0: ql 0, qh 0 → level 0 − 32; scale −24: 0.5·−24·−32.
    assert_eq!(out[0], 384.0);
}

/// ggml's Q3_K scale unpacking, one `j` at a time (as its CUDA
/// `dequantize_block_q3_K` reads it).
fn q3_scale(j: usize, s: &[u8]) -> i8 {
    let u = match j {
        0..4 => (s[j] & 0xF) | (s[j + 8] & 3) << 4,
        4..8 => (s[j] & 0xF) | ((s[j + 4] >> 2) & 3) << 4,
        8..12 => (s[j - 8] >> 4) | ((s[j] >> 4) & 3) << 4,
        _ => (s[j - 8] >> 4) | ((s[j - 4] >> 6) & 3) << 4,
    };
    u as i8 - 32
}

#[test]
fn q3_k_scales_decode_like_ggml_and_pack_back() {
    let mut rng = Rng::new(13);
    for _ in 0..2000 {
        let s = rng.bytes(12);
        let sc = scales_q3(&s);
        for (j, &v) in sc.iter().enumerate() {
            assert_eq!(v, q3_scale(j, &s), "{s:?} j={j}");
        }
        // Every 12 bytes are sixteen 6-bit scales: packing them gives the
        // bytes back.
        let p = Planned::Sym(SymBlock {
            d: 0,
            sc,
            levels: [4; 256],
        });
        let mut blk = [0u8; 110];
        pack_block(BlockType::Q3K, &p, &mut blk);
        assert_eq!(&blk[96..108], &s[..], "{sc:?}");
    }
}

#[test]
fn dequantize_hand_built_q3_k() {
    // qs[i] = 7i, hmask[i] = 13i (wrapping), scale bytes 37i + 5, d = −0.5.
    let mut blk: Vec<u8> = (0..32).map(|i| (i * 13) as u8).collect();
    blk.extend((0..64).map(|i| (i * 7) as u8));
    blk.extend((0..12).map(|i| (37 * i + 5) as u8));
    blk.extend([0x00, 0xB8]);
    let mut out = [0f32; 256];
    dequantize_row(BlockType::Q3K, &blk, &mut out);
    for (v, &got) in out.iter().enumerate() {
        let (h, s, l) = (v / 128, v % 128 / 32, v % 32);
        let low = (blk[32 + 32 * h + l] >> (2 * s)) & 3;
        let high = (blk[l] >> (4 * h + s)) & 1;
        // ggml: the offset 4 is taken where the hmask bit is clear.
        let q = low as i32 - if high == 1 { 0 } else { 4 };
        let sc = q3_scale(v / 16, &blk[96..108]) as f32;
        assert_eq!(got, -0.5 * sc * q as f32, "{v}");
    }
    // Value 0: qs 0, hmask 0 → −4; scale 5 | (byte 8 = 45) & 3 << 4 = 21 → −11.
    assert_eq!(out[0], -22.0);
}

#[test]
fn dequantize_hand_built_q2_k() {
    // scales[j] = j | (15 − j) << 4, qs[i] = 7i (wrapping), d = 1, dmin = 0.25.
    let mut blk: Vec<u8> = (0..16u8).map(|j| j | (15 - j) << 4).collect();
    blk.extend((0..64).map(|i| (i * 7) as u8));
    blk.extend([0x00, 0x3C, 0x00, 0x34]);
    let mut out = [0f32; 256];
    dequantize_row(BlockType::Q2K, &blk, &mut out);
    for (v, &got) in out.iter().enumerate() {
        let (h, s, l) = (v / 128, v % 128 / 32, v % 32);
        let level = ((blk[16 + 32 * h + l] >> (2 * s)) & 3) as f32;
        let j = (v / 16) as f32;
        assert_eq!(got, j * level - 0.25 * (15.0 - j), "{v}");
    }
    // Value 255: qs[63] = 185, top bit pair 2; scale 15, min 0.
    assert_eq!((out[0], out[255]), (-3.75, 30.0));
}

/// Q3_K, Q2_K, Q5_0, Q5_1, IQ4_NL and IQ4_XS blocks decode to llama.cpp's
/// values bit for bit: the
/// expected values are gguf-py's numpy dequantizer's (part of llama.cpp),
/// made by scripts/make_ggml_block_fixture.py (its command is in the file).
#[test]
fn dequantize_matches_llama_cpp_on_known_blocks() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ggml_blocks.json");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let hex = |s: &serde_json::Value| -> Vec<u8> {
        let s = s.as_str().unwrap();
        (0..s.len() / 2)
            .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
            .collect()
    };
    for ty in [
        BlockType::Q3K,
        BlockType::Q2K,
        BlockType::Q5_0,
        BlockType::Q5_1,
        BlockType::IQ4NL,
        BlockType::IQ4XS,
    ] {
        let entry = &doc[ty.name()];
        let blocks = hex(&entry["blocks"]);
        let want: Vec<u32> = hex(&entry["values_f32_le"])
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert!(
            want.len() >= 4 * 256,
            "{}: {} values",
            ty.name(),
            want.len()
        );
        let mut got = vec![0f32; want.len()];
        dequantize_row(ty, &blocks, &mut got);
        for (v, (g, &w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w,
                "{} value {v}: {g} vs {}",
                ty.name(),
                f32::from_bits(w)
            );
        }
    }
}

#[test]
fn first_non_finite_names_the_first_bad_block() {
    for ty in BlockType::ALL {
        let cols = 4 * ty.block_elems();
        let w = random_weights(ty, 1, cols, 9);
        assert_eq!(first_non_finite(ty, &w), None, "{}", ty.name());
        for (&at, bad) in scale_offsets(ty).iter().zip([0x7C00u16, 0xFE01]) {
            let mut w = w.clone();
            for b in [2, 3] {
                let o = b * ty.block_bytes() + at;
                w[o..o + 2].copy_from_slice(&bad.to_le_bytes());
            }
            let want = Some(2 * ty.block_elems());
            assert_eq!(first_non_finite(ty, &w), want, "{} offset {at}", ty.name());
        }
    }
    assert_eq!(first_non_finite(BlockType::Q8_0, &[]), None);
}

// ------------------------------------------------------------- encoders

#[test]
fn q4_0_encoder_is_ggml_ref() {
    // x = i − 16: d = −16 / −8 = 2; level = trunc(x/2 + 8.5), capped at 15.
    let x: Vec<f32> = (0..32).map(|i| i as f32 - 16.0).collect();
    let mut blk = [0u8; 18];
    quantize_row(BlockType::Q4_0, &x, &mut blk);
    assert_eq!(blk[..2], [0x00, 0x40]);
    let level = |i: usize| i.div_ceil(2).min(15) as u8;
    for j in 0..16 {
        assert_eq!(blk[2 + j], level(j) | level(16 + j) << 4, "byte {j}");
    }
}

#[test]
fn q8_0_encoder_is_ggml_ref() {
    // amax 127: d = 1; roundf sends halves away from zero.
    let mut x = vec![0f32; 32];
    x[..7].copy_from_slice(&[127.0, -127.0, 2.5, -2.5, 0.5, 1.49, -0.5]);
    let mut blk = [0u8; 34];
    quantize_row(BlockType::Q8_0, &x, &mut blk);
    assert_eq!(blk[..2], [0x00, 0x3C]);
    let q: Vec<i8> = blk[2..9].iter().map(|&b| b as i8).collect();
    assert_eq!(q, [127, -127, 3, -3, 1, 1, -1]);
}

/// Rows the encoders meet: uniform, spiky, one-signed, constant, zero.
fn encoder_rows(cols: usize) -> Vec<Vec<f32>> {
    let mut rng = Rng::new(17);
    let mut spiky = rng.floats(cols, 0.1);
    spiky[7] = 3.0;
    spiky[cols - 3] = -2.0;
    vec![
        rng.floats(cols, 1.0),
        spiky,
        rng.floats(cols, 1.0)
            .iter()
            .map(|v| v.abs() + 0.5)
            .collect(),
        rng.floats(cols, 1.0)
            .iter()
            .map(|v| -v.abs() - 0.25)
            .collect(),
        vec![0.75; cols],
        vec![0.0; cols],
        rng.floats(cols, 1e-3),
    ]
}

/// The per-value error bound each encoder states (module doc of `codec`),
/// for value `v` of block `blk` encoded from `x`. Q4_0 and Q8_0 round with
/// the exact scale `d` and decode with its f16 `d16`, so they add
/// `|q|·|d − d16|` (which grows where `d16` is subnormal).
fn encode_bound(ty: BlockType, blk: &[u8], x: &[f32], v: usize) -> f32 {
    let f16_at = |at: usize| f16_to_f32(u16::from_le_bytes([blk[at], blk[at + 1]]));
    let d16 = f16_at(0);
    match ty {
        BlockType::Q4_0 => {
            let d = x.iter().fold(0f32, |m, v| m.max(v.abs())) / 8.0;
            d + 8.0 * (d - d16.abs()).abs()
        }
        BlockType::Q8_0 => {
            let d = x.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            d * 0.5001 + 127.0 * (d - d16).abs()
        }
        BlockType::Q4K | BlockType::Q5K => {
            let (sc, _) = scales_k4(&blk[4..16]);
            (d16 * sc[v / 32] as f32 + f16_at(2)) / 2.0
        }
        BlockType::Q6K => {
            let d = f16_at(208);
            d * (blk[192 + v / 16] as i8 as f32).abs() + 16.0 * d
        }
        BlockType::Q3K => {
            let d = f16_at(108);
            d * (scales_q3(&blk[96..108])[v / 16] as f32).abs() + 2.0 * d
        }
        BlockType::Q2K => (f16_at(80) * (blk[v / 16] & 15) as f32 + f16_at(82)) / 2.0,
        BlockType::Q5_0 => {
            let d = x.iter().fold(0f32, |m, v| m.max(v.abs())) / 16.0;
            d + 16.0 * (d - d16.abs()).abs()
        }
        BlockType::Q5_1 => {
            // Levels from the exact step and min; decoded with their f16s.
            let lo = x.iter().fold(f32::MAX, |m, &v| m.min(v));
            let hi = x.iter().fold(f32::MIN, |m, &v| m.max(v));
            let d = (hi - lo) / 31.0;
            d / 2.0 + 31.0 * (d - d16).abs() + (lo - f16_at(2)).abs()
        }
        BlockType::IQ4NL => {
            let d = x.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
            14.0 * d16.abs() + 127.0 * (d - d16.abs()).abs()
        }
        BlockType::IQ4XS => {
            let j = v / 32;
            let s = x[32 * j..32 * j + 32]
                .iter()
                .fold(0f32, |m, v| m.max(v.abs()))
                / 127.0;
            let sc =
                f16_to_f32(u16::from_le_bytes([blk[0], blk[1]])) * ext::scales_xs(blk)[j] as f32;
            14.0 * sc.abs() + 127.0 * (s - sc.abs()).abs()
        }
    }
}

#[test]
fn encoders_round_trip_within_their_bounds() {
    // rms error / rms value ceilings, a sanity check on the scale search.
    let rel_rms_max = |ty| -> f32 {
        match ty {
            BlockType::Q4_0 | BlockType::Q4K => 0.12,
            BlockType::Q5K => 0.06,
            BlockType::Q6K => 0.04,
            BlockType::Q8_0 => 0.02,
            BlockType::Q3K => 0.16,
            BlockType::Q2K => 0.36,
            BlockType::Q5_0 | BlockType::Q5_1 => 0.06,
            BlockType::IQ4NL | BlockType::IQ4XS => 0.12,
        }
    };
    let rows = encoder_rows(512);
    for ty in BlockType::ALL {
        for (k, x) in rows.iter().enumerate() {
            let mut q = vec![0u8; ty.row_bytes(512).unwrap()];
            let mut y = vec![0f32; 512];
            quantize_row(ty, x, &mut q);
            dequantize_row(ty, &q, &mut y);
            let (be, bb) = (ty.block_elems(), ty.block_bytes());
            for (v, (&a, &b)) in x.iter().zip(&y).enumerate() {
                let (blk, xb) = (&q[v / be * bb..], &x[v / be * be..(v / be + 1) * be]);
                let bound = encode_bound(ty, blk, xb, v % be) * 1.0001 + 1e-6 * a.abs();
                assert!(
                    (a - b).abs() <= bound,
                    "{} row {k} value {v}: {a} -> {b}, bound {bound}",
                    ty.name()
                );
            }
            let err: f32 = x.iter().zip(&y).map(|(a, b)| (a - b) * (a - b)).sum();
            let norm: f32 = x.iter().map(|a| a * a).sum();
            // The last row's scales are f16 subnormals, coarse by design.
            // The ext types' plain encoders: only their per-value bounds are
            // checked here (a ceiling is not yet measured for them).
            if k + 1 < rows.len()
                && !matches!(
                    ty,
                    BlockType::Q5_0 | BlockType::Q5_1 | BlockType::IQ4NL | BlockType::IQ4XS
                )
            {
                let rel = (err / norm.max(f32::MIN_POSITIVE)).sqrt();
                assert!(
                    rel <= rel_rms_max(ty),
                    "{} row {k}: rel rms {rel}",
                    ty.name()
                );
            }
        }
    }
}

#[test]
fn encoders_keep_non_finite_input_out_of_panics() {
    for ty in BlockType::ALL {
        let n = ty.block_elems();
        let mut x = vec![1.0f32; n];
        x[3] = f32::NAN;
        x[5] = f32::INFINITY;
        let mut q = vec![0u8; ty.row_bytes(n).unwrap()];
        quantize_row(ty, &x, &mut q);
        let mut y = vec![0f32; n];
        dequantize_row(ty, &q, &mut y);
    }
}

// ---------------------------------------------------- activation rules

#[test]
fn q8_0_activations_follow_ggml_x86() {
    // amax 127: id = 1, d = 1; halves go to even.
    let mut x = vec![0f32; 64];
    x[..7].copy_from_slice(&[127.0, -127.0, 2.5, 3.5, -2.5, 0.5, -0.5]);
    x[32] = 0.3; // second block: d = 0.3 / 127 rounded to f16
    let a = prepared(BlockType::Q8_0, 64, &x, 1);
    let r = a.row(0);
    assert_eq!(r.qs[..7], [127, -127, 2, 4, -2, 0, 0]);
    assert_eq!(r.d[0], 1.0);
    assert_eq!(r.d[1], f16_to_f32(f32_to_f16(0.3 / 127.0)));
    assert_eq!((r.qs[32], r.qs[33]), (127, 0));
    // All zero: d 0, q 0; NaN quantizes to 0.
    let a = prepared(BlockType::Q8_0, 32, &[0.0; 32], 1);
    assert_eq!(
        (a.row(0).d[0], a.row(0).qs.iter().all(|&q| q == 0)),
        (0.0, true)
    );
    let mut x = vec![1.0f32; 32];
    x[4] = f32::NAN;
    assert_eq!(prepared(BlockType::Q8_0, 32, &x, 1).row(0).qs[4], 0);
}

#[test]
fn q4_0_activations_are_split_halves_with_lane_sums() {
    let mut rng = Rng::new(5);
    let x = rng.floats(96, 2.0);
    let natural = prepared(BlockType::Q8_0, 96, &x, 1);
    let split = prepared(BlockType::Q4_0, 96, &x, 1);
    let (n, s) = (natural.row(0), split.row(0));
    assert_eq!(n.d, s.d);
    for b in 0..3 {
        assert_eq!(s.qs[16 * b..16 * b + 16], n.qs[32 * b..32 * b + 16]);
        assert_eq!(
            s.qs[48 + 16 * b..48 + 16 * b + 16],
            n.qs[32 * b + 16..32 * b + 32]
        );
        for k in 0..4 {
            let sum: i32 = (4 * k..4 * k + 4)
                .map(|i| n.qs[32 * b + i] as i32 + n.qs[32 * b + 16 + i] as i32)
                .sum();
            assert_eq!(s.c8[4 * b + k], -8 * sum);
        }
    }
}

#[test]
fn q8_k_activations_follow_ggml_ref() {
    // The first value of largest magnitude (−127) sets iscale = 1; +127
    // later does not. nearest_int sends halves to even.
    let mut x = vec![0f32; 512];
    x[..6].copy_from_slice(&[2.5, -127.0, 3.5, 127.0, -2.5, 0.4]);
    x[256] = 2.0; // second block: max +2 → iscale −63.5, d = −2/127
    x[257] = -1.0;
    let a = prepared(BlockType::Q4K, 512, &x, 1);
    let r = a.row(0);
    assert_eq!(r.qs[..6], [2, -127, 4, 127, -2, 0]);
    assert_eq!(r.d[0], 1.0);
    assert_eq!(r.bsums[0], 2 - 127 + 4 + 127 - 2);
    assert_eq!(r.bsums[1..16], [0; 15]);
    assert_eq!(
        (r.qs[256], r.qs[257]),
        (-127, nearest_int(-63.5 * -1.0) as i8)
    );
    assert_eq!(r.d[1], 1.0 / (-127.0 / 2.0));
    // All zero: d = 0.
    assert_eq!(
        prepared(BlockType::Q6K, 256, &[0.0; 256], 1).row(0).d[0],
        0.0
    );
}

/// The dispatched (and, where available, the AVX-512) activation
/// quantizers against the scalar twins: same bytes, same scale bits, same
/// sums (`x.len()` a multiple of 256).
fn check_quantizer_twins(x: &[f32]) {
    let n = x.len();
    let (mut q0, mut d0) = (vec![0i8; n], vec![0f32; n / 32]);
    scalar::quantize_q8_0(x, &mut q0, &mut d0);
    let (mut qk, mut dk, mut bk) = (vec![0i8; n], vec![0f32; n / 256], vec![0i16; n / 16]);
    scalar::quantize_q8_k(x, &mut qk, &mut dk, &mut bk);
    let mut split = vec![0i8; n];
    scalar::split_q4_0(&q0, &mut split);
    let mut c8 = vec![0i32; n / 8];
    scalar::c8_sums(&split, &mut c8);
    #[cfg(target_arch = "x86_64")]
    if vnni() {
        let (mut q, mut d) = (vec![9i8; n], vec![9f32; n / 32]);
        // SAFETY: AVX2, F16C, AVX-512F/BW and VNNI detected just above.
        unsafe { avx512::quantize_q8_0(x, &mut q, &mut d) };
        assert_eq!((q, bits(&d)), (q0.clone(), bits(&d0)), "q8_0 of {x:?}");
        let (mut q, mut d, mut b) = (vec![9i8; n], vec![9f32; n / 256], vec![9i16; n / 16]);
        // SAFETY: as above.
        unsafe { avx512::quantize_q8_k(x, &mut q, &mut d, &mut b) };
        assert_eq!(
            (q, bits(&d), b),
            (qk.clone(), bits(&dk), bk.clone()),
            "q8_K of {x:?}"
        );
        let mut c = vec![9i32; n / 8];
        // SAFETY: as above.
        unsafe { avx512::c8_sums(&split, &mut c) };
        assert_eq!(c, c8, "c8 of {x:?}");
    }
    assert!(q0.iter().chain(&qk).all(|&q| q != i8::MIN), "−128 in {x:?}");
}

#[test]
fn activation_quantizer_twins_agree_on_named_rows() {
    let mut rng = Rng::new(21);
    let mut rows = vec![
        rng.floats(512, 3.0),
        vec![0.0; 256],
        vec![-0.0; 256],
        rng.floats(256, 1e-6),
        rng.floats(256, 3e38),
        (0..256).map(|i| (i as f32 - 128.0) / 2.0).collect(),
        (0..4096)
            .map(|i| ((i * 7919) % 509) as f32 - 254.0)
            .collect(),
    ];
    for special in [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1e-42,
        -f32::MIN_POSITIVE,
    ] {
        let mut x = rng.floats(512, 1.0);
        x[3] = special;
        x[300] = special;
        rows.push(x);
    }
    let mut ties = vec![0f32; 256];
    ties[..5].copy_from_slice(&[127.0, 0.5, 1.5, 2.5, -2.5]);
    rows.push(ties);
    for x in &rows {
        check_quantizer_twins(x);
    }
}

// --------------------------------------------------------------- twins

/// The scalar twin's one-row dot of `ty`'s family (`ext`'s or `scalar`'s).
fn twin_dot(ty: BlockType, w: &[u8], a: &scalar::ActRow) -> f32 {
    if ext::owns(ty) {
        a.check(ty, w);
        return ext::scalar::vec_dot(ty, w, a);
    }
    scalar::vec_dot(ty, w, a)
}

/// The scalar twin's rows dot of `ty`'s family.
fn twin_rows(ty: BlockType, w: &[u8], a: &scalar::ActRow, out: &mut [f32]) {
    if ext::owns(ty) {
        return ext::scalar::dot_rows(ty, w, a, out);
    }
    scalar::dot_rows(ty, w, a, out)
}

/// The AVX2 rows dot of `ty`'s family.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
unsafe fn avx2_rows(ty: BlockType, w: &[u8], a: &scalar::ActRow, out: &mut [f32]) {
    // SAFETY: this function's own contract.
    unsafe {
        if ext::owns(ty) {
            return ext::avx2::dot_rows(ty, w, a, out);
        }
        avx2::dot_rows(ty, w, a, out)
    }
}

/// The AVX-512 VNNI one-row dot of `ty`'s family.
///
/// # Safety
/// The CPU must support AVX2, F16C, AVX-512F/BW and VNNI.
#[cfg(target_arch = "x86_64")]
unsafe fn avx512_rows(ty: BlockType, w: &[u8], a: &scalar::ActRow, out: &mut [f32]) {
    if ext::owns(ty) {
        let (out, _) = out.as_chunks_mut::<1>();
        // SAFETY: this function's own contract.
        return unsafe { ext::avx512::dot_rows_n(ty, w, &[*a], out) };
    }
    // SAFETY: this function's own contract.
    unsafe { avx512::dot_rows(ty, w, a, out) }
}

/// The AVX-512 VNNI multi-row dot of `ty`'s family.
///
/// # Safety
/// The CPU must support AVX2, F16C, AVX-512F/BW and VNNI.
#[cfg(target_arch = "x86_64")]
unsafe fn avx512_rows_n<const N: usize>(
    ty: BlockType,
    w: &[u8],
    a: &[scalar::ActRow; N],
    out: &mut [[f32; N]],
) {
    // SAFETY: this function's own contract.
    unsafe {
        if ext::owns(ty) {
            return ext::avx512::dot_rows_n(ty, w, a, out);
        }
        avx512::dot_rows_n(ty, w, a, out)
    }
}

/// Every available version of the rows dot against the scalar twin, row
/// by row (`w`: whole rows of `ty` blocks, `rows` of them).
fn check_twins(ty: BlockType, w: &[u8], rows: usize, a: &scalar::ActRow, what: &str) {
    let rb = w.len() / rows;
    let want: Vec<f32> = w.chunks_exact(rb).map(|r| twin_dot(ty, r, a)).collect();
    let check = |got: &[f32], isa: &str| {
        for (r, (&g, &s)) in got.iter().zip(&want).enumerate() {
            assert!(
                same(g, s),
                "{} {what} row {r}: {isa} {g} vs scalar {s}",
                ty.name()
            );
        }
    };
    let mut got = vec![f32::NAN; rows];
    dot_rows(ty, w, a, &mut got);
    check(&got, "dispatched");
    twin_rows(ty, w, a, &mut got);
    check(&got, "scalar rows");
    #[cfg(target_arch = "x86_64")]
    {
        if cpu::has_avx2() {
            // SAFETY: AVX2 detected just above.
            unsafe { avx2_rows(ty, w, a, &mut got) };
            check(&got, "avx2");
        }
        if vnni() {
            // SAFETY: AVX2, F16C, AVX-512F/BW and VNNI detected just above.
            unsafe { avx512_rows(ty, w, a, &mut got) };
            check(&got, "avx512");
        }
    }
}

/// Column counts: the brief's three and, for the 32-wide types, every
/// block count to 9 (each tail of the 2- and 4-block steps).
fn twin_cols(ty: BlockType) -> Vec<usize> {
    let mut cols = vec![256, 512, 2048, 768];
    if ty.block_elems() == 32 {
        cols.extend((1..=9).map(|b| 32 * b));
    }
    cols
}

#[test]
fn twins_agree_on_random_rows() {
    for ty in BlockType::ALL {
        for cols in twin_cols(ty) {
            let rows = 3;
            let w = random_weights(ty, rows, cols, cols as u64);
            let x = Rng::new(cols as u64 + 1).floats(2 * cols, 3.0);
            let a = prepared(ty, cols, &x, 2);
            for t in 0..2 {
                check_twins(ty, &w, rows, &a.row(t), &format!("cols {cols} t {t}"));
            }
        }
    }
}

/// `dot_rows_n::<N>` (dispatched, and the AVX-512 kernel itself) against
/// the scalar twin's one-row dot for each of the first `N` rows of `a`.
fn check_multi_twins<const N: usize>(ty: BlockType, w: &[u8], rows: usize, a: &Activations) {
    let rb = w.len() / rows;
    let acts: [scalar::ActRow; N] = std::array::from_fn(|t| a.row(t));
    let check = |got: &[[f32; N]], isa: &str| {
        for (r, (g, row)) in got.iter().zip(w.chunks_exact(rb)).enumerate() {
            for (t, &g) in g.iter().enumerate() {
                let s = twin_dot(ty, row, &acts[t]);
                assert!(
                    same(g, s),
                    "{} N={N} row {r} t {t}: {isa} {g} vs scalar {s}",
                    ty.name()
                );
            }
        }
    };
    let mut got = vec![[f32::NAN; N]; rows];
    dot_rows_n(ty, w, &acts, &mut got);
    check(&got, "dispatched");
    #[cfg(target_arch = "x86_64")]
    if vnni() {
        got.fill([f32::NAN; N]);
        // SAFETY: AVX2, F16C, AVX-512F/BW and VNNI detected just above.
        unsafe { avx512_rows_n(ty, w, &acts, &mut got) };
        check(&got, "avx512");
    }
}

#[test]
fn multi_row_dots_equal_the_one_row_twin() {
    for ty in BlockType::ALL {
        for cols in twin_cols(ty) {
            let rows = 5;
            let w = random_weights(ty, rows, cols, 3 * cols as u64);
            let mut x = Rng::new(cols as u64 + 7).floats(4 * cols, 3.0);
            // One row at the extremes: full-scale values of both signs.
            for (i, v) in x[3 * cols..].iter_mut().enumerate() {
                *v = if i % 3 == 0 { -1e4 } else { 1e4 };
            }
            let a = prepared(ty, cols, &x, 4);
            check_multi_twins::<1>(ty, &w, rows, &a);
            check_multi_twins::<2>(ty, &w, rows, &a);
            check_multi_twins::<3>(ty, &w, rows, &a);
            check_multi_twins::<4>(ty, &w, rows, &a);
        }
    }
}

#[test]
fn twins_agree_at_extreme_levels_and_activations() {
    for ty in BlockType::ALL {
        let cols = 512;
        for fill in [0x00u8, 0xFF, 0x80, 0x7F, 0x88] {
            let mut w = vec![fill; ty.row_bytes(cols).unwrap()];
            for blk in w.chunks_exact_mut(ty.block_bytes()) {
                for &at in scale_offsets(ty) {
                    blk[at..at + 2].copy_from_slice(&0x3C00u16.to_le_bytes());
                }
            }
            for x in [
                vec![127.0f32; cols],
                vec![-127.0; cols],
                (0..cols)
                    .map(|c| if c % 2 == 0 { 127.0 } else { -127.0 })
                    .collect(),
            ] {
                let a = prepared(ty, cols, &x, 1);
                check_twins(ty, &w, 1, &a.row(0), &format!("fill {fill:#x} x0 {}", x[0]));
            }
        }
    }
}

#[test]
fn twins_agree_with_non_finite_scales() {
    for ty in BlockType::ALL {
        let cols = 2 * ty.block_elems();
        let x = Rng::new(2).floats(cols, 1.0);
        let a = prepared(ty, cols, &x, 1);
        for bad in [0x7C00u16, 0xFC00, 0x7E00] {
            let mut w = random_weights(ty, 1, cols, 4);
            let at = scale_offsets(ty)[0];
            w[at..at + 2].copy_from_slice(&bad.to_le_bytes());
            check_twins(ty, &w, 1, &a.row(0), &format!("scale {bad:#x}"));
        }
    }
}

// -------------------------------------------------------------- matmul

/// `matmul` computed with the scalar twin only.
fn scalar_matmul(
    ty: BlockType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
) -> Vec<f32> {
    let a = prepared(ty, cols, x, n);
    let rb = ty.row_bytes(cols).unwrap();
    let mut y = vec![0f32; n * rows];
    for t in 0..n {
        for r in 0..rows {
            y[t * rows + r] = twin_dot(ty, &w[r * rb..(r + 1) * rb], &a.row(t));
        }
    }
    y
}

fn run_matmul(ty: BlockType, w: &[u8], rows: usize, cols: usize, x: &[f32], n: usize) -> Vec<f32> {
    let mut y = vec![f32::NAN; n * rows];
    matmul(ty, w, rows, cols, x, n, &mut y);
    y
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn matmul_equals_the_scalar_twin_bit_for_bit() {
    // The last shapes are large enough to run in parallel blocks.
    for ty in BlockType::ALL {
        for (rows, cols) in [
            (1, 256),
            (3, 512),
            (17, 2048),
            (33, 768),
            (301, 512),
            (127, 2048),
        ] {
            for n in [1, 2, 3, 5] {
                let w = random_weights(ty, rows, cols, (rows * cols) as u64);
                let x = Rng::new(n as u64).floats(n * cols, 1.5);
                let got = run_matmul(ty, &w, rows, cols, &x, n);
                let want = scalar_matmul(ty, &w, rows, cols, &x, n);
                assert_eq!(bits(&got), bits(&want), "{} {rows}x{cols} n={n}", ty.name());
            }
        }
    }
}

#[test]
fn every_threading_gives_the_same_bits() {
    let (rows, cols, n) = (512, 2048, 3);
    let before = threading();
    for ty in BlockType::ALL {
        let w = random_weights(ty, rows, cols, 77);
        let x = Rng::new(78).floats(n * cols, 1.0);
        let want = scalar_matmul(ty, &w, rows, cols, &x, n);
        for t in [Threading::Single, Threading::Pool] {
            set_threading(t);
            assert_eq!(
                bits(&run_matmul(ty, &w, rows, cols, &x, n)),
                bits(&want),
                "{} {t:?}",
                ty.name()
            );
        }
    }
    set_threading(before);
}

#[test]
fn matmul_of_empty_shapes() {
    for ty in BlockType::ALL {
        assert!(run_matmul(ty, &[], 0, 256, &[0.5; 512], 2).is_empty());
        assert_eq!(run_matmul(ty, &[], 3, 0, &[], 2), vec![0.0; 6]);
    }
}

/// `w` with the f16 at each block's byte `at` set to zero.
fn zero_scale(ty: BlockType, w: &[u8], at: usize) -> Vec<u8> {
    let mut w = w.to_vec();
    for blk in w.chunks_exact_mut(ty.block_bytes()) {
        blk[at..at + 2].fill(0);
    }
    w
}

/// Per-value activation error `e_c` (module doc): Q8_0 `d/2 + 127·|d −
/// d16|` with `d = amax / 127`; Q8_K `|d|/2`; each with slack for the f32
/// scaling of `x` before rounding.
fn activation_error(x: &[f32], a: &scalar::ActRow) -> Vec<f64> {
    let be = x.len() / a.d.len();
    x.chunks(be)
        .zip(a.d)
        .flat_map(|(xb, &dx)| {
            let e = if be == 32 {
                let d = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64 / 127.0;
                d * (0.5 + 1e-4) + 127.0 * (d - dx as f64).abs()
            } else {
                (dx as f64).abs() * (0.5 + 1e-4)
            };
            std::iter::repeat_n(e, be)
        })
        .collect()
}

/// The quantized activation values `d_b·q_c` in natural order.
fn dequantized_activation(ty: BlockType, x: &[f32]) -> Vec<f64> {
    let natural = match ty {
        BlockType::Q4_0 | BlockType::Q5_0 | BlockType::Q5_1 => BlockType::Q8_0,
        BlockType::IQ4NL | BlockType::IQ4XS => BlockType::Q8_0,
        BlockType::Q4K | BlockType::Q5K => BlockType::Q6K,
        t => t,
    };
    let a = prepared(natural, x.len(), x, 1);
    let r = a.row(0);
    let be = x.len() / r.d.len();
    r.qs.iter()
        .enumerate()
        .map(|(c, &q)| r.d[c / be] as f64 * q as f64)
        .collect()
}

/// Two bounds on row `r` of `y = W·x`, with `ŵ = a − b` the dequantized
/// weight split into its scale and min parts, `x̃` the quantized activation
/// and `ρ = (nb + 12)·2^-23` (f32 rounding of the block combination):
/// `|y − Σ ŵ·x̃| ≤ ρ·Σ (|a| + |b|)·|x̃|` (only rounding), and
/// `|y − Σ ŵ·x| ≤ Σ |ŵ|·e + ρ·Σ (|a| + |b|)·(|x| + e)` (the module doc's).
fn check_error_bound(ty: BlockType, w: &[u8], rows: usize, cols: usize, x: &[f32]) {
    let y = run_matmul(ty, w, rows, cols, x, 1);
    let a = prepared(ty, cols, x, 1);
    let e = activation_error(x, &a.row(0));
    let xq = dequantized_activation(ty, x);
    let rb = ty.row_bytes(cols).unwrap();
    // One f32 step a lane per activation scale (a 32- or 256-value block).
    let rho = (a.row(0).d.len() + 12) as f64 * f64::powi(2.0, -23);
    let parts = match ty {
        BlockType::Q4K | BlockType::Q5K | BlockType::Q5_1 => {
            Some((zero_scale(ty, w, 2), zero_scale(ty, w, 0)))
        }
        BlockType::Q2K => Some((zero_scale(ty, w, 82), zero_scale(ty, w, 80))),
        _ => None,
    };
    let (mut wh, mut pa, mut pb) = (vec![0f32; cols], vec![0f32; cols], vec![0f32; cols]);
    for r in 0..rows {
        let row = |w: &[u8]| w[r * rb..(r + 1) * rb].to_vec();
        dequantize_row(ty, &row(w), &mut wh);
        if let Some((wa, wb)) = &parts {
            dequantize_row(ty, &row(wa), &mut pa);
            dequantize_row(ty, &row(wb), &mut pb);
        } else {
            pa.copy_from_slice(&wh);
            pb.fill(0.0);
        }
        let (mut exact, mut exact_q, mut act, mut mag, mut mag_q) = (0f64, 0f64, 0f64, 0f64, 0f64);
        for c in 0..cols {
            let (xc, ec, wc) = (x[c] as f64, e[c], wh[c] as f64);
            let parts = (pa[c] as f64).abs() + (pb[c] as f64).abs();
            exact += wc * xc;
            exact_q += wc * xq[c];
            act += wc.abs() * ec;
            mag += parts * (xc.abs() + ec);
            mag_q += parts * xq[c].abs();
        }
        let (yr, what) = (y[r] as f64, format!("{} {rows}x{cols} row {r}", ty.name()));
        let (err, bound) = ((yr - exact_q).abs(), rho * mag_q);
        assert!(
            err <= bound,
            "{what} vs quantized x: error {err} > bound {bound}"
        );
        let (err, bound) = ((yr - exact).abs(), act + rho * mag);
        assert!(err <= bound, "{what} vs x: error {err} > bound {bound}");
    }
}

#[test]
fn matmul_within_the_activation_rounding_bound() {
    for ty in BlockType::ALL {
        for cols in [256, 512, 2048] {
            let rows = 9;
            let mut rng = Rng::new(cols as u64);
            let wf = rng.floats(rows * cols, 0.05);
            let mut w = vec![0u8; rows * ty.row_bytes(cols).unwrap()];
            let rb = ty.row_bytes(cols).unwrap();
            for r in 0..rows {
                quantize_row(
                    ty,
                    &wf[r * cols..(r + 1) * cols],
                    &mut w[r * rb..(r + 1) * rb],
                );
            }
            check_error_bound(ty, &w, rows, cols, &rng.floats(cols, 2.0));
            // A spiky activation makes the activation scale coarse.
            let mut x = rng.floats(cols, 0.5);
            x[cols / 3] = 40.0;
            check_error_bound(ty, &w, rows, cols, &x);
            // Random (unencoded) blocks: large levels and mins.
            check_error_bound(ty, &random_weights(ty, rows, cols, 5), rows, cols, &x);
        }
    }
}

#[test]
fn non_finite_scales_poison_only_their_row() {
    for ty in BlockType::ALL {
        let (rows, cols) = (4, 512);
        let mut w = random_weights(ty, rows, cols, 8);
        let at = ty.row_bytes(cols).unwrap() + scale_offsets(ty)[0];
        w[at..at + 2].copy_from_slice(&0x7E00u16.to_le_bytes());
        let y = run_matmul(ty, &w, rows, cols, &Rng::new(1).floats(cols, 1.0), 1);
        assert!(
            y[1].is_nan() && y[0].is_finite() && y[2].is_finite(),
            "{} {y:?}",
            ty.name()
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn activation_quantizer_twins_agree_on_random_rows(
        x in (1usize..5).prop_flat_map(|b| proptest::collection::vec(prop_oneof![
            8 => -100.0f32..100.0,
            1 => any::<f32>(),
            1 => Just(0.0f32),
        ], 256 * b)),
    ) {
        check_quantizer_twins(&x);
    }

    #[test]
    fn random_shapes_batch_like_matvecs(
        ty in 0usize..BlockType::ALL.len(), rows in 1usize..40, blocks in 1usize..10, n in 1usize..6, seed in 0u64..1000,
    ) {
        let ty = BlockType::ALL[ty];
        let cols = blocks * ty.block_elems();
        let w = random_weights(ty, rows, cols, seed);
        let x = Rng::new(seed + 1).floats(n * cols, 4.0);
        let y = run_matmul(ty, &w, rows, cols, &x, n);
        prop_assert_eq!(bits(&y), bits(&scalar_matmul(ty, &w, rows, cols, &x, n)));
        for t in 0..n {
            let yt = run_matmul(ty, &w, rows, cols, &x[t * cols..(t + 1) * cols], 1);
            prop_assert_eq!(bits(&y[t * rows..(t + 1) * rows]), bits(&yt));
        }
    }
}
