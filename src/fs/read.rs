//! The bounded reader: opens with `O_NONBLOCK` (a FIFO cannot block the
//! open), checks the *opened* descriptor with fstat (a path checked first
//! could be swapped before the open), refuses anything but a regular file
//! — FIFOs, sockets, devices, directories — naming it, clears
//! `O_NONBLOCK`, and reads at most a per-use [`Cap`], named in the error.

use crate::error::{Error, Result};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

/// The most bytes one kind of file may hold, and the kind's name for the
/// error that refuses a larger one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cap {
    pub what: &'static str,
    pub bytes: u64,
}

/// Config, tokenizer, generation config, manifests, usage history, tuned
/// profiles, chat templates: the largest real tokenizer.json files are tens
/// of MiB.
pub const JSON_SIDE_FILE: Cap = Cap {
    what: "JSON side file",
    bytes: 256 << 20,
};
/// A `--config` file (TOML): a few hundred settings at most.
pub const CONFIG: Cap = Cap {
    what: "configuration file",
    bytes: 1 << 20,
};
/// `--grammar` (Lark or GBNF).
pub const GRAMMAR: Cap = Cap {
    what: "grammar",
    bytes: 16 << 20,
};
/// `--json-schema`.
pub const JSON_SCHEMA: Cap = Cap {
    what: "JSON schema",
    bytes: 16 << 20,
};
/// A text file of prompts, tasks or evaluation text (`--prompts`,
/// `--tasks`, `--text`, `--prompt-file`).
pub const PROMPTS: Cap = Cap {
    what: "prompt file",
    bytes: 1 << 30,
};
/// A learned predictor (`--prefetch learned:FILE`): a few dense matrices
/// per MoE layer as JSON.
pub const PREDICTOR: Cap = Cap {
    what: "learned predictor",
    bytes: 2 << 30,
};
/// Reference logits (`save_logits`): ids × vocabulary f32 values.
pub const LOGITS: Cap = Cap {
    what: "reference-logits file",
    bytes: 64 << 30,
};
/// A results CSV a command appends a row to (`bench --csv`).
pub const RESULTS_CSV: Cap = Cap {
    what: "results CSV",
    bytes: 1 << 30,
};
/// Any other file of a model directory a conversion copies (tokenizer
/// models, templates, READMEs).
pub const SIDE_FILE: Cap = Cap {
    what: "model side file",
    bytes: 4 << 30,
};
/// An importance file (`calibrate --out`): one f32 per column of every
/// calibrated input.
pub const IMPORTANCE: Cap = Cap {
    what: "importance file",
    bytes: 16 << 30,
};
/// A saved KV file: its header and every row.
pub const KV_FILE: Cap = Cap {
    what: "KV file",
    bytes: 64 << 30,
};

/// What a file that is not regular is, for the error that refuses it.
fn kind(t: std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else {
        "not a file"
    }
}

/// The error that refuses `path` for `reason`.
pub(crate) fn refused(path: &Path, reason: impl Into<String>) -> Error {
    Error::FileRefused {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Refuses `md` unless it is a regular file's.
pub(crate) fn check_regular(path: &Path, md: &std::fs::Metadata) -> Result<()> {
    if md.is_file() {
        return Ok(());
    }
    Err(refused(
        path,
        format!("not a regular file ({})", kind(md.file_type())),
    ))
}

/// Opens `path` for reading if it is a regular file (symlinks followed;
/// the descriptor itself is checked), in blocking mode.
pub fn open(path: &Path) -> Result<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| Error::file(path, e))?;
    let md = file.metadata().map_err(|e| Error::file(path, e))?;
    check_regular(path, &md)?;
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let fd = file.as_raw_fd();
    let flags = fcntl(fd, FcntlArg::F_GETFL).map_err(|e| Error::file(path, e.into()))?;
    let flags = OFlag::from_bits_truncate(flags) & !OFlag::O_NONBLOCK;
    fcntl(fd, FcntlArg::F_SETFL(flags)).map_err(|e| Error::file(path, e.into()))?;
    Ok(file)
}

/// Opens `path` like [`open`] and refuses it if it holds more than `cap`;
/// returns the file and its length.
pub fn open_capped(path: &Path, cap: Cap) -> Result<(File, u64)> {
    let file = open(path)?;
    let len = file.metadata().map_err(|e| Error::file(path, e))?.len();
    if len > cap.bytes {
        return Err(over(path, cap, &format!("{len} bytes")));
    }
    Ok((file, len))
}

