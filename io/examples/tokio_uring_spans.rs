//! tokio-uring against our reactor on the same coalesced expert spans at
//! the same queue depth (issue 32, item 7).
//!
//! Makes FILE (`size_gib`, default 2 GiB) of `experts` routed experts laid
//! out as the container lays them: per expert its gate, up and down tensors
//! and their row scales, back to back, each expert starting on a page. The
//! ranges of one expert coalesce ([`moestream_io::coalesce`], the store's
//! limits) into one span, as the store reads it. A seeded list of expert
//! ids (top-k of a uniform router per token) is then read, span by span,
//! with `depth` reads in flight, by:
//!
//! - `reactor`: [`moestream_io::Reactor::submit_stream_with`] on one
//!   thread, buffers from a [`moestream_io::SlabPool`] (what the store uses);
//! - `tokio-uring`: `tokio_uring::fs::File::read_at` on tokio-uring's
//!   current-thread runtime, `depth` tasks each reading into its own
//!   4096-aligned buffer.
//!
//! Both open FILE with O_DIRECT when the filesystem allows it (said
//! otherwise). Rounds alternate which goes first; it prints each reader's
//! median GB/s, median read latency and the CPU seconds its thread spent
//! per GB read (getrusage of the thread), and tokio-uring's against the
//! reactor's.
//!
//! `cargo run --release -p moestream-io --example tokio_uring_spans -- DIR [size_gib] [expert_mib] [depth] [rounds] [reads]`

use moestream_io::{
    coalesce, AlignedBuf, ByteRange, CoalesceLimits, OpenFile, Reactor, ReactorConfig, ReadReq,
    SlabPool,
};
use std::cell::{Cell, RefCell};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

/// The store's coalescing limits (src/store/layout.rs).
const LIMITS: CoalesceLimits = CoalesceLimits {
    merged_bytes_max: 1 << 30,
    gap_bytes_max: 64 << 10,
};
const TOP_K: usize = 8;
const SEED: u64 = 0x5eed_0032;

/// One round's figures: GB/s, median read latency (µs), CPU s per GB.
#[derive(Clone, Copy)]
struct Round {
    gb_s: f64,
    p50_us: f64,
    cpu_s_per_gb: f64,
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let Some(dir) = args.get(1) else {
        eprintln!("usage: tokio_uring_spans DIR [size_gib] [expert_mib] [depth] [rounds] [reads]");
        std::process::exit(2);
    };
    let arg = |i: usize, default: f64| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(default);
    let (size_gib, expert_mib) = (arg(2, 2.0), arg(3, 4.5));
    let (depth, rounds, reads) = (arg(4, 4.0), arg(5, 5.0), arg(6, 256.0));
    let sane = (0.01..=64.0).contains(&size_gib)
        && (0.1..=256.0).contains(&expert_mib)
        && (1.0..=256.0).contains(&depth)
        && (1.0..=100.0).contains(&rounds)
        && (1.0..=100_000.0).contains(&reads);
    if !sane {
        eprintln!("size_gib in [0.01, 64], expert_mib in [0.1, 256], depth in [1, 256], rounds in [1, 100], reads in [1, 100000]");
        std::process::exit(2);
    }
    let path = Path::new(dir).join("tokio_uring_spans.bin");
    let spans = make_file(&path, size_gib, expert_mib)?;
    let order = routed_order(spans.len(), reads as usize);
    let depth = depth as usize;
    let probe = OpenFile::open(&path, true).map_err(std::io::Error::other)?;
    let direct = probe.is_direct();
    drop(probe);
    println!(
        "{} experts of {:.2} MiB (one coalesced span each), {} reads a round, depth {depth}, {}",
        spans.len(),
        spans[0].1 as f64 / (1 << 20) as f64,
        order.len(),
        if direct {
            "O_DIRECT"
        } else {
            "buffered (this filesystem refuses O_DIRECT)"
        }
    );
    let reqs: Vec<(u64, usize)> = order.iter().map(|&e| spans[e]).collect();
    let mut reactor = Vec::new();
    let mut tokio = Vec::new();
    for r in 0..rounds as usize {
        if r % 2 == 0 {
            reactor.push(read_reactor(&path, &reqs, depth)?);
            tokio.push(read_tokio_uring(&path, &reqs, depth, direct)?);
        } else {
            tokio.push(read_tokio_uring(&path, &reqs, depth, direct)?);
            reactor.push(read_reactor(&path, &reqs, depth)?);
        }
    }
    report(&reactor, &tokio);
    std::fs::remove_file(&path)
}

