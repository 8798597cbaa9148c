//! `results.csv`, `summary.md` and log-log SVG plots of a cache-strategy benchmark.
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

use super::config::{BenchConfig, Pattern};
use super::run::BenchRow;
use crate::error::{Error, Result};
use crate::experiment::{default_result_path, ResultDir};

/// What [`write_results`] produced.
#[derive(Debug)]
pub struct BenchOutcome {
    /// The result folder.
    pub dir: PathBuf,
    /// The markdown table of every cell.
    pub table: String,
}

/// The CSV header, one column per [`BenchRow`] field.
const CSV_HEADER: &str =
    "strategy,length,gamma,pattern,runs,step_us,rollback_us,bytes_copied_per_step,extra_bytes_held";

/// Every row as CSV with a header.
pub fn csv(rows: &[BenchRow]) -> String {
    let mut out = format!("{CSV_HEADER}\n");
    for r in rows {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{:.3},{:.3},{:.0},{}",
            r.strategy.name(),
            r.length,
            r.gamma,
            r.pattern.name(),
            r.runs,
            r.step_us,
            r.rollback_us,
            r.bytes_copied,
            r.bytes_held
        );
    }
    out
}

/// A markdown table: strategy × length × γ × pattern → µs per step, µs of the rollback,
/// bytes copied per step, extra memory.
pub fn markdown(rows: &[BenchRow]) -> String {
    let mut out = String::from(
        "| strategy | length | γ | pattern | µs/step | rollback µs | copied/step | extra memory |\n\
         |---|---:|---:|---|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:.1} | {:.2} | {} | {} |",
            r.strategy.name(),
            r.length,
            r.gamma,
            r.pattern.name(),
            r.step_us,
            r.rollback_us,
            bytes(r.bytes_copied),
            bytes(r.bytes_held as f64)
        );
    }
    out
}

fn bytes(b: f64) -> String {
    match b {
        b if b >= 1024.0 * 1024.0 => format!("{:.1} MiB", b / (1024.0 * 1024.0)),
        b if b >= 1024.0 => format!("{:.1} KiB", b / 1024.0),
        b => format!("{b:.0} B"),
    }
}

/// How each strategy grows with cache length: per strategy and γ, the rollback and step
/// times at the longest length divided by those at the shortest (pattern `none`, else the
/// first pattern measured). Empty when only one length was measured.
pub fn target_checks(rows: &[BenchRow]) -> String {
    let (Some(short), Some(long)) = (
        rows.iter().map(|r| r.length).min(),
        rows.iter().map(|r| r.length).max(),
    ) else {
        return String::new();
    };
    if short == long {
        return String::new();
    }
    let pattern = if rows.iter().any(|r| r.pattern == Pattern::None) {
        Pattern::None
    } else {
        rows[0].pattern
    };
    let mut out = format!(
        "Growth from length {short} to {long} (pattern `{}`): time at {long} ÷ time at {short}. \
         Timer floor (median of an empty timed region on this machine): {:.3} µs; rollbacks \
         within a few hundredths of a µs of it are at the timer's resolution, and their ratios \
         are ratios of clock ticks.\n\n\
         | strategy | γ | rollback µs at {short} | rollback µs at {long} | rollback µs ratio | step µs ratio |\n\
         |---|---:|---:|---:|---:|---:|\n",
        pattern.name(),
        super::run::timer_floor_us()
    );
    let find = |r: &BenchRow, len: usize| {
        rows.iter().find(|o| {
            o.strategy == r.strategy
                && o.gamma == r.gamma
                && o.pattern == pattern
                && o.length == len
        })
    };
    for r in rows
        .iter()
        .filter(|r| r.length == short && r.pattern == pattern)
    {
        if let Some(l) = find(r, long) {
            let _ = writeln!(
                out,
                "| {} | {} | {:.3} | {:.3} | {:.2} | {:.2} |",
                r.strategy.name(),
                r.gamma,
                r.rollback_us,
                l.rollback_us,
                l.rollback_us / r.rollback_us.max(1e-3),
                l.step_us / r.step_us.max(1e-3)
            );
        }
    }
    out
}

