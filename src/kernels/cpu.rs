//! CPU feature detection, done once and cached (memchr's ifunc pattern):
//! compile-time-only dispatch would silently run the scalar path on a
//! default build.

use std::sync::OnceLock;

/// The SIMD level the kernels dispatch to. Levels are ordered: each one
/// implies the features of the ones below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    Scalar,
    /// AVX2 + FMA.
    Avx2,
    /// AVX-512F + AVX-512BW.
    Avx512,
    /// AVX-512F + AVX-512BW + AVX-512 VNNI (`vpdpbusd`), for the integer dots.
    Avx512Vnni,
}

/// The best ISA this CPU supports; `MOESTREAM_ISA=scalar|avx2|avx512` caps it
/// (`avx512` drops VNNI, so the integer dots fall back to AVX2).
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let best = detect();
        match std::env::var("MOESTREAM_ISA").as_deref() {
            Ok("scalar") => Isa::Scalar,
            Ok("avx2") => best.min(Isa::Avx2),
            Ok("avx512") => best.min(Isa::Avx512),
            _ => best,
        }
    })
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Isa {
    let avx512 = is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw");
    if avx512 && is_x86_feature_detected!("avx512vnni") {
        Isa::Avx512Vnni
    } else if avx512 {
        Isa::Avx512
    } else if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        Isa::Avx2
    } else {
        Isa::Scalar
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Isa {
    Isa::Scalar
}

/// Whether this CPU has what the VNNI integer kernels need (for twin tests
/// and benches that call a specific version regardless of the cap).
#[cfg(target_arch = "x86_64")]
pub fn has_avx512_vnni() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni")
}

/// Whether this CPU has AVX2 (the AVX2 integer kernels need nothing more).
#[cfg(target_arch = "x86_64")]
pub fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2")
}
