//! Pinning decisions (SPEC §7), as pure functions of the usage counters,
//! so every rule is table-tested without a model.
//!
//! - The pinned (hot) set starts as the hottest experts of the saved history,
//!   sized by confidence in it (up to half the slots), and is re-picked
//!   between requests: the coldest pinned expert is swapped for the hottest
//!   unpinned one only if `heat_new > heat_cold + heat_cold/4 + 4`, so two
//!   experts of similar heat never ping-pong.

use crate::store::usage::Usage;

/// Whether an unpinned expert of heat `hot` should replace a pinned one of
/// heat `cold` (the anti-ping-pong margin).
pub fn should_swap(hot: u32, cold: u32) -> bool {
    hot as u64 > cold as u64 + cold as u64 / 4 + 4
}

/// Mean selections per expert at which the pin set reaches half its
/// maximum size.
pub const CONFIDENCE_SELECTIONS: u64 = 8;

/// How many experts to pin in a layer of `slots` cache slots, given a saved
/// history of `tokens` tokens routed `top_k` of `experts`: at most half the
/// slots, scaled by the confidence `s / (s + 8)` where `s = tokens · top_k /
/// experts` is the mean number of selections per expert (no history, no
/// pins; GLM-5's 256-expert layers reach half the maximum after 256 tokens).
pub fn pin_count(slots: usize, tokens: u64, top_k: usize, experts: usize) -> usize {
    let max = (slots / 2) as u128;
    let picks = tokens as u128 * top_k as u128;
    let e = experts.max(1) as u128;
    // max · s / (s + C) with s = picks / e, in integers.
    (max * picks / (picks + CONFIDENCE_SELECTIONS as u128 * e)) as usize
}

/// The `n` hottest experts (by heat, then lifetime count, then lowest
/// index), hottest first; experts never used are not pinned.
pub fn hottest(usage: &[Usage], n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..usage.len()).filter(|&e| usage[e].count > 0).collect();
    order.sort_by(|&a, &b| {
        (usage[b].heat, usage[b].count)
            .cmp(&(usage[a].heat, usage[a].count))
            .then(a.cmp(&b))
    });
    order.truncate(n);
    order
}

/// Re-picks the pinned set between requests: repeatedly swaps the coldest
/// pinned expert for the hottest unpinned one while the margin allows.
/// Returns the swaps as `(unpinned, pinned)` pairs, in order.
pub fn repin(pinned: &mut [usize], usage: &[Usage]) -> Vec<(usize, usize)> {
    let mut swaps = Vec::new();
    loop {
        let Some((ci, &cold)) = pinned
            .iter()
            .enumerate()
            .min_by_key(|&(_, &e)| (usage[e].heat, usage[e].count, std::cmp::Reverse(e)))
        else {
            return swaps;
        };
        let hot = (0..usage.len())
            .filter(|e| !pinned.contains(e))
            .max_by_key(|&e| (usage[e].heat, usage[e].count, std::cmp::Reverse(e)));
        match hot {
            Some(hot) if should_swap(usage[hot].heat, usage[cold].heat) => {
                pinned[ci] = hot;
                swaps.push((cold, hot));
            }
            _ => return swaps,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(heat: u32, count: u64, last_use: u64) -> Usage {
        Usage {
            count,
            heat,
            last_use,
        }
    }

    #[test]
    fn the_swap_margin_stops_ping_pong() {
        // (hot, cold, swap?)
        let table = [
            (5, 0, true),  // 5 > 0 + 0 + 4
            (4, 0, false), // the +4 floor
            (10, 4, true), // 10 > 4 + 1 + 4
            (9, 4, false), // 9 > 9 fails
            (9, 5, false), // 9 > 5 + 1 + 4 fails
            (130, 100, true),
            (129, 100, false), // 129 > 100 + 25 + 4 fails
            (100, 100, false),
            (u32::MAX, u32::MAX - 1, false),
        ];
        for (hot, cold, want) in table {
            assert_eq!(should_swap(hot, cold), want, "{hot} vs {cold}");
        }
    }

    #[test]
    fn pin_count_grows_with_confidence_up_to_half_the_slots() {
        // (slots, tokens, top_k, experts, pins)
        let table = [
            (16, 0, 8, 256, 0),
            (16, 256, 8, 256, 4), // 8 selections per expert: half of 8
            (16, 768, 8, 256, 6), // 24 per expert: 3/4
            (16, 1 << 30, 8, 256, 7),
            (4, 20, 2, 4, 1), // 10 per expert: 2 · 10/18
            (1, 1 << 30, 8, 256, 0),
            (0, 1000, 8, 256, 0),
        ];
        for (slots, tokens, k, e, want) in table {
            assert_eq!(
                pin_count(slots, tokens, k, e),
                want,
                "{slots} slots, {tokens} tokens"
            );
        }
    }

    #[test]
    fn hottest_orders_by_heat_then_count_then_index() {
        let usage = [u(3, 5, 0), u(7, 1, 0), u(3, 9, 0), u(0, 0, 0), u(3, 9, 0)];
        assert_eq!(hottest(&usage, 3), [1, 2, 4]);
        assert_eq!(hottest(&usage, 10), [1, 2, 4, 0]);
    }

    #[test]
    fn repin_swaps_only_past_the_margin() {
        // Pinned {0, 1}; 2 is much hotter than 1, 3 only slightly hotter than 0.
        let usage = [u(20, 20, 0), u(2, 2, 0), u(30, 30, 0), u(24, 24, 0)];
        let mut pinned = vec![0, 1];
        let swaps = repin(&mut pinned, &usage);
        assert_eq!(swaps, [(1, 2)]);
        assert_eq!(pinned, [0, 2]);
        // Stable: a second pass changes nothing.
        assert!(repin(&mut pinned, &usage).is_empty());
        // Two experts alternating at equal heat never swap.
        let usage = [u(10, 10, 0), u(10, 10, 0)];
        let mut pinned = vec![0];
        assert!(repin(&mut pinned, &usage).is_empty());
    }
}
