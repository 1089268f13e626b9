//! CPU feature detection, done once and cached (memchr's ifunc pattern):
//! compile-time-only dispatch would silently run the scalar path on a
//! default build.

use std::sync::OnceLock;

/// The SIMD level the kernels dispatch to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    Scalar,
    Avx2,
    Avx512,
}

/// The best ISA this CPU supports; `MOESTREAM_ISA=scalar|avx2` caps it.
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let best = detect();
        match std::env::var("MOESTREAM_ISA").as_deref() {
            Ok("scalar") => Isa::Scalar,
            Ok("avx2") => best.min(Isa::Avx2),
            _ => best,
        }
    })
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Isa {
    if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") {
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
