//! The bit policy: which width each tensor is stored at (SPEC §4). A tensor
//! is put in a [`Class`] from its name and shape; each class has a width
//! (defaults below, every one overridable). Routers, norms and biases stay
//! f32 whatever the policy says: they are tiny and routing is sensitive.

use super::grouped::GFormat;
use super::QBits;
use crate::kernels::ggml::BlockType;
use std::collections::BTreeMap;
use std::fmt;

/// What a tensor is, for the bit policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Class {
    /// A routed expert's gate or up projection.
    ExpertGateUp,
    /// A routed expert's down projection.
    ExpertDown,
    /// Shared (always-on) experts.
    Shared,
    /// Attention projections, including MLA and the DSA indexer.
    Attention,
    /// Dense MLP layers.
    Dense,
    /// Token embeddings.
    Embed,
    /// The output projection.
    LmHead,
    /// Every matrix of the multi-token-prediction layers.
    Mtp,
    /// Routers (always f32).
    Router,
    /// Norm weights, biases and other 1-D tensors (always f32).
    Norm,
    /// Any other matrix.
    Other,
}

impl Class {
    /// Every class, in census order.
    pub const ALL: [Class; 11] = [
        Class::ExpertGateUp,
        Class::ExpertDown,
        Class::Shared,
        Class::Attention,
        Class::Dense,
        Class::Embed,
        Class::LmHead,
        Class::Mtp,
        Class::Router,
        Class::Norm,
        Class::Other,
    ];

    /// The name used on the command line (`--bits CLASS=BITS`) and in the census.
    pub fn name(self) -> &'static str {
        match self {
            Class::ExpertGateUp => "expert_gate_up",
            Class::ExpertDown => "expert_down",
            Class::Shared => "shared",
            Class::Attention => "attention",
            Class::Dense => "dense",
            Class::Embed => "embed",
            Class::LmHead => "lm_head",
            Class::Mtp => "mtp",
            Class::Router => "router",
            Class::Norm => "norm",
            Class::Other => "other",
        }
    }

    /// The routed experts' classes (`expert` on the command line).
    pub const ROUTED: [Class; 2] = [Class::ExpertGateUp, Class::ExpertDown];

    /// Parses [`Class::name`].
    pub fn parse(s: &str) -> Option<Class> {
        Class::ALL.into_iter().find(|c| c.name() == s)
    }

    /// The classes a command-line name stands for: one class by its
    /// [`Class::name`], or `expert` for both routed classes.
    pub fn group(s: &str) -> Option<Vec<Class>> {
        match s {
            "expert" => Some(Class::ROUTED.to_vec()),
            _ => Class::parse(s).map(|c| vec![c]),
        }
    }

    /// The class of tensor `name` of `shape` in a model of `layers` decoder
    /// layers (layer indices from `layers` on are MTP layers).
    pub fn of(name: &str, shape: &[usize], layers: usize) -> Class {
        if shape.len() != 2 {
            return Class::Norm;
        }
        let mtp = layer_index(name).is_some_and(|l| l >= layers);
        let router = name.ends_with("mlp.gate.weight")
            || name.ends_with("block_sparse_moe.gate.weight")
            || name.contains("shared_expert_gate");
        if router {
            Class::Router
        } else if mtp {
            Class::Mtp
        } else if name.contains(".experts.") {
            let down = name.ends_with(".down_proj.weight") || name.ends_with(".w2.weight");
            if down {
                Class::ExpertDown
            } else {
                Class::ExpertGateUp
            }
        } else if name.contains("shared_expert") {
            Class::Shared
        } else if name.contains(".self_attn.") {
            Class::Attention
        } else if name.contains(".mlp.") {
            Class::Dense
        } else if name.contains("embed_tokens") {
            Class::Embed
        } else if name.starts_with("lm_head") {
            Class::LmHead
        } else {
            Class::Other
        }
    }
}

/// The decoder-layer index in `model.layers.{l}.…`, if any.
pub fn layer_index(name: &str) -> Option<usize> {
    let rest = name.strip_prefix("model.layers.")?;
    rest.split('.').next()?.parse().ok()
}

