//! ARC, the adaptive replacement cache (Megiddo & Modha, FAST 2003): the
//! cached experts split into T1 (seen once since they came in) and T2
//! (seen again), each evicted in LRU order; ghost lists B1 and B2 remember
//! what each evicted. A miss on a B1 ghost says T1 was too small and grows
//! its target size `p`; a miss on a B2 ghost shrinks it. The victim comes
//! from T1 while T1 is over its target, else from T2. Ghosts are bounded
//! as in the paper: |T1| + |B1| <= c and all four lists <= 2c.
//!
//! State is per expert (list and stamp), sized at creation: no allocation
//! per access; trimming a ghost scans the layer's experts.

use super::{Evictor, Slot, View};

const NONE: u8 = 0;
const T1: u8 = 1;
const T2: u8 = 2;
const B1: u8 = 3;
const B2: u8 = 4;

/// Adaptive replacement between recency (T1) and frequency (T2).
#[derive(Clone, Debug)]
pub struct Adaptive {
    /// Per expert: the list it is in.
    list: Vec<u8>,
    /// Per expert: when it entered or was last touched in its list.
    stamp: Vec<u64>,
    /// Length of each list, indexed by the list constants.
    len: [usize; 5],
    /// Target length of T1.
    p: usize,
    /// Usable slots.
    c: usize,
    clock: u64,
}

impl Adaptive {
    pub fn new(experts: usize) -> Adaptive {
        Adaptive {
            list: vec![NONE; experts],
            stamp: vec![0; experts],
            len: [0; 5],
            p: 0,
            c: 0,
            clock: 0,
        }
    }

    /// The target length of T1.
    pub fn target(&self) -> usize {
        self.p
    }

    fn list_of(&self, key: usize) -> u8 {
        self.list.get(key).copied().unwrap_or(NONE)
    }

    fn move_to(&mut self, key: usize, to: u8) {
        if key >= self.list.len() {
            // An expert beyond the layer's count: grow (never in a model).
            self.list.resize(key + 1, NONE);
            self.stamp.resize(key + 1, 0);
        }
        self.len[self.list[key] as usize] -= usize::from(self.list[key] != NONE);
        self.len[to as usize] += usize::from(to != NONE);
        self.list[key] = to;
        self.clock += 1;
        self.stamp[key] = self.clock;
    }

    /// Forgets the least recent ghost of `list`.
    fn drop_oldest(&mut self, list: u8) {
        let oldest = (0..self.list.len())
            .filter(|&k| self.list[k] == list)
            .min_by_key(|&k| self.stamp[k]);
        if let Some(k) = oldest {
            self.move_to(k, NONE);
        }
    }

    fn trim_ghosts(&mut self) {
        while self.len[T1 as usize] + self.len[B1 as usize] > self.c && self.len[B1 as usize] > 0 {
            self.drop_oldest(B1);
        }
        while self.len.iter().sum::<usize>() > 2 * self.c {
            let from = if self.len[B2 as usize] > 0 { B2 } else { B1 };
            if self.len[from as usize] == 0 {
                break;
            }
            self.drop_oldest(from);
        }
    }

    /// The least recent unpinned slot of `list`.
    fn oldest_in(&self, list: u8, slots: &[Slot]) -> Option<usize> {
        slots
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.pinned && (self.list_of(s.key) == list))
            .min_by_key(|(_, s)| self.stamp.get(s.key).copied().unwrap_or(0))
            .map(|(i, _)| i)
    }
}

