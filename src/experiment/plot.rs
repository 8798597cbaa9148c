//! SVG plots of a run as small multiples: one panel per drafter × sampling setting, one
//! colour per cache strategy. `speedup_vs_gamma.svg`: measured speedup (solid, with its 95%
//! interval) and the time-accounting prediction (b) (dashed); `acceptance_vs_gamma.svg`: α;
//! `acceptance_per_position.svg`: acceptance per draft position at the longest γ. Series that
//! coincide in a panel (greedy acceptance is the same under every cache strategy) are drawn
//! once and named together. plotters' SVG backend writes text as `<text>` elements and,
//! without its font features, estimates label sizes itself: no system font is needed.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use plotters::element::DashedPathElement;
use plotters::prelude::*;

use super::config::{CacheChoice, GammaChoice};
use super::summary::PointSummary;
use crate::error::{Error, Result};

type PlotResult = std::result::Result<(), Box<dyn std::error::Error>>;

/// One line of a panel; `interval[i]` is the (low, high) of `points[i]` when drawn.
#[derive(Debug, Clone, PartialEq)]
struct Series {
    /// Cache strategies this line stands for (several when their series coincide).
    caches: Vec<CacheChoice>,
    points: Vec<(f64, f64)>,
    interval: Vec<Option<(f64, f64)>>,
    dashed: bool,
}

/// One panel: a drafter under one sampling setting.
struct Panel {
    title: String,
    series: Vec<Series>,
}

struct Figure<'a> {
    title: &'a str,
    x_desc: &'a str,
    y_desc: &'a str,
    x: (f64, f64),
    y: (f64, f64),
    reference: Option<f64>,
    /// What solid and dashed lines mean (empty: all solid, nothing to explain).
    line_key: &'a [(&'a str, bool)],
    /// Horizontal shift of each cache's series (± this), so that error bars at the same γ
    /// stay apart.
    jitter: f64,
}

/// Writes the plots into `dir` and returns their paths (none without speculative points).
pub fn write_plots(dir: &Path, rows: &[PointSummary]) -> Result<Vec<PathBuf>> {
    let panels = panel_rows(rows);
    let mut written = Vec::new();
    let mut save = |name: &str, svg: Option<String>| -> Result<()> {
        if let Some(svg) = svg {
            let path = dir.join(name);
            std::fs::write(&path, svg).map_err(|e| Error::io(&path, e))?;
            written.push(path);
        }
        Ok(())
    };
    save("acceptance_vs_gamma.svg", acceptance_vs_gamma(&panels)?)?;
    save("speedup_vs_gamma.svg", speedup_vs_gamma(&panels)?)?;
    save(
        "acceptance_per_position.svg",
        acceptance_per_position(&panels)?,
    )?;
    Ok(written)
}

/// Speculative rows with a fixed γ by panel (`drafter · sampling`), then by cache, sorted by γ.
type PanelRows<'a> = BTreeMap<String, BTreeMap<CacheChoice, Vec<(usize, &'a PointSummary)>>>;

fn panel_rows(rows: &[PointSummary]) -> PanelRows<'_> {
    let mut panels: PanelRows = BTreeMap::new();
    for row in rows {
        let s = &row.settings;
        if let (Some(d), Some(GammaChoice::Fixed(g))) = (&s.drafter, s.gamma) {
            // Everything of the setting but the cache, which is the panel's series.
            let mut title = format!("{d} · {}", s.sampling_label());
            if s.prefix_cache {
                title += " prefix-cache";
            }
            let engine = s.engine_label();
            if !engine.is_empty() {
                title += &format!(" {engine}");
            }
            panels
                .entry(title)
                .or_default()
                .entry(s.cache)
                .or_default()
                .push((g, row));
        }
    }
    for by_cache in panels.values_mut() {
        for group in by_cache.values_mut() {
            group.sort_by_key(|(g, _)| *g);
        }
    }
    panels
}

fn gamma_range(panels: &PanelRows) -> (f64, f64) {
    let max = panels
        .values()
        .flat_map(|p| p.values().flatten())
        .map(|(g, _)| *g)
        .max()
        .unwrap_or(1);
    (0.5, max as f64 + 0.5)
}

