//! LFRU, the default: frequency first (the decaying heat of the usage
//! table), token recency only breaks ties. The score is
//! `(heat << 8) | recent` with `recent = 255 − min(age, 255)`; the lowest
//! score goes.

use super::{lowest, Evictor, Slot, View};
use crate::store::usage::Usage;

/// The LFRU score of an expert with `u` at usage clock `now`.
pub fn lfru_score(u: Usage, now: u64) -> u64 {
    let age = now.saturating_sub(u.last_use).min(255);
    ((u.heat as u64) << 8) | (255 - age)
}

/// Frequency first (decaying heat), recency breaks ties.
#[derive(Clone, Copy, Debug, Default)]
pub struct Lfru;

impl Evictor for Lfru {
    fn name(&self) -> &'static str {
        "lfru"
    }

    fn victim(&self, _incoming: usize, slots: &[Slot], view: View) -> Option<usize> {
        lowest(slots, |s| lfru_score(view.of(s.key), view.now))
    }

    fn clone_box(&self) -> Box<dyn Evictor> {
        Box::new(*self)
    }
}

#[cfg(test)]
mod tests {
    use super::super::table::{check, run, Case};
    use super::*;

    fn u(heat: u32, count: u64, last_use: u64) -> Usage {
        Usage {
            count,
            heat,
            last_use,
        }
    }

    #[test]
    fn lfru_ranks_frequency_first_and_recency_second() {
        let now = 1000;
        // (usage, expected score)
        let table = [
            (u(0, 0, 0), 0),                 // never used, ancient
            (u(0, 5, 1000), 255),            // cold but just used
            (u(1, 1, 0), 256),               // heat 1 beats any recency
            (u(1, 1, 990), 256 + 245),       // age 10
            (u(3, 9, 1000), (3 << 8) | 255), // hot and fresh
            (u(2, 9, 1200), (2 << 8) | 255), // a future stamp counts as age 0
        ];
        for (usage, want) in table {
            assert_eq!(lfru_score(usage, now), want, "{usage:?}");
        }
        assert!(lfru_score(u(1, 1, 0), now) > lfru_score(u(0, 9, now), now));
    }

    #[test]
    fn keeps_the_frequent_expert_through_a_scan() {
        // (slots, steps, misses, held at the end)
        let table: [Case; 3] = [
            // 1 is hot; 2..5 pass through once: LFRU keeps 1, LRU would not.
            (2, &[&[1], &[1], &[1], &[2], &[3], &[4], &[1]], 4, &[1, 4]),
            // Equal heat: the least recent goes.
            (2, &[&[1], &[2], &[3], &[2]], 3, &[2, 3]),
            // One slot: the step's second miss replaces its first.
            (1, &[&[1, 2], &[2]], 2, &[2]),
        ];
        check("lfru", &table);
        let (lru, _) = run("lru", 2, &[&[1], &[1], &[1], &[2], &[3], &[4], &[1]]);
        assert_eq!(lru, 5);
    }
}
