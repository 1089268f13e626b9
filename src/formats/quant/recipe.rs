//! Named conversion recipes (`convert --recipe NAME`): a width for every
//! tensor class, written as a table so that a recipe reads as what it
//! stores. Routers and norms stay f32 in every recipe (see [`Policy`]).
//! The evidence behind them: routers and the MTP head at 8 bits or more;
//! attention and shared experts (always read) at 8; routed experts, the
//! bytes every token reads from disk, at 4, where the down projection
//! suffers most from narrowing (llama.cpp's MoE recipes keep it a step
//! above gate and up).
//!
//! The default (issue 30, results/quant-quality.md): routed gate/up q4g64
//! (grouped int4, an f16 scale per 64 weights), routed down q5_k (a step
//! above; Q8_0 on rows that are not whole 256-value blocks). On the trained
//! k256 fixture (every row whole 256-value blocks) it has mean KL 0.00108 at
//! 1,376,256 expert bytes per token, where llama.cpp's Q4_K_M has 0.00305 at
//! 1,394,688 and the old default (`row4`, per-row int4) 0.00315 at
//! 1,216,512. On the first trained fixture (128-wide rows: down stored
//! q8_0) 0.00164 at 835,584 against Q4_K_M's (Q5_0 there) 0.00251 at
//! 884,736 and row4's 0.00477 at 618,496.

use super::policy::{Class, Policy, Width};

/// One recipe: its name, what it is for, and `(class or "expert",
/// width)` pairs over the default policy.
#[derive(Clone, Copy, Debug)]
pub struct Recipe {
    pub name: &'static str,
    pub about: &'static str,
    widths: &'static [(&'static str, &'static str)],
}

/// Every recipe, smallest routed experts last.
pub const RECIPES: &[Recipe] = &[
    Recipe {
        name: "default",
        about: "routed gate/up q4g64 (int4, f16 scale per 64), routed down q5_k (q8_0 on partial blocks); the rest int8",
        widths: &[("expert_gate_up", "q4g64"), ("expert_down", "q5_k")],
    },
    Recipe {
        name: "row4",
        about: "routed experts per-row int4 (the default before issue 30: the fewest 4-bit bytes); the rest int8",
        widths: &[],
    },
    Recipe {
        name: "bf16",
        about: "every matrix BF16: the quality reference (routers and norms f32)",
        widths: &[
            ("expert", "bf16"),
            ("shared", "bf16"),
            ("attention", "bf16"),
            ("dense", "bf16"),
            ("embed", "bf16"),
            ("lm_head", "bf16"),
            ("mtp", "bf16"),
            ("other", "bf16"),
        ],
    },
    Recipe {
        name: "int8",
        about: "every matrix int8",
        widths: &[("expert", "int8")],
    },
    Recipe {
        name: "down8",
        about: "routed gate/up int4, routed down int8 (down a step above); the rest int8",
        widths: &[("expert_down", "int8")],
    },
    Recipe {
        name: "g32",
        about: "routed experts grouped int4 (f16 scale per 32 weights, q4g32); the rest int8",
        widths: &[("expert", "q4g32")],
    },
    Recipe {
        name: "k4m",
        about: "llama.cpp Q4_K_M-like blocks: routed gate/up q4_k, routed down q6_k, the rest q8_0 (K types fall back to q4_0/q8_0 on partial blocks)",
        widths: &[
            ("expert_gate_up", "q4_k"),
            ("expert_down", "q6_k"),
            ("shared", "q8_0"),
            ("attention", "q8_0"),
            ("dense", "q8_0"),
            ("embed", "q8_0"),
            ("lm_head", "q8_0"),
            ("mtp", "q8_0"),
        ],
    },
    Recipe {
        name: "k3m",
        about: "llama.cpp Q3_K_M-like blocks: routed gate/up q3_k, routed down q4_k, the rest q8_0 (K types fall back to q4_0/q8_0 on partial blocks)",
        widths: &[
            ("expert_gate_up", "q3_k"),
            ("expert_down", "q4_k"),
            ("shared", "q8_0"),
            ("attention", "q8_0"),
            ("dense", "q8_0"),
            ("embed", "q8_0"),
            ("lm_head", "q8_0"),
            ("mtp", "q8_0"),
        ],
    },
    Recipe {
        name: "k2",
        about: "llama.cpp Q2_K-like blocks: routed gate/up q2_k, routed down q3_k, the rest q8_0 (K types fall back to q4_0/q8_0 on partial blocks)",
        widths: &[
            ("expert_gate_up", "q2_k"),
            ("expert_down", "q3_k"),
            ("shared", "q8_0"),
            ("attention", "q8_0"),
            ("dense", "q8_0"),
            ("embed", "q8_0"),
            ("lm_head", "q8_0"),
            ("mtp", "q8_0"),
        ],
    },
    Recipe {
        name: "tiny",
        about: "routed gate/up int2, routed down int4 (experimental: the fewest bytes per token)",
        widths: &[("expert_gate_up", "int2")],
    },
];

