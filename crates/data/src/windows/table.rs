//! A long-format table read row by row for the columns asked for: a CSV file with a header row,
//! or a Parquet file (by its `.parquet` or `.pq` extension; snappy, zstd or lz4 pages).

use std::path::Path;

use parquet::errors::ParquetError;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;

use crate::DataError;
use crate::csv::{csv_error, find_column, open_reader};

/// One cell as the table holds it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Cell {
    Int(i64),
    Real(f64),
    Text(String),
    /// A Parquet null.
    Missing,
}

impl std::fmt::Display for Cell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cell::Int(v) => write!(f, "{v}"),
            Cell::Real(v) => write!(f, "{v}"),
            Cell::Text(t) => f.write_str(t),
            Cell::Missing => f.write_str("null"),
        }
    }
}

/// What a position in the table is called in errors: a CSV line, a Parquet row.
pub(crate) type Unit = &'static str;

/// A table's file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableFormat {
    /// Text with a header row, fields split at a delimiter.
    Csv,
    /// Apache Parquet (snappy, zstd or lz4 pages).
    Parquet,
}

impl TableFormat {
    /// Parquet for a `.parquet` or `.pq` file, else CSV.
    pub fn of_path(path: &Path) -> Self {
        let parquet = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e.eq_ignore_ascii_case("parquet") || e.eq_ignore_ascii_case("pq"));
        if parquet {
            TableFormat::Parquet
        } else {
            TableFormat::Csv
        }
    }

    /// What a position in a table of this format is called: a CSV `line`, a Parquet `row`.
    pub(crate) fn unit(self) -> Unit {
        match self {
            TableFormat::Csv => "line",
            TableFormat::Parquet => "row",
        }
    }
}

/// Calls `row(position, cells)` for every row of the table at `path` (positions as
/// [`TableFormat::unit`] names them, from 1 for Parquet), `cells` those of `columns` in order.
/// A column the table lacks is an error naming the table's columns.
pub(crate) fn read_table(
    path: &Path,
    (format, delimiter): (TableFormat, u8),
    columns: &[String],
    row: impl FnMut(u64, &[Cell]) -> Result<(), DataError>,
) -> Result<(), DataError> {
    match format {
        TableFormat::Parquet => read_parquet(path, columns, row),
        TableFormat::Csv => read_csv(path, delimiter, columns, row),
    }
}

/// Where each of `columns` is among `headers`.
fn positions(path: &Path, headers: &[String], columns: &[String]) -> Result<Vec<usize>, DataError> {
    columns
        .iter()
        .map(|name| find_column(path, headers, name))
        .collect()
}

fn read_csv(
    path: &Path,
    delimiter: u8,
    columns: &[String],
    mut row: impl FnMut(u64, &[Cell]) -> Result<(), DataError>,
) -> Result<(), DataError> {
    let (mut reader, headers) = open_reader(path, delimiter)?;
    let at = positions(path, &headers, columns)?;
    let mut record = ::csv::StringRecord::new();
    let mut cells = Vec::with_capacity(at.len());
    while reader
        .read_record(&mut record)
        .map_err(|e| DataError::file(path, csv_error(&e)))?
    {
        cells.clear();
        cells.extend(at.iter().map(|&c| Cell::Text(record[c].trim().to_owned())));
        row(record.position().map_or(0, |p| p.line()), &cells)?;
    }
    Ok(())
}

fn read_parquet(
    path: &Path,
    columns: &[String],
    mut row: impl FnMut(u64, &[Cell]) -> Result<(), DataError>,
) -> Result<(), DataError> {
    let bad = |e: String| DataError::file(path, format!("cannot read it as Parquet: {e}"));
    let unreadable = |e: std::io::Error| DataError::file(path, format!("cannot read: {e}"));
    let file = std::fs::File::open(path).map_err(unreadable)?;
    let (pages, len) = (
        file.try_clone().map_err(unreadable)?,
        file.metadata().map_err(unreadable)?.len(),
    );
    super::pages::check_footer(&pages, len).map_err(bad)?;
    let reader = guarded(|| SerializedFileReader::new(file)).map_err(bad)?;
    super::pages::check_pages(&pages, len, reader.metadata()).map_err(bad)?;
    let headers: Vec<String> = reader
        .metadata()
        .file_metadata()
        .schema()
        .get_fields()
        .iter()
        .map(|f| f.name().to_owned())
        .collect();
    let at = positions(path, &headers, columns)?;
    let mut cells = Vec::with_capacity(at.len());
    let mut records = guarded(|| reader.get_row_iter(None)).map_err(bad)?;
    for k in 1.. {
        let Some(record) = guarded(|| Ok(records.next())).map_err(bad)? else {
            break;
        };
        let record = record.map_err(|e| bad(e.to_string()))?;
        let fields: Vec<&Field> = record.get_column_iter().map(|(_, f)| f).collect();
        cells.clear();
        for &c in &at {
            let field = fields
                .get(c)
                .ok_or_else(|| bad(format!("row {k} has {} fields", fields.len())))?;
            cells.push(cell(field));
        }
        row(k, &cells)?;
    }
    Ok(())
}

/// Runs a call into the `parquet` crate, which has panicked on damaged files (an index out of
/// bounds in its RLE decoder, an `unwrap` in its metadata reader: found by kiln's fuzz harness
/// in version 57): a panic becomes an error naming it, so a damaged table is an error, not a
/// crash.
fn guarded<T>(call: impl FnOnce() -> Result<T, ParquetError>) -> Result<T, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)) {
        Ok(result) => result.map_err(|e| e.to_string()),
        Err(payload) => {
            let why = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(format!(
                "the file is damaged (the Parquet reader failed: {why})"
            ))
        }
    }
}

/// A Parquet field as a cell: integers (and dates, as days) whole, floating numbers real,
/// strings text; anything else as its text.
fn cell(field: &Field) -> Cell {
    match field {
        Field::Null => Cell::Missing,
        Field::Byte(v) => Cell::Int(i64::from(*v)),
        Field::Short(v) => Cell::Int(i64::from(*v)),
        Field::Int(v) => Cell::Int(i64::from(*v)),
        Field::Long(v) => Cell::Int(*v),
        Field::UByte(v) => Cell::Int(i64::from(*v)),
        Field::UShort(v) => Cell::Int(i64::from(*v)),
        Field::UInt(v) => Cell::Int(i64::from(*v)),
        Field::Date(v) => Cell::Int(i64::from(*v)),
        Field::Float(v) => Cell::Real(f64::from(*v)),
        Field::Double(v) => Cell::Real(*v),
        Field::Str(s) => Cell::Text(s.clone()),
        other => Cell::Text(other.to_string()),
    }
}
