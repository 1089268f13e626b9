//! Sets of Unicode code points as sorted, disjoint, non-adjacent inclusive
//! ranges: the character classes of GBNF and the first/follow sets of the
//! lexeme analysis. Invariant: `ranges` is sorted, ranges neither overlap
//! nor touch, and every bound is at most [`MAX`].

/// The largest code point.
pub(super) const MAX: u32 = 0x10_FFFF;
const SURROGATES: (u32, u32) = (0xD800, 0xDFFF);

/// A set of code points.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(super) struct CharSet {
    ranges: Vec<(u32, u32)>,
}

impl CharSet {
    /// The empty set.
    pub(super) const EMPTY: CharSet = CharSet { ranges: Vec::new() };

    /// The set of `ranges` (in any order, overlapping or not; a range
    /// whose end is below its start is empty).
    pub(super) fn from_ranges(mut ranges: Vec<(u32, u32)>) -> CharSet {
        ranges.retain(|&(lo, hi)| lo <= hi && lo <= MAX);
        for r in &mut ranges {
            r.1 = r.1.min(MAX);
        }
        ranges.sort_unstable();
        let mut merged: Vec<(u32, u32)> = Vec::with_capacity(ranges.len());
        for (lo, hi) in ranges {
            match merged.last_mut() {
                Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
                _ => merged.push((lo, hi)),
            }
        }
        CharSet { ranges: merged }
    }

    /// The set holding `c` alone.
    pub(super) fn single(c: char) -> CharSet {
        CharSet {
            ranges: vec![(c as u32, c as u32)],
        }
    }

    pub(super) fn ranges(&self) -> &[(u32, u32)] {
        &self.ranges
    }

    pub(super) fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The scalar values not in the set.
    pub(super) fn complement(&self) -> CharSet {
        let mut out = Vec::with_capacity(self.ranges.len() + 2);
        let mut next = 0u32;
        for &(lo, hi) in &self.ranges {
            if lo > next {
                out.push((next, lo - 1));
            }
            next = hi + 1;
        }
        if next <= MAX {
            out.push((next, MAX));
        }
        CharSet::from_ranges(out).minus_surrogates()
    }

    fn minus_surrogates(self) -> CharSet {
        let (s_lo, s_hi) = SURROGATES;
        let mut out = Vec::with_capacity(self.ranges.len() + 1);
        for (lo, hi) in self.ranges {
            if hi < s_lo || lo > s_hi {
                out.push((lo, hi));
                continue;
            }
            if lo < s_lo {
                out.push((lo, s_lo - 1));
            }
            if hi > s_hi {
                out.push((s_hi + 1, hi));
            }
        }
        CharSet { ranges: out }
    }

    /// Adds every code point of `other`; returns whether the set grew.
    pub(super) fn add(&mut self, other: &CharSet) -> bool {
        if other.ranges.iter().all(|r| self.covers(*r)) {
            return false;
        }
        let mut all = std::mem::take(&mut self.ranges);
        all.extend_from_slice(&other.ranges);
        *self = CharSet::from_ranges(all);
        true
    }

    fn covers(&self, (lo, hi): (u32, u32)) -> bool {
        let i = self.ranges.partition_point(|r| r.1 < lo);
        self.ranges.get(i).is_some_and(|r| r.0 <= lo && hi <= r.1)
    }

    /// Whether the sets share a code point.
    pub(super) fn intersects(&self, other: &CharSet) -> bool {
        let (mut i, mut j) = (0, 0);
        while i < self.ranges.len() && j < other.ranges.len() {
            let (a, b) = (self.ranges[i], other.ranges[j]);
            if a.1 < b.0 {
                i += 1;
            } else if b.1 < a.0 {
                j += 1;
            } else {
                return true;
            }
        }
        false
    }

    /// Every code point whose UTF-8 encoding starts with the same byte as
    /// the encoding of a code point of the set: what a byte-level lexer
    /// cannot tell apart from the set after one byte.
    pub(super) fn same_lead_byte(&self) -> CharSet {
        let widened = self
            .ranges
            .iter()
            .map(|&(lo, hi)| (lead_block(lo).0, lead_block(hi).1))
            .collect();
        CharSet::from_ranges(widened)
    }
}

/// The code points whose UTF-8 encoding has the same first byte as `c`'s.
fn lead_block(c: u32) -> (u32, u32) {
    let (class_lo, class_hi, block) = match c {
        0..=0x7F => return (c, c),
        0x80..=0x7FF => (0x80, 0x7FF, 0x3F),
        0x800..=0xFFFF => (0x800, 0xFFFF, 0xFFF),
        _ => (0x1_0000, MAX, 0x3_FFFF),
    };
    ((c & !block).max(class_lo), (c | block).min(class_hi))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_sorted_merged_and_clipped() {
        let s = CharSet::from_ranges(vec![(10, 12), (0, 3), (4, 5), (20, 19), (11, 15)]);
        assert_eq!(s.ranges(), &[(0, 5), (10, 15)]);
        assert!(CharSet::from_ranges(vec![(5, 4)]).is_empty());
    }

    #[test]
    fn complement_skips_surrogates() {
        let s = CharSet::from_ranges(vec![(0, 0x60), (0x7B, MAX)]).complement();
        assert_eq!(s.ranges(), &[(0x61, 0x7A)]);
        let any = CharSet::default().complement();
        assert_eq!(any.ranges(), &[(0, 0xD7FF), (0xE000, MAX)]);
        assert!(any.complement().is_empty());
    }

    #[test]
    fn add_and_intersects() {
        let mut s = CharSet::single('a');
        assert!(s.add(&CharSet::single('b')));
        assert!(!s.add(&CharSet::single('a')));
        assert_eq!(s.ranges(), &[(0x61, 0x62)]);
        assert!(s.intersects(&CharSet::from_ranges(vec![(0x62, 0x70)])));
        assert!(!s.intersects(&CharSet::single('c')));
    }

    #[test]
    fn lead_byte_blocks() {
        assert_eq!(CharSet::single('a').same_lead_byte(), CharSet::single('a'));
        // é (U+E9) and è (U+E8) both start with 0xC3: U+C0..U+FF.
        let e = CharSet::single('é').same_lead_byte();
        assert_eq!(e.ranges(), &[(0xC0, 0xFF)]);
        assert!(e.intersects(&CharSet::single('è')));
        // U+0800 starts with 0xE0, which covers U+0800..U+0FFF only.
        assert_eq!(
            CharSet::single('\u{800}').same_lead_byte().ranges(),
            &[(0x800, 0xFFF)]
        );
        assert_eq!(
            CharSet::single('😀').same_lead_byte().ranges(),
            &[(0x1_0000, 0x3_FFFF)]
        );
    }
}