/// A stored width: an integer width of the container (per row, or
/// grouped), llama.cpp blocks, BF16 or f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Width {
    Int(QBits),
    Grouped(GFormat),
    /// ggml blocks (Q8_0, Q4_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), see
    /// [`crate::formats::quant::kquant`].
    Blocks(BlockType),
    Bf16,
    F32,
}

impl Width {
    /// From a bit count: 2, 4, 8, 16 (BF16) or 32.
    pub fn from_bits(bits: u32) -> Option<Width> {
        match bits {
            16 => Some(Width::Bf16),
            32 => Some(Width::F32),
            b => QBits::from_bits(b).map(Width::Int),
        }
    }

    /// A bit count (see [`Width::from_bits`]), the spelling [`Width`]'s
    /// `Display` writes (`int4`, `bf16`, `f32`), a grouped format's name
    /// (`q4g64`, `q4g64a`, `q3g64`, `q2g64`, …) or a block type as llama.cpp
    /// spells it (`q4_k`, `Q8_0`).
    pub fn parse(s: &str) -> Option<Width> {
        if let Ok(bits) = s.parse() {
            return Width::from_bits(bits);
        }
        match s {
            "bf16" => Some(Width::Bf16),
            "f32" => Some(Width::F32),
            _ => s
                .strip_prefix("int")
                .and_then(|b| b.parse().ok())
                .and_then(QBits::from_bits)
                .map(Width::Int)
                .or_else(|| GFormat::parse(s).map(Width::Grouped))
                .or_else(|| BlockType::parse(s).map(Width::Blocks)),
        }
    }

    /// What [`Width::parse`] accepts, for error messages.
    pub const SPELLINGS: &str = "2, 4, 8, 16 (BF16), 32 (f32), int2/int4/int8/bf16/f32, a grouped format q{4,3,2}g{32,64,128} (q4g64a: int4 with a min), or a block type q8_0, q4_0, q2_k, q3_k, q4_k, q5_k, q6_k";

    /// Whole bits per weight: per-row widths and grouped formats their
    /// levels' bits (without the group parameters); a block type its
    /// storage per weight, scales included, rounded down (Q8_0 8, Q6_K 6,
    /// Q4_K 4, Q3_K 3, Q2_K 2).
    pub fn bits(self) -> u32 {
        match self {
            Width::Int(q) => q.bits(),
            Width::Grouped(f) => f.bits().bits(),
            Width::Blocks(t) => (t.block_bytes() * 8 / t.block_elems()) as u32,
            Width::Bf16 => 16,
            Width::F32 => 32,
        }
    }

    /// The width a matrix of `cols` columns is stored at: block types need
    /// whole blocks, so a K type over columns that are not a multiple of
    /// 256 falls back to the 32-value block of at least its bits (Q2_K,
    /// Q3_K and Q4_K → Q4_0, Q5_K and Q6_K → Q8_0; llama.cpp takes IQ4_NL,
    /// Q4_0's size, for Q2_K and Q3_K), and a block type over columns that
    /// are not a multiple of 32 to int8 (as llama.cpp's quantizer falls
    /// back; the census shows what was stored).
    pub fn fitted(self, cols: usize) -> Width {
        let Width::Blocks(ty) = self else {
            return self;
        };
        if ty.row_bytes(cols).is_some() {
            return self;
        }
        let small = match ty {
            BlockType::Q2K | BlockType::Q3K | BlockType::Q4K => BlockType::Q4_0,
            _ => BlockType::Q8_0,
        };
        match small.row_bytes(cols) {
            Some(_) => Width::Blocks(small),
            None => Width::Int(QBits::Int8),
        }
    }
}

impl fmt::Display for Width {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Width::Int(q) => write!(f, "int{}", q.bits()),
            Width::Blocks(t) => write!(f, "{}", t.name().to_lowercase()),
            Width::Grouped(g) => write!(f, "{g}"),
            Width::Bf16 => write!(f, "bf16"),
            Width::F32 => write!(f, "f32"),
        }
    }
}

/// The width of every class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    widths: BTreeMap<Class, Width>,
}

