//! How a run reads and schedules experts, resolved once: what was asked
//! for explicitly wins, then the tuned profile of this disk and model
//! (`moestream tune`), then the defaults. A setting left to the profile is
//! [`Choice::Auto`], never a sentinel value. Pure: the profile is passed
//! in, so the rules are table-tested here; the command line only maps its
//! flags onto [`Requested`].

use crate::fs::tuned::TunedProfile;
use crate::store::{Lookahead, Variant};
use moestream_io::ReadMode;

/// A setting asked for explicitly, or left to the profile and defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice<T> {
    Auto,
    Set(T),
}

/// What a run asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Requested {
    pub read_mode: Choice<ReadMode>,
    pub pipeline: Choice<bool>,
    /// Router-lookahead prefetch: `Set(None)` is off.
    pub prefetch: Choice<Option<Lookahead>>,
    /// A RAM budget was given (the default read mode is then O_DIRECT).
    pub budgeted: bool,
}

impl Requested {
    /// Whether some setting is left to the profile.
    pub fn wants_profile(&self) -> bool {
        self.read_mode == Choice::Auto
            || self.pipeline == Choice::Auto
            || self.prefetch == Choice::Auto
    }
}

/// The settings a run uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub read_mode: ReadMode,
    pub pipeline: bool,
    pub prefetch: Option<Lookahead>,
    /// Profile values that were not understood and gave way to the
    /// defaults, as `name `value``.
    pub not_understood: Vec<String>,
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

/// Prefetch without a profile: the router lookahead from the attention
/// state, one MoE layer ahead, under a RAM budget (a run that streams
/// experts from disk), and none otherwise. Measured cold at 3 GB on Qwen3
/// shapes (results/prefetch-budget.md): +18% decode tok/s with near-uniform
/// routing at the same bytes, +8% with realistic routing (lookahead recall
/// 0.70) at 16% more bytes read; depth 2 lost to depth 1 there. The cache
/// makes the same decisions either way, so tokens do not change.
pub fn default_prefetch(budgeted: bool) -> Option<Lookahead> {
    budgeted.then_some(Lookahead {
        from: Variant::Attn,
        depth: 1,
    })
}

/// Resolves `req` against `profile` (when some setting is `Auto`) and the
/// defaults.
pub fn resolve(req: &Requested, profile: Option<&TunedProfile>) -> Resolved {
    let mut r = Resolved {
        read_mode: default_read_mode(req.budgeted),
        pipeline: DEFAULT_PIPELINE,
        prefetch: default_prefetch(req.budgeted),
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
    if let Choice::Set(m) = req.read_mode {
        r.read_mode = m;
    }
    if let Choice::Set(p) = req.pipeline {
        r.pipeline = p;
    }
    if let Choice::Set(l) = req.prefetch {
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

    const AUTO: Requested = Requested {
        read_mode: Choice::Auto,
        pipeline: Choice::Auto,
        prefetch: Choice::Auto,
        budgeted: false,
    };

    #[test]
    fn asked_beats_profile_beats_defaults() {
        let attn2 = parse_lookahead("attn-2");
        let attn1 = parse_lookahead("attn-1");
        let p = profile("mmap", false, "attn-2");
        let set = Requested {
            read_mode: Choice::Set(ReadMode::Pread),
            pipeline: Choice::Set(true),
            prefetch: Choice::Set(None),
            budgeted: true,
        };
        let budgeted = Requested {
            budgeted: true,
            ..AUTO
        };
        // (asked, profile) -> (mode, pipeline, prefetch)
        let table = [
            (AUTO, None, (ReadMode::Buffered, true, None)),
            (budgeted, None, (ReadMode::Direct, true, attn1)),
            (AUTO, Some(&p), (ReadMode::Mmap, false, attn2)),
            (budgeted, Some(&p), (ReadMode::Mmap, false, attn2)),
            (set, Some(&p), (ReadMode::Pread, true, None)),
            (set, None, (ReadMode::Pread, true, None)),
        ];
        for (i, (req, prof, (mode, pipeline, prefetch))) in table.into_iter().enumerate() {
            let r = resolve(&req, prof);
            assert_eq!(
                (r.read_mode, r.pipeline, r.prefetch),
                (mode, pipeline, prefetch),
                "row {i}"
            );
            assert!(r.not_understood.is_empty());
        }
    }

    #[test]
    fn profile_values_not_understood_give_way_to_the_defaults_by_name() {
        let p = profile("bogus", true, "sideways-9");
        let r = resolve(&AUTO, Some(&p));
        assert_eq!((r.read_mode, r.prefetch), (ReadMode::Buffered, None));
        assert_eq!(
            r.not_understood,
            ["read_mode `bogus`", "prefetch `sideways-9`"]
        );
        // A profile is not consulted when nothing is left to it.
        let set = Requested {
            read_mode: Choice::Set(ReadMode::Direct),
            pipeline: Choice::Set(false),
            prefetch: Choice::Set(None),
            budgeted: false,
        };
        assert!(resolve(&set, Some(&p)).not_understood.is_empty());
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
