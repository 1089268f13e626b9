//! A dependency-free SVG line-plot writer: a [`Figure`] is a grid of small
//! [`Panel`]s sharing one y scale (from 0) and one log2 x scale, each
//! holding one polyline (with point markers) per [`Series`], with tick
//! labels, axis labels, a title and one legend for the whole figure
//! (series are coloured by name, consistently across panels).
//!
//! Output is a self-contained SVG 1.1 document; every piece of text is
//! XML-escaped. Points that cannot be placed (non-finite, or x ≤ 0 on the
//! log scale) are left out rather than corrupting the document.

use std::fmt::Write;

/// One line: `(x, y)` points, drawn in the given order.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// One small plot.
#[derive(Clone, Debug, PartialEq)]
pub struct Panel {
    pub title: String,
    pub series: Vec<Series>,
}

/// A grid of panels with a title, shared axes and one legend.
#[derive(Clone, Debug, PartialEq)]
pub struct Figure {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// Tick positions on the x axis (log2 scale, each > 0) and their labels.
    pub x_ticks: Vec<(f64, String)>,
    pub panels: Vec<Panel>,
}

const PANEL_W: f64 = 320.0;
const PANEL_H: f64 = 240.0;
const PLOT_LEFT: f64 = 58.0;
const PLOT_RIGHT: f64 = 14.0;
const PLOT_TOP: f64 = 28.0;
const PLOT_BOTTOM: f64 = 46.0;
const COLUMNS_MAX: usize = 3;
const LEGEND_ENTRY_W: f64 = 150.0;
const LEGEND_ROW_H: f64 = 18.0;
const TITLE_H: f64 = 34.0;
const PALETTE: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
    "#7f7f7f", "#bcbd22",
];

