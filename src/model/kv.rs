//! The KV cache: per layer, what attention needs of every past position.
//!
//! - GQA layers keep rotated keys and values, `(positions, kv_heads *
//!   head_dim)` each.
//! - MLA layers keep only the normalized latent `(positions, kv_lora_rank)`
//!   and the rotary key `(positions, qk_rope_head_dim)` — the compressed
//!   cache — plus, beside it, the DSA indexer's keys `(positions,
//!   index_head_dim)` when the layer has an indexer. Indexer keys stay f32:
//!   its top-k boundary gaps are tiny.
//!
//! Sized at creation for the whole request; appending past capacity is a
//! request error, not a reallocation in the decode loop.

use crate::error::{Error, Result};

/// What one layer caches per position.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum KvLayout {
    Gqa {
        kv_dim: usize,
    },
    Mla {
        kv_lora: usize,
        rope: usize,
        index_dim: usize,
    },
}

/// One layer's cache, rows `0..len` valid.
pub enum LayerKv {
    Gqa {
        /// (capacity, kv_dim) rotated keys.
        k: Vec<f32>,
        /// (capacity, kv_dim) values.
        v: Vec<f32>,
    },
    Mla {
        /// (capacity, kv_lora) normalized latents.
        latent: Vec<f32>,
        /// (capacity, rope) rotated shared keys.
        k_rope: Vec<f32>,
        /// (capacity, index_dim) indexer keys; empty without an indexer.
        index_k: Vec<f32>,
    },
}

impl LayerKv {
    fn new(layout: KvLayout, capacity: usize) -> LayerKv {
        match layout {
            KvLayout::Gqa { kv_dim } => LayerKv::Gqa {
                k: vec![0f32; capacity * kv_dim],
                v: vec![0f32; capacity * kv_dim],
            },
            KvLayout::Mla {
                kv_lora,
                rope,
                index_dim,
            } => LayerKv::Mla {
                latent: vec![0f32; capacity * kv_lora],
                k_rope: vec![0f32; capacity * rope],
                index_k: vec![0f32; capacity * index_dim],
            },
        }
    }
}

impl LayerKv {
    /// The layer's buffers with their widths (floats per position), in
    /// the order a KV file stores them.
    pub fn buffers_mut(&mut self, layout: KvLayout) -> Vec<(&mut Vec<f32>, usize)> {
        match (self, layout) {
            (LayerKv::Gqa { k, v }, KvLayout::Gqa { kv_dim }) => vec![(k, kv_dim), (v, kv_dim)],
            (
                LayerKv::Mla {
                    latent,
                    k_rope,
                    index_k,
                },
                KvLayout::Mla {
                    kv_lora,
                    rope,
                    index_dim,
                },
            ) => vec![(latent, kv_lora), (k_rope, rope), (index_k, index_dim)],
            _ => unreachable!("a layer's buffers follow its layout"),
        }
    }
}

impl KvLayout {
    /// Attention-cache bytes per position (f32), excluding indexer keys.
    pub fn attention_bytes_per_token(self) -> usize {
        match self {
            KvLayout::Gqa { kv_dim } => 2 * kv_dim * 4,
            KvLayout::Mla { kv_lora, rope, .. } => (kv_lora + rope) * 4,
        }
    }

    /// Indexer-key bytes per position.
    pub fn index_bytes_per_token(self) -> usize {
        match self {
            KvLayout::Gqa { .. } => 0,
            KvLayout::Mla { index_dim, .. } => index_dim * 4,
        }
    }
}

/// Per-layer KV storage for one sequence.
pub struct KvCache {
    pub layers: Vec<LayerKv>,
    layouts: Vec<KvLayout>,
    capacity: usize,
    len: usize,
}

impl KvCache {
    /// A cache for `capacity` positions with one layer per layout.
    pub fn new(layouts: &[KvLayout], capacity: usize) -> KvCache {
        KvCache {
            layers: layouts.iter().map(|l| LayerKv::new(*l, capacity)).collect(),
            layouts: layouts.to_vec(),
            capacity,
            len: 0,
        }
    }

    /// Positions filled so far (by completed forwards).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is filled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions the cache can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Checks that `n` more positions fit.
    pub fn reserve(&self, n: usize) -> Result<()> {
        if self.len + n > self.capacity {
            return Err(Error::Request(format!(
                "context of {} tokens exceeds the KV cache capacity {}",
                self.len + n,
                self.capacity
            )));
        }
        Ok(())
    }

