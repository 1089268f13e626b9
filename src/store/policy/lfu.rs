//! LFU: the expert selected the fewest times (over the usage table's
//! lifetime, the saved history included) goes; the least recently used of
//! equally frequent ones first.

use super::{lowest, Evictor, Slot, View};

/// Least frequently used.
#[derive(Clone, Copy, Debug, Default)]
pub struct Lfu;

impl Evictor for Lfu {
    fn name(&self) -> &'static str {
        "lfu"
    }

    fn victim(&self, _incoming: usize, slots: &[Slot], view: View) -> Option<usize> {
        lowest(slots, |s| (view.of(s.key).count, s.last))
    }

    fn clone_box(&self) -> Box<dyn Evictor> {
        Box::new(*self)
    }
}

#[cfg(test)]
mod tests {
    use super::super::table::{check, Case};

    #[test]
    fn evicts_the_least_frequent_then_the_least_recent() {
        // (slots, steps, misses, held at the end)
        let table: [Case; 3] = [
            // 1 twice, 2 once: 3 evicts 2.
            (2, &[&[1], &[1], &[2], &[3], &[1]], 3, &[1, 3]),
            // Counts never decay: 1's early popularity keeps it while 2
            // and 3 take turns in the other slot.
            (2, &[&[1], &[1], &[1], &[2], &[3], &[2], &[3]], 5, &[1, 3]),
            // Equal counts: the least recent goes (LRU order).
            (2, &[&[1], &[2], &[3], &[1]], 4, &[1, 3]),
        ];
        check("lfu", &table);
    }
}
