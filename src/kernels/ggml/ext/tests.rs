//! Hand-built Q5_0, Q5_1, IQ4_NL and IQ4_XS blocks decode as ggml-common.h
//! lays them out, and the encoders' bytes are ggml's reference ones.
//! (`ggml::tests` runs these types through every generic test: the twins,
//! `matmul`, the error bounds, ggml's own dequantization of known blocks.)

use super::super::{dequantize_row, quantize_row, BlockType};

/// ggml-common.h's `kvalues_iq4nl`, spelled out again.
const KV: [f32; 16] = [
    -127., -104., -83., -65., -49., -35., -22., -10., 1., 13., 25., 38., 53., 69., 89., 113.,
];

/// Level bytes `j | (15 − j) << 4`: value `j` has nibble `j`, value `16 +
/// j` nibble `15 − j`.
fn ramp(qs: &mut [u8]) {
    for (j, q) in qs.iter_mut().enumerate() {
        *q = j as u8 | (15 - j as u8) << 4;
    }
}

fn decode(ty: BlockType, blk: &[u8]) -> Vec<f32> {
    let mut out = vec![0f32; blk.len() / ty.block_bytes() * ty.block_elems()];
    dequantize_row(ty, blk, &mut out);
    out
}

#[test]
fn dequantize_hand_built_q5_0() {
    let mut blk = [0u8; 22];
    blk[..2].copy_from_slice(&0x3800u16.to_le_bytes()); // d = 0.5
    blk[2..6].copy_from_slice(&0x8000_0003u32.to_le_bytes()); // bits 0, 1, 31
    ramp(&mut blk[6..]);
    let out = decode(BlockType::Q5_0, &blk);
    for (v, &got) in out.iter().enumerate().take(32) {
        let nib = if v < 16 { v } else { 31 - v } as i32;
        let high = if [0, 1, 31].contains(&v) { 16 } else { 0 };
        assert_eq!(got, (nib + high - 16) as f32 * 0.5, "value {v}");
    }
}

#[test]
fn dequantize_hand_built_q5_1() {
    let mut blk = [0u8; 24];
    blk[..2].copy_from_slice(&0x3400u16.to_le_bytes()); // d = 0.25
    blk[2..4].copy_from_slice(&0xBC00u16.to_le_bytes()); // m = −1
    blk[4..8].copy_from_slice(&0x0001_0004u32.to_le_bytes()); // bits 2, 16
    ramp(&mut blk[8..]);
    let out = decode(BlockType::Q5_1, &blk);
    for (v, &got) in out.iter().enumerate().take(32) {
        let nib = if v < 16 { v } else { 31 - v } as i32;
        let high = if [2, 16].contains(&v) { 16 } else { 0 };
        assert_eq!(got, (nib + high) as f32 * 0.25 - 1.0, "value {v}");
    }
}

#[test]
fn dequantize_hand_built_iq4_nl() {
    let mut blk = [0u8; 18];
    blk[..2].copy_from_slice(&0x4000u16.to_le_bytes()); // d = 2
    ramp(&mut blk[2..]);
    let out = decode(BlockType::IQ4NL, &blk);
    for (v, &got) in out.iter().enumerate().take(32) {
        let nib = if v < 16 { v } else { 31 - v };
        assert_eq!(got, 2.0 * KV[nib], "value {v}");
    }
}

#[test]
fn dequantize_hand_built_iq4_xs() {
    let mut blk = [0u8; 136];
    blk[..2].copy_from_slice(&0x3800u16.to_le_bytes()); // d = 0.5
                                                        // Sub-block j's 6-bit scale code l_j (decoding to l_j − 32).
    let code = |j: usize| ((9 * j + 5) % 64) as u16;
    let mut h = 0u16;
    for j in 0..8 {
        blk[4 + j / 2] |= ((code(j) & 15) as u8) << (4 * (j % 2));
        h |= (code(j) >> 4) << (2 * j);
    }
    blk[2..4].copy_from_slice(&h.to_le_bytes());
    for j in 0..8 {
        ramp(&mut blk[8 + 16 * j..24 + 16 * j]);
    }
    let out = decode(BlockType::IQ4XS, &blk);
    for (v, &got) in out.iter().enumerate().take(256) {
        let (j, i) = (v / 32, v % 32);
        let nib = if i < 16 { i } else { 31 - i };
        let dl = 0.5 * (code(j) as f32 - 32.0);
        assert_eq!(got, dl * KV[nib], "value {v}");
    }
}

#[test]
fn q5_encoders_are_ggml_ref() {
    // Q5_0: x = i − 16, max −16 → d = 1, level = trunc(x + 16.5) capped at 31.
    let x: Vec<f32> = (0..32).map(|i| i as f32 - 16.0).collect();
    let mut blk = [0u8; 22];
    quantize_row(BlockType::Q5_0, &x, &mut blk);
    assert_eq!(blk[..2], [0x00, 0x3C]);
    let want: Vec<f32> = x.iter().map(|&v| v.min(15.0)).collect();
    assert_eq!(decode(BlockType::Q5_0, &blk), want);
    // Q5_1: min −16, max 15 → d = 1, m = −16: every value exact.
    let mut blk = [0u8; 24];
    quantize_row(BlockType::Q5_1, &x, &mut blk);
    assert_eq!(blk[..4], [0x00, 0x3C, 0x00, 0xCC]);
    assert_eq!(decode(BlockType::Q5_1, &blk), x);
}

#[test]
fn iq4_encoders_hit_table_values_exactly() {
    // Values on the table times 0.5 (max magnitude −63.5 = −127·0.5).
    let x: Vec<f32> = (0..256).map(|i| KV[(i * 7) % 16] * 0.5).collect();
    let mut nl = vec![0u8; 8 * 18];
    quantize_row(BlockType::IQ4NL, &x, &mut nl);
    assert_eq!(decode(BlockType::IQ4NL, &nl), x);
    let mut xs = [0u8; 136];
    quantize_row(BlockType::IQ4XS, &x, &mut xs);
    // d = 0.5·(−1)/−32 → every scale −32: d·sc = 0.5 again.
    assert_eq!(decode(BlockType::IQ4XS, &xs), x);
}
