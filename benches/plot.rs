//! Charts of a benchmark report (`kiln-bench/1`, typed: [`Report`]), each written as PNG and SVG.
//!
//! Per suite, `<suite>.png`/`.svg`: every comparison's ratio kiln / baseline as a horizontal bar,
//! coloured by whether it meets its goal, with a tick at the goal and a dashed line at parity
//! (1.0) (`ratio`). Comparisons of the group [`SWEEP_GROUP`] are drawn instead in
//! `<suite>-batch-sweep.png`/`.svg`: one panel per unit, kiln and baseline against the batch
//! size on a log2 axis, one pair of lines per series (the name without its `b=N` token)
//! (`sweep`).
//!
//! A comparison whose details hold `loss_curves` (`{"kiln": [...], "baseline": [...]}` and
//! optionally the baseline's `baseline_name`: the same-learning rows) also gets
//! `<suite>-loss-<model>-<precision>.png`/`.svg`: both sides' training loss per step, and
//! below it their difference (`loss`).
//!
//! Missing and non-finite values are left out of the drawing (a bar without a value reads
//! "no value"); nothing here panics on odd input. Text uses the DejaVu Sans embedded in
//! `kiln-train`, so no system fonts are needed; the SVGs name the family "DejaVu Sans" with a
//! sans-serif fallback (`canvas`: the backends, header, legend and panels all charts share).

mod canvas;
mod loss;
mod ratio;
mod sweep;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use kiln_train::plot::{register_fonts, usable};

use crate::report::{Comparison, Report, SWEEP_GROUP};
use canvas::write_chart;
use ratio::{Bar, RatioChart};
use sweep::{SweepChart, sweep_panels};

/// The ratio charts' reading guide, before the report's facts in their second line.
const RATIO_NOTE: &str = "bar = kiln / baseline, 1.0 = parity";

/// The file stem of the batch-size sweep chart.
const SWEEP_STEM: &str = "batch-sweep";

/// Writes the charts of `report` into `dir`, creating it if needed, and returns the paths
/// written: `<suite>.png` and `<suite>.svg` per suite with comparisons outside [`SWEEP_GROUP`],
/// and `<suite>-batch-sweep.png`/`.svg` per suite with comparisons in it. File stems are slugs of
/// the suite names (`[a-z0-9-]`, made unique). A report without comparisons writes nothing.
pub fn write_plots(report: &Report, dir: &Path) -> crate::Result<Vec<PathBuf>> {
    let rows = &report.comparisons;
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    if !register_fonts() {
        return Err("plots: the embedded font could not be loaded".to_owned());
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("plots: cannot create {}: {e}", dir.display()))?;

    let subtitle = subtitle(report);
    let (sweep, plain): (Vec<&Comparison>, Vec<&Comparison>) =
        rows.iter().partition(|r| r.group == SWEEP_GROUP);
    let mut stems = HashSet::new();
    let mut written = Vec::new();
    for (suite, members) in by_suite(&plain) {
        let chart = RatioChart {
            title: format!("{suite}: ratio kiln / baseline"),
            subtitle: joined(&[RATIO_NOTE, subtitle.as_str()]),
            bars: members.iter().map(|r| Bar::of(r)).collect(),
        };
        let stem = unique(slug(suite), &mut stems);
        write_chart(dir, &stem, &chart, &mut written)?;
    }
    for (suite, members) in by_suite(&sweep) {
        let chart = SweepChart {
            title: format!("{suite}: batch-size sweep, kiln and baseline against batch size"),
            subtitle: subtitle.clone(),
            panels: sweep_panels(&members),
        };
        let stem = unique(format!("{}-{SWEEP_STEM}", slug(suite)), &mut stems);
        write_chart(dir, &stem, &chart, &mut written)?;
    }
    for (stem, chart) in loss::loss_charts(rows, &subtitle) {
        let stem = unique(stem, &mut stems);
        write_chart(dir, &stem, &chart, &mut written)?;
    }
    Ok(written)
}

/// A usable number: finite and at most [`kiln_train::plot::MAX_MAGNITUDE`].
fn number(v: f64) -> Option<f64> {
    Some(v).filter(|x| usable(*x))
}

/// The non-empty texts of `parts`, joined by ` · `.
fn joined(parts: &[&str]) -> String {
    parts
        .iter()
        .filter(|s| !s.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join(" · ")
}

/// Comparisons grouped by suite, suites and members in report order.
fn by_suite<'a>(rows: &[&'a Comparison]) -> Vec<(&'a str, Vec<&'a Comparison>)> {
    let mut out: Vec<(&str, Vec<&Comparison>)> = Vec::new();
    for row in rows {
        let suite = if row.suite.is_empty() {
            "unnamed suite"
        } else {
            row.suite.as_str()
        };
        match out.iter_mut().find(|(s, _)| *s == suite) {
            Some((_, members)) => members.push(row),
            None => out.push((suite, vec![row])),
        }
    }
    out
}

/// What the report says about where and when it was measured, for the charts' second line.
fn subtitle(report: &Report) -> String {
    let mut parts = Vec::new();
    if !report.created.is_empty() {
        parts.push(report.created.clone());
    }
    if let Some(device) = &report.machine.device {
        parts.push(format!("device {device}"));
    }
    if let Some(cpus) = report.machine.cpus {
        parts.push(format!("{cpus} CPUs"));
    }
    if report.quick {
        parts.push("quick run".to_owned());
    }
    parts.join(" · ")
}

/// `s` lowercased with every run of other characters than `[a-z0-9]` turned into one `-`.
fn slug(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars().flat_map(char::to_lowercase) {
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    let out = out.trim_end_matches('-');
    if out.is_empty() {
        "suite".to_owned()
    } else {
        out.to_owned()
    }
}

/// `stem`, or `stem-2`, `stem-3`, … if taken; records the result as taken.
fn unique(stem: String, taken: &mut HashSet<String>) -> String {
    let mut candidate = stem.clone();
    let mut n = 2;
    while taken.contains(&candidate) {
        candidate = format!("{stem}-{n}");
        n += 1;
    }
    taken.insert(candidate.clone());
    candidate
}
