//! moestream-io: getting bytes from NVMe into memory, with no knowledge of
//! models.
//!
//! What this crate owns:
//! - [`AlignedBuf`], the O_DIRECT-safe buffer, and [`Slab`]/[`SlabPool`],
//!   the owned result of a read and the bounded pool that recycles buffers;
//! - the read modes ([`ReadMode`]: direct, buffered, drop, mmap, pread)
//!   behind one trait, [`RangeReader`], opened with [`open`]; O_DIRECT is
//!   probed once per file with a reported fallback
//!   ([`RangeReader::effective_mode`]);
//! - the io_uring [`Reactor`]: batches of owned-buffer reads with a bounded
//!   queue depth, returned in completion order, probed at construction so
//!   callers can fall back to the synchronous readers; and
//!   [`ReactorService`], the reactor on its own thread, fed over a channel;
//! - [`coalesce`], merging nearby ranges into larger reads within named
//!   limits;
//! - [`sweep`], the raw disk sweep over modes, block sizes and queue depths
//!   (`moestream bench io`, and what `moestream tune` measures a disk
//!   with), with its CSV and its SVG plot ([`Figure`], a dependency-free
//!   line-plot writer).
//!
//! Unsafe code lives only in `aligned` (the allocation), `ring` (handing
//! buffers to the kernel), `reactor` (keeping them alive until completion)
//! and the mmap reader.

mod aligned;
mod bench;
mod coalesce;
mod error;
mod file;
mod mode;
mod plot;
mod reactor;
mod read_service;
mod ring;
mod service;
mod slab;
mod source;
mod sweep;

pub use aligned::{align_up, alloc_stats, AlignedBuf, ALIGN, MAP_BYTES_MIN};
pub use coalesce::{coalesce, ByteRange, CoalesceLimits, MergedRead};
pub use error::IoError;
pub use file::{DirectSpan, OpenFile};
pub use mode::ReadMode;
pub use plot::{Figure, Panel, Series};
pub use reactor::{FaultInjector, Priority, Reactor, ReactorConfig, ReadDone, ReadReq};
pub use read_service::{
    read_service, ReactorReads, ReadService, SourceRead, ThreadReads, REACTOR_PATH,
};
pub use service::{Batch, BatchEvent, ReactorService, ReadCounters, ServiceCounters};
pub use slab::{PoolStats, Slab, SlabPool};
pub use source::{open, open_with_pool, shared_pool, RangeReader, SHARED_POOLED_BYTES_MAX};
pub use sweep::{
    device_read_bytes, drop_page_cache, size_label, sweep, sweep_svg, write_csv, ReadEngine,
    SweepConfig, SweepRow, CSV_HEADER, SWEEP_DEPTH_MAX,
};