impl Default for Policy {
    /// The base every recipe edits (the `row4` recipe; `convert`'s
    /// default recipe narrows it further, see `recipe.rs`): routed experts
    /// int4; attention, dense, shared experts, embeddings, lm_head and MTP
    /// int8; routers and norms f32.
    fn default() -> Self {
        let mut widths = BTreeMap::new();
        for c in Class::ALL {
            let w = match c {
                Class::ExpertGateUp | Class::ExpertDown => Width::Int(QBits::Int4),
                Class::Router | Class::Norm => Width::F32,
                _ => Width::Int(QBits::Int8),
            };
            widths.insert(c, w);
        }
        Policy { widths }
    }
}

impl Policy {
    /// Sets the width of `class`. Routers and norms cannot be narrowed.
    pub fn set(&mut self, class: Class, width: Width) -> Result<(), String> {
        if matches!(class, Class::Router | Class::Norm) && width != Width::F32 {
            return Err(format!(
                "class `{}` is always f32 (routing and norms are too sensitive to narrow)",
                class.name()
            ));
        }
        self.widths.insert(class, width);
        Ok(())
    }

    /// Sets the width of every class of `classes`.
    pub fn set_all(&mut self, classes: &[Class], width: Width) -> Result<(), String> {
        classes.iter().try_for_each(|c| self.set(*c, width))
    }

    /// The width of `class`.
    pub fn width(&self, class: Class) -> Width {
        self.widths[&class]
    }

    /// The width tensor `name` of `shape` gets in a model of `layers`
    /// layers ([`Width::fitted`] to its columns).
    pub fn width_of(&self, name: &str, shape: &[usize], layers: usize) -> Width {
        let cols = shape.get(1).copied().unwrap_or(0);
        self.width(Class::of(name, shape, layers)).fitted(cols)
    }

    /// Parses `CLASS=BITS` and applies it.
    pub fn apply_override(&mut self, spec: &str) -> Result<(), String> {
        let (c, b) = spec
            .split_once('=')
            .ok_or_else(|| format!("`{spec}`: expected CLASS=BITS, e.g. attention=4"))?;
        let classes = Class::group(c).ok_or_else(|| {
            let names: Vec<_> = Class::ALL.iter().map(|c| c.name()).collect();
            format!(
                "`{c}`: unknown class (classes: expert, {})",
                names.join(", ")
            )
        })?;
        let width =
            Width::parse(b).ok_or_else(|| format!("`{b}`: bits must be {}", Width::SPELLINGS))?;
        self.set_all(&classes, width)
    }

