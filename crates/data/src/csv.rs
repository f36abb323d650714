//! Tabular data from a CSV file: numeric feature columns and either one label column or
//! several real-valued target columns (regression), parsed once into memory.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::{DataError, Dataset, InMemory, TargetSlot, TargetSpec, Targets};

/// Which columns of a CSV file are what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvOptions {
    /// The header of the label column (unused with `target_columns`).
    pub label_column: String,
    /// Headers of real-valued target columns, in order: each row's target is then their `f32`
    /// values, `[columns]` (regression), instead of a class label.
    pub target_columns: Option<Vec<String>>,
    /// Headers of the feature columns, in order; `None` takes every other column.
    pub feature_columns: Option<Vec<String>>,
    pub delimiter: u8,
}

impl Default for CsvOptions {
    fn default() -> Self {
        Self {
            label_column: "label".to_owned(),
            target_columns: None,
            feature_columns: None,
            delimiter: b',',
        }
    }
}

/// A CSV file's rows as samples of shape `[features]`. Integer labels are used as they are;
/// any other labels are class names, numbered in sorted order. With target columns, a row's
/// target is their values, which must be finite.
#[derive(Debug, Clone)]
pub struct CsvDataset {
    path: PathBuf,
    data: InMemory,
    feature_columns: Vec<String>,
    /// Empty for a label column.
    target_columns: Vec<String>,
    class_names: Option<Vec<String>>,
}

