//! Belady's MIN: evict the expert whose next use is farthest in the
//! future, or keep the incoming one out when it is needed later than all
//! of them (a miss is computed from its read buffer, so it need not take a
//! slot). Over a layer's accesses this is the fewest misses any policy can
//! have with that many slots: the ratio to it bounds what a better live
//! policy could gain. It needs every access's next use
//! ([`Evictor::on_next_use`]), which only the replay knows.

use super::{Evictor, Slot, View};

/// The offline optimum.
#[derive(Clone, Debug)]
pub struct Belady {
    /// Per expert: the access at which it is next looked up (`u64::MAX`:
    /// never).
    next: Vec<u64>,
}

impl Belady {
    pub fn new(experts: usize) -> Belady {
        Belady {
            next: vec![u64::MAX; experts],
        }
    }

    fn next_of(&self, key: usize) -> u64 {
        self.next.get(key).copied().unwrap_or(u64::MAX)
    }
}

impl Evictor for Belady {
    fn name(&self) -> &'static str {
        "belady"
    }

    fn victim(&self, incoming: usize, slots: &[Slot], _view: View) -> Option<usize> {
        let mut far: Option<(usize, u64)> = None;
        for (i, s) in slots.iter().enumerate().filter(|(_, s)| !s.pinned) {
            let n = self.next_of(s.key);
            if far.is_none_or(|(_, f)| n > f) {
                far = Some((i, n));
            }
        }
        let (i, n) = far?;
        (self.next_of(incoming) < n).then_some(i)
    }

    fn on_next_use(&mut self, key: usize, at: u64) {
        if key >= self.next.len() {
            self.next.resize(key + 1, u64::MAX);
        }
        self.next[key] = at;
    }

    fn offline(&self) -> bool {
        true
    }

    fn clone_box(&self) -> Box<dyn Evictor> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::super::table::run;
    use super::super::NAMES;
    use std::collections::HashMap;

    fn singles(seq: &[usize]) -> Vec<Vec<usize>> {
        seq.iter().map(|&k| vec![k]).collect()
    }

    fn refs(steps: &[Vec<usize>]) -> Vec<&[usize]> {
        steps.iter().map(Vec::as_slice).collect()
    }

    /// The textbook reference string (Silberschatz, 3 frames). MIN with
    /// every miss loaded faults 9 times; letting a miss bypass the cache
    /// saves one more.
    #[test]
    fn the_textbook_string() {
        let seq = [7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1];
        let steps = singles(&seq);
        assert_eq!(run("belady", 3, &refs(&steps)), (8, vec![0, 1, 2]));
        assert_eq!(run("lru", 3, &refs(&steps)).0, 12);
    }

    /// The fewest misses over every choice of what to keep after each step
    /// (any subset of the cached and the step's experts, at most `slots`).
    fn brute_force(slots: usize, steps: &[Vec<usize>]) -> u64 {
        let mut best: HashMap<u32, u64> = HashMap::from([(0, 0)]);
        for step in steps {
            let want: u32 = step.iter().map(|&k| 1u32 << k).sum();
            let mut next = HashMap::new();
            for (&held, &misses) in &best {
                let misses = misses + u64::from((want & !held).count_ones());
                let pool = held | want;
                let mut sub = pool;
                loop {
                    if sub.count_ones() as usize <= slots {
                        let e = next.entry(sub).or_insert(u64::MAX);
                        *e = (*e).min(misses);
                    }
                    if sub == 0 {
                        break;
                    }
                    sub = (sub - 1) & pool;
                }
            }
            best = next;
        }
        best.into_values().min().unwrap()
    }

    /// On pseudo-random steps of 1-3 experts out of 6: Belady equals the
    /// brute-force optimum, and no policy beats it.
    #[test]
    fn equals_the_brute_force_optimum() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rand = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for case in 0..60 {
            let slots = 1 + case % 4;
            let steps: Vec<Vec<usize>> = (0..12)
                .map(|_| {
                    let mut s: Vec<usize> = (0..1 + rand(3)).map(|_| rand(6) as usize).collect();
                    s.sort_unstable();
                    s.dedup();
                    s
                })
                .collect();
            let optimum = brute_force(slots, &steps);
            let (belady, _) = run("belady", slots, &refs(&steps));
            assert_eq!(belady, optimum, "{slots} slots, {steps:?}");
            for name in NAMES {
                let (m, _) = run(name, slots, &refs(&steps));
                assert!(m >= optimum, "{name} beat the optimum on {steps:?}");
            }
        }
    }
}
