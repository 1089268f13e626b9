//! Activation taps for calibration (`moestream calibrate`): while a
//! [`Recorder`] is installed on a thread, every product that names its
//! [`Site`] adds the squares of its input rows to the recorder, column by
//! column (llama.cpp's imatrix idea: the mean squared input of a column is
//! how much an error in that column's weights costs). Without a recorder a
//! tap is one thread-local flag read, so the forward pass is unchanged.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;

/// Which MLP of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Block {
    /// A dense layer's MLP.
    Dense,
    /// The shared (always-on) expert.
    Shared,
    /// Routed expert `e`.
    Expert(u32),
}

/// Which input of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Part {
    /// The normed input every attention projection reads (q, k, v; MLA's
    /// q_a / q and kv_a).
    AttnIn,
    /// The input of the attention output projection.
    AttnOut,
    /// MLA's normed query latent, the input of q_b.
    QLatent,
    /// The input of an MLP's gate and up projections.
    MlpIn(Block),
    /// The input of an MLP's down projection.
    MlpDown(Block),
}

/// Where an input was recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Site {
    /// An input of decoder layer `l` (MTP layers after the decoder's).
    Layer(u32, Part),
    /// The final normed hidden state, the input of lm_head.
    Head,
}

/// The squares of one site's input rows, summed per column.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sums {
    pub squares: Vec<f64>,
    pub rows: u64,
}

/// What a calibration run recorded, per site.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Recorder {
    pub sites: BTreeMap<Site, Sums>,
}

impl Recorder {
    /// Adds `x`'s rows of `cols` columns at `site`. Rows of a site whose
    /// width changed are a caller's bug.
    pub fn add(&mut self, site: Site, x: &[f32], cols: usize) {
        let sums = self.sites.entry(site).or_default();
        if sums.squares.is_empty() {
            sums.squares = vec![0.0; cols];
        }
        assert_eq!(sums.squares.len(), cols, "site {site:?} changed width");
        for row in x.chunks_exact(cols) {
            for (s, &v) in sums.squares.iter_mut().zip(row) {
                *s += f64::from(v) * f64::from(v);
            }
        }
        sums.rows += (x.len() / cols) as u64;
    }
}

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    static LAYER: Cell<u32> = const { Cell::new(0) };
    static RECORDER: RefCell<Recorder> = RefCell::new(Recorder::default());
}

/// Starts recording on this thread (anything recorded before is dropped).
pub fn install() {
    RECORDER.with(|r| *r.borrow_mut() = Recorder::default());
    ON.with(|on| on.set(true));
}

/// Stops recording on this thread and hands back what was recorded.
pub fn finish() -> Recorder {
    ON.with(|on| on.set(false));
    RECORDER.with(|r| std::mem::take(&mut *r.borrow_mut()))
}

/// The decoder layer the next [`record`]s belong to.
pub fn at_layer(l: usize) {
    LAYER.with(|c| c.set(l as u32));
}

/// Records `x` (rows of `cols`) as input `part` of the current layer.
#[inline]
pub fn record(part: Part, x: &[f32], cols: usize) {
    if ON.with(Cell::get) {
        let l = LAYER.with(Cell::get);
        RECORDER.with(|r| r.borrow_mut().add(Site::Layer(l, part), x, cols));
    }
}

/// Records `x` (rows of `cols`) as the input of lm_head.
#[inline]
pub fn record_head(x: &[f32], cols: usize) {
    if ON.with(Cell::get) {
        RECORDER.with(|r| r.borrow_mut().add(Site::Head, x, cols));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recording_sums_squares_per_column_only_while_installed() {
        record(Part::AttnIn, &[1.0, 2.0], 2);
        install();
        at_layer(3);
        record(Part::AttnIn, &[1.0, 2.0, -3.0, 0.5], 2);
        record_head(&[2.0], 1);
        let r = finish();
        record(Part::AttnIn, &[9.0, 9.0], 2);
        let attn = &r.sites[&Site::Layer(3, Part::AttnIn)];
        assert_eq!(attn.squares, vec![10.0, 4.25]);
        assert_eq!(attn.rows, 2);
        assert_eq!(r.sites[&Site::Head].squares, vec![4.0]);
        assert_eq!(r.sites.len(), 2);
        assert!(finish().sites.is_empty(), "nothing recorded once finished");
    }
}
