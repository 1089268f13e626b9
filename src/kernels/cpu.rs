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

/// The best ISA this CPU supports; `MOESTREAM_ISA=scalar|avx2|avx512|avx512vnni`
/// caps it (`avx512` drops VNNI, so the integer dots fall back to AVX2;
/// `avx512vnni` drops only AMX, see [`amx`]).
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

/// Whether the int8/int4 prefill dots run on the AMX-INT8 tiles
/// (`kernels::amx`): the dispatch is at AVX-512 VNNI ([`isa`]), the CPU has
/// AMX-TILE and AMX-INT8, Linux granted this process the tile state, and
/// `MOESTREAM_ISA=avx512vnni` does not hold the kernels at VNNI.
pub fn amx() -> bool {
    static AMX: OnceLock<bool> = OnceLock::new();
    *AMX.get_or_init(|| {
        isa() == Isa::Avx512Vnni
            && std::env::var("MOESTREAM_ISA").as_deref() != Ok("avx512vnni")
            && has_amx_int8()
    })
}

/// Whether this CPU has AMX-TILE and AMX-INT8 and this process may use
/// the tiles (asked of Linux once), whatever the dispatch cap says (for
/// twin tests and benches).
#[cfg(target_arch = "x86_64")]
pub fn has_amx_int8() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        if !has_avx512_vnni() {
            return false;
        }
        // CPUID leaf 7 exists on every x86-64 CPU with AVX-512 (checked
        // just above).
        let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
        let (tile, int8) = (1 << 24, 1 << 25);
        edx & (tile | int8) == tile | int8 && super::amx::request_tiles()
    })
}

#[cfg(not(target_arch = "x86_64"))]
pub fn has_amx_int8() -> bool {
    false
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
