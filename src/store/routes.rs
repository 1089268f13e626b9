//! One MoE layer's routing decision for a batch of rows, as the store
//! takes it ([`super::ExpertStore::fetch`]): each row's chosen experts
//! (best first), their weights and the router's margin, and derived from
//! them the (expert, row, weight) pairs in the order transformers sums
//! them, the union of experts and the rows each is applied to. The
//! vectors are reused, so a decode step allocates nothing once they grew.

/// A layer's routes (see the module docs).
#[derive(Default)]
pub struct Routes {
    /// Every row's chosen experts, best first, one row after another.
    chosen: Vec<usize>,
    weights: Vec<f32>,
    /// End of each row in `chosen`.
    ends: Vec<usize>,
    /// Each row's top-k margin.
    margins: Vec<f32>,
    /// Cache-aware routing: (chosen experts exact routing would not have
    /// chosen, experts chosen), over the rows that leaned.
    leaned: (usize, usize),
    /// (expert, row, weight), sorted by expert then row.
    pairs: Vec<(usize, usize, f32)>,
    /// The union of `pairs`' experts, sorted.
    ids: Vec<usize>,
    /// Rows routed to each of `ids`.
    rows: Vec<usize>,
}

/// One row's routing.
#[derive(Clone, Copy)]
pub(crate) struct Row<'a> {
    pub(crate) experts: &'a [usize],
    pub(crate) weights: &'a [f32],
    pub(crate) margin: f32,
}

impl Routes {
    /// Empties the routes (keeping their memory).
    pub fn clear(&mut self) {
        self.chosen.clear();
        self.weights.clear();
        self.ends.clear();
        self.margins.clear();
        self.leaned = (0, 0);
        self.pairs.clear();
        self.ids.clear();
        self.rows.clear();
    }

    /// Adds the next row: its experts best first, their weights, the
    /// router's margin, and with cache-aware routing how many of them exact
    /// routing would not have chosen.
    pub fn push(&mut self, experts: &[usize], weights: &[f32], margin: f32, moved: Option<usize>) {
        assert_eq!(experts.len(), weights.len(), "one weight per expert");
        let row = self.ends.len();
        for (&e, &w) in experts.iter().zip(weights) {
            self.pairs.push((e, row, w));
        }
        self.chosen.extend_from_slice(experts);
        self.weights.extend_from_slice(weights);
        self.ends.push(self.chosen.len());
        self.margins.push(margin);
        if let Some(moved) = moved {
            self.leaned.0 += moved;
            self.leaned.1 += experts.len();
        }
    }

    /// Orders the pairs and derives the union once every row is pushed.
    pub fn seal(&mut self) {
        self.pairs.sort_unstable_by_key(|&(e, t, _)| (e, t));
        self.ids.clear();
        self.ids.extend(self.pairs.iter().map(|p| p.0));
        self.ids.dedup();
        let pairs = &self.pairs;
        self.rows.clear();
        self.rows.extend(
            self.ids
                .iter()
                .map(|&e| pairs.partition_point(|p| p.0 <= e) - pairs.partition_point(|p| p.0 < e)),
        );
    }

    /// Rows pushed.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether no row was pushed.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Row `i`'s routing.
    pub(crate) fn row(&self, i: usize) -> Row<'_> {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        let end = self.ends[i];
        Row {
            experts: &self.chosen[start..end],
            weights: &self.weights[start..end],
            margin: self.margins[i],
        }
    }

    /// (moved, chosen) of the rows routed cache-aware.
    pub(crate) fn leaned(&self) -> (usize, usize) {
        self.leaned
    }

    /// (expert, row, weight), sorted by expert then row (after [`Routes::seal`]).
    pub fn pairs(&self) -> &[(usize, usize, f32)] {
        &self.pairs
    }

    /// The union of experts, sorted (after [`Routes::seal`]).
    pub fn ids(&self) -> &[usize] {
        &self.ids
    }

    /// Rows routed to each of [`Routes::ids`].
    pub(crate) fn rows_per_id(&self) -> &[usize] {
        &self.rows
    }

    /// The pairs of expert `e`: a range of [`Routes::pairs`].
    pub fn pairs_of(&self, e: usize) -> std::ops::Range<usize> {
        self.pairs.partition_point(|p| p.0 < e)..self.pairs.partition_point(|p| p.0 <= e)
    }
}
