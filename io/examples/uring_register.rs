//! Do io_uring's registered buffers and fixed files pay on expert-sized
//! reads? (issue 18, item 2: keep them only if they gain ≥ 3%.)
//!
//! Reads FILE with O_DIRECT through one ring, `depth` reads in flight, each
//! `size` bytes at random aligned offsets, in three setups:
//!
//! - `plain`: `IORING_OP_READ` on the file descriptor (what the reactor does);
//! - `fixed-file`: the same on a registered file (`types::Fixed`);
//! - `fixed-both`: `IORING_OP_READ_FIXED` into registered buffers, on the
//!   registered file.
//!
//! Rounds alternate the setups; it prints each setup's median GB/s and the
//! median CPU seconds the reading thread spent per GB (getrusage of the
//! thread), and each against `plain`. Drop the page cache first if FILE
//! could be cached (O_DIRECT bypasses it, but a cached file still skews).
//!
//! `cargo run --release -p moestream-io --example uring_register -- FILE [size_mib] [depth] [rounds] [seconds]`

use io_uring::{opcode, types, IoUring};
use moestream_io::AlignedBuf;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Setup {
    Plain,
    FixedFile,
    FixedBoth,
}

const SETUPS: [Setup; 3] = [Setup::Plain, Setup::FixedFile, Setup::FixedBoth];

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1) else {
        eprintln!("usage: uring_register FILE [size_mib] [depth] [rounds] [seconds]");
        std::process::exit(2);
    };
    let arg = |i: usize, default: f64| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(default);
    let (size_mib, depth, rounds, secs) = (arg(2, 18.0), arg(3, 4.0), arg(4, 5.0), arg(5, 3.0));
    let sane = (1.0 / 256.0..=1024.0).contains(&size_mib)
        && (1.0..=256.0).contains(&depth)
        && (1.0..=1000.0).contains(&rounds)
        && (0.01..=3600.0).contains(&secs);
    if !sane {
        eprintln!("size_mib in [1/256, 1024], depth in [1, 256], rounds in [1, 1000], seconds in [0.01, 3600]");
        std::process::exit(2);
    }
    let size = ((size_mib * (1 << 20) as f64) as usize).next_multiple_of(4096);
    let (depth, rounds) = (depth as usize, rounds as usize);
    let seconds = Duration::from_secs_f64(secs);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)?;
    let len = file.metadata()?.len();
    if len < (size * depth) as u64 {
        eprintln!("{path} is smaller than {depth} reads of {size} bytes");
        std::process::exit(2);
    }
    println!("file {path}: {} GB; reads of {size} bytes, {depth} in flight, {rounds} rounds of {seconds:?}", len as f64 / 1e9);
    let mut results: Vec<(Setup, Vec<(f64, f64)>)> =
        SETUPS.iter().map(|&s| (s, Vec::new())).collect();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..rounds {
        for (setup, rows) in results.iter_mut() {
            let r = run(&file, len, *setup, size, depth, seconds, &mut seed)?;
            println!(
                "round {round} {setup:?}: {:.3} GB/s, {:.4} CPU s/GB",
                r.0, r.1
            );
            rows.push(r);
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let summary: Vec<(Setup, f64, f64)> = results
        .iter()
        .map(|(s, rows)| {
            (
                *s,
                median(rows.iter().map(|r| r.0).collect()),
                median(rows.iter().map(|r| r.1).collect()),
            )
        })
        .collect();
    let (_, plain_gbs, plain_cpu) = summary[0];
    println!("| setup | GB/s (median) | vs plain | CPU s per GB (median) | vs plain |");
    println!("|---|---|---|---|---|");
    for (s, gbs, cpu) in summary {
        println!(
            "| {s:?} | {gbs:.3} | {:.3}x | {cpu:.4} | {:.2}x |",
            gbs / plain_gbs,
            cpu / plain_cpu.max(1e-12)
        );
    }
    Ok(())
}

/// One timed run of `setup`: (GB/s, CPU seconds of this thread per GB).
fn run(
    file: &std::fs::File,
    len: u64,
    setup: Setup,
    size: usize,
    depth: usize,
    seconds: Duration,
    seed: &mut u64,
) -> std::io::Result<(f64, f64)> {
    let mut ring = IoUring::new(depth as u32 * 2)?;
    let mut bufs: Vec<AlignedBuf> = (0..depth)
        .map(|_| AlignedBuf::new(size).map_err(std::io::Error::other))
        .collect::<Result<_, _>>()?;
    for b in bufs.iter_mut() {
        b.as_mut_slice().fill(1); // fault the pages in before timing
    }
    if setup != Setup::Plain {
        ring.submitter().register_files(&[file.as_raw_fd()])?;
    }
    if setup == Setup::FixedBoth {
        let iovecs: Vec<libc::iovec> = bufs
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_slice().as_mut_ptr().cast(),
                iov_len: size,
            })
            .collect();
        // SAFETY: the buffers outlive the ring's use of them: they are
        // unregistered (the ring dropped) before `bufs` is dropped below.
        unsafe { ring.submitter().register_buffers(&iovecs)? };
    }
    let slots = len / size as u64;
    let mut next_offset = || {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        (*seed % slots) * size as u64
    };
    let cpu0 = thread_cpu();
    let start = Instant::now();
    let mut bytes = 0u64;
    let mut inflight = 0;
    let mut free: Vec<usize> = (0..depth).collect();
    loop {
        let timed_out = start.elapsed() >= seconds;
        while !timed_out && !free.is_empty() {
            let i = free.pop().expect("a free buffer");
            let buf = bufs[i].as_mut_slice().as_mut_ptr();
            let offset = next_offset();
            let sqe = match setup {
                Setup::Plain => opcode::Read::new(types::Fd(file.as_raw_fd()), buf, size as u32)
                    .offset(offset)
                    .build(),
                Setup::FixedFile => opcode::Read::new(types::Fixed(0), buf, size as u32)
                    .offset(offset)
                    .build(),
                Setup::FixedBoth => {
                    opcode::ReadFixed::new(types::Fixed(0), buf, size as u32, i as u16)
                        .offset(offset)
                        .build()
                }
            };
            // SAFETY: buffer i is not reused until its completion is reaped
            // (it returns to `free` only then), and the file stays open.
            unsafe { ring.submission().push(&sqe.user_data(i as u64)) }
                .map_err(std::io::Error::other)?;
            inflight += 1;
        }
        if inflight == 0 {
            break;
        }
        ring.submit_and_wait(1)?;
        for cqe in ring.completion() {
            if cqe.result() < 0 {
                return Err(std::io::Error::from_raw_os_error(-cqe.result()));
            }
            bytes += cqe.result() as u64;
            inflight -= 1;
            free.push(cqe.user_data() as usize);
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let cpu = thread_cpu() - cpu0;
    drop(ring);
    drop(bufs);
    let gb = bytes as f64 / 1e9;
    Ok((gb / wall, cpu / gb.max(1e-12)))
}

/// CPU seconds (user + system) of the calling thread.
fn thread_cpu() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_THREAD with a valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}
