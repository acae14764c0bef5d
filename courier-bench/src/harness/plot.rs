//! `--plot FILE.svg`: one chart of a suite.
//!
//! - A suite with a size sweep (a case family measured at two or more
//!   `bytes`) is drawn as its first lower-is-better metric against message
//!   size, log-log, one line per family and subject (the family is left out of
//!   the label when there is only one).
//! - Otherwise every time (`_ns` metric) is a horizontal bar on a log axis,
//!   one per case, subject and metric.

use std::collections::BTreeSet;
use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::report::{human, Report, Row, Sense};
use super::{size_label, Result};

const SIZE: (u32, u32) = (1024, 640);

/// Draws `report` into the SVG file `path`.
pub fn draw(report: &Report, path: &Path) -> Result<()> {
    match sweep_metric(report) {
        Some(metric) => draw_sweep(report, &metric, path),
        None => draw_bars(report, path),
    }
}

/// The first lower-is-better metric that some family has at several sizes.
fn sweep_metric(report: &Report) -> Option<String> {
    report
        .rows
        .iter()
        .filter(|r| r.bytes.is_some() && Sense::of(&r.metric) == Sense::LowerIsBetter)
        .find(|r| {
            let sizes: BTreeSet<u64> = report
                .rows
                .iter()
                .filter(|o| o.family == r.family && o.metric == r.metric)
                .filter_map(|o| o.bytes)
                .collect();
            sizes.len() >= 2
        })
        .map(|r| r.metric.clone())
}

/// One line per (family, subject) of `metric`, points in size order.
fn lines<'r>(report: &'r Report, metric: &str) -> Vec<(String, Vec<(f64, f64)>)> {
    let rows: Vec<&'r Row> = report
        .rows
        .iter()
        .filter(|r| r.metric == metric && r.bytes.is_some() && r.value > 0.0)
        .collect();
    let families: BTreeSet<&str> = rows.iter().map(|r| r.family.as_str()).collect();
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for r in &rows {
        let key = (r.family.as_str(), r.subject.as_str());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys.into_iter()
        .map(|(family, subject)| {
            let mut points: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.family == family && r.subject == subject)
                .map(|r| (r.bytes.unwrap_or(0) as f64, r.value))
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            let label = if families.len() > 1 {
                format!("{family} · {subject}")
            } else {
                subject.to_string()
            };
            (label, points)
        })
        .collect()
}

fn bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo.is_finite() {
        (lo / 1.5, hi * 1.5)
    } else {
        (1.0, 10.0)
    }
}

