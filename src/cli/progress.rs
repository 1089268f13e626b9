//! Progress bars (indicatif) on stderr, drawn only when stderr is a
//! terminal: loading the resident weights, prefill of a long prompt (both
//! through the library's [`Progress`] hook), `tune`'s probes and `bench
//! sweep`'s budgets. Piped or redirected output gets no bar and no
//! escape codes.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use moestream::model::progress::{Progress, Work};
use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::Mutex;

/// Whether bars are drawn: stderr is a terminal.
pub(super) fn on() -> bool {
    std::io::stderr().is_terminal()
}

/// The hook for loading and prefill: one bar per piece of work, created at
/// its first report and cleared when it completes; off when not on a
/// terminal.
pub(super) fn hook() -> Progress {
    if !on() {
        return Progress::default();
    }
    let bars: Mutex<HashMap<Work, ProgressBar>> = Mutex::new(HashMap::new());
    Progress::new(move |work, done, total| {
        let mut bars = bars.lock().unwrap_or_else(|e| e.into_inner());
        if done >= total {
            if let Some(b) = bars.remove(&work) {
                b.finish_and_clear();
            }
            return;
        }
        let b = bars.entry(work).or_insert_with(|| match work {
            Work::Load => bar(total, "loading resident weights", Unit::Bytes),
            Work::Prefill => bar(total, "prefill", Unit::Count("positions")),
        });
        b.set_position(done);
    })
}

/// What a bar counts.
#[derive(Clone, Copy)]
pub(super) enum Unit {
    Bytes,
    Count(&'static str),
}

/// A bar of `len` units labelled `msg`; hidden when not on a terminal.
pub(super) fn bar(len: u64, msg: &'static str, unit: Unit) -> ProgressBar {
    if !on() {
        return ProgressBar::hidden();
    }
    let template = match unit {
        Unit::Bytes => "{msg} [{bar:30}] {bytes}/{total_bytes} ({eta})".to_string(),
        Unit::Count(what) => format!("{{msg}} [{{bar:30}}] {{pos}}/{{len}} {what} ({{eta}})"),
    };
    let b = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    b.set_style(
        ProgressStyle::with_template(&template)
            .expect("a valid progress template")
            .progress_chars("=> "),
    );
    b.set_message(msg);
    b
}
