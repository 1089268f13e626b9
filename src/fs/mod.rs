//! The one door to files: every file a user can point at is read through
//! [`read`](mod@read) (regular files only, checked on the opened descriptor, with a
//! named size cap), and every file the program writes goes through
//! [`write`](mod@write) (a temp file of an unpredictable name created with
//! `O_EXCL | O_NOFOLLOW` beside the target, synced and renamed; removed on
//! every error). [`guard`] refuses an output that is one of the command's
//! inputs; [`print`](mod@print) fingerprints a file's content cheaply; [`lock`] holds a
//! directory against a second process.
//!
//! Invariants: nothing here blocks on a FIFO, reads without bound, writes
//! through a device or a planted symlink, or leaves a temp file behind on
//! an error it sees.
//!
//! Not through here, on purpose: the kernel's own files (`/proc`, `/sys`,
//! cgroup control files such as `memory.max`), which are read as the kernel
//! serves them and written in place (a rename cannot replace them), and the
//! expert reads of `moestream-io` (shards already opened through
//! [`read::open`]'s checks by the weight index).

pub mod guard;
pub mod lock;
pub mod print;
pub mod read;
pub mod state;
pub mod tuned;
pub mod write;

pub use guard::check_not_input;
pub use read::{open, read, read_to_string, Cap};
pub use write::{remove_stale, write, Output};