impl CsvDataset {
    /// Parses `path` (with a header row). Errors name the file, line and column at fault.
    pub fn open(path: impl AsRef<Path>, options: &CsvOptions) -> Result<Self, DataError> {
        let path = path.as_ref();
        let (mut reader, headers) = open_reader(path, options.delimiter)?;
        let columns = Columns::find(path, &headers, options)?;
        let rows = read_rows(path, &mut reader, &headers, &columns)?;
        let (target, targets, class_names) = match rows.targets {
            RawTargets::Labels(raw) => {
                let (labels, classes, names) = number_labels(path, &options.label_column, raw)?;
                (TargetSpec::label(classes), Targets::Classes(labels), names)
            }
            RawTargets::Values(values) => (
                TargetSpec::Values {
                    shape: vec![columns.target.width()],
                },
                Targets::Values(values),
                None,
            ),
        };
        let data =
            InMemory::with_targets(rows.features, vec![columns.features.len()], target, targets)?;
        let name = |at: &[usize]| at.iter().map(|&i| headers[i].clone()).collect();
        Ok(Self {
            path: path.to_owned(),
            data,
            feature_columns: name(&columns.features),
            target_columns: match &columns.target {
                TargetColumns::Values(at) => name(at),
                TargetColumns::Label(_) => Vec::new(),
            },
            class_names,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn feature_columns(&self) -> &[String] {
        &self.feature_columns
    }

    /// The target columns (empty when the target is a label column).
    pub fn target_columns(&self) -> &[String] {
        &self.target_columns
    }

    /// The class names, when the labels were names rather than integers.
    pub fn class_names(&self) -> Option<&[String]> {
        self.class_names.as_deref()
    }

    pub(crate) fn in_memory(&self) -> &InMemory {
        &self.data
    }
}

/// A reader of the CSV file at `path`, past its header row, and the headers (trimmed).
pub(crate) fn open_reader(
    path: &Path,
    delimiter: u8,
) -> Result<(::csv::Reader<std::fs::File>, Vec<String>), DataError> {
    let mut reader = ::csv::ReaderBuilder::new()
        .delimiter(delimiter)
        .has_headers(true)
        .from_path(path)
        .map_err(|e| DataError::file(path, format!("cannot read: {e}")))?;
    let headers: Vec<String> = reader
        .headers()
        .map_err(|e| DataError::file(path, format!("cannot read the header row: {e}")))?
        .iter()
        .map(|h| h.trim().to_owned())
        .collect();
    Ok((reader, headers))
}

/// Which columns hold the target.
enum TargetColumns {
    Label(usize),
    Values(Vec<usize>),
}

impl TargetColumns {
    fn width(&self) -> usize {
        match self {
            TargetColumns::Label(_) => 1,
            TargetColumns::Values(at) => at.len(),
        }
    }

    fn contains(&self, i: usize) -> bool {
        match self {
            TargetColumns::Label(at) => *at == i,
            TargetColumns::Values(at) => at.contains(&i),
        }
    }
}

/// The positions of the feature and target columns.
struct Columns {
    features: Vec<usize>,
    target: TargetColumns,
}

impl Columns {
    fn find(path: &Path, headers: &[String], options: &CsvOptions) -> Result<Self, DataError> {
        let column = |name: &str| find_column(path, headers, name);
        let target = match &options.target_columns {
            Some(names) if names.is_empty() => {
                return Err(DataError::file(path, "no target columns were given"));
            }
            Some(names) => {
                TargetColumns::Values(names.iter().map(|n| column(n)).collect::<Result<_, _>>()?)
            }
            None => TargetColumns::Label(column(&options.label_column)?),
        };
        let features: Vec<usize> = match &options.feature_columns {
            Some(names) => names.iter().map(|n| column(n)).collect::<Result<_, _>>()?,
            None => (0..headers.len())
                .filter(|&i| !target.contains(i))
                .collect(),
        };
        if let Some(&both) = features.iter().find(|&&i| target.contains(i)) {
            return Err(DataError::file(
                path,
                format!(
                    "column `{}` is both a feature and the target",
                    headers[both]
                ),
            ));
        }
        if features.is_empty() {
            return Err(DataError::file(
                path,
                "has no feature columns besides the target",
            ));
        }
        Ok(Self { features, target })
    }
}

/// Targets as read: label texts by line, or values.
enum RawTargets {
    Labels(Vec<(u64, String)>),
    Values(Vec<f32>),
}

struct Rows {
    features: Vec<f32>,
    targets: RawTargets,
}

/// The number in `text`, or an error naming the line and column.
fn number(path: &Path, line: u64, column: &str, text: &str) -> Result<f32, DataError> {
    text.parse().map_err(|_| {
        DataError::file(
            path,
            format!("line {line}, column `{column}`: `{text}` is not a number"),
        )
    })
}

fn read_rows(
    path: &Path,
    reader: &mut ::csv::Reader<std::fs::File>,
    headers: &[String],
    columns: &Columns,
) -> Result<Rows, DataError> {
    let mut features = Vec::new();
    let mut targets = match columns.target {
        TargetColumns::Label(_) => RawTargets::Labels(Vec::new()),
        TargetColumns::Values(_) => RawTargets::Values(Vec::new()),
    };
    let mut record = ::csv::StringRecord::new();
    let mut rows = 0;
    while reader
        .read_record(&mut record)
        .map_err(|e| DataError::file(path, csv_error(&e)))?
    {
        let line = record.position().map_or(0, |p| p.line());
        for &c in &columns.features {
            features.push(number(path, line, &headers[c], record[c].trim())?);
        }
        match (&columns.target, &mut targets) {
            (TargetColumns::Label(at), RawTargets::Labels(raw)) => {
                raw.push((line, record[*at].trim().to_owned()));
            }
            (TargetColumns::Values(at), RawTargets::Values(values)) => {
                for &c in at {
                    values.push(target_value(path, line, &headers[c], record[c].trim())?);
                }
            }
            _ => {}
        }
        rows += 1;
    }
    if rows == 0 {
        return Err(DataError::file(path, "has a header but no rows"));
    }
    Ok(Rows { features, targets })
}

/// A regression target: a finite number.
fn target_value(path: &Path, line: u64, column: &str, text: &str) -> Result<f32, DataError> {
    let value = number(path, line, column, text)?;
    if !value.is_finite() {
        return Err(DataError::file(
            path,
            format!(
                "line {line}, column `{column}`: target `{text}` is not a finite number \
                 (regression targets must be finite)"
            ),
        ));
    }
    Ok(value)
}

/// Where the column `name` is among `headers`; an error naming the table's columns.
pub(crate) fn find_column(path: &Path, headers: &[String], name: &str) -> Result<usize, DataError> {
    headers.iter().position(|h| h == name).ok_or_else(|| {
        DataError::file(
            path,
            format!(
                "has no column `{name}` (its columns: {})",
                headers.join(", ")
            ),
        )
    })
}

pub(crate) fn csv_error(e: &::csv::Error) -> String {
    match e.kind() {
        ::csv::ErrorKind::UnequalLengths {
            pos,
            expected_len,
            len,
        } => format!(
            "line {}: {len} fields, but the header has {expected_len}",
            pos.as_ref().map_or(0, |p| p.line())
        ),
        _ => e.to_string(),
    }
}

pub(crate) type Labels = (Vec<i64>, usize, Option<Vec<String>>);

/// Labels by line: integers as they are (never negative), or any other texts as class names
/// numbered in sorted order; with the class count and the names.
pub(crate) fn number_labels(
    path: &Path,
    column: &str,
    raw: Vec<(u64, String)>,
) -> Result<Labels, DataError> {
    let ints: Option<Vec<i64>> = raw.iter().map(|(_, t)| t.parse::<i64>().ok()).collect();
    if let Some(ints) = ints {
        if let Some(((line, text), _)) = raw.iter().zip(&ints).find(|(_, v)| **v < 0) {
            return Err(DataError::file(
                path,
                format!("line {line}, column `{column}`: label {text} is negative"),
            ));
        }
        let classes = ints.iter().max().map_or(0, |m| *m as usize + 1);
        return Ok((ints, classes.max(2), None));
    }
    let names: Vec<String> = raw
        .iter()
        .map(|(_, t)| t.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let labels = raw
        .iter()
        .map(|(_, t)| names.binary_search(t).map_or(0, |i| i as i64))
        .collect();
    Ok((labels, names.len(), Some(names)))
}

impl Dataset for CsvDataset {
    fn len(&self) -> usize {
        self.data.len()
    }

    fn sample_shape(&self) -> &[usize] {
        self.data.sample_shape()
    }

    fn read(&self, index: usize, out: &mut [f32]) -> Result<i64, DataError> {
        self.data.read(index, out)
    }

    fn classes(&self) -> Option<usize> {
        self.data.classes()
    }

    fn target(&self) -> TargetSpec {
        self.data.target()
    }

    fn read_sample(
        &self,
        index: usize,
        features: &mut [f32],
        target: TargetSlot<'_>,
    ) -> Result<(), DataError> {
        self.data.read_sample(index, features, target)
    }
}
