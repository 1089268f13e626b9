//! LRU: the least recently looked-up or inserted expert goes (the cache's
//! own clock, so of one step's experts the lowest-numbered was touched
//! first).

use super::{lowest, Evictor, Slot, View};

/// Least recently used.
#[derive(Clone, Copy, Debug, Default)]
pub struct Lru;

impl Evictor for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }

    fn victim(&self, _incoming: usize, slots: &[Slot], _view: View) -> Option<usize> {
        lowest(slots, |s| s.last)
    }

    fn clone_box(&self) -> Box<dyn Evictor> {
        Box::new(*self)
    }
}

#[cfg(test)]
mod tests {
    use super::super::table::{check, Case};

    #[test]
    fn evicts_the_least_recently_used() {
        // (slots, steps, misses, held at the end)
        let table: [Case; 4] = [
            (2, &[&[1], &[2], &[1], &[3], &[1], &[2]], 4, &[1, 2]),
            // 1 2 3 cycling through 2 slots: LRU misses every time.
            (2, &[&[1], &[2], &[3], &[1], &[2], &[3]], 6, &[2, 3]),
            (3, &[&[1, 2], &[3], &[1, 4], &[2]], 5, &[1, 2, 4]),
            (0, &[&[1], &[1]], 2, &[]),
        ];
        check("lru", &table);
    }
}
