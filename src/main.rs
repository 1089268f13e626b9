//! The `moestream` binary: sets the allocator up, then hands over to the
//! command line ([`cli`]; `moestream --help` lists its commands).

mod cli;

/// Large buffers (expert matrices, slabs) above this size are mapped and
/// unmapped by the allocator rather than carved from its heap.
const MMAP_THRESHOLD: libc::c_int = 1 << 20;

fn main() -> std::process::ExitCode {
    // glibc raises its mmap threshold each time a mapped chunk is freed (up
    // to 32 MiB), after which freed expert buffers stay in the heap and the
    // resident set creeps past `--ram-gb` (measured: 3.99 GiB against a
    // 3.26 GiB plan on a GLM-5-shaped model). A fixed threshold turns the
    // dynamic one off, so a freed expert's pages go back to the system.
    // SAFETY: mallopt is called once, before any other thread exists, with
    // a valid parameter and value; it only tunes the allocator.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
    cli::main()
}
