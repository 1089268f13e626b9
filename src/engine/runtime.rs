//! The one configuration of a run, resolved once: [`resolve`] turns what
//! was asked for ([`Requested`]) into a [`RuntimeConfig`] `{ model, store,
//! io, generation }`. The command line fills [`Requested`] from its
//! sources in order of precedence (flags, then `MOESTREAM_<FLAG>`
//! environment variables, then the `--config` file; cli/config.rs), then
//! the tuned profile of this disk and model (`moestream tune`) decides
//! what is still [`Choice::Auto`], then the defaults here. A setting left
//! to the profile is [`Choice::Auto`], never a sentinel value, and every
//! field of [`RuntimeConfig`] is read by loading or generating. Pure: the
//! profile is passed in, so the rules are table-tested here.

use crate::engine::GenOptions;
use crate::formats::quant::policy::Policy;
use crate::fs::tuned::TunedProfile;
use crate::model::mla::{DsaMode, MlaMode};
use crate::model::progress::Progress;
use crate::model::LoadOptions;
use crate::store::policy::EvictPolicy;
use crate::store::predictor::Predictor;
use crate::store::{Lookahead, ScheduleOptions, Variant};
use moestream_io::ReadMode;
use std::sync::Arc;

/// A setting asked for explicitly, or left to the profile and defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice<T> {
    Auto,
    Set(T),
}

/// The model's own settings: attention paths, load-time quantization,
/// the context the KV cache is planned for.
#[derive(Clone, Debug)]
pub struct ModelSettings {
    pub mla: MlaMode,
    pub dsa: DsaMode,
    /// Quantize float and FP8 tensors by this policy as they load.
    pub quantize_at_load: Option<Policy>,
    /// Context positions the KV cache is planned for.
    pub context: usize,
}

impl Default for ModelSettings {
    fn default() -> Self {
        let d = LoadOptions::default();
        ModelSettings {
            mla: d.mla,
            dsa: d.dsa,
            quantize_at_load: d.quantize_at_load,
            context: d.context,
        }
    }
}

/// The expert store as asked for: size, budget, eviction, pins, and the
/// pipelining and prefetch still open to the profile.
#[derive(Clone, Debug)]
pub struct StoreRequest {
    /// Routed experts cached per layer when there is no budget.
    pub expert_cache: usize,
    /// RAM budget in bytes; slots are then planned to fit it, and the
    /// default read mode is O_DIRECT.
    pub ram_budget: Option<u64>,
    pub policy: EvictPolicy,
    pub pin_history: bool,
    pub pipeline: Choice<bool>,
    /// Router-lookahead prefetch: `Set(None)` is off.
    pub prefetch: Choice<Option<Lookahead>>,
    /// See [`ScheduleOptions::prefetch_experts`].
    pub prefetch_experts: Option<usize>,
    pub recall: bool,
    pub cache_lean: Option<f32>,
    /// A learned lookahead predictor (in place of the router lookahead).
    pub predictor: Option<Arc<Predictor>>,
    /// See [`LoadOptions::input_bytes`].
    pub input_bytes: u64,
}

impl Default for StoreRequest {
    fn default() -> Self {
        let d = LoadOptions::default();
        StoreRequest {
            expert_cache: d.expert_cache,
            ram_budget: None,
            policy: d.policy,
            pin_history: d.pin_history,
            pipeline: Choice::Auto,
            prefetch: Choice::Auto,
            prefetch_experts: None,
            recall: false,
            cache_lean: None,
            predictor: None,
            input_bytes: 0,
        }
    }
}

/// How expert bytes are read, as asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoRequest {
    pub read_mode: Choice<ReadMode>,
    /// Submit a layer's misses through the io_uring reactor (else one by
    /// one on a reader thread).
    pub reactor: bool,
}

impl Default for IoRequest {
    fn default() -> Self {
        IoRequest {
            read_mode: Choice::Auto,
            reactor: true,
        }
    }
}

/// What a run asks for, every source merged (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct Requested {
    pub model: ModelSettings,
    pub store: StoreRequest,
    pub io: IoRequest,
    pub generation: GenOptions,
}

