//! What a replay simulates besides eviction: how misses are read
//! ([`Prefetch`]) and what each layer pins from a usage history ([`Pin`]),
//! with the spellings `moestream replay --prefetch` and `--pin` take.
//! Every spelling parses back to the value it names.

use crate::store::policy;

/// How misses reach the cache in the simulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prefetch {
    /// Every miss is a demand read.
    None,
    /// The run's lookahead guesses from variant `from` (0 = attn, 1 =
    /// output) are read ahead, from up to `depth` (1 or 2) layers before.
    Lookahead { from: usize, depth: usize },
    /// Exactly the misses are read ahead (the best any prefetch can do).
    Oracle,
}

impl Prefetch {
    /// The attn guess one layer ahead, as `--prefetch on` reads it.
    pub const ATTN: Prefetch = Prefetch::Lookahead { from: 0, depth: 1 };

    /// The spellings [`Prefetch::parse`] takes, for error messages.
    pub const SPELLINGS: &'static str =
        "none, lookahead, lookahead:attn, lookahead:output (either with :1 or :2, the depth) or oracle";

    /// `none`, `lookahead` (= `lookahead:attn`), `lookahead:output`, either
    /// with `:1` or `:2` for the depth (`lookahead:attn:2`), or `oracle`.
    pub fn parse(s: &str) -> Option<Prefetch> {
        let mut parts = s.split(':');
        match (parts.next()?, parts.next(), parts.next(), parts.next()) {
            ("none", None, ..) => Some(Prefetch::None),
            ("oracle", None, ..) => Some(Prefetch::Oracle),
            ("lookahead", from, depth, None) => {
                let from = match from {
                    None | Some("attn") => 0,
                    Some("output") => 1,
                    _ => return None,
                };
                let depth = match depth {
                    None | Some("1") => 1,
                    Some("2") => 2,
                    _ => return None,
                };
                Some(Prefetch::Lookahead { from, depth })
            }
            _ => None,
        }
    }

    pub fn name(self) -> String {
        match self {
            Prefetch::None => "none".into(),
            Prefetch::Lookahead { from: 0, depth: 1 } => "lookahead".into(),
            Prefetch::Lookahead { from, depth } => {
                let v = if from == 0 { "attn" } else { "output" };
                match depth {
                    1 => format!("lookahead:{v}"),
                    d => format!("lookahead:{v}:{d}"),
                }
            }
            Prefetch::Oracle => "oracle".into(),
        }
    }
}

/// 100% in the hundredths of a percent [`Pin::Share`] counts.
pub const SHARE_ALL: u32 = 10_000;

/// What each layer pins, and so whether a run's first half is its history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pin {
    /// No history: every run replayed whole from empty caches.
    None,
    /// The first half of each run is the history, the second half is
    /// replayed; this many experts pinned per layer (at most half the
    /// slots, as the cache allows; 0 pins nothing).
    Count(usize),
    /// The same, pinning this share of the slots, in hundredths of a
    /// percent (`2550` is 25.5%), rounded down to a whole expert.
    Share(u32),
    /// The same, pinning as many as the store would from a history of that
    /// length ([`policy::pin_count`]).
    History,
}

impl Pin {
    /// The spellings [`Pin::parse`] takes, for error messages.
    pub const SPELLINGS: &'static str =
        "none, history, a count of experts (2) or a share of the slots from 0% to 100% (25%, 12.5%)";

    /// `none`, `history`, a count (`2`) or a share of the slots from `0%`
    /// to `100%` with at most two decimals (`25%`, `12.5%`).
    pub fn parse(s: &str) -> Option<Pin> {
        match s {
            "none" => Some(Pin::None),
            "history" => Some(Pin::History),
            _ => match s.strip_suffix('%') {
                Some(p) => hundredths(p).filter(|&h| h <= SHARE_ALL).map(Pin::Share),
                None if digits(s) => s.parse().ok().map(Pin::Count),
                None => None,
            },
        }
    }

    pub fn name(self) -> String {
        match self {
            Pin::None => "none".into(),
            Pin::Count(n) => n.to_string(),
            Pin::Share(h) if h % 100 == 0 => format!("{}%", h / 100),
            Pin::Share(h) => {
                let frac = format!("{:02}", h % 100);
                format!("{}.{}%", h / 100, frac.trim_end_matches('0'))
            }
            Pin::History => "history".into(),
        }
    }

    /// Experts to pin in a layer of `slots` slots, `experts` experts chosen
    /// `top_k` per token, after a history of `tokens` tokens: a share is
    /// rounded down (25% of 6 slots pins 1), and at most half the slots
    /// are pinned.
    pub fn count(self, slots: usize, tokens: u64, top_k: usize, experts: usize) -> usize {
        let n = match self {
            Pin::None => 0,
            Pin::Count(n) => n,
            // Exact: 29% of 100 slots is 29, not 28.999….
            Pin::Share(h) => (slots as u128 * u128::from(h) / u128::from(SHARE_ALL)) as usize,
            Pin::History => policy::pin_count(slots, tokens, top_k, experts),
        };
        n.min(slots / 2)
    }
}