/// Panels with one series per cache from `line`, coinciding series merged.
fn build(
    panels: &PanelRows,
    line: impl Fn(&[(usize, &PointSummary)]) -> Vec<Series>,
) -> Vec<Panel> {
    panels
        .iter()
        .map(|(title, by_cache)| {
            let all = by_cache.iter().flat_map(|(&cache, rows)| {
                line(rows).into_iter().map(move |mut s| {
                    s.caches = vec![cache];
                    s
                })
            });
            Panel {
                title: title.clone(),
                series: merge_coincident(all.collect()),
            }
        })
        .collect()
}

/// Series with the same points (within 1e-9), intervals and style become one, naming every
/// cache strategy it stands for.
fn merge_coincident(series: Vec<Series>) -> Vec<Series> {
    let mut out: Vec<Series> = Vec::new();
    for s in series.into_iter().filter(|s| !s.points.is_empty()) {
        let same = |o: &Series| {
            o.dashed == s.dashed
                && o.points.len() == s.points.len()
                && o.points
                    .iter()
                    .zip(&s.points)
                    .all(|(a, b)| (a.0 - b.0).abs() < 1e-9 && (a.1 - b.1).abs() < 1e-9)
                && o.interval == s.interval
        };
        match out.iter_mut().find(|o| same(o)) {
            Some(o) => o.caches.extend(s.caches),
            None => out.push(s),
        }
    }
    out
}

fn series(points: Vec<(f64, f64)>, interval: Vec<Option<(f64, f64)>>, dashed: bool) -> Series {
    Series {
        caches: Vec::new(),
        points,
        interval,
        dashed,
    }
}

fn acceptance_vs_gamma(panels: &PanelRows) -> Result<Option<String>> {
    let built = build(panels, |rows| {
        let points: Vec<(f64, f64)> = rows
            .iter()
            .filter_map(|(g, r)| Some((*g as f64, r.alpha?)))
            .collect();
        vec![series(points, Vec::new(), false)]
    });
    let figure = Figure {
        title: "Acceptance rate vs draft length",
        x_desc: "γ (draft length)",
        y_desc: "α (accepted / proposed)",
        x: gamma_range(panels),
        y: (0.0, 1.05),
        reference: None,
        line_key: &[],
        jitter: 0.0,
    };
    render(&figure, &built)
}

fn speedup_vs_gamma(panels: &PanelRows) -> Result<Option<String>> {
    let built = build(panels, |rows| {
        let measured: Vec<&(usize, &PointSummary)> =
            rows.iter().filter(|(_, r)| r.speedup.is_some()).collect();
        let predicted = rows
            .iter()
            .filter_map(|(g, r)| Some((*g as f64, r.cost.as_ref()?.predicted)));
        vec![
            series(
                measured
                    .iter()
                    .map(|(g, r)| (*g as f64, r.speedup.unwrap_or(0.0)))
                    .collect(),
                measured.iter().map(|(_, r)| r.speedup_interval).collect(),
                false,
            ),
            series(predicted.collect(), Vec::new(), true),
        ]
    });
    let top = built
        .iter()
        .flat_map(|p| &p.series)
        .flat_map(|s| {
            let highs = s.interval.iter().flatten().map(|i| i.1);
            s.points.iter().map(|p| p.1).chain(highs)
        })
        .fold(1.0f64, f64::max);
    let figure = Figure {
        title: "Speedup over autoregressive vs draft length",
        x_desc: "γ (draft length)",
        y_desc: "speedup (× tokens/s)",
        x: gamma_range(panels),
        y: (0.0, top * 1.1),
        reference: Some(1.0),
        line_key: &[
            ("measured (median, 95% interval)", false),
            ("predicted (b) τ/(γc+v+o)", true),
        ],
        jitter: 0.06,
    };
    render(&figure, &built)
}