/// Writes the file (unless one of this size is there) and returns each
/// expert's coalesced span (offset, len).
fn make_file(path: &Path, size_gib: f64, expert_mib: f64) -> std::io::Result<Vec<(u64, usize)>> {
    // gate and up (inter × hidden) and down (hidden × inter) in int4 with
    // f32 row scales: three equal packed parts, a few KiB of scales each.
    let part = ((expert_mib * (1 << 20) as f64) as usize / 3).next_multiple_of(4096);
    let scales = 4096;
    let expert = (3 * (part + scales)).next_multiple_of(4096);
    let total = (size_gib * (1u64 << 30) as f64) as u64;
    let experts = (total / expert as u64).max(1) as usize;
    let bytes = experts as u64 * expert as u64;
    if std::fs::metadata(path).ok().map(|m| m.len()) != Some(bytes) {
        let mut f = std::io::BufWriter::with_capacity(8 << 20, std::fs::File::create(path)?);
        let mut block = vec![0u8; 8 << 20];
        let mut x = SEED;
        let mut left = bytes;
        while left > 0 {
            for b in block.chunks_exact_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                b.copy_from_slice(&x.to_le_bytes());
            }
            let n = left.min(block.len() as u64) as usize;
            f.write_all(&block[..n])?;
            left -= n as u64;
        }
        f.into_inner()?.sync_all()?;
    }
    Ok((0..experts)
        .map(|e| {
            let base = (e * expert) as u64;
            let ranges: Vec<ByteRange> = (0..3)
                .flat_map(|i| {
                    let at = base + (i * (part + scales)) as u64;
                    [
                        ByteRange {
                            offset: at,
                            len: part as u64,
                        },
                        ByteRange {
                            offset: at + part as u64,
                            len: scales as u64,
                        },
                    ]
                })
                .collect();
            let merged = coalesce(&ranges, LIMITS);
            assert_eq!(merged.len(), 1, "an expert's parts coalesce into one span");
            (merged[0].offset, merged[0].len as usize)
        })
        .collect())
}

/// Expert ids in the order a decode reads them: per token, top-k distinct
/// experts of a uniform router (seeded), `reads` in all.
fn routed_order(experts: usize, reads: usize) -> Vec<usize> {
    let mut x = SEED | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut out = Vec::with_capacity(reads);
    while out.len() < reads {
        let mut token: Vec<usize> = Vec::with_capacity(TOP_K);
        while token.len() < TOP_K.min(experts) {
            let e = (next() % experts as u64) as usize;
            if !token.contains(&e) {
                token.push(e);
            }
        }
        out.extend(token);
    }
    out.truncate(reads);
    out
}

/// CPU seconds this thread has used.
fn thread_cpu_s() -> f64 {
    // SAFETY: getrusage writes one `rusage` into the zeroed value we own.
    let u = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut u);
        u
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

fn figures(bytes: u64, wall_s: f64, cpu_s: f64, mut lat_us: Vec<f64>) -> Round {
    lat_us.sort_by(f64::total_cmp);
    let gb = bytes as f64 / 1e9;
    Round {
        gb_s: gb / wall_s,
        p50_us: lat_us[lat_us.len() / 2],
        cpu_s_per_gb: cpu_s / gb,
    }
}

/// One round through the reactor: `depth` reads in flight, refilled as
/// each completes.
fn read_reactor(path: &Path, reqs: &[(u64, usize)], depth: usize) -> std::io::Result<Round> {
    let file = Arc::new(OpenFile::open(path, true).map_err(std::io::Error::other)?);
    let span = reqs.iter().map(|r| r.1).max().unwrap_or(0);
    let pool = SlabPool::new((depth + 1) * (span + 2 * 4096));
    let config = ReactorConfig {
        depth: depth as u32,
        // The depth is the bound, not the bytes.
        inflight_bytes_max: (depth + 1) * (span + 2 * 4096),
        ..ReactorConfig::default()
    };
    let mut reactor = Reactor::new(config, pool).map_err(std::io::Error::other)?;
    let started: RefCell<Vec<Instant>> = RefCell::new(vec![Instant::now(); reqs.len()]);
    let mut lat = Vec::with_capacity(reqs.len());
    let mut bytes = 0u64;
    let mut next = 0usize;
    let (t0, c0) = (Instant::now(), thread_cpu_s());
    reactor
        .submit_stream_with(
            || {
                let &(offset, len) = reqs.get(next)?;
                started.borrow_mut()[next] = Instant::now();
                next += 1;
                Some(ReadReq {
                    tag: next as u64 - 1,
                    file: file.clone(),
                    offset,
                    len,
                })
            },
            |(tag, slab)| {
                let slab = slab.expect("a reactor read");
                bytes += slab.len() as u64;
                lat.push(started.borrow()[tag as usize].elapsed().as_secs_f64() * 1e6);
            },
        )
        .map_err(std::io::Error::other)?;
    Ok(figures(
        bytes,
        t0.elapsed().as_secs_f64(),
        thread_cpu_s() - c0,
        lat,
    ))
}

/// A 4096-aligned buffer tokio-uring can own while the kernel fills it.
struct Aligned(AlignedBuf);

