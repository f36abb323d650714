//! CSV columns grouped into named arrays (`kiln data prepare --csv F --array NAME=A,B …
//! --target NAME=C`): each group is one array holding its columns' values of a row, `i64` where
//! every value of the group is an integer, else `f32`; the target group is classes (integers,
//! or names numbered in sorted order) or values, as a `.npy` target would be.

use std::collections::BTreeMap;
use std::path::Path;

use crate::csv::{csv_error, number_labels, open_reader};
use crate::{DType, DataError, StoredTarget, TargetSpec};

/// Named columns of a CSV file that make one array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnGroup {
    /// The array's name.
    pub name: String,
    /// Its columns' headers, in order; the array is `[columns]` per row (`[]` for one column
    /// of the target).
    pub columns: Vec<String>,
}

/// One group's values, row after row.
pub(crate) struct GroupArray {
    pub name: String,
    pub dtype: DType,
    /// Per-row shape.
    pub shape: Vec<usize>,
    /// Little-endian elements of `dtype`.
    pub bytes: Vec<u8>,
}

/// A cell as read: an integer literal or another number.
#[derive(Clone, Copy)]
enum Cell {
    Int(i64),
    Real(f64),
}

/// The groups of a CSV file, read: the input arrays, the target array and its record, and the
/// number of rows.
pub(crate) struct CsvGroups {
    pub rows: usize,
    pub inputs: Vec<GroupArray>,
    pub target: GroupArray,
    pub record: StoredTarget,
}

/// Reads `inputs` and `target`'s columns of the CSV file at `path`. Errors name the file, and
/// the line and column of a bad cell.
pub(crate) fn read_groups(
    path: &Path,
    delimiter: u8,
    inputs: &[ColumnGroup],
    target: &ColumnGroup,
    classes: Option<usize>,
) -> Result<CsvGroups, DataError> {
    let (mut reader, headers) = open_reader(path, delimiter)?;
    let groups: Vec<&ColumnGroup> = inputs.iter().chain([target]).collect();
    let at = locate(path, &headers, &groups)?;
    let mut cells: Vec<Vec<Cell>> = vec![vec![]; inputs.len()];
    let mut texts: Vec<(u64, String)> = vec![];
    let mut record = ::csv::StringRecord::new();
    let mut rows = 0;
    while reader
        .read_record(&mut record)
        .map_err(|e| DataError::file(path, csv_error(&e)))?
    {
        let line = record.position().map_or(0, |p| p.line());
        for (g, out) in cells.iter_mut().enumerate() {
            for &c in &at[g] {
                out.push(cell(path, line, &headers[c], record[c].trim())?);
            }
        }
        for &c in &at[inputs.len()] {
            texts.push((line, record[c].trim().to_owned()));
        }
        rows += 1;
    }
    if rows == 0 {
        return Err(DataError::file(path, "has a header but no rows"));
    }
    let inputs = inputs
        .iter()
        .zip(cells)
        .map(|(g, cells)| group_array(&g.name, vec![g.columns.len()], &cells))
        .collect();
    let (target, record) = target_array(path, &headers, &at[at.len() - 1], target, texts, classes)?;
    Ok(CsvGroups {
        rows,
        inputs,
        target,
        record,
    })
}

/// Each group's column positions; errors for an unknown column, an empty group or a column in
/// two groups.
fn locate(
    path: &Path,
    headers: &[String],
    groups: &[&ColumnGroup],
) -> Result<Vec<Vec<usize>>, DataError> {
    let mut owner: BTreeMap<usize, &str> = BTreeMap::new();
    let mut at = Vec::with_capacity(groups.len());
    for g in groups {
        if g.columns.is_empty() {
            return Err(DataError::file(
                path,
                format!("array `{}` names no columns", g.name),
            ));
        }
        let mut positions = vec![];
        for name in &g.columns {
            let Some(c) = headers.iter().position(|h| h == name) else {
                return Err(DataError::file(
                    path,
                    format!(
                        "has no column `{name}` (for array `{}`; its columns: {})",
                        g.name,
                        headers.join(", ")
                    ),
                ));
            };
            if let Some(other) = owner.insert(c, &g.name) {
                return Err(DataError::file(
                    path,
                    format!(
                        "column `{name}` is given to both `{other}` and `{}`",
                        g.name
                    ),
                ));
            }
            positions.push(c);
        }
        at.push(positions);
    }
    Ok(at)
}

/// The number in `text`: an integer literal, or any other number.
fn cell(path: &Path, line: u64, column: &str, text: &str) -> Result<Cell, DataError> {
    if let Ok(v) = text.parse::<i64>() {
        return Ok(Cell::Int(v));
    }
    text.parse::<f64>().map(Cell::Real).map_err(|_| {
        DataError::file(
            path,
            format!(
                "line {line}, column `{column}`: `{text}` is not a number (encode categories \
                 as integers; only the target may hold class names)"
            ),
        )
    })
}

