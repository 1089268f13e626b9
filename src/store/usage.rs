//! Expert usage counters, the input of tiering and pinning: for every
//! (layer, expert), the lifetime selection count, a decaying heat, and the
//! clock of its last use. Every router selection updates them; heats halve
//! every `decay_interval` clock ticks (one tick per forwarded token).
//!
//! The table persists as JSON in the model's state directory under the
//! cache directory (`crate::fs::state`, never the model directory, which may be
//! read-only or shared) so the next process can pin the experts this model
//! actually uses. Processes sharing a model merge rather than overwrite:
//! [`UsageTable::save`] takes an advisory lock, adds this run's selections
//! (what it recorded since it loaded the history) to whatever the file
//! holds now, and writes through a temp file unique to the process.

use crate::error::{Error, Result};
use crate::fs::lock::Lock;
use std::path::{Path, PathBuf};

/// The usage history's file name in a model's state directory.
pub const HISTORY_FILE: &str = "usage.json";

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
    /// The table and clock as loaded (zeros if nothing was), so a save adds
    /// only what this process recorded.
    baseline: (Vec<Vec<Usage>>, u64),
}

impl UsageTable {
    /// A table for `experts[l]` experts in layer `l`, decaying every
    /// `decay_interval` ticks (> 0).
    pub fn new(experts: &[usize], decay_interval: u64) -> UsageTable {
        assert!(decay_interval > 0, "decay interval must be positive");
        let table: Vec<Vec<Usage>> = experts.iter().map(|&n| vec![Usage::default(); n]).collect();
        UsageTable {
            baseline: (table.clone(), 0),
            table,
            clock: 0,
            decay_interval,
        }
    }

    /// Records that `experts` of `layer` were selected now.
    pub fn record(&mut self, layer: usize, experts: &[usize]) {
        record(&mut self.table[layer], experts, self.clock);
    }

    /// Advances the clock by `tokens`, halving every heat at each multiple of
    /// the decay interval crossed.
    pub fn tick(&mut self, tokens: u64) {
        let passes = decay_passes(self.clock, tokens, self.decay_interval);
        self.clock += tokens;
        for layer in &mut self.table {
            decay(layer, passes);
        }
    }

    /// Replaces the usage of `layer` (a store keeps each layer's usage
    /// beside its cache and copies it here to save).
    pub fn set_layer(&mut self, layer: usize, usage: &[Usage]) {
        self.table[layer].copy_from_slice(usage);
    }

    /// Sets the clock (see [`UsageTable::set_layer`]).
    pub fn set_clock(&mut self, clock: u64) {
        self.clock = clock;
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

    /// Merges this process's selections into the history at `path`:
    /// under an exclusive advisory lock (`path` + `.lock`), what the file
    /// holds now (if it has this geometry) plus what this table recorded
    /// since its baseline, written through a unique temp file and a rename.
    /// Counts and the clock add up exactly; heats add this run's gain;
    /// a last use moves to this run's if it used the expert.
    pub fn save(&mut self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| Error::file(dir, e))?;
        }
        let _lock = Lock::exclusive(&lock_path(path))?;
        if let (Some(dir), Some(name)) = (path.parent(), path.file_name()) {
            crate::fs::remove_stale(dir, &format!("{}.tmp-", name.to_string_lossy()));
        }
        let mut merged = UsageTable::new(
            &self.table.iter().map(Vec::len).collect::<Vec<_>>(),
            self.decay_interval,
        );
        if path.exists() && merged.load(path).is_err() {
            // Another geometry or a damaged file: this run's table replaces it.
            merged = UsageTable::new(
                &self.table.iter().map(Vec::len).collect::<Vec<_>>(),
                self.decay_interval,
            );
        }
        let now = merged.clock;
        let (base, base_clock) = &self.baseline;
        for ((dst, ours), base) in merged.table.iter_mut().zip(&self.table).zip(base) {
            for ((d, o), b) in dst.iter_mut().zip(ours).zip(base) {
                let used = o.count.saturating_sub(b.count);
                d.count = d.count.saturating_add(used);
                d.heat = d.heat.saturating_add(o.heat.saturating_sub(b.heat));
                if used > 0 {
                    d.last_use = now + o.last_use.saturating_sub(*base_clock);
                }
            }
        }
        merged.clock = now.saturating_add(self.clock.saturating_sub(*base_clock));
        merged.write(path)?;
        // What is on disk now is this table's new baseline.
        self.baseline = (self.table.clone(), self.clock);
        Ok(())
    }

    /// Writes the table to `path` (unique temp file + rename).
    fn write(&self, path: &Path) -> Result<()> {
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
        crate::fs::write(path, &bytes)
    }

    /// Loads a saved table into this one; the saved geometry must match.
    /// Returns the tokens of history loaded.
    pub fn load(&mut self, path: &Path) -> Result<u64> {
        let text = crate::fs::read_to_string(path, crate::fs::read::JSON_SIDE_FILE)?;
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
        self.baseline = (self.table.clone(), self.clock);
        Ok(saved.clock)
    }
}

/// Records that `experts` of one layer were selected at `clock`.
pub fn record(layer: &mut [Usage], experts: &[usize], clock: u64) {
    for &e in experts {
        let u = &mut layer[e];
        u.count += 1;
        u.heat = u.heat.saturating_add(1);
        u.last_use = clock;
    }
}

/// Decay passes crossed when the clock advances from `clock` by `tokens`
/// (heats halve at every multiple of `interval`).
pub fn decay_passes(clock: u64, tokens: u64, interval: u64) -> u64 {
    (clock + tokens) / interval - clock / interval
}

/// Halves every heat of one layer `passes` times.
pub fn decay(layer: &mut [Usage], passes: u64) {
    if passes > 0 {
        for u in layer {
            u.heat = u.heat.checked_shr(passes.min(32) as u32).unwrap_or(0);
        }
    }
}

pub(crate) fn lock_path(path: &Path) -> std::path::PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".lock");
    s.into()
}

/// The usage history of the model in `dir`.
pub fn history_path(dir: &Path) -> Result<PathBuf> {
    Ok(crate::fs::state::model_state_dir(dir)?.join(HISTORY_FILE))
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
    fn concurrent_saves_merge_every_run() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state").join(HISTORY_FILE);
        let runs = 12;
        std::thread::scope(|s| {
            for r in 0..runs {
                let p = p.clone();
                s.spawn(move || {
                    let mut t = UsageTable::new(&[2, 3], 4);
                    for _ in 0..=r {
                        t.record(1, &[r % 3]);
                    }
                    t.tick(10);
                    t.save(&p).unwrap();
                });
            }
        });
        let mut back = UsageTable::new(&[2, 3], 4);
        assert_eq!(back.load(&p).unwrap(), 10 * runs as u64);
        let total: u64 = (0..3).map(|e| back.get(1, e).count).sum();
        assert_eq!(total, (1..=runs as u64).sum::<u64>());
        // A loaded table saves only what it recorded since.
        back.record(0, &[1]);
        back.save(&p).unwrap();
        back.save(&p).unwrap();
        let mut again = UsageTable::new(&[2, 3], 4);
        again.load(&p).unwrap();
        assert_eq!(again.get(0, 1).count, 1);
        let leftovers: Vec<_> = std::fs::read_dir(p.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .filter(|n| n.contains("tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
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
