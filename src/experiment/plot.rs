//! SVG plots of a run: acceptance vs γ, speedup vs γ (measured and predicted), acceptance
//! per draft position. plotters' SVG backend writes text as `<text>` elements and, without
//! its font features, estimates label sizes itself: no system font is needed.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use plotters::element::DashedPathElement;
use plotters::prelude::*;

use super::config::GammaChoice;
use super::report::PointSummary;
use crate::error::{Error, Result};

type PlotResult = std::result::Result<(), Box<dyn std::error::Error>>;

/// One line of a chart.
struct Series {
    name: String,
    points: Vec<(f64, f64)>,
    dashed: bool,
    color: usize,
}

struct Chart<'a> {
    title: &'a str,
    x_desc: &'a str,
    y_desc: &'a str,
    x: (f64, f64),
    y: (f64, f64),
}

/// Writes the plots into `dir` and returns their paths (none without speculative points).
pub fn write_plots(dir: &Path, rows: &[PointSummary]) -> Result<Vec<PathBuf>> {
    let groups = fixed_gamma_groups(rows);
    let mut written = Vec::new();
    let mut save = |name: &str, svg: Option<String>| -> Result<()> {
        if let Some(svg) = svg {
            let path = dir.join(name);
            std::fs::write(&path, svg).map_err(|e| Error::io(&path, e))?;
            written.push(path);
        }
        Ok(())
    };
    save("acceptance_vs_gamma.svg", acceptance_vs_gamma(&groups)?)?;
    save("speedup_vs_gamma.svg", speedup_vs_gamma(&groups)?)?;
    save(
        "acceptance_per_position.svg",
        acceptance_per_position(&groups, rows)?,
    )?;
    Ok(written)
}

/// Speculative rows with a fixed γ, grouped by drafter and setting, sorted by γ.
fn fixed_gamma_groups(rows: &[PointSummary]) -> BTreeMap<String, Vec<(usize, &PointSummary)>> {
    let mut groups: BTreeMap<String, Vec<(usize, &PointSummary)>> = BTreeMap::new();
    for row in rows {
        let s = &row.settings;
        if let (Some(d), Some(GammaChoice::Fixed(g))) = (&s.drafter, s.gamma) {
            groups
                .entry(format!("{d} {}", s.setting_label()))
                .or_default()
                .push((g, row));
        }
    }
    for group in groups.values_mut() {
        group.sort_by_key(|(g, _)| *g);
    }
    groups
}

fn gamma_range(groups: &BTreeMap<String, Vec<(usize, &PointSummary)>>) -> (f64, f64) {
    let max = groups
        .values()
        .flatten()
        .map(|(g, _)| *g)
        .max()
        .unwrap_or(1);
    (0.5, max as f64 + 0.5)
}

fn acceptance_vs_gamma(
    groups: &BTreeMap<String, Vec<(usize, &PointSummary)>>,
) -> Result<Option<String>> {
    let series: Vec<Series> = groups
        .iter()
        .enumerate()
        .map(|(i, (name, rows))| Series {
            name: name.clone(),
            points: rows
                .iter()
                .filter_map(|(g, r)| Some((*g as f64, r.alpha?)))
                .collect(),
            dashed: false,
            color: i,
        })
        .collect();
    let chart = Chart {
        title: "Acceptance rate vs draft length",
        x_desc: "γ (draft length)",
        y_desc: "α (accepted / proposed)",
        x: gamma_range(groups),
        y: (0.0, 1.05),
    };
    render(&chart, &series, None)
}

fn speedup_vs_gamma(
    groups: &BTreeMap<String, Vec<(usize, &PointSummary)>>,
) -> Result<Option<String>> {
    let mut series = Vec::new();
    for (i, (name, rows)) in groups.iter().enumerate() {
        let measured = rows
            .iter()
            .filter_map(|(g, r)| Some((*g as f64, r.speedup?)));
        let predicted = rows
            .iter()
            .filter_map(|(g, r)| Some((*g as f64, r.predicted_speedup?)));
        series.push(Series {
            name: format!("{name} measured"),
            points: measured.collect(),
            dashed: false,
            color: i,
        });
        series.push(Series {
            name: format!("{name} predicted"),
            points: predicted.collect(),
            dashed: true,
            color: i,
        });
    }
    let top = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(1.0f64, f64::max);
    let chart = Chart {
        title: "Speedup over autoregressive vs draft length",
        x_desc: "γ (draft length)",
        y_desc: "speedup (× tokens/s)",
        x: gamma_range(groups),
        y: (0.0, top * 1.15),
    };
    render(&chart, &series, Some(1.0))
}

