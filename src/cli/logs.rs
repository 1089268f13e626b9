//! The log subscriber: `tracing` events (the library's warnings, the
//! CLI's info and debug lines) go to stderr, as text or one JSON object a
//! line. The level: `-q` errors only, default warnings, `-v` info, `-vv`
//! debug, `-vvv` trace; without `-v`/`-q`, `RUST_LOG` (an env-filter
//! directive such as `moestream=debug`) when set. Flags beat the
//! environment, as everywhere in the CLI.

use clap::{ArgAction, Args, ValueEnum};

#[derive(Args, Clone, Debug)]
pub(super) struct LogArgs {
    /// More log output on stderr: -v info, -vv debug, -vvv trace (default:
    /// warnings; without -v or -q, RUST_LOG when set).
    #[arg(short, long, action = ArgAction::Count, global = true)]
    verbose: u8,
    /// Errors only in the log.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    quiet: bool,
    /// Log lines as text or JSON (one object a line).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(super) enum LogFormat {
    Text,
    Json,
}

impl LogArgs {
    /// The filter directive the flags ask for; `None` leaves it to
    /// `RUST_LOG` (and then to warnings).
    fn directive(&self) -> Option<&'static str> {
        match (self.quiet, self.verbose) {
            (true, _) => Some("error"),
            (false, 0) => None,
            (false, 1) => Some("info"),
            (false, 2) => Some("debug"),
            (false, _) => Some("trace"),
        }
    }
}

/// Installs the subscriber for this process (once, before anything logs).
/// A `RUST_LOG` that does not parse is said on stderr and warnings are
/// logged instead.
pub(super) fn install(a: &LogArgs) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = match a.directive() {
        Some(d) => EnvFilter::new(d),
        None => match std::env::var("RUST_LOG") {
            Ok(v) if !v.trim().is_empty() => EnvFilter::try_new(&v).unwrap_or_else(|e| {
                eprintln!("RUST_LOG `{v}`: {e}; logging warnings");
                EnvFilter::new("warn")
            }),
            _ => EnvFilter::new("warn"),
        },
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let installed = match a.log_format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder.json().with_ansi(false).try_init(),
    };
    if let Err(e) = installed {
        eprintln!("warning: no log subscriber: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_pick_the_level_and_leave_the_rest_to_rust_log() {
        let args = |verbose, quiet| LogArgs {
            verbose,
            quiet,
            log_format: LogFormat::Text,
        };
        let table = [
            (0, false, None),
            (1, false, Some("info")),
            (2, false, Some("debug")),
            (3, false, Some("trace")),
            (9, false, Some("trace")),
            (0, true, Some("error")),
        ];
        for (v, q, want) in table {
            assert_eq!(args(v, q).directive(), want, "-v x{v}, -q {q}");
        }
    }
}