impl Requested {
    /// Whether some setting is left to the profile.
    pub fn wants_profile(&self) -> bool {
        self.io.read_mode == Choice::Auto
            || self.store.pipeline == Choice::Auto
            || self.store.prefetch == Choice::Auto
    }
}

/// The store's settings a run uses.
#[derive(Clone, Debug)]
pub struct StoreSettings {
    pub expert_cache: usize,
    pub ram_budget: Option<u64>,
    pub policy: EvictPolicy,
    pub pin_history: bool,
    pub schedule: ScheduleOptions,
    pub predictor: Option<Arc<Predictor>>,
    /// See [`LoadOptions::input_bytes`].
    pub input_bytes: u64,
}

/// How a run reads expert bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoSettings {
    pub read_mode: ReadMode,
    pub reactor: bool,
}

/// The settings a run uses: [`Self::load_options`] for loading,
/// `generation` for generating.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    pub model: ModelSettings,
    pub store: StoreSettings,
    pub io: IoSettings,
    pub generation: GenOptions,
    /// Profile values that were not understood and gave way to the
    /// defaults, as `name `value``.
    pub not_understood: Vec<String>,
}

impl RuntimeConfig {
    /// What loading is asked to do, every field from this configuration
    /// (`progress` is where loading reports, not a setting).
    pub fn load_options(&self, progress: Progress) -> LoadOptions {
        LoadOptions {
            expert_cache: self.store.expert_cache,
            read_mode: self.io.read_mode,
            mla: self.model.mla,
            dsa: self.model.dsa,
            io_reactor: self.io.reactor,
            quantize_at_load: self.model.quantize_at_load.clone(),
            ram_budget: self.store.ram_budget,
            policy: self.store.policy,
            pin_history: self.store.pin_history,
            context: self.model.context,
            schedule: self.store.schedule,
            predictor: self.store.predictor.clone(),
            progress,
            input_bytes: self.store.input_bytes,
        }
    }
}

/// The read mode without a profile: O_DIRECT under a RAM budget (the page
/// cache gets no room there: direct led every mode in results/io-modes.md
/// and results/roofline.md), the page cache otherwise (a free second-level
/// cache when RAM is plentiful).
pub fn default_read_mode(budgeted: bool) -> ReadMode {
    if budgeted {
        ReadMode::Direct
    } else {
        ReadMode::Buffered
    }
}

/// Pipelining without a profile.
pub const DEFAULT_PIPELINE: bool = true;

/// Prefetch without a profile: none. Measured cold at 3 GB on the 24-layer
/// Qwen3-30B-A3B shape (results/prefetch-budget.md, "The default becomes
/// off"): with realistic routing (lookahead recall 0.70, the real models'
/// figure) the lookahead from attn read 19% more bytes for 0.99-1.03x
/// decode tok/s on this disk and 0.84x on a disk throttled to 1.5 GB/s;
/// from output it read ahead too late to overlap anything (0.94x, 1.00x);
/// on the trained fixtures every prefetch setting was at or below off
/// (results/policies.md). Only near-uniform routing, which the
/// lookahead guesses 98.5% right, gained (1.24x unthrottled, 1.00x
/// throttled). `moestream tune` measures prefetch on the user's disk
/// and model, and its profile decides.
pub const DEFAULT_PREFETCH: Option<Lookahead> = None;

/// The three settings a profile may decide.
struct Tunable {
    read_mode: ReadMode,
    pipeline: bool,
    prefetch: Option<Lookahead>,
    not_understood: Vec<String>,
}

/// Resolves `req` against `profile` (when some setting is `Auto`) and the
/// defaults.
pub fn resolve(req: &Requested, profile: Option<&TunedProfile>) -> RuntimeConfig {
    let t = tunable(req, profile);
    let s = &req.store;
    RuntimeConfig {
        model: req.model.clone(),
        store: StoreSettings {
            expert_cache: s.expert_cache,
            ram_budget: s.ram_budget,
            policy: s.policy,
            pin_history: s.pin_history,
            schedule: ScheduleOptions {
                pipeline: t.pipeline,
                lookahead: t.prefetch,
                prefetch_experts: s.prefetch_experts,
                recall: s.recall,
                cache_lean: s.cache_lean,
            },
            predictor: s.predictor.clone(),
            input_bytes: s.input_bytes,
        },
        io: IoSettings {
            read_mode: t.read_mode,
            reactor: req.io.reactor,
        },
        generation: req.generation.clone(),
        not_understood: t.not_understood,
    }
}