/// Writes `results.csv`, `summary.md` and `plots/` into a folder that appears only when all
/// of them were written: `out`, or `experiments/bench-cache/<run-id>/`.
pub fn write_results(
    config: &BenchConfig,
    rows: &[BenchRow],
    out: Option<PathBuf>,
) -> Result<BenchOutcome> {
    let dir = ResultDir::plan(out.unwrap_or_else(|| default_result_path("bench-cache")))?;
    let partial = dir.create()?.to_path_buf();
    let write = |name: &str, text: &str| -> Result<()> {
        let path = partial.join(name);
        std::fs::write(&path, text).map_err(|e| Error::io(&path, e))
    };
    let table = markdown(rows);
    write("results.csv", &csv(rows))?;
    let summary = format!(
        "# Cache strategy benchmark\n\n{} KV heads × {} head_dim, f32, {} layer(s), CPU. \
         µs: median of {}–{} steps per cell. Copied: bytes moved per step beyond writing the \
         new K/V once; extra memory: held beyond the cache's own tokens.\n\n{table}\n{}",
        config.kv_heads,
        config.head_dim,
        config.layers,
        config.min_runs,
        config.max_runs,
        target_checks(rows)
    );
    write("summary.md", &summary)?;
    write_plots(&partial.join("plots"), rows)?;
    Ok(BenchOutcome {
        dir: dir.finish()?,
        table,
    })
}

/// One log-log SVG per γ × pattern and measure (`step_…`, `rollback_…`): µs vs cache length,
/// one line per strategy. Returns the paths written.
pub fn write_plots(dir: &Path, rows: &[BenchRow]) -> Result<Vec<PathBuf>> {
    let mut cells: BTreeMap<(usize, Pattern), Vec<&BenchRow>> = BTreeMap::new();
    for r in rows {
        cells.entry((r.gamma, r.pattern)).or_default().push(r);
    }
    let mut written = Vec::new();
    for ((gamma, pattern), group) in cells {
        for (measure, of) in [
            ("step", (|r: &BenchRow| r.step_us) as fn(&BenchRow) -> f64),
            ("rollback", |r: &BenchRow| r.rollback_us),
        ] {
            let title = format!(
                "{measure} µs vs cache length (γ = {gamma}, accept {})",
                pattern.name()
            );
            let svg = render(&title, &group, of)
                .map_err(|e| Error::invalid(format!("plot {title:?}: {e}")))?;
            let path = dir.join(format!("{measure}_g{gamma}_{}.svg", pattern.name()));
            std::fs::write(&path, svg).map_err(|e| Error::io(&path, e))?;
            written.push(path);
        }
    }
    Ok(written)
}

type PlotResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn render(title: &str, rows: &[&BenchRow], of: fn(&BenchRow) -> f64) -> PlotResult<String> {
    let mut series: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    for r in rows {
        // Log axes need positive values; a time below the clock's resolution is shown at 1 ns.
        let y = of(r).max(1e-3);
        series
            .entry(r.strategy.name())
            .or_default()
            .push((r.length as f64, y));
    }
    let range = |vals: Vec<f64>| {
        let lo = vals.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = vals.iter().copied().fold(0f64, f64::max);
        (lo / 1.5, hi * 1.5)
    };
    let all = series.values().flatten();
    let (x0, x1) = range(all.clone().map(|p| p.0).collect());
    let (y0, y1) = range(all.map(|p| p.1).collect());
    let mut svg = String::new();
    {
        let height = 480 + 18 * series.len() as u32;
        let root = SVGBackend::with_string(&mut svg, (820, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let (plot_area, legend_area) = root.split_vertically(480);
        let mut ctx = ChartBuilder::on(&plot_area)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())?;
        ctx.configure_mesh()
            .x_desc("cache length (tokens)")
            .y_desc("µs (median)")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.3}"))
            .draw()?;
        for (i, (name, points)) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            ctx.draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?;
            ctx.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
            let y = 6 + 18 * i as i32;
            legend_area.draw(&PathElement::new(
                [(70, y + 6), (100, y + 6)],
                color.stroke_width(2),
            ))?;
            legend_area.draw(&Text::new(name.to_string(), (110, y), ("sans-serif", 13)))?;
        }
        root.present()?;
    }
    Ok(svg)
}
