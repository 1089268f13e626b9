//! `replay --plot FILE`: hit rate against cache slots, one line per
//! policy; SVG, or PNG when the file name ends in `.png`.

use super::Outcome;
use plotters::prelude::*;
use std::path::Path;

fn log2(slots: f64) -> f64 {
    slots.max(1.0).log2()
}

type Points<'a> = [(&'a str, f64, f64)];

/// Plots the outcomes with a numeric slot count (not `trace`) into `path`
/// (PNG when it ends in `.png`, else SVG), titled `title`.
pub fn hit_rate(
    path: &Path,
    outcomes: &[Outcome],
    title: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let points: Vec<(&str, f64, f64)> = outcomes
        .iter()
        .filter_map(|o| {
            Some((
                o.policy.as_str(),
                o.slots.parse::<f64>().ok()?,
                o.hit_rate(),
            ))
        })
        .collect();
    let (lo, hi) = points
        .iter()
        .fold((f64::MAX, 0f64), |(lo, hi), p| (lo.min(p.1), hi.max(p.1)));
    if points.is_empty() {
        return Err("no numeric slot count to plot".into());
    }
    let png = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("png"));
    crate::fs::write::write_via(path, |inner| {
        if png {
            draw(
                crate::lab::png::Textless::new(inner, (800, 500)).into_drawing_area(),
                &points,
                (lo, hi),
                title,
            )
        } else {
            draw(
                SVGBackend::new(inner, (800, 500)).into_drawing_area(),
                &points,
                (lo, hi),
                title,
            )
        }
    })?;
    Ok(())
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    points: &Points,
    (lo, hi): (f64, f64),
    title: &str,
) -> Result<(), Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(log2(lo) - 0.2..log2(hi) + 0.2, 0f64..1f64)?;
    // x is log2(slots), labelled in slots at the powers of two.
    let powers = (log2(hi).floor() - log2(lo).ceil()) as usize + 1;
    chart
        .configure_mesh()
        .x_labels(powers.max(2))
        .x_label_formatter(&|v| format!("{}", 2f64.powf(*v).round()))
        .x_desc("cache slots per layer (log scale)")
        .y_desc("hit rate")
        .draw()?;
    let mut names: Vec<&str> = points.iter().map(|p| p.0).collect();
    names.dedup();
    names.sort_unstable();
    names.dedup();
    for (i, name) in names.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let mut line: Vec<(f64, f64)> = points
            .iter()
            .filter(|p| p.0 == *name)
            .map(|p| (log2(p.1), p.2))
            .collect();
        line.sort_by(|a, b| a.0.total_cmp(&b.0));
        chart
            .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))?
            .label(*name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        chart.draw_series(line.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}