/// Read mode, pipelining and prefetch: asked, else the profile's, else
/// the defaults.
fn tunable(req: &Requested, profile: Option<&TunedProfile>) -> Tunable {
    let budgeted = req.store.ram_budget.is_some();
    let mut r = Tunable {
        read_mode: default_read_mode(budgeted),
        pipeline: DEFAULT_PIPELINE,
        prefetch: DEFAULT_PREFETCH,
        not_understood: Vec::new(),
    };
    if let Some(p) = profile.filter(|_| req.wants_profile()) {
        match p.read_mode.parse() {
            Ok(m) => r.read_mode = m,
            Err(_) => r
                .not_understood
                .push(format!("read_mode `{}`", p.read_mode)),
        }
        r.pipeline = p.pipeline;
        match (p.prefetch.as_str(), parse_lookahead(&p.prefetch)) {
            ("off", _) => r.prefetch = None,
            (_, Some(l)) => r.prefetch = Some(l),
            (bad, None) => r.not_understood.push(format!("prefetch `{bad}`")),
        }
    }
    if let Choice::Set(m) = req.io.read_mode {
        r.read_mode = m;
    }
    if let Choice::Set(p) = req.store.pipeline {
        r.pipeline = p;
    }
    if let Choice::Set(l) = req.store.prefetch {
        r.prefetch = l;
    }
    r
}

/// A profile's `off` / `attn-1` / `output-2`: `None` for anything else
/// (`off` included: see [`lookahead_name`]).
pub fn parse_lookahead(s: &str) -> Option<Lookahead> {
    let (from, depth) = s.split_once('-')?;
    let from = match from {
        "attn" => Variant::Attn,
        "output" => Variant::Output,
        _ => return None,
    };
    Some(Lookahead {
        from,
        depth: depth.parse().ok().filter(|&d| d > 0)?,
    })
}