fn draw_sweep(report: &Report, metric: &str, path: &Path) -> Result<()> {
    let lines = lines(report, metric);
    let (x0, x1) = bounds(lines.iter().flat_map(|(_, p)| p.iter().map(|p| p.0)));
    let (y0, y1) = bounds(lines.iter().flat_map(|(_, p)| p.iter().map(|p| p.1)));
    let unit = report
        .rows
        .iter()
        .find(|r| r.metric == metric)
        .map_or("", |r| r.unit.as_str());
    // Ticks on the powers of two the sizes are, at most about a dozen.
    let mut ticks: Vec<f64> = (0..63)
        .map(|k| (1u64 << k) as f64)
        .filter(|&t| t >= x0 && t <= x1)
        .collect();
    let stride = ticks.len().div_ceil(12).max(1);
    ticks = ticks.into_iter().step_by(stride).collect();
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("{}: {metric}", report.suite), ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(80)
        .build_cartesian_2d(
            (x0..x1).log_scale().with_key_points(ticks),
            (y0..y1).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc("message size")
        .y_desc(format!("{metric} (median)"))
        .x_label_formatter(&|x| size_label(x.round() as u64))
        .y_label_formatter(&|y| human(*y, unit))
        .draw()?;
    for (i, (label, points)) in lines.into_iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(PointSeries::of_element(
            points,
            3,
            color.filled(),
            &|c, s, st| Circle::new(c, s, st),
        ))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

fn draw_bars(report: &Report, path: &Path) -> Result<()> {
    // Times only (`_ns`): one axis, one unit.
    let rows: Vec<&Row> = report
        .rows
        .iter()
        .filter(|r| r.metric.ends_with("_ns") && r.value > 0.0)
        .collect();
    let n = rows.len().max(1);
    let (x0, x1) = bounds(rows.iter().map(|r| r.value));
    let labels: Vec<String> = rows
        .iter()
        .map(|r| format!("{} · {} · {}", r.case, r.subject, r.metric))
        .collect();
    let label_width = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0) as u32 * 7 + 24;
    let height = (140 + 26 * n as u32).max(240);
    let root = SVGBackend::new(path, (SIZE.0 + label_width, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{} (median; lower is better)", report.suite),
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(label_width)
        .build_cartesian_2d((x0..x1).log_scale(), -0.5..n as f64 - 0.5)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_label_formatter(&|x| human(*x, "ns"))
        .x_desc("median")
        .draw()?;
    // Rows top to bottom in report order: row i is centred on y = n - 1 - i,
    // labelled to the left of the axis.
    let style = TextStyle::from(("sans-serif", 13)).pos(Pos::new(HPos::Right, VPos::Center));
    for (i, (r, label)) in rows.iter().zip(&labels).enumerate() {
        let y = (n - 1 - i) as f64;
        let color = Palette99::pick(i % 8).to_rgba();
        chart.draw_series(std::iter::once(Rectangle::new(
            [(x0, y - 0.35), (r.value, y + 0.35)],
            color.filled(),
        )))?;
        let (px, py) = chart.backend_coord(&(x0, y));
        root.draw(&Text::new(label.clone(), (px - 8, py), style.clone()))?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(family: &str, subject: &str, bytes: Option<u64>, value: f64) -> Row {
        Row {
            case: match bytes {
                Some(b) => format!("{family}_{}", size_label(b)),
                None => family.into(),
            },
            family: family.into(),
            subject: subject.into(),
            metric: "copy_ns".into(),
            unit: "ns".into(),
            value,
            summary: None,
            bytes,
            tasks: None,
        }
    }

    #[test]
    fn a_sweep_is_one_line_per_family_and_subject() {
        let report = Report {
            suite: "floor".into(),
            rows: vec![
                row("memcpy_warm", "floor", Some(1 << 20), 30.0),
                row("memcpy_warm", "floor", Some(1 << 16), 2.0),
                row("memcpy_fresh", "floor", Some(1 << 16), 9.0),
                row("memcpy_fresh", "floor", Some(1 << 20), 90.0),
                row("rtt", "floor", None, 5.0),
            ],
            notes: vec![],
        };
        assert_eq!(sweep_metric(&report).as_deref(), Some("copy_ns"));
        let l = lines(&report, "copy_ns");
        assert_eq!(
            l,
            vec![
                (
                    "memcpy_warm · floor".to_string(),
                    vec![(65536.0, 2.0), (1048576.0, 30.0)]
                ),
                (
                    "memcpy_fresh · floor".to_string(),
                    vec![(65536.0, 9.0), (1048576.0, 90.0)]
                ),
            ]
        );
        let dir = std::env::temp_dir().join(format!("courier-bench-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let svg = dir.join("sweep.svg");
        draw(&report, &svg).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.starts_with("<svg"));
        assert!(text.contains("memcpy_fresh · floor"));
        let bars = Report {
            rows: vec![
                row("rtt", "floor", None, 5.0),
                row("send", "floor", Some(22), 9.0),
            ],
            ..report
        };
        assert_eq!(sweep_metric(&bars), None);
        let svg = dir.join("bars.svg");
        draw(&bars, &svg).unwrap();
        let text = std::fs::read_to_string(&svg).unwrap();
        assert!(text.contains("send_22b · floor · copy_ns"), "labels drawn");
        assert!(text.contains("rtt · floor · copy_ns"), "labels drawn");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