impl Figure {
    /// Renders the figure as an SVG document.
    pub fn to_svg(&self) -> String {
        let names = self.series_names();
        let columns = self.panels.len().clamp(1, COLUMNS_MAX);
        let rows = self.panels.len().div_ceil(columns).max(1);
        let width = (columns as f64 * PANEL_W).max(2.0 * LEGEND_ENTRY_W);
        let per_row = ((width / LEGEND_ENTRY_W).floor() as usize).max(1);
        let legend_h = names.len().div_ceil(per_row) as f64 * LEGEND_ROW_H;
        let top = TITLE_H + legend_h + 6.0;
        let height = top + rows as f64 * PANEL_H + 6.0;
        let x_scale = self.x_range();
        let y = YAxis::new(self.y_max());

        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif" font-size="11">"#
        );
        let _ = writeln!(
            s,
            r#"<rect x="0" y="0" width="{width:.0}" height="{height:.0}" fill="white"/>"#
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="22" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
            width / 2.0,
            escape(&self.title)
        );
        for (i, name) in names.iter().enumerate() {
            let lx = 12.0 + (i % per_row) as f64 * LEGEND_ENTRY_W;
            let ly = TITLE_H + (i / per_row) as f64 * LEGEND_ROW_H + 9.0;
            let _ = writeln!(
                s,
                r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{}" stroke-width="2.5"/><text x="{:.1}" y="{:.1}">{}</text>"#,
                lx + 22.0,
                color(i),
                lx + 28.0,
                ly + 4.0,
                escape(name)
            );
        }
        for (k, panel) in self.panels.iter().enumerate() {
            let px = (k % columns) as f64 * PANEL_W;
            let py = top + (k / columns) as f64 * PANEL_H;
            self.panel(&mut s, panel, px, py, x_scale, &y, &names);
        }
        s.push_str("</svg>\n");
        s
    }

    /// Series names in first-appearance order (the legend, and colours).
    fn series_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for series in self.panels.iter().flat_map(|p| &p.series) {
            if !names.contains(&series.name.as_str()) {
                names.push(&series.name);
            }
        }
        names
    }

    /// The x range in log2 units, padded, over the ticks and the points.
    fn x_range(&self) -> (f64, f64) {
        let xs = self
            .x_ticks
            .iter()
            .map(|t| t.0)
            .chain(self.points().map(|p| p.0))
            .filter(|&x| x > 0.0 && x.is_finite())
            .map(f64::log2);
        let (lo, hi) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(x), hi.max(x))
        });
        if !lo.is_finite() {
            return (-1.0, 1.0);
        }
        let pad = ((hi - lo) * 0.06).max(0.5);
        (lo - pad, hi + pad)
    }

    fn y_max(&self) -> f64 {
        self.points()
            .map(|p| p.1)
            .filter(|y| y.is_finite())
            .fold(0.0, f64::max)
    }

    fn points(&self) -> impl Iterator<Item = (f64, f64)> + '_ {
        self.panels
            .iter()
            .flat_map(|p| &p.series)
            .flat_map(|s| s.points.iter().copied())
    }

    #[allow(clippy::too_many_arguments)]
    fn panel(
        &self,
        s: &mut String,
        panel: &Panel,
        px: f64,
        py: f64,
        (x_lo, x_hi): (f64, f64),
        y: &YAxis,
        names: &[&str],
    ) {
        let (left, top) = (px + PLOT_LEFT, py + PLOT_TOP);
        let (w, h) = (
            PANEL_W - PLOT_LEFT - PLOT_RIGHT,
            PANEL_H - PLOT_TOP - PLOT_BOTTOM,
        );
        let (bottom, right) = (top + h, left + w);
        let sx = |x: f64| left + (x.log2() - x_lo) / (x_hi - x_lo) * w;
        let sy = |v: f64| bottom - v / y.max * h;
        let _ = writeln!(s, "<g>");
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="12">{}</text>"#,
            left + w / 2.0,
            py + 18.0,
            escape(&panel.title)
        );
        for &v in &y.ticks {
            let yy = sy(v);
            let _ = writeln!(
                s,
                r##"<line x1="{left:.1}" y1="{yy:.1}" x2="{right:.1}" y2="{yy:.1}" stroke="#e4e4e4"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                left - 4.0,
                yy + 4.0,
                escape(&y.label(v))
            );
        }
        for (x, label) in self.x_ticks.iter().filter(|t| t.0 > 0.0) {
            let xx = sx(*x);
            let _ = writeln!(
                s,
                r##"<line x1="{xx:.1}" y1="{bottom:.1}" x2="{xx:.1}" y2="{:.1}" stroke="#444"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
                bottom + 4.0,
                bottom + 16.0,
                escape(label)
            );
        }
        let _ = writeln!(
            s,
            r##"<rect x="{left:.1}" y="{top:.1}" width="{w:.1}" height="{h:.1}" fill="none" stroke="#444"/>"##
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            left + w / 2.0,
            bottom + 34.0,
            escape(&self.x_label)
        );
        let (lx, ly) = (px + 14.0, top + h / 2.0);
        let _ = writeln!(
            s,
            r#"<text x="{lx:.1}" y="{ly:.1}" text-anchor="middle" transform="rotate(-90 {lx:.1} {ly:.1})">{}</text>"#,
            escape(&self.y_label)
        );
        for series in &panel.series {
            let c = color(names.iter().position(|n| *n == series.name).unwrap_or(0));
            let placed: Vec<(f64, f64)> = series
                .points
                .iter()
                .filter(|(x, v)| *x > 0.0 && x.is_finite() && v.is_finite())
                .map(|&(x, v)| (sx(x), sy(v)))
                .collect();
            let points: Vec<String> = placed
                .iter()
                .map(|(x, y)| format!("{x:.1},{y:.1}"))
                .collect();
            let _ = writeln!(
                s,
                r#"<polyline fill="none" stroke="{c}" stroke-width="1.8" points="{}"><title>{}</title></polyline>"#,
                points.join(" "),
                escape(&series.name)
            );
            for (x, y) in placed {
                let _ = writeln!(s, r#"<circle cx="{x:.1}" cy="{y:.1}" r="2.5" fill="{c}"/>"#);
            }
        }
        let _ = writeln!(s, "</g>");
    }
}

