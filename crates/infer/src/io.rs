//! Inference inputs and outputs on disk. Inputs: a prepared kiln dataset (a directory with
//! `kiln-dataset.json`; its targets are kept for the task's metrics), a `.npy` array
//! `[samples, …]`, or a CSV file with a header row (every column numeric; a `label` column, if there, is kept as
//! labels, not fed to the model). Outputs: `.npy`, `.safetensors` (one tensor, `outputs`) or
//! `.csv`, chosen by the file's extension, written to a temporary file and renamed into place;
//! an existing file is never overwritten. And the check every engine makes of a batch's values
//! against its sample shape.

use std::io::Write;
use std::path::Path;

use kiln_data::{Dataset, MANIFEST_FILE, NpyArray, ShardedDataset, TargetSpec, Targets};

use crate::InferError;

/// What the inputs' samples should give, sample after sample.
#[derive(Debug, Clone, PartialEq)]
pub struct InputTargets {
    pub spec: TargetSpec,
    pub values: Targets,
}

/// Samples read into memory, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Inputs {
    /// `len × sample numel` values.
    pub values: Vec<f32>,
    pub sample_shape: Vec<usize>,
    pub len: usize,
    /// The samples' targets, where the source has them (a dataset's, a CSV's `label` column).
    pub targets: Option<InputTargets>,
    /// What was read, for reports.
    pub description: String,
}

impl Inputs {
    /// Samples `start..start + n` as one contiguous slice.
    pub fn slice(&self, start: usize, n: usize) -> &[f32] {
        let numel: usize = self.sample_shape.iter().product();
        &self.values[start * numel..(start + n) * numel]
    }
}

/// Reads `path`: a dataset directory, a `.npy` file or a `.csv` file.
pub fn read_inputs(path: &Path) -> Result<Inputs, InferError> {
    if path.is_dir() {
        if !path.join(MANIFEST_FILE).is_file() {
            return Err(InferError::file(
                path,
                format!(
                    "a directory of inputs must be a prepared kiln dataset (no {MANIFEST_FILE}; \
                     see `kiln data prepare`)"
                ),
            ));
        }
        let dataset = ShardedDataset::open(path)?;
        let numel = dataset.sample_numel();
        let spec = dataset.target();
        let per = spec.numel();
        let mut values = vec![0f32; dataset.len() * numel];
        let mut targets = spec.batch(dataset.len());
        for (i, chunk) in values.chunks_exact_mut(numel.max(1)).enumerate() {
            dataset.read_sample(i, chunk, targets.slot(i, per))?;
        }
        return Ok(Inputs {
            values,
            sample_shape: dataset.sample_shape().to_vec(),
            len: dataset.len(),
            targets: Some(InputTargets {
                spec,
                values: targets,
            }),
            description: format!("dataset {} ({} samples)", path.display(), dataset.len()),
        });
    }
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("npy") => read_npy(path),
        Some("csv") => read_csv(path),
        _ => Err(InferError::file(
            path,
            "unknown input kind: give a prepared dataset directory, a .npy file or a .csv file",
        )),
    }
}

fn read_npy(path: &Path) -> Result<Inputs, InferError> {
    let bytes = std::fs::read(path).map_err(|e| InferError::file(path, e))?;
    let array = NpyArray::parse(&bytes).map_err(|e| InferError::file(path, e))?;
    if array.shape.len() < 2 || array.shape[0] == 0 {
        return Err(InferError::file(
            path,
            format!(
                "the array is {:?}; inputs are [samples, …features] with at least one sample",
                array.shape
            ),
        ));
    }
    Ok(Inputs {
        values: array.to_f32(),
        sample_shape: array.shape[1..].to_vec(),
        len: array.shape[0],
        targets: None,
        description: format!(
            "{} ({} samples of {:?} {})",
            path.display(),
            array.shape[0],
            &array.shape[1..],
            array.dtype
        ),
    })
}

fn read_csv(path: &Path) -> Result<Inputs, InferError> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .from_path(path)
        .map_err(|e| InferError::file(path, format!("cannot read: {e}")))?;
    let headers: Vec<String> = reader
        .headers()
        .map_err(|e| InferError::file(path, format!("cannot read the header row: {e}")))?
        .iter()
        .map(|h| h.trim().to_owned())
        .collect();
    let label_at = headers.iter().position(|h| h == "label");
    let features = headers.len() - usize::from(label_at.is_some());
    if features == 0 {
        return Err(InferError::file(path, "has no feature columns"));
    }
    let mut values = Vec::new();
    let mut labels = Vec::new();
    for (row, record) in reader.records().enumerate() {
        let line = row + 2;
        let record = record.map_err(|e| InferError::file(path, format!("line {line}: {e}")))?;
        for (col, field) in record.iter().enumerate() {
            let field = field.trim();
            if Some(col) == label_at {
                let label = field.parse::<i64>().map_err(|_| {
                    InferError::file(
                        path,
                        format!("line {line}, column label: `{field}` is not an integer label"),
                    )
                })?;
                labels.push(label);
            } else {
                let v = field.parse::<f32>().map_err(|_| {
                    InferError::file(
                        path,
                        format!(
                            "line {line}, column {}: `{field}` is not a number",
                            headers.get(col).map_or("?", String::as_str)
                        ),
                    )
                })?;
                values.push(v);
            }
        }
    }
    let len = values.len() / features;
    if len == 0 {
        return Err(InferError::file(path, "has a header but no rows"));
    }
    Ok(Inputs {
        values,
        sample_shape: vec![features],
        len,
        targets: label_at.map(|_| InputTargets {
            spec: TargetSpec::label(labels.iter().max().map_or(0, |&m| m.max(0) as usize + 1)),
            values: Targets::Classes(labels),
        }),
        description: format!("{} ({len} rows of {features} features)", path.display()),
    })
}

