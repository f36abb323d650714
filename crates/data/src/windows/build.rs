//! `kiln data prepare --windows`: a long-format table (CSV or Parquet) sorted into one series per
//! group and stored column by column, with the manifest naming each column's role.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use super::table::{Cell, TableFormat, read_table};
use super::{
    FORMAT, REALS_FILE, Series, TARGETS_FILE, TargetNormalizer, VERSION, WINDOWS_FILE,
    WindowColumns, Windows, WindowsManifest,
};
use crate::prepare::{write_new_dir, write_npy};
use crate::{DType, DataError};

/// A long-format table (a CSV file, or Parquet by its `.parquet` or `.pq` extension) and how to
/// window it.
#[derive(Debug, Clone)]
pub struct WindowsSource {
    pub table: PathBuf,
    /// The table's format ([`TableFormat::of_path`] tells it by the file's extension).
    pub format: TableFormat,
    /// The CSV's field delimiter.
    pub delimiter: u8,
    pub columns: WindowColumns,
    pub encoder_length: usize,
    /// The shortest history where a series' end allows no full one; `None`: fixed length.
    pub min_encoder_length: Option<usize>,
    pub horizon: usize,
    pub normalize: TargetNormalizer,
}

/// The CSV's rows as read, column by column.
#[derive(Default)]
struct Rows {
    /// Each row's series: a number into `keys`.
    series: Vec<usize>,
    keys: Vec<Vec<String>>,
    times: Vec<i64>,
    /// `targets` values per row.
    targets: Vec<f32>,
    /// Known then unknown reals per row.
    reals: Vec<f32>,
    /// Static categoricals' texts per row.
    statics: Vec<String>,
    /// Each row's place in the table: its CSV line or Parquet row.
    lines: Vec<u64>,
}

/// Reads `source`'s table and writes its series into `out`, which must not exist yet; checks the
/// result by opening it. Returns the manifest written. Errors name the file, the line (CSV) or row
/// (Parquet) and the column, or the series, at fault.
pub fn prepare_windows(source: &WindowsSource, out: &Path) -> Result<WindowsManifest, DataError> {
    check_source(source)?;
    let rows = read_rows(source)?;
    write_new_dir(out, |dir| {
        let manifest = write_series(source, &rows, dir)?;
        Windows::open(dir)?;
        Ok(manifest)
    })
}

