//! The KV cache of the GQA families: per layer, the rotated keys and the
//! values of every past position, `(positions, kv_heads * head_dim)` each.
//! Sized at creation for the whole request; appending past capacity is a
//! request error, not a reallocation in the decode loop.

use crate::error::{Error, Result};

/// Keys and values of one layer.
pub struct LayerKv {
    /// (capacity, kv_dim), first `len` rows valid.
    pub k: Vec<f32>,
    /// (capacity, kv_dim), first `len` rows valid.
    pub v: Vec<f32>,
}

/// Per-layer KV storage for one sequence.
pub struct KvCache {
    pub layers: Vec<LayerKv>,
    kv_dim: usize,
    capacity: usize,
    len: usize,
}

impl KvCache {
    /// A cache for `capacity` positions of `num_layers` layers of width `kv_dim`.
    pub fn new(num_layers: usize, kv_dim: usize, capacity: usize) -> KvCache {
        let layers = (0..num_layers)
            .map(|_| LayerKv {
                k: vec![0f32; capacity * kv_dim],
                v: vec![0f32; capacity * kv_dim],
            })
            .collect();
        KvCache {
            layers,
            kv_dim,
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

    /// Width of one cached row.
    pub fn kv_dim(&self) -> usize {
        self.kv_dim
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

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.layers.len() * 2 * self.capacity * self.kv_dim * 4
    }
}
