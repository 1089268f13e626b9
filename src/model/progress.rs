//! Progress of long work (loading the resident weights, prefilling a long
//! prompt), reported through a hook the caller installs: the library never
//! draws anything and holds no global. The CLI turns reports into progress
//! bars on a terminal (indicatif); everywhere else the hook is off and a
//! report costs one branch.
//!
//! Reports are made between units of work (a layer loaded, a prefill chunk
//! done), never inside a kernel or a read.
//!
//! An [`Interrupt`] is the other direction: another thread asks long work
//! to stop, and the work checks it at the same boundaries (a server
//! shutting down stops a prefill of minutes within a layer's sub-chunk).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What is progressing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Work {
    /// Reading the resident weights at load, in bytes.
    Load,
    /// Prefilling a prompt of more than one chunk, in positions.
    Prefill,
}

type Report = dyn Fn(Work, u64, u64) + Send + Sync;

/// A progress hook: `report(work, done, total)`; off by default.
#[derive(Clone, Default)]
pub struct Progress(Option<Arc<Report>>);

impl Progress {
    /// A hook calling `f(work, done, total)` on every report; `done ==
    /// total` ends a piece of work.
    pub fn new(f: impl Fn(Work, u64, u64) + Send + Sync + 'static) -> Progress {
        Progress(Some(Arc::new(f)))
    }

    /// Whether a hook is installed.
    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Reports `done` of `total` (clamped to `total`).
    pub fn report(&self, work: Work, done: u64, total: u64) {
        if let Some(f) = &self.0 {
            f(work, done.min(total), total);
        }
    }
}

impl fmt::Debug for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.is_on() {
            "Progress(on)"
        } else {
            "Progress(off)"
        })
    }
}

/// A request, from any thread, that long work stop at its next boundary;
/// clones share one flag. Raised stays raised.
#[derive(Clone, Debug, Default)]
pub struct Interrupt(Arc<AtomicBool>);

impl Interrupt {
    /// Asks the work to stop.
    pub fn raise(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether [`Interrupt::raise`] was called.
    pub fn is_raised(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// `Err(Interrupted)` once raised: the work's check at a boundary.
    pub fn check(&self) -> crate::error::Result<()> {
        match self.is_raised() {
            true => Err(crate::error::Error::Interrupted),
            false => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn reports_reach_the_hook_clamped_and_off_costs_nothing() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let p = Progress::new(move |w, d, t| s.lock().unwrap().push((w, d, t)));
        assert!(p.is_on());
        p.report(Work::Load, 5, 10);
        p.report(Work::Prefill, 12, 10);
        assert_eq!(
            *seen.lock().unwrap(),
            vec![(Work::Load, 5, 10), (Work::Prefill, 10, 10)]
        );
        let off = Progress::default();
        assert!(!off.is_on());
        off.report(Work::Load, 1, 2);
        assert_eq!(format!("{off:?}"), "Progress(off)");
    }

    #[test]
    fn an_interrupt_raised_by_a_clone_stops_the_work() {
        let work = Interrupt::default();
        assert!(work.check().is_ok());
        let asker = work.clone();
        std::thread::spawn(move || asker.raise()).join().unwrap();
        assert!(work.is_raised());
        assert!(matches!(
            work.check(),
            Err(crate::error::Error::Interrupted)
        ));
    }
}
