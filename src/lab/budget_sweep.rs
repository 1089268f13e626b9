//! `moestream bench sweep`: cold decode speed against the RAM budget. The
//! command runs one `moestream run --json` per (round, read mode, budget),
//! each in a fresh memory cgroup capped at its budget when one can be made;
//! this module owns what it measures and writes: one [`SweepRow`] per run,
//! read from the run's JSON ([`SweepRow::from_run`]), the CSV
//! ([`write_csv`], columns [`CSV_COLUMNS`]) and the plot of decode tok/s
//! and MB read per token against the budget, one line per read mode
//! (plotters, [`write_plots`]: SVG with its text, and PNG without text:
//! no font engine is linked, see `lab::png`).
//!
//! Rows of runs without a cgroup say so (`cgroup` = `none`): without the
//! cap, the page cache the run leans on is not bounded by its budget.

use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Ok,
    /// The plan refused the budget (too small).
    Refused,
    /// Killed by the cgroup's OOM killer.
    Oom,
    Failed,
}

/// One run of the sweep.
#[derive(Clone, Debug, Serialize)]
pub struct SweepRow {
    pub round: usize,
    pub read_mode: String,
    pub ram_gb: f64,
    pub outcome: Outcome,
    /// `capped` (inside a memory cgroup of the budget) or `none`.
    pub cgroup: &'static str,
    pub slots: Option<usize>,
    pub tok_s: Option<f64>,
    /// Decode steps per second, the prefill left out.
    pub decode_tok_s: Option<f64>,
    pub prefill_s: Option<f64>,
    pub mb_per_token: Option<f64>,
    pub hit_rate: Option<f64>,
    pub peak_rss_mib: Option<f64>,
    pub cgroup_peak_mib: Option<f64>,
    pub oom_kills: Option<u64>,
    /// Why a run did not finish, or why it ran without a cgroup.
    pub note: String,
}

/// The CSV's columns, in order.
pub const CSV_COLUMNS: [&str; 15] = [
    "round",
    "read_mode",
    "ram_gb",
    "outcome",
    "cgroup",
    "slots",
    "tok_s",
    "decode_tok_s",
    "prefill_s",
    "mb_per_token",
    "hit_rate",
    "peak_rss_mib",
    "cgroup_peak_mib",
    "oom_kills",
    "note",
];

fn round_to(x: f64, places: i32) -> f64 {
    let f = 10f64.powi(places);
    (x * f).round() / f
}

impl SweepRow {
    /// A row with the run's identity and nothing measured.
    pub fn new(round: usize, read_mode: &str, ram_gb: f64, cgroup: &'static str) -> SweepRow {
        SweepRow {
            round,
            read_mode: read_mode.to_string(),
            ram_gb,
            outcome: Outcome::Failed,
            cgroup,
            slots: None,
            tok_s: None,
            decode_tok_s: None,
            prefill_s: None,
            mb_per_token: None,
            hit_rate: None,
            peak_rss_mib: None,
            cgroup_peak_mib: None,
            oom_kills: None,
            note: String::new(),
        }
    }

    /// Fills the measurements from `run --json`'s object (`stats`,
    /// `config`); the outcome becomes `ok`. The read mode becomes the one
    /// the run used (`auto` resolved).
    pub fn from_run(mut self, v: &serde_json::Value) -> SweepRow {
        let s = &v["stats"];
        let f = |k: &str| s[k].as_f64();
        self.outcome = Outcome::Ok;
        self.slots = v["config"]["slots_per_layer"].as_u64().map(|x| x as usize);
        if let Some(mode) = v["config"]["io"].as_str() {
            self.read_mode = mode.to_string();
        }
        self.tok_s = f("tok_per_s").map(|x| round_to(x, 3));
        self.decode_tok_s = match (f("decode_steps"), f("decode_s")) {
            (Some(n), Some(t)) if t > 0.0 => Some(round_to(n / t, 3)),
            _ => None,
        };
        self.prefill_s = f("prefill_seconds").map(|x| round_to(x, 3));
        self.mb_per_token = f("bytes_read_per_token").map(|x| round_to(x / 1e6, 2));
        self.hit_rate = f("expert_hit_rate").map(|x| round_to(x, 3));
        self.peak_rss_mib = f("peak_rss_bytes").map(|x| round_to(x / (1u64 << 20) as f64, 1));
        self
    }
}

/// Writes `rows` as CSV to `path` (header [`CSV_COLUMNS`]).
pub fn write_csv(rows: &[SweepRow], path: &Path) -> std::io::Result<()> {
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in rows {
        w.serialize(r).map_err(std::io::Error::other)?;
    }
    let mut bytes = w
        .into_inner()
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    if rows.is_empty() {
        bytes = format!("{}\n", CSV_COLUMNS.join(",")).into_bytes();
    }
    crate::fs::write(path, &bytes).map_err(std::io::Error::other)
}