// SAFETY: the pointer is the buffer's own allocation, which does not move
// while `Aligned` lives (moving `Aligned` moves only the handle); the
// first `len` bytes are initialized (AlignedBuf zeroes its allocation).
unsafe impl tokio_uring::buf::IoBuf for Aligned {
    fn stable_ptr(&self) -> *const u8 {
        self.0.as_slice().as_ptr()
    }
    fn bytes_init(&self) -> usize {
        self.0.len()
    }
    fn bytes_total(&self) -> usize {
        self.0.capacity()
    }
}

// SAFETY: as above; `set_init` only ever grows the exposed length within
// the capacity, whose bytes are zeroed, so initialized.
unsafe impl tokio_uring::buf::IoBufMut for Aligned {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr()
    }
    unsafe fn set_init(&mut self, pos: usize) {
        if pos > self.0.len() {
            self.0.set_len(pos);
        }
    }
}

/// One round through tokio-uring: `depth` tasks, each taking the next span
/// and reading it into its own buffer.
fn read_tokio_uring(
    path: &Path,
    reqs: &[(u64, usize)],
    depth: usize,
    direct: bool,
) -> std::io::Result<Round> {
    let reqs: Rc<Vec<(u64, usize)>> = Rc::new(reqs.to_vec());
    let span = reqs.iter().map(|r| r.1).max().unwrap_or(0);
    let path = path.to_path_buf();
    tokio_uring::builder()
        .entries(depth.next_power_of_two().max(4) as u32)
        .start(async move {
            let mut open = tokio_uring::fs::OpenOptions::new();
            open.read(true);
            if direct {
                open.custom_flags(libc::O_DIRECT);
            }
            let file = Rc::new(open.open(&path).await?);
            let next = Rc::new(Cell::new(0usize));
            let (t0, c0) = (Instant::now(), thread_cpu_s());
            let mut tasks = Vec::with_capacity(depth);
            for _ in 0..depth {
                let (file, next, reqs) = (file.clone(), next.clone(), reqs.clone());
                tasks.push(tokio_uring::spawn(async move {
                    let mut buf =
                        Aligned(AlignedBuf::new(span + 4096).map_err(std::io::Error::other)?);
                    let (mut bytes, mut lat) = (0u64, Vec::new());
                    loop {
                        let i = next.get();
                        let Some(&(offset, len)) = reqs.get(i) else {
                            break;
                        };
                        next.set(i + 1);
                        // O_DIRECT: read the page-aligned superset of the span.
                        let start = offset - offset % 4096;
                        let want = (len + (offset - start) as usize).next_multiple_of(4096);
                        buf.0.set_len(0);
                        let slice = tokio_uring::buf::BoundedBuf::slice(buf, ..want);
                        let t = Instant::now();
                        let (got, slice) = file.read_at(slice, start).await;
                        buf = slice.into_inner();
                        let got = got?;
                        if got < len {
                            return Err(std::io::Error::other(format!(
                                "short read at {start}: {got} of {want}"
                            )));
                        }
                        lat.push(t.elapsed().as_secs_f64() * 1e6);
                        bytes += len as u64;
                    }
                    Ok::<_, std::io::Error>((bytes, lat))
                }));
            }
            let (mut bytes, mut lat) = (0u64, Vec::new());
            for t in tasks {
                let (b, l) = t.await.map_err(std::io::Error::other)??;
                bytes += b;
                lat.extend(l);
            }
            let round = figures(bytes, t0.elapsed().as_secs_f64(), thread_cpu_s() - c0, lat);
            Ok(round)
        })
}

fn median(xs: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = xs.collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn report(reactor: &[Round], tokio: &[Round]) {
    println!(
        "| reader | GB/s (median of {}) | read p50 µs | CPU s / GB |",
        reactor.len()
    );
    println!("| --- | --- | --- | --- |");
    let mut meds = Vec::new();
    for (name, rounds) in [("reactor", reactor), ("tokio-uring", tokio)] {
        let m = (
            median(rounds.iter().map(|r| r.gb_s)),
            median(rounds.iter().map(|r| r.p50_us)),
            median(rounds.iter().map(|r| r.cpu_s_per_gb)),
        );
        println!("| {name} | {:.3} | {:.0} | {:.4} |", m.0, m.1, m.2);
        meds.push(m);
    }
    println!(
        "tokio-uring / reactor: GB/s {:.3}, read p50 {:.3}, CPU per GB {:.3}",
        meds[1].0 / meds[0].0,
        meds[1].1 / meds[0].1,
        meds[1].2 / meds[0].2
    );
    for (i, (a, b)) in reactor.iter().zip(tokio).enumerate() {
        println!(
            "round {i}: reactor {:.3} GB/s, tokio-uring {:.3} GB/s",
            a.gb_s, b.gb_s
        );
    }
}