    /// Marks `n` positions appended (after every layer wrote them).
    pub fn advance(&mut self, n: usize) {
        assert!(self.len + n <= self.capacity, "KV cache overflow");
        self.len += n;
    }

    /// The layouts, one per layer.
    pub fn layouts(&self) -> &[KvLayout] {
        &self.layouts
    }

    /// Forgets every position from `len` on (a shorter prefix is reused;
    /// the rows past it are overwritten by the next forwards).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Grows the capacity to at least `capacity` positions, keeping the
    /// filled rows (a reused prefix continuing a longer request).
    pub fn grow(&mut self, capacity: usize) {
        if capacity <= self.capacity {
            return;
        }
        for (layer, layout) in self.layers.iter_mut().zip(&self.layouts) {
            for (buf, width) in layer.buffers_mut(*layout) {
                buf.resize(capacity * width, 0.0);
            }
        }
        self.capacity = capacity;
    }

    /// A new cache of `capacity` positions (at least this one's filled
    /// ones) holding a copy of the filled rows: a sequence forked after
    /// its prompt (a request's choices share the prompt's positions,
    /// computed once).
    pub fn fork(&mut self, capacity: usize) -> KvCache {
        let mut out = KvCache::new(&self.layouts, capacity.max(self.len));
        let len = self.len;
        let layouts = self.layouts.clone();
        let layers = self.layers.iter_mut().zip(out.layers.iter_mut());
        for ((src, dst), layout) in layers.zip(layouts) {
            let pairs = src
                .buffers_mut(layout)
                .into_iter()
                .zip(dst.buffers_mut(layout));
            for ((from, width), (to, _)) in pairs {
                to[..len * width].copy_from_slice(&from[..len * width]);
            }
        }
        out.len = len;
        out
    }

    /// Attention-cache bytes per position summed over layers (indexer keys excluded).
    pub fn attention_bytes_per_token(&self) -> usize {
        self.layouts
            .iter()
            .map(|l| l.attention_bytes_per_token())
            .sum()
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.layouts
            .iter()
            .map(|l| (l.attention_bytes_per_token() + l.index_bytes_per_token()) * self.capacity)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mla_caches_only_latent_and_rotary_key() {
        let l = KvLayout::Mla {
            kv_lora: 512,
            rope: 64,
            index_dim: 128,
        };
        assert_eq!(l.attention_bytes_per_token(), 576 * 4);
        let gqa = KvLayout::Gqa { kv_dim: 128 * 128 };
        assert_eq!(
            gqa.attention_bytes_per_token() / l.attention_bytes_per_token(),
            56
        );
        let kv = KvCache::new(&[l, l], 10);
        assert_eq!(kv.attention_bytes_per_token(), 2 * 576 * 4);
        assert_eq!(kv.bytes(), 2 * (576 + 128) * 4 * 10);
    }

    #[test]
    fn a_fork_copies_the_filled_rows_into_its_own_capacity() {
        let layouts = [
            KvLayout::Gqa { kv_dim: 2 },
            KvLayout::Mla {
                kv_lora: 1,
                rope: 1,
                index_dim: 1,
            },
        ];
        let mut kv = KvCache::new(&layouts, 4);
        let mut x = 0.0;
        for (layer, layout) in kv.layers.iter_mut().zip(layouts) {
            for (buf, _) in layer.buffers_mut(layout) {
                for v in buf.iter_mut() {
                    x += 1.0;
                    *v = x;
                }
            }
        }
        kv.advance(3);
        let mut fork = kv.fork(6);
        assert_eq!((fork.len(), fork.capacity()), (3, 6));
        for ((a, b), layout) in kv
            .layers
            .iter_mut()
            .zip(fork.layers.iter_mut())
            .zip(layouts)
        {
            for ((a, w), (b, _)) in a.buffers_mut(layout).into_iter().zip(b.buffers_mut(layout)) {
                assert_eq!(a[..3 * w], b[..3 * w]);
                assert!(b[3 * w..].iter().all(|&v| v == 0.0), "past the filled rows");
            }
        }
        assert_eq!(
            kv.fork(1).capacity(),
            3,
            "never shorter than the filled rows"
        );
    }

    #[test]
    fn reserve_refuses_overflow() {
        let kv = KvCache::new(&[KvLayout::Gqa { kv_dim: 4 }], 3);
        assert!(kv.reserve(3).is_ok());
        assert!(kv.reserve(4).is_err());
    }
}