/// The shared y axis: from 0 to a round maximum, with round ticks.
struct YAxis {
    max: f64,
    step: f64,
    ticks: Vec<f64>,
}

impl YAxis {
    fn new(data_max: f64) -> Self {
        let data_max = if data_max > 0.0 { data_max } else { 1.0 };
        let step = nice_step(data_max / 5.0);
        let steps = (data_max / step - 1e-9).ceil().max(1.0);
        let ticks = (0..=steps as usize).map(|i| i as f64 * step).collect();
        YAxis {
            max: steps * step,
            step,
            ticks,
        }
    }

    fn label(&self, v: f64) -> String {
        let decimals = (-self.step.log10()).ceil().max(0.0) as usize;
        format!("{v:.decimals$}")
    }
}

/// The smallest of 1, 2, 5 × 10^k that is at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let base = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * base)
        .find(|&s| s >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0 * base)
}

fn color(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// Escapes text for XML character data and attribute values.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figure(panels: Vec<Panel>) -> Figure {
        Figure {
            title: "t".to_owned(),
            x_label: "x".to_owned(),
            y_label: "y".to_owned(),
            x_ticks: vec![(1.0, "1".to_owned()), (8.0, "8".to_owned())],
            panels,
        }
    }

    fn series(name: &str, points: &[(f64, f64)]) -> Series {
        Series {
            name: name.to_owned(),
            points: points.to_vec(),
        }
    }

    #[test]
    fn one_polyline_per_series_and_one_legend_entry_per_name() {
        let f = figure(vec![
            Panel {
                title: "a".to_owned(),
                series: vec![
                    series("one", &[(1.0, 1.0), (8.0, 2.0)]),
                    series("two", &[(1.0, 0.5)]),
                ],
            },
            Panel {
                title: "b".to_owned(),
                series: vec![series("two", &[(2.0, 3.0), (4.0, 1.0)])],
            },
        ]);
        let svg = f.to_svg();
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 3);
        assert_eq!(svg.matches("<circle").count(), 5);
        assert_eq!(svg.matches(">two</text>").count(), 1, "one legend entry");
        // Every opened element is closed or self-closed.
        let opened = svg.matches("<g>").count();
        assert_eq!(opened, 2);
        assert_eq!(svg.matches("</g>").count(), opened);
    }

    #[test]
    fn unplaceable_points_are_left_out() {
        let f = figure(vec![Panel {
            title: "p".to_owned(),
            series: vec![series(
                "s",
                &[(0.0, 1.0), (2.0, f64::NAN), (4.0, 1.0), (-1.0, 2.0)],
            )],
        }]);
        let svg = f.to_svg();
        assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
        assert_eq!(svg.matches("<circle").count(), 1);
        // An empty figure is still a document.
        let empty = figure(vec![]).to_svg();
        assert!(empty.starts_with("<svg") && empty.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(escape(r#"a<b>&"c'"#), "a&lt;b&gt;&amp;&quot;c&apos;");
        assert_eq!(escape("x\u{1}y"), "x y");
    }

    #[test]
    fn y_axis_is_round() {
        let y = YAxis::new(2.34);
        assert_eq!(y.step, 0.5);
        assert_eq!(y.max, 2.5);
        assert_eq!(y.ticks.len(), 6);
        assert_eq!(y.label(1.5), "1.5");
        let y = YAxis::new(0.0);
        assert_eq!(y.max, 1.0);
        let y = YAxis::new(1800.0);
        assert_eq!((y.step, y.max), (500.0, 2000.0));
        assert_eq!(y.label(1000.0), "1000");
    }
}
