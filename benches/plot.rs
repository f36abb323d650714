//! Charts of a [`Report`] as PNG and SVG: per suite the ratios as bars (`ratio`), the sweep as
//! lines (`sweep`), rows' loss curves (`loss`). Odd values are left out, never a panic.

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
use sweep::sweep_chart;

/// The file stem of the batch-size sweep chart.
const SWEEP_STEM: &str = "batch-sweep";

/// Writes the charts of `report` into `dir` (created if needed) and returns the paths written:
/// `<suite>.png`/`.svg`, `<suite>-batch-sweep.*` and `<suite>-loss-*.*`, stems unique slugs.
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
            subtitle: joined(&["bar = kiln / baseline, 1.0 = parity", &subtitle]),
            bars: members.iter().map(|r| Bar::of(r)).collect(),
        };
        written.extend(write_chart(dir, &unique(slug(suite), &mut stems), &chart)?);
    }
    for (suite, members) in by_suite(&sweep) {
        let title = format!("{suite}: batch-size sweep, kiln and baseline against batch size");
        let chart = sweep_chart(title, subtitle.clone(), &members);
        let stem = unique(format!("{}-{SWEEP_STEM}", slug(suite)), &mut stems);
        written.extend(write_chart(dir, &stem, &chart)?);
    }
    for (stem, chart) in rows.iter().filter_map(|c| loss::loss_chart(c, &subtitle)) {
        written.extend(write_chart(dir, &unique(stem, &mut stems), &chart)?);
    }
    Ok(written)
}

/// A usable number: finite and at most [`kiln_train::plot::MAX_MAGNITUDE`].
fn number(v: f64) -> Option<f64> {
    Some(v).filter(|x| usable(*x))
}

/// The non-empty texts of `parts`, joined by ` · `.
fn joined(parts: &[&str]) -> String {
    let parts: Vec<&str> = parts.iter().copied().filter(|s| !s.is_empty()).collect();
    parts.join(" · ")
}

/// Comparisons grouped by suite, suites and members in report order.
fn by_suite<'a>(rows: &[&'a Comparison]) -> Vec<(&'a str, Vec<&'a Comparison>)> {
    grouped(rows, |r| match r.suite.as_str() {
        "" => "unnamed suite",
        suite => suite,
    })
}

/// `items` grouped by `key`: the groups in the order of their first items, the items in order.
fn grouped<'a, T, K: PartialEq>(items: &[&'a T], key: impl Fn(&'a T) -> K) -> Vec<(K, Vec<&'a T>)> {
    let mut out: Vec<(K, Vec<&T>)> = Vec::new();
    for &item in items {
        let k = key(item);
        match out.iter_mut().find(|(g, _)| *g == k) {
            Some((_, members)) => members.push(item),
            None => out.push((k, vec![item])),
        }
    }
    out
}

/// The smallest and largest of `values`, if there are any.
fn min_max(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values.fold(None, |acc, v| {
        Some(acc.map_or((v, v), |(lo, hi): (f64, f64)| (lo.min(v), hi.max(v))))
    })
}

/// What the report says about where and when it was measured, for the charts' second line.
fn subtitle(report: &Report) -> String {
    let machine = &report.machine;
    let device = machine
        .device
        .as_ref()
        .map_or(String::new(), |d| format!("device {d}"));
    let cpus = machine.cpus.map_or(String::new(), |n| format!("{n} CPUs"));
    let quick = if report.quick { "quick run" } else { "" };
    joined(&[&report.created, &device, &cpus, quick])
}

/// `s` lowercased, each run of characters other than `[a-z0-9]` one `-` (none at the ends).
fn slug(s: &str) -> String {
    let lower = s.to_lowercase();
    let words: Vec<&str> = lower
        .split(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit()))
        .filter(|w| !w.is_empty())
        .collect();
    if words.is_empty() {
        "suite".to_owned()
    } else {
        words.join("-")
    }
}

/// `stem`, or `stem-2`, `stem-3`, … if taken; records the result as taken.
fn unique(stem: String, taken: &mut HashSet<String>) -> String {
    let numbered = (2..).map(|n| format!("{stem}-{n}"));
    let mut candidates = std::iter::once(stem.clone()).chain(numbered);
    let free = candidates.find(|c| !taken.contains(c)).unwrap_or_default();
    taken.insert(free.clone());
    free
}