fn acceptance_per_position(
    groups: &BTreeMap<String, Vec<(usize, &PointSummary)>>,
    rows: &[PointSummary],
) -> Result<Option<String>> {
    // The longest fixed draft of each setting (shorter ones repeat its first positions) and
    // every adaptive point.
    let longest = groups.values().filter_map(|g| g.last().map(|(_, r)| *r));
    let adaptive = rows
        .iter()
        .filter(|r| r.settings.gamma == Some(GammaChoice::Adaptive));
    let series: Vec<Series> = longest
        .chain(adaptive)
        .filter(|r| !r.acceptance_at.is_empty())
        .enumerate()
        .map(|(i, r)| Series {
            name: r.label.clone(),
            points: (1..)
                .map(|p| p as f64)
                .zip(r.acceptance_at.iter().copied())
                .collect(),
            dashed: false,
            color: i,
        })
        .collect();
    let longest = series.iter().map(|s| s.points.len()).max().unwrap_or(1);
    let chart = Chart {
        title: "Acceptance per draft position",
        x_desc: "draft position",
        y_desc: "P(accepted | proposed)",
        x: (0.5, longest as f64 + 0.5),
        y: (0.0, 1.05),
    };
    render(&chart, &series, None)
}

/// The SVG text of `chart`, or `None` when no series has a point.
fn render(chart: &Chart, series: &[Series], reference: Option<f64>) -> Result<Option<String>> {
    if series.iter().all(|s| s.points.is_empty()) {
        return Ok(None);
    }
    let mut svg = String::new();
    draw(&mut svg, chart, series, reference)
        .map_err(|e| Error::invalid(format!("plot {:?}: {e}", chart.title)))?;
    Ok(Some(svg))
}

fn draw(svg: &mut String, chart: &Chart, series: &[Series], reference: Option<f64>) -> PlotResult {
    // Room for the legend below the plot: one line per series.
    let height = 480 + 18 * series.len() as u32;
    let root = SVGBackend::with_string(svg, (820, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (plot_area, legend_area) = root.split_vertically(480);
    let mut ctx = ChartBuilder::on(&plot_area)
        .caption(chart.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(chart.x.0..chart.x.1, chart.y.0..chart.y.1)?;
    ctx.configure_mesh()
        .x_desc(chart.x_desc)
        .y_desc(chart.y_desc)
        // Ticks every half step; only whole numbers (γ, positions) are labelled.
        .x_labels(2 * (chart.x.1 - chart.x.0).ceil() as usize + 1)
        .x_label_formatter(&|x| {
            if (x - x.round()).abs() < 1e-6 {
                format!("{x:.0}")
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| format!("{y:.2}"))
        .draw()?;
    if let Some(y) = reference {
        ctx.draw_series(LineSeries::new(
            [(chart.x.0, y), (chart.x.1, y)],
            BLACK.mix(0.4),
        ))?;
    }
    for s in series {
        let color = color_of(s.color);
        let style = color.stroke_width(2);
        if s.dashed {
            ctx.draw_series(DashedLineSeries::new(s.points.clone(), 6, 4, style))?;
        } else {
            ctx.draw_series(LineSeries::new(s.points.clone(), style))?;
        }
        ctx.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    // A legend drawn by hand below the chart, so it never covers data.
    for (i, s) in series.iter().enumerate() {
        let y = 6 + 18 * i as i32;
        let color = color_of(s.color);
        let line = [(70, y + 6), (100, y + 6)];
        if s.dashed {
            legend_area.draw(&DashedPathElement::new(line, 6, 4, color.stroke_width(2)))?;
        } else {
            legend_area.draw(&PathElement::new(line, color.stroke_width(2)))?;
        }
        legend_area.draw(&Text::new(s.name.clone(), (110, y), ("sans-serif", 13)))?;
    }
    root.present()?;
    Ok(())
}

/// Tableau's ten distinct colours, cycled.
fn color_of(i: usize) -> RGBAColor {
    const COLORS: [(u8, u8, u8); 10] = [
        (31, 119, 180),
        (255, 127, 14),
        (44, 160, 44),
        (214, 39, 40),
        (148, 103, 189),
        (140, 86, 75),
        (227, 119, 194),
        (127, 127, 127),
        (188, 189, 34),
        (23, 190, 207),
    ];
    let (r, g, b) = COLORS[i % COLORS.len()];
    RGBColor(r, g, b).to_rgba()
}
