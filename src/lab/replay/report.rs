//! The replay's outputs: the table printed, and the CSV rows (one per
//! policy and slot count).

use super::Outcome;
use std::fmt::Write as _;
use std::path::Path;

/// The table: per slot count and policy, hits, misses, hit rate, misses
/// and MB per token, demand (stalling) misses, and the ratio to Belady.
pub fn table(outcomes: &[Outcome]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<12} {:>5} {:>12} {:>12} {:>8} {:>11} {:>9} {:>12} {:>9}",
        "policy",
        "slots",
        "hits",
        "misses",
        "hit rate",
        "miss/token",
        "MB/token",
        "demand miss",
        "÷ belady"
    );
    for o in outcomes {
        let _ = writeln!(
            s,
            "{:<12} {:>5} {:>12} {:>12} {:>7.1}% {:>11.2} {:>9.1} {:>12} {:>9}",
            o.policy,
            o.slots,
            o.hits,
            o.misses,
            100.0 * o.hit_rate(),
            o.misses_per_token(),
            o.bytes_per_token() / 1e6,
            o.demand_misses,
            o.ratio_to_belady
                .map_or("-".to_owned(), |r| format!("{r:.3}")),
        );
    }
    for o in outcomes.iter().filter(|o| o.chose()) {
        let ended: Vec<String> = o.ended.iter().map(|(p, n)| format!("{p} {n}")).collect();
        let _ = writeln!(
            s,
            "{} at {} slots ended on {} (layers), {} switches",
            o.policy,
            o.slots,
            ended.join(", "),
            o.switches
        );
    }
    s
}

/// The CSV columns, in order (the first six are the documented ones).
pub const CSV_COLUMNS: [&str; 12] = [
    "policy",
    "slots",
    "misses",
    "hits",
    "bytes_per_token",
    "ratio_to_belady",
    "hit_rate",
    "misses_per_token",
    "demand_misses",
    "prefetch_wasted_bytes",
    "tokens",
    "prefetch",
];

/// Writes one row per outcome to `path`.
pub fn write_csv(path: &Path, outcomes: &[Outcome], prefetch: &str) -> crate::Result<()> {
    let out = crate::fs::Output::create(path)?;
    let csv_err = |e: csv::Error| crate::Error::file(path, std::io::Error::other(e));
    let mut w = csv::Writer::from_writer(out);
    rows(&mut w, outcomes, prefetch).map_err(csv_err)?;
    w.into_inner()
        .map_err(|e| crate::Error::file(path, std::io::Error::other(e.to_string())))?
        .finish()
}

fn rows<W: std::io::Write>(
    w: &mut csv::Writer<W>,
    outcomes: &[Outcome],
    prefetch: &str,
) -> csv::Result<()> {
    w.write_record(CSV_COLUMNS)?;
    for o in outcomes {
        w.write_record([
            o.policy.clone(),
            o.slots.clone(),
            o.misses.to_string(),
            o.hits.to_string(),
            format!("{:.1}", o.bytes_per_token()),
            o.ratio_to_belady
                .map_or(String::new(), |r| format!("{r:.4}")),
            format!("{:.6}", o.hit_rate()),
            format!("{:.4}", o.misses_per_token()),
            o.demand_misses.to_string(),
            o.prefetch_wasted_bytes.to_string(),
            o.tokens.to_string(),
            prefetch.to_owned(),
        ])?;
    }
    w.flush()?;
    Ok(())
}