/// Whether `s` is one or more ASCII digits (no sign, no spaces).
fn digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// `12`, `12.5` or `12.25` in hundredths (1200, 1250, 1225); `None` for
/// anything else (a sign, three decimals, an empty part).
fn hundredths(s: &str) -> Option<u32> {
    let (whole, frac) = s.split_once('.').unwrap_or((s, "00"));
    if !digits(whole) || !digits(frac) || frac.len() > 2 || whole.len() > 3 {
        return None;
    }
    let whole: u32 = whole.parse().ok()?;
    let frac: u32 = format!("{frac:0<2}").parse().ok()?;
    Some(whole * 100 + frac)
}

/// What one simulation does besides evicting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setup {
    pub prefetch: Prefetch,
    pub pin: Pin,
}

impl Setup {
    /// `prefetch`, no pins, no history.
    pub fn prefetch(prefetch: Prefetch) -> Setup {
        Setup {
            prefetch,
            pin: Pin::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefetch_and_pin_settings_parse_and_name_themselves() {
        let table = [
            ("none", Some(Prefetch::None), "none"),
            ("oracle", Some(Prefetch::Oracle), "oracle"),
            ("lookahead", Some(Prefetch::ATTN), "lookahead"),
            ("lookahead:attn", Some(Prefetch::ATTN), "lookahead"),
            ("lookahead:attn:1", Some(Prefetch::ATTN), "lookahead"),
            (
                "lookahead:output",
                Some(Prefetch::Lookahead { from: 1, depth: 1 }),
                "lookahead:output",
            ),
            (
                "lookahead:attn:2",
                Some(Prefetch::Lookahead { from: 0, depth: 2 }),
                "lookahead:attn:2",
            ),
            (
                "lookahead:output:2",
                Some(Prefetch::Lookahead { from: 1, depth: 2 }),
                "lookahead:output:2",
            ),
            ("lookahead:attn:3", None, ""),
            ("lookahead:attn:0", None, ""),
            ("lookahead:output:0", None, ""),
            ("lookahead:2", None, ""),
            ("lookahead:input", None, ""),
            ("lookahead:attn:2:x", None, ""),
            ("none:2", None, ""),
        ];
        for (s, want, name) in table {
            assert_eq!(Prefetch::parse(s), want, "{s}");
            if let Some(p) = want {
                assert_eq!(p.name(), name);
                assert_eq!(Prefetch::parse(&p.name()), want, "{s} round trip");
            }
        }
        // (spelling, pin, experts pinned of 16 slots: 256 tokens of top-4 of 32)
        let table = [
            ("none", Some(Pin::None), 0),
            ("0", Some(Pin::Count(0)), 0),
            ("3", Some(Pin::Count(3)), 3),
            ("20", Some(Pin::Count(20)), 8), // at most half the slots
            ("25%", Some(Pin::Share(25_00)), 4),
            ("29%", Some(Pin::Share(29_00)), 4), // 4.64 rounded down
            ("12.5%", Some(Pin::Share(12_50)), 2),
            ("6.25%", Some(Pin::Share(6_25)), 1),
            ("0%", Some(Pin::Share(0)), 0),
            ("100%", Some(Pin::Share(SHARE_ALL)), 8),
            ("history", Some(Pin::History), 8 * 32 / 40), // 8 · s / (s + 8), s = 32
            ("101%", None, 0),
            ("120%", None, 0),
            ("100.01%", None, 0),
            ("-5%", None, 0),
            ("+5%", None, 0),
            ("1.125%", None, 0),
            (".5%", None, 0),
            ("5.%", None, 0),
            ("nan%", None, 0),
            ("%", None, 0),
            ("+3", None, 0),
            ("", None, 0),
            ("-1", None, 0),
            ("half", None, 0),
        ];
        for (s, want, pins) in table {
            assert_eq!(Pin::parse(s), want, "{s}");
            if let Some(p) = want {
                assert_eq!(p.count(16, 256, 4, 32), pins, "{s}");
                assert_eq!(Pin::parse(&p.name()), want, "{s} round trip");
            }
        }
    }

    /// A share pins `floor(share · slots)` exactly, where a float product
    /// would land just below a whole number (29% of 100 is 28.999…).
    #[test]
    fn a_share_rounds_down_exactly() {
        for slots in 0..=200usize {
            for h in (0..=SHARE_ALL).step_by(25) {
                let want = (slots * h as usize / SHARE_ALL as usize).min(slots / 2);
                assert_eq!(Pin::Share(h).count(slots, 0, 1, 1), want, "{h} of {slots}");
            }
        }
        let cases = [
            (29_00, 100, 29),
            (7_00, 100, 7),
            (33_33, 300, 99),
            (50_00, 7, 3),
        ];
        for (h, slots, want) in cases {
            assert_eq!(Pin::Share(h).count(slots, 0, 1, 1), want, "{h} of {slots}");
        }
    }
}