impl Evictor for Adaptive {
    fn name(&self) -> &'static str {
        "arc"
    }

    fn victim(&self, incoming: usize, slots: &[Slot], _view: View) -> Option<usize> {
        let t1 = self.len[T1 as usize];
        let from_t1 = t1 >= 1 && (t1 > self.p || (self.list_of(incoming) == B2 && t1 == self.p));
        let (first, second) = if from_t1 { (T1, T2) } else { (T2, T1) };
        self.oldest_in(first, slots)
            .or_else(|| self.oldest_in(second, slots))
            // Slots the policy never saw inserted (none in practice): LRU.
            .or_else(|| super::lowest(slots, |s| s.last))
    }

    fn on_hit(&mut self, key: usize) {
        if matches!(self.list_of(key), T1 | T2) {
            self.move_to(key, T2);
        }
    }

    fn on_miss(&mut self, key: usize) {
        let (b1, b2) = (self.len[B1 as usize], self.len[B2 as usize]);
        match self.list_of(key) {
            B1 => self.p = (self.p + (b2 / b1).max(1)).min(self.c),
            B2 => self.p = self.p.saturating_sub((b1 / b2).max(1)),
            _ => {}
        }
    }

    fn on_insert(&mut self, key: usize) {
        let to = match self.list_of(key) {
            B1 | B2 | T2 => T2,
            _ => T1,
        };
        self.move_to(key, to);
        self.trim_ghosts();
    }

    fn on_evict(&mut self, key: usize) {
        let to = match self.list_of(key) {
            T2 => B2,
            _ => B1,
        };
        self.move_to(key, to);
        self.trim_ghosts();
    }

    fn on_limit(&mut self, limit: usize) {
        self.c = limit;
        self.p = self.p.min(limit);
    }

    fn clone_box(&self) -> Box<dyn Evictor> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::super::table::{check, run, Case};
    use super::*;

    #[test]
    fn keeps_what_was_seen_twice_and_adapts_on_ghost_hits() {
        // (slots, steps, misses, held at the end)
        let table: [Case; 3] = [
            // 1 was seen twice (T2); 2 only once (T1): 3 evicts 2, so 1
            // still hits (LRU evicts 1 here and misses it: 4).
            (2, &[&[1], &[1], &[2], &[3], &[1]], 3, &[1, 3]),
            // 2 comes back from B1 and takes T2's place: 1 goes to B2 and
            // misses once more.
            (2, &[&[1], &[1], &[2], &[3], &[2], &[1]], 5, &[1, 2]),
            // A one-pass scan through a full T1 keeps no ghosts.
            (2, &[&[1], &[2], &[3], &[4], &[1]], 5, &[1, 4]),
        ];
        check("arc", &table);
        assert_eq!(run("lru", 2, &[&[1], &[1], &[2], &[3], &[1]]).0, 4);
    }

    #[test]
    fn ghost_hits_move_the_target() {
        let slot = |key| Slot {
            key,
            last: 0,
            pinned: false,
        };
        let mut a = Adaptive::new(8);
        a.on_limit(2);
        // 1 seen twice (T2), 2 once (T1); 3 evicts 2 (T1 over its target 0).
        a.on_miss(1);
        a.on_insert(1);
        a.on_hit(1);
        a.on_miss(2);
        a.on_insert(2);
        a.on_miss(3);
        assert_eq!(a.victim(3, &[slot(1), slot(2)], View::EMPTY), Some(1));
        a.on_evict(2);
        a.on_insert(3);
        assert_eq!(a.target(), 0);
        // 2 returns from B1: T1 was too small.
        a.on_miss(2);
        assert_eq!(a.target(), 1);
        // Now T1 (just 3) is not over its target: T2's 1 goes, into B2.
        assert_eq!(a.victim(2, &[slot(1), slot(3)], View::EMPTY), Some(0));
        a.on_evict(1);
        a.on_insert(2);
        // 1 returns from B2: T2 was too small.
        a.on_miss(1);
        assert_eq!(a.target(), 0);
    }

    /// The paper's ARC, request by request (lists as vectors, LRU first).
    fn classic(c: usize, seq: &[usize]) -> u64 {
        let (mut t1, mut t2, mut b1, mut b2) = (vec![], vec![], vec![], vec![]);
        let (mut p, mut misses) = (0usize, 0);
        fn take(l: &mut Vec<usize>, x: usize) -> bool {
            l.iter()
                .position(|&k| k == x)
                .map(|i| l.remove(i))
                .is_some()
        }
        let replace = |t1: &mut Vec<usize>,
                       t2: &mut Vec<usize>,
                       b1: &mut Vec<usize>,
                       b2: &mut Vec<usize>,
                       in_b2: bool,
                       p: usize| {
            if !t1.is_empty() && (t1.len() > p || (in_b2 && t1.len() == p)) {
                b1.push(t1.remove(0));
            } else {
                b2.push(t2.remove(0));
            }
        };
        for &x in seq {
            if take(&mut t1, x) || take(&mut t2, x) {
                t2.push(x);
                continue;
            }
            misses += 1;
            if b1.contains(&x) {
                p = (p + (b2.len() / b1.len()).max(1)).min(c);
                replace(&mut t1, &mut t2, &mut b1, &mut b2, false, p);
                take(&mut b1, x);
                t2.push(x);
            } else if b2.contains(&x) {
                p = p.saturating_sub((b1.len() / b2.len()).max(1));
                replace(&mut t1, &mut t2, &mut b1, &mut b2, true, p);
                take(&mut b2, x);
                t2.push(x);
            } else {
                let total = t1.len() + t2.len() + b1.len() + b2.len();
                if t1.len() + b1.len() == c {
                    if t1.len() < c {
                        b1.remove(0);
                        replace(&mut t1, &mut t2, &mut b1, &mut b2, false, p);
                    } else {
                        t1.remove(0);
                    }
                } else if total >= c {
                    if total == 2 * c {
                        b2.remove(0);
                    }
                    replace(&mut t1, &mut t2, &mut b1, &mut b2, false, p);
                }
                t1.push(x);
            }
        }
        misses
    }

    /// One expert per step, the cache's ARC makes the paper's ARC's
    /// decisions: the same misses on skewed pseudo-random sequences.
    #[test]
    fn equals_the_papers_arc_one_request_at_a_time() {
        let mut x: u64 = 0x1234_5678_9abc_def1;
        let mut rand = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for case in 0..40 {
            let c = 1 + case % 7;
            // Skewed: a few hot experts and a long tail, in phases.
            let seq: Vec<usize> = (0..400)
                .map(|i| {
                    let r = rand();
                    if r % 3 == 0 {
                        (r % 4) as usize + (i / 100) * 2
                    } else {
                        (r % 15) as usize
                    }
                })
                .collect();
            let steps: Vec<&[usize]> = seq.iter().map(std::slice::from_ref).collect();
            let (ours, _) = run("arc", c, &steps);
            assert_eq!(ours, classic(c, &seq), "{c} slots, case {case}");
        }
    }
}