fn acceptance_per_position(panels: &PanelRows) -> Result<Option<String>> {
    // The longest draft of each cache (shorter ones repeat its first positions).
    let built = build(panels, |rows| {
        let Some((_, longest)) = rows.last() else {
            return Vec::new();
        };
        let points = (1..)
            .map(|p| p as f64)
            .zip(longest.acceptance_at.iter().copied())
            .collect();
        vec![series(points, Vec::new(), false)]
    });
    let longest = built
        .iter()
        .flat_map(|p| &p.series)
        .map(|s| s.points.len())
        .max()
        .unwrap_or(1);
    let figure = Figure {
        title: "Acceptance per draft position (longest γ of each panel)",
        x_desc: "draft position",
        y_desc: "P(accepted | proposed)",
        x: (0.5, longest as f64 + 0.5),
        y: (0.0, 1.05),
        reference: None,
        line_key: &[],
        jitter: 0.0,
    };
    render(&figure, &built)
}

const PANEL_W: u32 = 400;
const PANEL_H: u32 = 300;
const TITLE_H: u32 = 36;
const LEGEND_H: u32 = 64;

/// The SVG text of `figure`, or `None` when no panel has a point.
fn render(figure: &Figure, panels: &[Panel]) -> Result<Option<String>> {
    if panels.iter().all(|p| p.series.is_empty()) {
        return Ok(None);
    }
    let mut svg = String::new();
    draw(&mut svg, figure, panels)
        .map_err(|e| Error::invalid(format!("plot {:?}: {e}", figure.title)))?;
    Ok(Some(svg))
}

fn draw(svg: &mut String, figure: &Figure, panels: &[Panel]) -> PlotResult {
    let cols = panels.len().clamp(1, 2);
    let rows = panels.len().div_ceil(cols);
    let size = (
        PANEL_W * cols as u32,
        TITLE_H + PANEL_H * rows as u32 + LEGEND_H,
    );
    let root = SVGBackend::with_string(svg, size).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, rest) = root.split_vertically(TITLE_H);
    let (grid, legend) = rest.split_vertically(PANEL_H * rows as u32);
    title.titled(figure.title, ("sans-serif", 20))?;
    for (panel, area) in panels.iter().zip(grid.split_evenly((rows, cols))) {
        draw_panel(&area, figure, panel)?;
    }
    draw_legend(&legend, figure, panels)?;
    root.present()?;
    Ok(())
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    figure: &Figure,
    panel: &Panel,
) -> PlotResult
where
    DB::ErrorType: 'static,
{
    let mut ctx = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 15))
        .margin(8)
        .x_label_area_size(36)
        .y_label_area_size(48)
        .build_cartesian_2d(figure.x.0..figure.x.1, figure.y.0..figure.y.1)?;
    ctx.configure_mesh()
        .x_desc(figure.x_desc)
        .y_desc(figure.y_desc)
        .x_labels(2 * (figure.x.1 - figure.x.0).ceil() as usize + 1)
        .x_label_formatter(&|x| {
            if (x - x.round()).abs() < 1e-6 {
                format!("{x:.0}")
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| format!("{y:.1}"))
        .draw()?;
    if let Some(y) = figure.reference {
        let line = [(figure.x.0, y), (figure.x.1, y)];
        ctx.draw_series(LineSeries::new(line, BLACK.mix(0.4)))?;
    }
    for s in &panel.series {
        let color = cache_color(s.caches[0]);
        let style = color.stroke_width(2);
        let dx = match s.caches.as_slice() {
            [CacheChoice::Staged] => -figure.jitter,
            [CacheChoice::Slack] => figure.jitter,
            _ => 0.0,
        };
        let points: Vec<(f64, f64)> = s.points.iter().map(|&(x, y)| (x + dx, y)).collect();
        if s.dashed {
            ctx.draw_series(DashedLineSeries::new(points.clone(), 6, 4, style))?;
        } else {
            ctx.draw_series(LineSeries::new(points.clone(), style))?;
            ctx.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        }
        let bars = points.iter().zip(&s.interval);
        let bars = bars.filter_map(|(&(x, _), iv)| iv.map(|(lo, hi)| error_bar(x, lo, hi)));
        for bar in bars.flatten() {
            ctx.draw_series(std::iter::once(PathElement::new(
                bar,
                color.stroke_width(1),
            )))?;
        }
    }
    if let Some(note) = merged_note(panel) {
        // Just inside the top-left corner of the plotting area.
        let at = (
            figure.x.0 + 0.03 * (figure.x.1 - figure.x.0),
            figure.y.1 - 0.02 * (figure.y.1 - figure.y.0),
        );
        ctx.plotting_area()
            .draw(&Text::new(note, at, ("sans-serif", 12)))?;
    }
    Ok(())
}

/// "staged = slack: identical, drawn once" when series of the panel were merged.
fn merged_note(panel: &Panel) -> Option<String> {
    let merged = panel.series.iter().find(|s| s.caches.len() > 1)?;
    Some(format!(
        "{}: identical, drawn once",
        caches_name(&merged.caches)
    ))
}

/// The three strokes of a vertical error bar from `lo` to `hi` at `x`, with caps.
fn error_bar(x: f64, lo: f64, hi: f64) -> [Vec<(f64, f64)>; 3] {
    let cap = 0.08;
    [
        vec![(x, lo), (x, hi)],
        vec![(x - cap, lo), (x + cap, lo)],
        vec![(x - cap, hi), (x + cap, hi)],
    ]
}

/// The shared legend: one colour per cache strategy present, what solid and dashed mean.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    figure: &Figure,
    panels: &[Panel],
) -> PlotResult
where
    DB::ErrorType: 'static,
{
    let mut caches: Vec<CacheChoice> = panels
        .iter()
        .flat_map(|p| &p.series)
        .flat_map(|s| s.caches.iter().copied())
        .collect();
    caches.sort();
    caches.dedup();
    let mut x = 20;
    for cache in caches {
        let color = cache_color(cache);
        area.draw(&PathElement::new(
            [(x, 16), (x + 30, 16)],
            color.stroke_width(3),
        ))?;
        area.draw(&Text::new(
            format!("cache = {cache}"),
            (x + 36, 9),
            ("sans-serif", 13),
        ))?;
        x += 150;
    }
    let mut x = 20;
    for &(name, dashed) in figure.line_key {
        let line = [(x, 44), (x + 30, 44)];
        let style = BLACK.stroke_width(2);
        if dashed {
            area.draw(&DashedPathElement::new(line, 6, 4, style))?;
        } else {
            area.draw(&PathElement::new(line, style))?;
        }
        area.draw(&Text::new(name, (x + 36, 37), ("sans-serif", 13)))?;
        x += 290;
    }
    Ok(())
}

