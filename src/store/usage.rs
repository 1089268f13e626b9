//! Expert usage counters, the input of tiering and pinning: for every
//! (layer, expert), the lifetime selection count, a decaying heat, and the
//! clock of its last use. Every router selection updates them; heats halve
//! every `decay_interval` clock ticks (one tick per forwarded token).

/// Usage of one expert.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Selections over the process lifetime.
    pub count: u64,
    /// Selections, halved every decay pass.
    pub heat: u32,
    /// Clock value at the last selection.
    pub last_use: u64,
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
