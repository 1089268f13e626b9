//! Read buffers the cache will hold: warmed off the read path, and the
//! gate that lets each layer's cache grow only into buffers already
//! faulted in (results/budget-sweep.md).

use super::ExpertStore;
use std::sync::atomic::Ordering;

impl ExpertStore {
    /// A gated cache (see [`ExpertStore::warm_buffers`]) grows by at most
    /// `misses` slots, and only into idle pooled buffers beyond the plan's
    /// in-flight and prefetch items (2 x top-k, plus the prefetch reads):
    /// this layer's reads then take buffers already faulted in, and the
    /// experts they evict give theirs back. Once warming lags (a busy
    /// machine starves its idle-priority thread), the gate opens for good:
    /// every cache may use all its slots, as an ungated one does, and reads
    /// take warmed buffers while there are any and fault their own when
    /// not. Without that, a machine whose cores were all busy never filled
    /// its cache (hit rate 0.00 against 0.80 idle).
    pub(super) fn grow_into_spare_buffers(&self, layer: usize, misses: usize) {
        if misses == 0 || !self.gated.load(Ordering::Relaxed) {
            return;
        }
        let pool = moestream_io::shared_pool();
        if pool.warming_lags() {
            self.gated.store(false, Ordering::Relaxed);
            for cache in &self.layers {
                cache.lock().slots.grow(usize::MAX);
            }
            return;
        }
        let reserve = 2 * self.top_k + self.schedule.prefetch_experts_max;
        let spare = pool.idle_class_buffers().saturating_sub(reserve);
        self.layers[layer].lock().slots.grow(spare.min(misses));
    }

    /// Starts faulting in, on idle CPU, the read buffers the cache will
    /// hold once full, and gates the caches: each grows only into idle
    /// buffers warming has provided (they start empty, at limit 0, and
    /// reach their slots as fast as memory can be faulted in off the read
    /// path). Called at load, before anything is cached.
    /// Buffers to warm: slots x MoE layers, plus the plan's in-flight item
    /// (2 x top-k: reads landing while the experts they evict are in use)
    /// and the prefetch reads, in one size that fits any of
    /// this model's expert reads. Only for zero-copy experts, whose read
    /// buffers the cache keeps; a float expert is decoded out and its
    /// buffer recycled at once. Without this, every miss until the cache
    /// fills reads into fresh pages and pays their faults inside the read
    /// (the larger the cache, the more such misses: 75 slots decoded slower
    /// than 22 on the Qwen3-30B shapes).
    pub fn warm_buffers(&self) {
        let Some(layer) = self.experts.locations.iter().position(|l| !l.is_empty()) else {
            return;
        };
        let spans = self.experts.plan(layer, 0);
        if !self.zero_copy() || spans.len() != 1 {
            self.limit_idle_buffers();
            return;
        }
        // A direct read covers the 4096-aligned superset of its span.
        let class = moestream_io::align_up(spans[0].len) + moestream_io::ALIGN;
        let slots: usize = (0..self.layers.len()).map(|l| self.slots(l)).sum();
        let held = slots
            .saturating_add(2 * self.top_k)
            .saturating_add(self.schedule.prefetch_experts_max);
        moestream_io::shared_pool().warm(class, held);
        // From now on a cache grows only into buffers warming provided.
        for cache in &self.layers {
            cache.lock().slots.gate(0);
        }
        self.gated.store(true, Ordering::Relaxed);
    }

    /// Without warming (float experts, or experts read as several spans,
    /// such as a GGUF expert's three slices), the buffers the cache holds
    /// are allocated by the reads themselves, and the pool must keep no more
    /// idle than the plan's in-flight item (2 x top-k experts plus the
    /// prefetch reads) covers: its default idle limit (256 MiB) is not in
    /// the RAM plan, and a prefill's burst of reads would leave that much
    /// idle for the rest of the run.
    fn limit_idle_buffers(&self) {
        let Some((ram, _)) = self.expert_bytes() else {
            return;
        };
        let experts = (2 * self.top_k).saturating_add(self.schedule.prefetch_experts_max);
        let bytes = usize::try_from(ram)
            .unwrap_or(usize::MAX)
            .saturating_mul(experts);
        moestream_io::shared_pool().limit_idle(bytes);
    }
}