    /// One line: `expert=int4 shared=int8 …`.
    pub fn summary(&self) -> String {
        self.widths
            .iter()
            .map(|(c, w)| format!("{}={w}", c.name()))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_follow_the_names_of_every_family() {
        let m = [2usize, 2];
        let cases = [
            (
                "model.layers.0.mlp.experts.3.gate_proj.weight",
                Class::ExpertGateUp,
            ),
            (
                "model.layers.0.mlp.experts.3.down_proj.weight",
                Class::ExpertDown,
            ),
            (
                "model.layers.0.block_sparse_moe.experts.3.w2.weight",
                Class::ExpertDown,
            ),
            (
                "model.layers.0.block_sparse_moe.experts.3.w3.weight",
                Class::ExpertGateUp,
            ),
            ("model.layers.0.mlp.gate.weight", Class::Router),
            ("model.layers.0.block_sparse_moe.gate.weight", Class::Router),
            (
                "model.layers.0.mlp.shared_expert_gate.weight",
                Class::Router,
            ),
            (
                "model.layers.0.mlp.shared_expert.up_proj.weight",
                Class::Shared,
            ),
            (
                "model.layers.0.mlp.shared_experts.up_proj.weight",
                Class::Shared,
            ),
            (
                "model.layers.0.self_attn.kv_b_proj.weight",
                Class::Attention,
            ),
            (
                "model.layers.0.self_attn.indexer.wk.weight",
                Class::Attention,
            ),
            ("model.layers.0.mlp.down_proj.weight", Class::Dense),
            ("model.embed_tokens.weight", Class::Embed),
            ("lm_head.weight", Class::LmHead),
            ("model.layers.4.eh_proj.weight", Class::Mtp),
            ("model.layers.4.mlp.experts.0.up_proj.weight", Class::Mtp),
            ("model.layers.4.mlp.gate.weight", Class::Router),
        ];
        for (name, want) in cases {
            assert_eq!(Class::of(name, &m, 4), want, "{name}");
        }
        assert_eq!(Class::of("model.norm.weight", &[8], 4), Class::Norm);
        assert_eq!(
            Class::of("model.layers.0.self_attn.q_proj.bias", &[8], 4),
            Class::Norm
        );
    }

    #[test]
    fn the_default_policy_and_its_overrides() {
        let mut p = Policy::default();
        assert_eq!(p.width(Class::ExpertGateUp), Width::Int(QBits::Int4));
        assert_eq!(p.width(Class::ExpertDown), Width::Int(QBits::Int4));
        p.apply_override("expert=8").unwrap();
        assert_eq!(p.width(Class::ExpertGateUp), Width::Int(QBits::Int8));
        assert_eq!(p.width(Class::ExpertDown), Width::Int(QBits::Int8));
        p.apply_override("expert_down=2").unwrap();
        assert_eq!(p.width(Class::ExpertDown), Width::Int(QBits::Int2));
        assert_eq!(p.width(Class::ExpertGateUp), Width::Int(QBits::Int8));
        assert_eq!(p.width(Class::Attention), Width::Int(QBits::Int8));
        assert_eq!(p.width(Class::Router), Width::F32);
        p.apply_override("attention=16").unwrap();
        assert_eq!(p.width(Class::Attention), Width::Bf16);
        assert!(p.apply_override("router=8").is_err());
        assert!(p
            .apply_override("experts=4")
            .unwrap_err()
            .contains("unknown class"));
        assert!(p.apply_override("expert=3").unwrap_err().contains("bits"));
        p.apply_override("expert=q3g64").unwrap();
        assert_eq!(p.width(Class::ExpertDown).to_string(), "q3g64");
        assert!(p
            .apply_override("expert=q3g64a")
            .unwrap_err()
            .contains("q4g64a"));
        assert!(p.apply_override("expert").is_err());
        p.apply_override("expert=q4_k").unwrap();
        assert_eq!(p.width(Class::ExpertDown), Width::Blocks(BlockType::Q4K));
        p.apply_override("expert_gate_up=q3_k").unwrap();
        assert_eq!(p.width(Class::ExpertGateUp), Width::Blocks(BlockType::Q3K));
        p.apply_override("expert=Q2_K").unwrap();
        assert_eq!(p.width(Class::ExpertDown), Width::Blocks(BlockType::Q2K));
        assert!(p
            .apply_override("expert=q5_0")
            .unwrap_err()
            .contains("q3_k"));
    }

    #[test]
    fn block_widths_fall_back_on_columns_of_partial_blocks() {
        let k = |t| Width::Blocks(t);
        assert_eq!(k(BlockType::Q4K).fitted(512), k(BlockType::Q4K));
        assert_eq!(k(BlockType::Q4K).fitted(192), k(BlockType::Q4_0));
        assert_eq!(k(BlockType::Q6K).fitted(96), k(BlockType::Q8_0));
        assert_eq!(k(BlockType::Q5K).fitted(100), Width::Int(QBits::Int8));
        assert_eq!(k(BlockType::Q3K).fitted(768), k(BlockType::Q3K));
        assert_eq!(k(BlockType::Q3K).fitted(192), k(BlockType::Q4_0));
        assert_eq!(k(BlockType::Q2K).fitted(128), k(BlockType::Q4_0));
        assert_eq!(k(BlockType::Q2K).fitted(48), Width::Int(QBits::Int8));
        assert_eq!(k(BlockType::Q2K).to_string(), "q2_k");
        assert_eq!((k(BlockType::Q3K).bits(), k(BlockType::Q2K).bits()), (3, 2));
        assert_eq!(k(BlockType::Q8_0).fitted(64), k(BlockType::Q8_0));
        assert_eq!(Width::Int(QBits::Int4).fitted(7), Width::Int(QBits::Int4));
        assert_eq!(k(BlockType::Q5K).to_string(), "q5_k");
    }
}