/// An error for lengths of 0, and for columns given no role or two.
fn check_source(s: &WindowsSource) -> Result<(), DataError> {
    for (key, v) in [("encoder_length", s.encoder_length), ("horizon", s.horizon)] {
        if v == 0 {
            return Err(DataError::InvalidConfig {
                key,
                value: "0".to_owned(),
                expected: "at least 1 time step".to_owned(),
            });
        }
    }
    if let Some(min) = s
        .min_encoder_length
        .filter(|&n| n == 0 || n > s.encoder_length)
    {
        return Err(DataError::InvalidConfig {
            key: "min_encoder_length",
            value: min.to_string(),
            expected: format!("1 to the encoder length ({})", s.encoder_length),
        });
    }
    let c = &s.columns;
    if c.group.is_empty() || c.target.is_empty() {
        return Err(DataError::file(
            &s.table,
            "a windowed dataset needs group column(s) naming the series and target column(s)",
        ));
    }
    let mut role: HashMap<&str, &str> = HashMap::new();
    let roles = [
        ("time", std::slice::from_ref(&c.time)),
        ("group", &c.group[..]),
        ("target", &c.target[..]),
        ("known", &c.known[..]),
        ("static", &c.static_categoricals[..]),
    ];
    for (name, columns) in roles {
        for column in columns {
            if let Some(other) = role.insert(column, name) {
                return Err(DataError::file(
                    &s.table,
                    format!("column `{column}` is given two roles: {other} and {name}"),
                ));
            }
        }
    }
    for column in &c.unknown {
        match role.insert(column, "unknown") {
            None | Some("target") => {}
            Some(other) => {
                return Err(DataError::file(
                    &s.table,
                    format!(
                        "column `{column}` is given two roles: {other} and unknown (only a \
                         target may also be an unknown real, as its history)"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Every row of the table, checked: integer times, finite reals and targets.
fn read_rows(source: &WindowsSource) -> Result<Rows, DataError> {
    let c = &source.columns;
    let reals: Vec<String> = c.known.iter().chain(&c.unknown).cloned().collect();
    let columns: Vec<String> = std::iter::once(&c.time)
        .chain(&c.group)
        .chain(&c.target)
        .chain(&reals)
        .chain(&c.static_categoricals)
        .cloned()
        .collect();
    let (g, t, r) = (c.group.len(), c.target.len(), reals.len());
    let mut rows = Rows::default();
    let mut key_numbers: HashMap<Vec<String>, usize> = HashMap::new();
    let path = &source.table;
    let unit = source.format.unit();
    read_table(
        path,
        (source.format, source.delimiter),
        &columns,
        |at, cells| {
            let bad = |k: usize, what: &str| {
                let cell = &cells[k];
                DataError::file(
                    path,
                    format!("{unit} {at}, column `{}`: `{cell}` {what}", columns[k]),
                )
            };
            let named = (1..=g).chain(1 + g + t + r..cells.len());
            if let Some(k) = named.into_iter().find(|&k| is_missing(&cells[k])) {
                return Err(bad(
                    k,
                    "is missing: every row names its series and its categories",
                ));
            }
            let key: Vec<String> = cells[1..=g].iter().map(|c| c.to_string()).collect();
            let next = key_numbers.len();
            let number = *key_numbers.entry(key.clone()).or_insert(next);
            if number == next {
                rows.keys.push(key);
            }
            rows.series.push(number);
            rows.times
                .push(integer(&cells[0]).ok_or_else(|| bad(0, "is not an integer time index"))?);
            for (k, cell) in cells.iter().enumerate().take(1 + g + t + r).skip(1 + g) {
                let v = finite(cell).ok_or_else(|| bad(k, NOT_FINITE))?;
                if k < 1 + g + t {
                    rows.targets.push(v);
                } else {
                    rows.reals.push(v);
                }
            }
            rows.statics
                .extend(cells[1 + g + t + r..].iter().map(|c| c.to_string()));
            rows.lines.push(at);
            Ok(())
        },
    )?;
    if rows.times.is_empty() {
        return Err(DataError::file(path, "has a header but no rows"));
    }
    Ok(rows)
}

const NOT_FINITE: &str = "is not a finite number (fill or drop missing values before \
                          preparing: a window cannot hold a gap)";

/// A null, or empty text.
fn is_missing(cell: &Cell) -> bool {
    match cell {
        Cell::Missing => true,
        Cell::Text(t) => t.is_empty(),
        Cell::Int(_) | Cell::Real(_) => false,
    }
}

/// A whole number: an integer cell, or text that is one.
fn integer(cell: &Cell) -> Option<i64> {
    match cell {
        Cell::Int(v) => Some(*v),
        Cell::Text(t) => t.parse().ok(),
        Cell::Real(_) | Cell::Missing => None,
    }
}

/// A number finite as `f32`.
fn finite(cell: &Cell) -> Option<f32> {
    let v = match cell {
        Cell::Int(v) => *v as f64,
        Cell::Real(v) => *v,
        Cell::Text(t) => t.parse::<f64>().ok()?,
        Cell::Missing => return None,
    };
    Some(v as f32).filter(|v| v.is_finite())
}

/// Sorts the rows into series (by key, then time), checks them, and writes the columns and the
/// manifest into `dir`.
fn write_series(
    source: &WindowsSource,
    rows: &Rows,
    dir: &Path,
) -> Result<WindowsManifest, DataError> {
    let mut order: Vec<usize> = (0..rows.times.len()).collect();
    order.sort_by(|&a, &b| {
        let (ka, kb) = (&rows.keys[rows.series[a]], &rows.keys[rows.series[b]]);
        ka.cmp(kb).then(rows.times[a].cmp(&rows.times[b]))
    });
    let categories = categories(&source.columns.static_categoricals, &rows.statics);
    let series = series_of(source, rows, &order, &categories)?;
    let t = source.columns.target.len();
    let r = source.columns.known.len() + source.columns.unknown.len();
    let gather = |values: &[f32], width: usize| -> Vec<u8> {
        order
            .iter()
            .flat_map(|&i| &values[i * width..(i + 1) * width])
            .flat_map(|v| v.to_le_bytes())
            .collect()
    };
    let n = order.len();
    write_npy(
        &dir.join(TARGETS_FILE),
        DType::F32,
        &[n, t],
        &gather(&rows.targets, t),
    )?;
    if r > 0 {
        write_npy(
            &dir.join(REALS_FILE),
            DType::F32,
            &[n, r],
            &gather(&rows.reals, r),
        )?;
    }
    let manifest = WindowsManifest {
        format: FORMAT.to_owned(),
        version: VERSION,
        columns: source.columns.clone(),
        encoder_length: source.encoder_length,
        horizon: source.horizon,
        min_encoder_length: source
            .min_encoder_length
            .filter(|&n| n < source.encoder_length),
        normalize: source.normalize,
        rows: n,
        categories,
        series,
    };
    for (key, steps) in [
        ("encoder_length", source.encoder_length),
        ("horizon", source.horizon),
    ] {
        if steps > manifest.rows {
            return Err(DataError::InvalidConfig {
                key,
                value: steps.to_string(),
                expected: format!(
                    "at most the {} rows of {}: no window looks further back or ahead than \
                     the data",
                    manifest.rows,
                    source.table.display()
                ),
            });
        }
    }
    if manifest
        .series
        .iter()
        .all(|s| manifest.windows_in(s.len) == 0)
    {
        return Err(DataError::file(
            &source.table,
            format!(
                "no series is long enough for one window: the longest has {} steps, a window \
                 needs {} (encoder {} + horizon {})",
                manifest.series.iter().map(|s| s.len).max().unwrap_or(0),
                manifest.min_encoder() + source.horizon,
                manifest.min_encoder(),
                source.horizon
            ),
        ));
    }
    let path = dir.join(WINDOWS_FILE);
    let text = serde_json::to_string_pretty(&manifest)
        .map_err(|e| DataError::file(&path, format!("cannot serialize the manifest: {e}")))?;
    std::fs::write(&path, text + "\n")
        .map_err(|e| DataError::file(&path, format!("cannot write: {e}")))?;
    Ok(manifest)
}

/// Each static column's values, sorted.
fn categories(columns: &[String], statics: &[String]) -> BTreeMap<String, Vec<String>> {
    let s = columns.len();
    columns
        .iter()
        .enumerate()
        .map(|(c, name)| {
            let values: BTreeSet<&String> = statics.iter().skip(c).step_by(s.max(1)).collect();
            (name.clone(), values.into_iter().cloned().collect())
        })
        .collect()
}

/// The series of the sorted rows: consecutive time steps, and static columns constant.
fn series_of(
    source: &WindowsSource,
    rows: &Rows,
    order: &[usize],
    categories: &BTreeMap<String, Vec<String>>,
) -> Result<Vec<Series>, DataError> {
    let statics = &source.columns.static_categoricals;
    let s = statics.len();
    let mut series: Vec<Series> = vec![];
    for (k, &i) in order.iter().enumerate() {
        let key = &rows.keys[rows.series[i]];
        match series.last_mut() {
            Some(last) if &last.key == key => {
                let prev = order[k - 1];
                check_step(source, rows, (prev, i), key)?;
                check_statics(source, rows, (prev, i), key)?;
                last.len += 1;
            }
            _ => {
                let codes = statics
                    .iter()
                    .enumerate()
                    .map(|(c, name)| {
                        let value = &rows.statics[i * s + c];
                        categories[name]
                            .binary_search(value)
                            .map_or(0, |v| v as i64)
                    })
                    .collect();
                series.push(Series {
                    key: key.clone(),
                    start: k,
                    len: 1,
                    first_time: rows.times[i],
                    statics: codes,
                });
            }
        }
    }
    Ok(series)
}

/// An error unless rows `a` and `b` of series `key` have the same static categoricals.
fn check_statics(
    source: &WindowsSource,
    rows: &Rows,
    (a, b): (usize, usize),
    key: &[String],
) -> Result<(), DataError> {
    let statics = &source.columns.static_categoricals;
    let s = statics.len();
    for (c, name) in statics.iter().enumerate() {
        let (va, vb) = (&rows.statics[a * s + c], &rows.statics[b * s + c]);
        if va != vb {
            return Err(DataError::file(
                &source.table,
                format!(
                    "{}s {} and {}: static column `{name}` changes within series {} (`{va}`, \
                     then `{vb}`): a static categorical is one value per series",
                    source.format.unit(),
                    rows.lines[a],
                    rows.lines[b],
                    key.join("/")
                ),
            ));
        }
    }
    Ok(())
}

/// An error unless row `b` is the time step after row `a` of series `key`.
fn check_step(
    source: &WindowsSource,
    rows: &Rows,
    (a, b): (usize, usize),
    key: &[String],
) -> Result<(), DataError> {
    let (ta, tb) = (rows.times[a], rows.times[b]);
    let step = i128::from(tb) - i128::from(ta);
    if step == 1 {
        return Ok(());
    }
    let what = if step == 0 {
        "repeat the same time".to_owned()
    } else {
        format!(
            "leave a gap of {} missing steps: fill the missing steps before preparing",
            step - 1
        )
    };
    Err(DataError::file(
        &source.table,
        format!(
            "{}s {} and {} of series {} (`{}` {ta} and {tb}) {what}",
            source.format.unit(),
            rows.lines[a],
            rows.lines[b],
            key.join("/"),
            source.columns.time
        ),
    ))
}