/// Output file formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    Npy,
    Safetensors,
    Csv,
}

impl OutputFormat {
    /// The format `path`'s extension asks for.
    pub fn of(path: &Path) -> Result<Self, InferError> {
        match path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            Some("npy") => Ok(OutputFormat::Npy),
            Some("safetensors") => Ok(OutputFormat::Safetensors),
            Some("csv") => Ok(OutputFormat::Csv),
            _ => Err(InferError::file(
                path,
                "unknown output format: the file must end in .npy, .safetensors or .csv",
            )),
        }
    }
}

/// Checks that `path` can be written: a known format, not there yet, its directory existing.
pub fn check_output(path: &Path) -> Result<OutputFormat, InferError> {
    let format = OutputFormat::of(path)?;
    check_new_file(path)?;
    Ok(format)
}

/// An error unless `path` can be created as a new file: it does not exist (kiln never
/// overwrites an output) and its directory does.
pub fn check_new_file(path: &Path) -> Result<(), InferError> {
    if path.exists() {
        return Err(InferError::file(
            path,
            "exists already; kiln does not overwrite outputs (choose another name)",
        ));
    }
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !parent.is_dir() {
        return Err(InferError::file(path, "its directory does not exist"));
    }
    Ok(())
}

/// Writes `values` of `shape` (`[samples, …output]`) to `path` in the format its extension
/// names.
pub fn write_outputs(path: &Path, shape: &[usize], values: &[f32]) -> Result<(), InferError> {
    let format = check_output(path)?;
    let bytes = match format {
        OutputFormat::Npy => {
            kiln_data::npy_f32_bytes(shape, values).map_err(|e| InferError::file(path, e))?
        }
        OutputFormat::Safetensors => {
            let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            let view = safetensors::tensor::TensorView::new(
                safetensors::Dtype::F32,
                shape.to_vec(),
                &data,
            )
            .map_err(|e| InferError::file(path, e))?;
            safetensors::serialize([("outputs", view)], None)
                .map_err(|e| InferError::file(path, e))?
        }
        OutputFormat::Csv => {
            let samples = shape.first().copied().unwrap_or(0);
            let per = values.len().checked_div(samples).unwrap_or(0);
            let mut text = (0..per)
                .map(|i| format!("output_{i}"))
                .collect::<Vec<_>>()
                .join(",");
            text.push('\n');
            for row in values.chunks(per.max(1)) {
                let line: Vec<String> = row.iter().map(f32::to_string).collect();
                text.push_str(&line.join(","));
                text.push('\n');
            }
            text.into_bytes()
        }
    };
    let tmp = path.with_file_name(format!(
        ".{}.tmp-{}",
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("outputs"),
        std::process::id()
    ));
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&bytes)?;
        file.sync_all()
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(InferError::file(path, format!("cannot write: {e}")));
    }
    if path.exists() {
        let _ = std::fs::remove_file(&tmp);
        return Err(InferError::file(
            path,
            "appeared while writing; not overwritten",
        ));
    }
    std::fs::rename(&tmp, path).map_err(|e| InferError::file(path, format!("cannot write: {e}")))
}

/// Checks that `inputs` holds `n` samples of `sample_shape`, 1 ≤ `n` ≤ `max` (`limit` says what
/// sets the maximum); returns one sample's number of values.
pub(crate) fn check_batch(
    inputs: &[f32],
    n: usize,
    sample_shape: &[usize],
    max: usize,
    limit: &str,
) -> Result<usize, InferError> {
    let numel: usize = sample_shape.iter().product();
    if n == 0 || n > max {
        return Err(InferError::Input(format!(
            "{n} samples in one batch; 1 to {max} fit ({limit})"
        )));
    }
    if inputs.len() != n * numel {
        return Err(InferError::Input(format!(
            "{} values for {n} samples of shape {sample_shape:?} ({} expected)",
            inputs.len(),
            n * numel
        )));
    }
    Ok(numel)
}