impl Recipe {
    /// The recipe called `name`; the error lists every name.
    pub fn find(name: &str) -> Result<&'static Recipe, String> {
        RECIPES.iter().find(|r| r.name == name).ok_or_else(|| {
            let names: Vec<_> = RECIPES.iter().map(|r| r.name).collect();
            format!("`{name}`: unknown recipe (recipes: {})", names.join(", "))
        })
    }

    /// The recipe's policy: the default policy with its widths applied.
    pub fn policy(&self) -> Policy {
        let mut p = Policy::default();
        for (class, width) in self.widths {
            let classes = Class::group(class).expect("recipes name known classes");
            let width = Width::parse(width).expect("recipes name known widths");
            p.set_all(&classes, width)
                .expect("recipes leave routers and norms f32");
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::quant::QBits;

    #[test]
    fn every_recipe_builds_and_row4_is_the_base_policy() {
        for r in RECIPES {
            let p = r.policy();
            assert_eq!(p.width(Class::Router), Width::F32, "{}", r.name);
            assert!(p.width(Class::Mtp).bits() >= 8, "{}: MTP ≥ 8 bits", r.name);
        }
        assert_eq!(Recipe::find("row4").unwrap().policy(), Policy::default());
        let default = Recipe::find("default").unwrap().policy();
        assert_eq!(default.width(Class::ExpertGateUp).to_string(), "q4g64");
        assert_eq!(default.width(Class::ExpertDown).to_string(), "q5_k");
        assert_eq!(default.width(Class::Attention), Width::Int(QBits::Int8));
        assert_eq!(
            default.width(Class::ExpertDown).fitted(128).to_string(),
            "q8_0"
        );
        let down8 = Recipe::find("down8").unwrap().policy();
        assert_eq!(down8.width(Class::ExpertDown), Width::Int(QBits::Int8));
        assert_eq!(down8.width(Class::ExpertGateUp), Width::Int(QBits::Int4));
        let g32 = Recipe::find("g32").unwrap().policy();
        assert_eq!(g32.width(Class::ExpertDown).to_string(), "q4g32");
        let k4m = Recipe::find("k4m").unwrap().policy();
        assert_eq!(k4m.width(Class::ExpertDown).to_string(), "q6_k");
        assert_eq!(k4m.width(Class::Attention).to_string(), "q8_0");
        let k3m = Recipe::find("k3m").unwrap().policy();
        assert_eq!(k3m.width(Class::ExpertGateUp).to_string(), "q3_k");
        assert_eq!(k3m.width(Class::ExpertDown).to_string(), "q4_k");
        assert_eq!(k3m.width(Class::Shared).to_string(), "q8_0");
        let k2 = Recipe::find("k2").unwrap().policy();
        assert_eq!(k2.width(Class::ExpertGateUp).to_string(), "q2_k");
        assert_eq!(k2.width(Class::ExpertDown).to_string(), "q3_k");
        assert_eq!(k2.width(Class::LmHead).to_string(), "q8_0");
        let e = Recipe::find("q4").unwrap_err();
        assert!(e.contains("down8") && e.contains("unknown recipe"), "{e}");
    }
}
