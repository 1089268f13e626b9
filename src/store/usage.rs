//! Expert usage counters, the input of tiering and pinning: for every
//! (layer, expert), the lifetime selection count, a decaying heat, and the
//! clock of its last use. Every router selection updates them; heats halve
//! every `decay_interval` clock ticks (one tick per forwarded token).
//!
//! The table persists in the model directory ([`HISTORY_FILE`], JSON,
//! written to a temp file and renamed) so the next process can pin the
//! experts this model actually uses.

use crate::error::{Error, Result};
use std::path::Path;

/// The usage history's file name in the model directory.
pub const HISTORY_FILE: &str = "moestream-usage.json";

/// Usage of one expert.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Usage {
    /// Selections over the process lifetime.
    pub count: u64,
    /// Selections, halved every decay pass.
    pub heat: u32,
    /// Clock value at the last selection.
    pub last_use: u64,
}

/// The saved form of a [`UsageTable`].
#[derive(serde::Serialize, serde::Deserialize)]
struct Saved {
    version: u32,
    /// Tokens forwarded over every run that contributed.
    clock: u64,
    /// `[layer][expert]` as `[count, heat, last_use]`.
    layers: Vec<Vec<[u64; 3]>>,
}

/// Usage of every expert of every layer.
pub struct UsageTable {
    table: Vec<Vec<Usage>>,
    clock: u64,
    decay_interval: u64,
}

impl UsageTable {
    /// A table for `experts[l]` experts in layer `l`, decaying every
    /// `decay_interval` ticks (> 0).
    pub fn new(experts: &[usize], decay_interval: u64) -> UsageTable {
        assert!(decay_interval > 0, "decay interval must be positive");
        UsageTable {
            table: experts.iter().map(|&n| vec![Usage::default(); n]).collect(),
            clock: 0,
            decay_interval,
        }
    }

    /// Records that `experts` of `layer` were selected now.
    pub fn record(&mut self, layer: usize, experts: &[usize]) {
        for &e in experts {
            let u = &mut self.table[layer][e];
            u.count += 1;
            u.heat = u.heat.saturating_add(1);
            u.last_use = self.clock;
        }
    }

    /// Advances the clock by `tokens`, halving every heat at each multiple of
    /// the decay interval crossed.
    pub fn tick(&mut self, tokens: u64) {
        let before = self.clock / self.decay_interval;
        self.clock += tokens;
        let passes = self.clock / self.decay_interval - before;
        if passes > 0 {
            for u in self.table.iter_mut().flatten() {
                u.heat = u.heat.checked_shr(passes.min(32) as u32).unwrap_or(0);
            }
        }
    }

    /// The usage of one expert.
    pub fn get(&self, layer: usize, expert: usize) -> Usage {
        self.table[layer][expert]
    }

    /// The current clock.
    pub fn clock(&self) -> u64 {
        self.clock
    }

    /// Usage of every expert of `layer`.
    pub fn layer(&self, layer: usize) -> &[Usage] {
        &self.table[layer]
    }

    /// Writes the table to `path` (temp file + rename).
    pub fn save(&self, path: &Path) -> Result<()> {
        let saved = Saved {
            version: 1,
            clock: self.clock,
            layers: self
                .table
                .iter()
                .map(|l| {
                    l.iter()
                        .map(|u| [u.count, u.heat as u64, u.last_use])
                        .collect()
                })
                .collect(),
        };
        let bytes = serde_json::to_vec(&saved).expect("usage serializes");
        crate::convert::writer::write_atomic(path, &bytes)
    }

    /// Loads a saved table into this one; the saved geometry must match.
    /// Returns the tokens of history loaded.
    pub fn load(&mut self, path: &Path) -> Result<u64> {
        let text = crate::config::read_capped(path)?;
        let saved: Saved = serde_json::from_str(&text)
            .map_err(|e| Error::config(path, "(file)", format!("not a usage history: {e}")))?;
        let shape: Vec<usize> = saved.layers.iter().map(Vec::len).collect();
        let want: Vec<usize> = self.table.iter().map(Vec::len).collect();
        if saved.version != 1 || shape != want {
            return Err(Error::config(
                path,
                "layers",
                "the history was recorded for a different model geometry",
            ));
        }
        for (dst, src) in self.table.iter_mut().zip(&saved.layers) {
            for (u, &[count, heat, last_use]) in dst.iter_mut().zip(src) {
                *u = Usage {
                    count,
                    heat: heat.min(u32::MAX as u64) as u32,
                    last_use: last_use.min(saved.clock),
                };
            }
        }
        self.clock = saved.clock;
        Ok(saved.clock)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selections_count_heat_and_stamp_the_clock() {
        let mut t = UsageTable::new(&[0, 4], 10);
        t.record(1, &[2, 3]);
        t.tick(3);
        t.record(1, &[2]);
        assert_eq!(
            t.get(1, 2),
            Usage {
                count: 2,
                heat: 2,
                last_use: 3
            }
        );
        assert_eq!(
            t.get(1, 3),
            Usage {
                count: 1,
                heat: 1,
                last_use: 0
            }
        );
        assert_eq!(t.get(1, 0), Usage::default());
    }

    #[test]
    fn the_history_round_trips_and_refuses_another_geometry() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(HISTORY_FILE);
        let mut t = UsageTable::new(&[0, 3], 4);
        t.record(1, &[0, 2]);
        t.tick(5);
        t.record(1, &[2]);
        t.save(&p).unwrap();
        let mut back = UsageTable::new(&[0, 3], 4);
        assert_eq!(back.load(&p).unwrap(), 5);
        for e in 0..3 {
            assert_eq!(back.get(1, e), t.get(1, e));
        }
        assert_eq!(back.clock(), 5);
        let mut other = UsageTable::new(&[0, 4], 4);
        assert!(other.load(&p).unwrap_err().to_string().contains("geometry"));
        std::fs::write(&p, b"{").unwrap();
        assert!(back.load(&p).is_err());
    }

    #[test]
    fn heat_halves_per_decay_pass_but_count_stays() {
        let mut t = UsageTable::new(&[2], 4);
        for _ in 0..8 {
            t.record(0, &[1]);
        }
        t.tick(4);
        assert_eq!(t.get(0, 1).heat, 4);
        t.tick(8);
        assert_eq!(t.get(0, 1).heat, 1);
        assert_eq!(t.get(0, 1).count, 8);
    }
}
