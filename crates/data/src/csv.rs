//! Tabular data from a CSV file: numeric feature columns and one label column, parsed once
//! into memory.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::{DataError, Dataset, InMemory};

/// Which columns of a CSV file are what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvOptions {
    /// The header of the label column.
    pub label_column: String,
    /// Headers of the feature columns, in order; `None` takes every other column.
    pub feature_columns: Option<Vec<String>>,
    pub delimiter: u8,
}

impl Default for CsvOptions {
    fn default() -> Self {
        Self {
            label_column: "label".to_owned(),
            feature_columns: None,
            delimiter: b',',
        }
    }
}

/// A CSV file's rows as samples of shape `[features]`. Integer labels are used as they are;
/// any other labels are class names, numbered in sorted order.
#[derive(Debug, Clone)]
pub struct CsvDataset {
    path: PathBuf,
    data: InMemory,
    feature_columns: Vec<String>,
    classes: usize,
    class_names: Option<Vec<String>>,
}

impl CsvDataset {
    /// Parses `path` (with a header row). Errors name the file, line and column at fault.
    pub fn open(path: impl AsRef<Path>, options: &CsvOptions) -> Result<Self, DataError> {
        let path = path.as_ref();
        let mut reader = ::csv::ReaderBuilder::new()
            .delimiter(options.delimiter)
            .has_headers(true)
            .from_path(path)
            .map_err(|e| DataError::file(path, format!("cannot read: {e}")))?;
        let headers: Vec<String> = reader
            .headers()
            .map_err(|e| DataError::file(path, format!("cannot read the header row: {e}")))?
            .iter()
            .map(|h| h.trim().to_owned())
            .collect();
        let column = |name: &str| {
            headers.iter().position(|h| h == name).ok_or_else(|| {
                DataError::file(
                    path,
                    format!(
                        "has no column `{name}` (its columns: {})",
                        headers.join(", ")
                    ),
                )
            })
        };
        let label_at = column(&options.label_column)?;
        let feature_at: Vec<usize> = match &options.feature_columns {
            Some(names) => names.iter().map(|n| column(n)).collect::<Result<_, _>>()?,
            None => (0..headers.len()).filter(|&i| i != label_at).collect(),
        };
        if feature_at.is_empty() {
            return Err(DataError::file(
                path,
                "has no feature columns besides the label",
            ));
        }
        let mut features = Vec::new();
        let mut raw_labels = Vec::new();
        let mut record = ::csv::StringRecord::new();
        loop {
            match reader.read_record(&mut record) {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => return Err(DataError::file(path, csv_error(&e))),
            }
            let line = record.position().map_or(0, |p| p.line());
            for &c in &feature_at {
                let text = record[c].trim();
                let value: f32 = text.parse().map_err(|_| {
                    DataError::file(
                        path,
                        format!(
                            "line {line}, column `{}`: `{text}` is not a number",
                            headers[c]
                        ),
                    )
                })?;
                features.push(value);
            }
            raw_labels.push((line, record[label_at].trim().to_owned()));
        }
        if raw_labels.is_empty() {
            return Err(DataError::file(path, "has a header but no rows"));
        }
        let (labels, classes, class_names) =
            number_labels(path, &options.label_column, raw_labels)?;
        let data = InMemory::new(features, labels, vec![feature_at.len()])?;
        Ok(Self {
            path: path.to_owned(),
            data,
            feature_columns: feature_at.iter().map(|&i| headers[i].clone()).collect(),
            classes,
            class_names,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn feature_columns(&self) -> &[String] {
        &self.feature_columns
    }

    /// Labels lie in `0..classes()`.
    pub fn classes(&self) -> usize {
        self.classes
    }

    /// The class names, when the labels were names rather than integers.
    pub fn class_names(&self) -> Option<&[String]> {
        self.class_names.as_deref()
    }

    pub(crate) fn in_memory(&self) -> &InMemory {
        &self.data
    }
}

fn csv_error(e: &::csv::Error) -> String {
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

type Labels = (Vec<i64>, usize, Option<Vec<String>>);

fn number_labels(path: &Path, column: &str, raw: Vec<(u64, String)>) -> Result<Labels, DataError> {
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
        Some(self.classes)
    }
}
