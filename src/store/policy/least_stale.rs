//! Least-Stale, after SpecMD (2026): MoE expert reuse is not the temporal
//! locality LRU assumes, but a token's experts are predictable from how
//! recently, in tokens, the layer chose them. An expert's staleness is the
//! number of tokens since the layer last selected it (the usage table's
//! `last_use`, a token clock, where LRU's clock counts lookups); the
//! stalest goes, the least heated of equally stale ones first, then the
//! least recently touched. This is our per-layer reading of the paper's
//! policy (its cache spans layers).

use super::{lowest, Evictor, Slot, View};

/// The expert chosen the most tokens ago goes.
#[derive(Clone, Copy, Debug, Default)]
pub struct LeastStale;

impl Evictor for LeastStale {
    fn name(&self) -> &'static str {
        "least-stale"
    }

    fn victim(&self, _incoming: usize, slots: &[Slot], view: View) -> Option<usize> {
        lowest(slots, |s| {
            let u = view.of(s.key);
            (u.last_use, u.heat, s.last)
        })
    }

    fn clone_box(&self) -> Box<dyn Evictor> {
        Box::new(*self)
    }
}

#[cfg(test)]
mod tests {
    use super::super::table::{check, run, Case};

    #[test]
    fn evicts_the_stalest_then_the_coldest() {
        // (slots, steps, misses, held at the end)
        let table: [Case; 3] = [
            // A step's experts are equally fresh: 1 and 2 chosen together,
            // 2 again later, so 1 goes when 3 comes.
            (2, &[&[1, 2], &[2], &[3], &[2]], 3, &[2, 3]),
            // Same token, same staleness: the colder (1, heat 1) goes before
            // 2 (heat 2), whatever the lookup order; LRU would evict 2.
            (2, &[&[2], &[1, 2], &[3], &[2]], 3, &[2, 3]),
            (1, &[&[4], &[5], &[4]], 3, &[4]),
        ];
        check("least-stale", &table);
        // LRU on the second sequence: in step 1, 1's insertion comes after
        // 2's lookup, so 2 is the least recent, goes, and misses again.
        assert_eq!(run("lru", 2, &[&[2], &[1, 2], &[3], &[2]]).0, 4);
    }
}