/// `off`, or `attn-1` / `output-2`: the profile's spelling of a lookahead.
pub fn lookahead_name(l: Option<Lookahead>) -> String {
    l.map_or("off".into(), |l| format!("{}-{}", l.from.name(), l.depth))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(mode: &str, pipeline: bool, prefetch: &str) -> TunedProfile {
        TunedProfile {
            version: 1,
            device: "vda".into(),
            model: "m".into(),
            read_mode: mode.into(),
            pipeline,
            prefetch: prefetch.into(),
            ram_gb: None,
            disk: Vec::new(),
            probes: Vec::new(),
        }
    }

    /// A request of these three settings, budgeted or not.
    fn asked(
        read_mode: Choice<ReadMode>,
        pipeline: Choice<bool>,
        prefetch: Choice<Option<Lookahead>>,
        budgeted: bool,
    ) -> Requested {
        let mut r = Requested::default();
        r.io.read_mode = read_mode;
        r.store.pipeline = pipeline;
        r.store.prefetch = prefetch;
        r.store.ram_budget = budgeted.then_some(1 << 30);
        r
    }

    fn auto() -> Requested {
        asked(Choice::Auto, Choice::Auto, Choice::Auto, false)
    }

    /// (read mode, pipeline, prefetch) of a resolved configuration.
    fn tuned(r: &RuntimeConfig) -> (ReadMode, bool, Option<Lookahead>) {
        (
            r.io.read_mode,
            r.store.schedule.pipeline,
            r.store.schedule.lookahead,
        )
    }

    #[test]
    fn asked_beats_profile_beats_defaults() {
        let attn2 = parse_lookahead("attn-2");
        let p = profile("mmap", false, "attn-2");
        let set = asked(
            Choice::Set(ReadMode::Pread),
            Choice::Set(true),
            Choice::Set(None),
            true,
        );
        let budgeted = asked(Choice::Auto, Choice::Auto, Choice::Auto, true);
        let auto = auto();
        // (asked, profile) -> (mode, pipeline, prefetch)
        let table = [
            (&auto, None, (ReadMode::Buffered, true, None)),
            (&budgeted, None, (ReadMode::Direct, true, None)),
            (&auto, Some(&p), (ReadMode::Mmap, false, attn2)),
            (&budgeted, Some(&p), (ReadMode::Mmap, false, attn2)),
            (&set, Some(&p), (ReadMode::Pread, true, None)),
            (&set, None, (ReadMode::Pread, true, None)),
        ];
        for (i, (req, prof, (mode, pipeline, prefetch))) in table.into_iter().enumerate() {
            let r = resolve(req, prof);
            assert_eq!(tuned(&r), (mode, pipeline, prefetch), "row {i}");
            assert!(r.not_understood.is_empty());
        }
    }

    #[test]
    fn profile_values_not_understood_give_way_to_the_defaults_by_name() {
        let p = profile("bogus", true, "sideways-9");
        let r = resolve(&auto(), Some(&p));
        assert_eq!(
            (r.io.read_mode, r.store.schedule.lookahead),
            (ReadMode::Buffered, None)
        );
        assert_eq!(
            r.not_understood,
            ["read_mode `bogus`", "prefetch `sideways-9`"]
        );
        // A profile is not consulted when nothing is left to it.
        let set = asked(
            Choice::Set(ReadMode::Direct),
            Choice::Set(false),
            Choice::Set(None),
            false,
        );
        assert!(resolve(&set, Some(&p)).not_understood.is_empty());
    }

    /// Every setting asked for reaches loading: none is ignored, none is
    /// replaced by another.
    #[test]
    fn every_requested_setting_reaches_the_load_options() {
        let mut req = auto();
        req.model = ModelSettings {
            mla: MlaMode::Explicit,
            dsa: DsaMode::Off,
            quantize_at_load: Some(Policy::default()),
            context: 123,
        };
        let lookahead = parse_lookahead("output-3");
        req.store = StoreRequest {
            expert_cache: 7,
            ram_budget: Some(5_000_000_000),
            policy: EvictPolicy::Lru,
            pin_history: false,
            pipeline: Choice::Set(false),
            prefetch: Choice::Set(lookahead),
            prefetch_experts: Some(9),
            recall: true,
            cache_lean: Some(0.5),
            predictor: None,
            input_bytes: 77,
        };
        req.io = IoRequest {
            read_mode: Choice::Set(ReadMode::Mmap),
            reactor: false,
        };
        req.generation.max_tokens = 11;
        let c = resolve(&req, None);
        assert_eq!(c.generation.max_tokens, 11);
        let o = c.load_options(Progress::default());
        assert_eq!(
            (o.mla, o.dsa, o.context),
            (MlaMode::Explicit, DsaMode::Off, 123)
        );
        assert!(o.quantize_at_load.is_some());
        assert_eq!((o.expert_cache, o.ram_budget), (7, Some(5_000_000_000)));
        assert_eq!((o.policy, o.pin_history), (EvictPolicy::Lru, false));
        assert_eq!(o.input_bytes, 77);
        assert_eq!((o.read_mode, o.io_reactor), (ReadMode::Mmap, false));
        let want = ScheduleOptions {
            pipeline: false,
            lookahead,
            prefetch_experts: Some(9),
            recall: true,
            cache_lean: Some(0.5),
        };
        assert_eq!(o.schedule, want);
        // The store's bound comes from the asked count, not a sentinel.
        assert_eq!(o.schedule.schedule(8, false).prefetch_experts_max, 9);
    }

    #[test]
    fn lookahead_names_round_trip() {
        for s in ["attn-1", "output-4"] {
            assert_eq!(lookahead_name(parse_lookahead(s)), s);
        }
        assert_eq!(lookahead_name(None), "off");
        for bad in ["off", "attn-0", "attn", "x-1", "output-x"] {
            assert_eq!(parse_lookahead(bad), None, "{bad}");
        }
    }
}
