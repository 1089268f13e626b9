//! Coalescing: merging nearby byte ranges of one file into fewer, larger
//! reads. A pure function with named limits:
//! - `merged_bytes_max`: a merged read never grows past this (a single
//!   requested range longer than it is read alone, never split);
//! - `gap_bytes_max`: the read-amplification limit, the most unrequested
//!   bytes read between two neighbouring ranges to join them.
//!
//! Input ranges must be sorted by offset (a programmer error otherwise);
//! they may touch or overlap. Every input range is covered by exactly one
//! merged read, which lists it in `parts`. Merged reads come out sorted by
//! offset.

use std::ops::Range;

/// A byte range `[offset, offset + len)` of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteRange {
    pub offset: u64,
    pub len: u64,
}

impl ByteRange {
    pub const fn new(offset: u64, len: u64) -> Self {
        ByteRange { offset, len }
    }

    /// One past the last byte.
    pub const fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// The limits of [`coalesce`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoalesceLimits {
    pub merged_bytes_max: u64,
    pub gap_bytes_max: u64,
}

/// One read covering one or more requested ranges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MergedRead {
    pub offset: u64,
    pub len: u64,
    /// Indices into the input of the ranges this read covers, ascending.
    pub parts: Vec<usize>,
}

impl MergedRead {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }

    /// Where `part` lies inside this read's bytes. Panics if `part` is not
    /// inside the read.
    pub fn window(&self, part: ByteRange) -> Range<usize> {
        assert!(
            part.offset >= self.offset && part.end() <= self.end(),
            "range {part:?} is outside merged read [{}, {})",
            self.offset,
            self.end()
        );
        let start = (part.offset - self.offset) as usize;
        start..start + part.len as usize
    }

    fn try_extend(&mut self, index: usize, range: ByteRange, limits: CoalesceLimits) -> bool {
        let gap = range.offset.saturating_sub(self.end());
        let end = self.end().max(range.end());
        if gap > limits.gap_bytes_max || end - self.offset > limits.merged_bytes_max {
            return false;
        }
        self.len = end - self.offset;
        self.parts.push(index);
        true
    }
}

/// Merges sorted `ranges` into reads within `limits`.
pub fn coalesce(ranges: &[ByteRange], limits: CoalesceLimits) -> Vec<MergedRead> {
    assert!(
        ranges.windows(2).all(|w| w[0].offset <= w[1].offset),
        "coalesce needs ranges sorted by offset"
    );
    let mut merged: Vec<MergedRead> = Vec::new();
    for (index, &range) in ranges.iter().enumerate() {
        let extended = merged
            .last_mut()
            .is_some_and(|read| read.try_extend(index, range, limits));
        if !extended {
            merged.push(MergedRead {
                offset: range.offset,
                len: range.len,
                parts: vec![index],
            });
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LIMITS: CoalesceLimits = CoalesceLimits {
        merged_bytes_max: 1000,
        gap_bytes_max: 100,
    };

    fn ranges(list: &[(u64, u64)]) -> Vec<ByteRange> {
        list.iter().map(|&(o, l)| ByteRange::new(o, l)).collect()
    }

    fn reads(list: &[(u64, u64, &[usize])]) -> Vec<MergedRead> {
        list.iter()
            .map(|&(offset, len, parts)| MergedRead {
                offset,
                len,
                parts: parts.to_vec(),
            })
            .collect()
    }

    #[test]
    fn table_requested_to_merged() {
        #[allow(clippy::type_complexity)]
        let table: &[(&str, &[(u64, u64)], &[(u64, u64, &[usize])])] = &[
            ("empty", &[], &[]),
            ("single", &[(10, 20)], &[(10, 20, &[0])]),
            ("adjacent", &[(0, 100), (100, 100)], &[(0, 200, &[0, 1])]),
            (
                "gap at limit",
                &[(0, 100), (200, 100)],
                &[(0, 300, &[0, 1])],
            ),
            (
                "gap over limit",
                &[(0, 100), (201, 100)],
                &[(0, 100, &[0]), (201, 100, &[1])],
            ),
            ("overlap", &[(0, 100), (50, 100)], &[(0, 150, &[0, 1])]),
            ("contained", &[(0, 500), (10, 10)], &[(0, 500, &[0, 1])]),
            (
                "size at limit",
                &[(0, 500), (500, 500)],
                &[(0, 1000, &[0, 1])],
            ),
            (
                "size over limit",
                &[(0, 500), (500, 501)],
                &[(0, 500, &[0]), (500, 501, &[1])],
            ),
            (
                "oversized alone",
                &[(0, 5000), (5000, 10)],
                &[(0, 5000, &[0]), (5000, 10, &[1])],
            ),
            (
                "run then break",
                &[(0, 300), (350, 300), (700, 300), (1000, 50)],
                &[(0, 1000, &[0, 1, 2]), (1000, 50, &[3])],
            ),
            ("duplicates", &[(8, 8), (8, 8)], &[(8, 8, &[0, 1])]),
        ];
        for (name, requested, expected) in table {
            assert_eq!(
                coalesce(&ranges(requested), LIMITS),
                reads(expected),
                "{name}"
            );
        }
    }

    #[test]
    fn window_locates_part() {
        let input = ranges(&[(100, 10), (150, 20)]);
        let merged = coalesce(&input, LIMITS);
        assert_eq!(merged[0].window(input[0]), 0..10);
        assert_eq!(merged[0].window(input[1]), 50..70);
    }

    #[test]
    #[should_panic(expected = "sorted")]
    fn unsorted_input_panics() {
        coalesce(&ranges(&[(10, 1), (0, 1)]), LIMITS);
    }

    proptest! {
        #[test]
        fn every_range_covered_once_within_limits(
            mut raw in prop::collection::vec((0u64..10_000, 0u64..600), 0..40),
            merged_bytes_max in 1u64..3000,
            gap_bytes_max in 0u64..300,
        ) {
            raw.sort();
            let input = ranges(&raw);
            let limits = CoalesceLimits { merged_bytes_max, gap_bytes_max };
            let merged = coalesce(&input, limits);
            let mut seen = vec![0; input.len()];
            for read in &merged {
                let single = read.parts.len() == 1;
                prop_assert!(single || read.len <= merged_bytes_max);
                for &i in &read.parts {
                    seen[i] += 1;
                    prop_assert!(input[i].offset >= read.offset && input[i].end() <= read.end());
                }
            }
            prop_assert!(seen.iter().all(|&n| n == 1));
            prop_assert!(merged.windows(2).all(|w| w[0].offset <= w[1].offset));
        }
    }
}