/// Per read mode, `(ram_gb, y)` medians over rounds of the finished runs
/// (the mean of the middle two for an even count).
fn lines(
    rows: &[SweepRow],
    y: impl Fn(&SweepRow) -> Option<f64>,
) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut by: BTreeMap<String, BTreeMap<u64, Vec<f64>>> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.outcome == Outcome::Ok) {
        if let Some(v) = y(r).filter(|v| v.is_finite()) {
            by.entry(r.read_mode.clone())
                .or_default()
                .entry(r.ram_gb.to_bits())
                .or_default()
                .push(v);
        }
    }
    by.into_iter()
        .map(|(mode, points)| {
            let mut pts: Vec<(f64, f64)> = points
                .into_iter()
                .map(|(gb, mut vs)| {
                    vs.sort_by(f64::total_cmp);
                    let mid = vs.len() / 2;
                    let median = if vs.len() % 2 == 0 {
                        (vs[mid - 1] + vs[mid]) / 2.0
                    } else {
                        vs[mid]
                    };
                    (f64::from_bits(gb), median)
                })
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            (mode, pts)
        })
        .collect()
}

const PLOT_W: u32 = 1200;
const PLOT_H: u32 = 480;

/// Writes the plot of `rows` as `svg` and `png`: decode tok/s and MB read
/// per token against the RAM budget, one line per read mode.
pub fn write_plots(rows: &[SweepRow], title: &str, svg: &Path, png: &Path) -> Result<(), String> {
    use plotters::prelude::*;
    let panels = [
        ("decode tok/s", lines(rows, |r| r.decode_tok_s.or(r.tok_s))),
        ("MB read per token", lines(rows, |r| r.mb_per_token)),
    ];
    crate::fs::write::write_via(svg, |inner| {
        let root = SVGBackend::new(inner, (PLOT_W, PLOT_H)).into_drawing_area();
        draw(root, title, &panels)
    })
    .map_err(|e| e.to_string())?;
    crate::fs::write::write_via(png, |inner| {
        let root = crate::lab::png::Textless::new(inner, (PLOT_W, PLOT_H)).into_drawing_area();
        draw(root, title, &panels)
    })
    .map_err(|e| e.to_string())
}

type Panel = (&'static str, Vec<(String, Vec<(f64, f64)>)>);

const COLORS: [plotters::style::RGBColor; 6] = [
    plotters::style::RGBColor(31, 119, 180),
    plotters::style::RGBColor(214, 39, 40),
    plotters::style::RGBColor(44, 160, 44),
    plotters::style::RGBColor(255, 127, 14),
    plotters::style::RGBColor(148, 103, 189),
    plotters::style::RGBColor(140, 86, 75),
];

fn draw<DB: plotters::prelude::DrawingBackend>(
    root: plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    panels: &[Panel],
) -> Result<(), plotters::prelude::DrawingAreaErrorKind<DB::ErrorType>> {
    use plotters::prelude::*;
    root.fill(&WHITE)?;
    let root = root.titled(title, ("sans-serif", 22))?;
    let xs = panels
        .iter()
        .flat_map(|p| p.1.iter().flat_map(|l| l.1.iter().map(|pt| pt.0)));
    let (x0, x1) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let (x0, x1) = if x0 <= x1 { (x0, x1) } else { (0.0, 1.0) };
    let pad = ((x1 - x0) * 0.05).max(0.05);
    for (area, (label, series)) in root.split_evenly((1, 2)).iter().zip(panels) {
        let y_max = series
            .iter()
            .flat_map(|l| l.1.iter().map(|p| p.1))
            .fold(0.0f64, f64::max)
            .max(1e-3)
            * 1.15;
        let mut chart = ChartBuilder::on(area)
            .margin(14)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .caption(*label, ("sans-serif", 18))
            .build_cartesian_2d((x0 - pad)..(x1 + pad), 0.0..y_max)?;
        chart
            .configure_mesh()
            .x_desc("RAM budget (GB)")
            .y_desc(*label)
            .draw()?;
        for (i, (mode, pts)) in series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
                .label(mode.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
        }
        if !series.is_empty() {
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()?;
        }
    }
    root.present()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(mode: &str, gb: f64, tok: f64) -> SweepRow {
        let mut r = SweepRow::new(1, mode, gb, "none");
        r.outcome = Outcome::Ok;
        r.decode_tok_s = Some(tok);
        r.mb_per_token = Some(10.0 / gb);
        r
    }

    #[test]
    fn lines_take_the_median_of_finished_runs_per_mode_and_budget() {
        let mut refused = SweepRow::new(1, "direct", 1.0, "capped");
        refused.outcome = Outcome::Refused;
        let rows = vec![
            row("direct", 2.0, 1.0),
            row("direct", 2.0, 3.0),
            row("direct", 2.0, 2.0),
            row("direct", 4.0, 5.0),
            row("buffered", 4.0, 1.5),
            row("buffered", 4.0, 2.5),
            refused,
        ];
        let l = lines(&rows, |r| r.decode_tok_s);
        assert_eq!(
            l,
            vec![
                ("buffered".to_string(), vec![(4.0, 2.0)]),
                ("direct".to_string(), vec![(2.0, 2.0), (4.0, 5.0)]),
            ]
        );
    }

    #[test]
    fn the_csv_has_its_columns_and_a_row_per_run() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s.csv");
        write_csv(&[row("direct", 2.0, 1.0)], &p).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        let mut lines = text.lines();
        assert_eq!(lines.next().unwrap(), CSV_COLUMNS.join(","));
        assert!(lines.next().unwrap().starts_with("1,direct,2.0,ok,none,"));
        write_csv(&[], &p).unwrap();
        assert_eq!(
            std::fs::read_to_string(&p).unwrap().trim(),
            CSV_COLUMNS.join(",")
        );
    }
}