/// `cells` as an array of per-row `shape`: `i64` where every cell is an integer, else `f32`.
fn group_array(name: &str, shape: Vec<usize>, cells: &[Cell]) -> GroupArray {
    let ints = cells.iter().all(|c| matches!(c, Cell::Int(_)));
    let (dtype, bytes) = if ints {
        let bytes = cells
            .iter()
            .flat_map(|c| match c {
                Cell::Int(v) => v.to_le_bytes(),
                Cell::Real(_) => [0; 8],
            })
            .collect();
        (DType::I64, bytes)
    } else {
        let bytes = cells
            .iter()
            .flat_map(|c| match *c {
                Cell::Int(v) => (v as f32).to_le_bytes(),
                Cell::Real(v) => (v as f32).to_le_bytes(),
            })
            .collect();
        (DType::F32, bytes)
    };
    GroupArray {
        name: name.to_owned(),
        dtype,
        shape,
        bytes,
    }
}

/// The target group: integers are classes, other numbers values (finite), and a single column
/// of other texts class names, numbered in sorted order.
fn target_array(
    path: &Path,
    headers: &[String],
    at: &[usize],
    group: &ColumnGroup,
    texts: Vec<(u64, String)>,
    classes: Option<usize>,
) -> Result<(GroupArray, StoredTarget), DataError> {
    let shape = if at.len() == 1 {
        vec![]
    } else {
        vec![at.len()]
    };
    let column = |k: usize| headers[at[k % at.len()]].as_str();
    let numbers: Option<Vec<Cell>> = texts
        .iter()
        .map(|(line, t)| cell(path, *line, "", t).ok())
        .collect();
    let Some(cells) = numbers else {
        return named_classes(path, group, &shape, texts, classes);
    };
    let array = group_array(&group.name, shape.clone(), &cells);
    let spec = if array.dtype == DType::I64 {
        let values = cells.iter().map(|c| match c {
            Cell::Int(v) => *v,
            Cell::Real(_) => 0,
        });
        let max = values.clone().max().unwrap_or(0);
        let classes = classes.unwrap_or((max.max(0) as usize + 1).max(2));
        for (k, v) in values.enumerate() {
            if v < 0 || v as u64 >= classes as u64 {
                return Err(DataError::file(
                    path,
                    format!(
                        "line {}, column `{}`: class {v} is outside 0..{classes}",
                        texts[k].0,
                        column(k)
                    ),
                ));
            }
        }
        TargetSpec::Classes { classes, shape }
    } else if let Some(classes) = classes {
        return Err(DataError::file(
            path,
            format!(
                "target `{}` holds real values, which are regression targets, but a class count \
                 ({classes}) was given: class targets are integers or names",
                group.name
            ),
        ));
    } else {
        if let Some(k) = cells
            .iter()
            .position(|c| matches!(c, Cell::Real(v) if !(*v as f32).is_finite()))
        {
            return Err(DataError::file(
                path,
                format!(
                    "line {}, column `{}`: target `{}` is not a finite number (regression \
                     targets must be finite)",
                    texts[k].0,
                    column(k),
                    texts[k].1
                ),
            ));
        }
        TargetSpec::Values { shape }
    };
    let record = StoredTarget::new(&group.name, &spec, array.dtype, None);
    Ok((array, record))
}

/// A target column of class names: numbered in sorted order.
fn named_classes(
    path: &Path,
    group: &ColumnGroup,
    shape: &[usize],
    texts: Vec<(u64, String)>,
    classes: Option<usize>,
) -> Result<(GroupArray, StoredTarget), DataError> {
    if !shape.is_empty() || classes.is_some() {
        let why = if shape.is_empty() {
            "the names define the classes: leave out the class count"
        } else {
            "class names need a single target column"
        };
        return Err(DataError::file(
            path,
            format!(
                "target `{}` holds texts that are not numbers: {why}",
                group.name
            ),
        ));
    }
    // Not all integers (some text is not a number), so these are names, numbered in order.
    let (labels, count, names) = number_labels(path, &group.columns[0], texts)?;
    let bytes = labels.iter().flat_map(|l| l.to_le_bytes()).collect();
    let spec = TargetSpec::label(count.max(2));
    let class_names = names.filter(|n| n.len() >= 2);
    let array = GroupArray {
        name: group.name.clone(),
        dtype: DType::I64,
        shape: vec![],
        bytes,
    };
    let record = StoredTarget::new(&group.name, &spec, DType::I64, class_names);
    Ok((array, record))
}