fn caches_name(caches: &[CacheChoice]) -> String {
    let names: Vec<String> = caches.iter().map(|c| c.to_string()).collect();
    names.join(" = ")
}

/// A fixed colour per cache strategy, the same in every plot.
fn cache_color(cache: CacheChoice) -> RGBAColor {
    match cache {
        CacheChoice::Staged => RGBColor(31, 119, 180).to_rgba(),
        CacheChoice::Slack => RGBColor(255, 127, 14).to_rgba(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(cache: CacheChoice, ys: &[f64], dashed: bool) -> Series {
        Series {
            caches: vec![cache],
            points: ys.iter().enumerate().map(|(i, &y)| (i as f64, y)).collect(),
            interval: Vec::new(),
            dashed,
        }
    }

    #[test]
    fn coincident_series_are_drawn_once_naming_both() {
        let merged = merge_coincident(vec![
            line(CacheChoice::Staged, &[0.8, 0.6], false),
            line(CacheChoice::Slack, &[0.8, 0.6], false),
            line(CacheChoice::Slack, &[0.8, 0.6], true),
        ]);
        assert_eq!(merged.len(), 2);
        assert_eq!(merged[0].caches, [CacheChoice::Staged, CacheChoice::Slack]);
        assert_eq!(caches_name(&merged[0].caches), "staged = slack");
        assert!(merged[1].dashed);
    }

    #[test]
    fn different_series_stay_apart() {
        let merged = merge_coincident(vec![
            line(CacheChoice::Staged, &[0.8, 0.6], false),
            line(CacheChoice::Slack, &[0.8, 0.61], false),
        ]);
        assert_eq!(merged.len(), 2);
    }
}