fn over(path: &Path, cap: Cap, size: &str) -> Error {
    refused(
        path,
        format!(
            "{size}, over the {}-byte limit of a {}",
            cap.bytes, cap.what
        ),
    )
}

/// The bytes of the regular file `path`, at most `cap`.
pub fn read(path: &Path, cap: Cap) -> Result<Vec<u8>> {
    let (file, len) = open_capped(path, cap)?;
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(cap.bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::file(path, e))?;
    if bytes.len() as u64 > cap.bytes {
        return Err(over(path, cap, "grew while read"));
    }
    Ok(bytes)
}

/// The text of the regular file `path`, at most `cap`.
pub fn read_to_string(path: &Path, cap: Cap) -> Result<String> {
    String::from_utf8(read(path, cap)?).map_err(|e| {
        refused(
            path,
            format!("not UTF-8 text (byte {})", e.utf8_error().valid_up_to()),
        )
    })
}

/// A long sequential read of an opened file (from [`open`]) from its
/// current position: it advises the kernel to read `ahead` bytes past what
/// was consumed (`WILLNEED`, so the reads queue deeper than the device's
/// read-ahead window) and to drop what was consumed (`DONTNEED`, so the
/// page cache a memory cgroup counts does not grow with the file). Advice
/// is a hint: the bytes are the file's whatever the kernel does with it.
pub struct Streamed {
    file: File,
    ahead: u64,
    /// The position reached, the end of the range advised `WILLNEED`, and
    /// the end of the range dropped.
    pos: u64,
    advised: u64,
    dropped: u64,
}

impl Streamed {
    /// Streams `file` from its current position, advising `ahead` bytes.
    pub fn new(mut file: File, ahead: u64) -> std::io::Result<Streamed> {
        use std::io::Seek;
        let pos = file.stream_position()?;
        Ok(Streamed {
            file,
            ahead: ahead.max(1),
            pos,
            advised: pos,
            dropped: pos,
        })
    }

    fn advise(&self, from: u64, len: u64, advice: nix::fcntl::PosixFadviseAdvice) {
        let (Ok(from), Ok(len)) = (i64::try_from(from), i64::try_from(len)) else {
            return;
        };
        // A hint: its failure changes nothing read.
        let _ = nix::fcntl::posix_fadvise(self.file.as_raw_fd(), from, len, advice);
    }
}

impl Read for Streamed {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use nix::fcntl::PosixFadviseAdvice::{POSIX_FADV_DONTNEED, POSIX_FADV_WILLNEED};
        if self.advised < self.pos.saturating_add(self.ahead / 2) {
            let end = self.pos.saturating_add(self.ahead);
            self.advise(self.advised, end - self.advised, POSIX_FADV_WILLNEED);
            self.advised = end;
        }
        let n = self.file.read(buf)?;
        self.pos += n as u64;
        if self.pos - self.dropped >= self.ahead / 4 || n == 0 {
            self.advise(self.dropped, self.pos - self.dropped, POSIX_FADV_DONTNEED);
            self.dropped = self.pos;
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_a_fifo_and_a_directory_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("f");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        for (p, what) in [
            (Path::new("/dev/zero"), "character device"),
            (fifo.as_path(), "FIFO"),
            (dir.path(), "directory"),
        ] {
            let e = read(p, GRAMMAR).unwrap_err().to_string();
            assert!(
                e.contains(&p.display().to_string()) && e.contains(what),
                "{e}"
            );
        }
    }

    #[test]
    fn a_streamed_read_gives_the_file_from_where_it_was() {
        use std::io::{Seek, SeekFrom};
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        let bytes: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&p, &bytes).unwrap();
        for (start, ahead) in [(0u64, 4096u64), (13, 1), (99_999, 1 << 20)] {
            let mut f = open(&p).unwrap();
            f.seek(SeekFrom::Start(start)).unwrap();
            let mut got = Vec::new();
            let mut s = Streamed::new(f, ahead).unwrap();
            let mut chunk = [0u8; 3000];
            loop {
                let n = s.read(&mut chunk).unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&chunk[..n]);
            }
            assert_eq!(got, &bytes[start as usize..], "from {start}, ahead {ahead}");
        }
    }

    #[test]
    fn a_file_over_its_cap_is_refused_naming_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("g");
        std::fs::write(&p, vec![b'a'; 100]).unwrap();
        let cap = Cap {
            what: "test file",
            bytes: 99,
        };
        let e = read(&p, cap).unwrap_err().to_string();
        assert!(e.contains("99-byte limit of a test file"), "{e}");
        assert_eq!(read(&p, GRAMMAR).unwrap().len(), 100);
    }
}
