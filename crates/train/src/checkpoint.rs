//! Crash-safe checkpoints. A checkpoint is a directory `checkpoints/step-<N>/` holding
//! `model.safetensors` (the weights, readable from Python with `safetensors`),
//! `state.safetensors` (optimizer moments and steps, the CPU generator's state) and
//! `checkpoint.json` (step, data position, loss-scaler state, dropout generator positions,
//! running sums, the resolved configuration, kiln and libtorch versions, and the SHA-256 of
//! every file and of itself). It is written under a temporary name, every file fsynced, then
//! renamed into place, so a crash at any moment leaves the previous checkpoint loadable; older
//! ones are pruned only after the new one is complete.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors, tensor::TensorView};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tch::{Device, Kind, Tensor};

use crate::TrainError;

pub const FORMAT: &str = "kiln-checkpoint";
pub const VERSION: u32 = 1;
pub const MODEL_FILE: &str = "model.safetensors";
pub const STATE_FILE: &str = "state.safetensors";
pub const META_FILE: &str = "checkpoint.json";
const TMP_PREFIX: &str = ".tmp-";

fn file_error(path: &Path, e: impl std::fmt::Display) -> TrainError {
    TrainError::File {
        path: path.to_owned(),
        message: e.to_string(),
    }
}

/// Training sums that span steps, so that metrics after a resume equal an uninterrupted run's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunningSums {
    pub epoch_loss: f64,
    pub epoch_correct: f64,
    pub epoch_samples: u64,
    pub interval_loss: f64,
    pub interval_correct: f64,
    pub interval_samples: u64,
    pub skipped_steps: u64,
    pub best_val_accuracy: Option<f64>,
}

/// `checkpoint.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    pub format: String,
    pub version: u32,
    pub kiln_version: String,
    pub libtorch_version: String,
    /// Optimizer steps taken.
    pub step: u64,
    /// Where the data continues: the epoch, and the next batch within it.
    pub epoch: u64,
    pub batch: usize,
    /// The batch size the run trains with (what `"auto"` chose, for a resume).
    #[serde(default)]
    pub batch_size: Option<u64>,
    pub loss_scale: Option<f64>,
    pub loss_scale_growth_tracker: Option<i64>,
    /// The model's own generator positions (dropout).
    pub model_rng: Vec<u64>,
    /// Validation accuracy of the epoch this checkpoint ends, if it ends one.
    pub val_accuracy: Option<f64>,
    pub sums: RunningSums,
    /// The resolved configuration with provenance.
    pub config: serde_json::Value,
    /// The shape of the model's input and its classes (absent in checkpoints from before
    /// inference existed).
    #[serde(default)]
    pub input: Option<crate::models::InputSpec>,
    /// SHA-256 of each tensor file.
    pub files: BTreeMap<String, String>,
    /// SHA-256 of this JSON with this field empty.
    pub meta_sha256: String,
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl Meta {
    fn digest(&self) -> Result<String, serde_json::Error> {
        let mut copy = self.clone();
        copy.meta_sha256 = String::new();
        Ok(sha256_hex(serde_json::to_string(&copy)?.as_bytes()))
    }
}

fn dtype_of(kind: Kind) -> Option<Dtype> {
    Some(match kind {
        Kind::Float => Dtype::F32,
        Kind::Double => Dtype::F64,
        Kind::Half => Dtype::F16,
        Kind::BFloat16 => Dtype::BF16,
        Kind::Int64 => Dtype::I64,
        Kind::Int => Dtype::I32,
        Kind::Uint8 => Dtype::U8,
        Kind::Bool => Dtype::BOOL,
        _ => return None,
    })
}

fn kind_of(dtype: Dtype) -> Option<Kind> {
    Some(match dtype {
        Dtype::F32 => Kind::Float,
        Dtype::F64 => Kind::Double,
        Dtype::F16 => Kind::Half,
        Dtype::BF16 => Kind::BFloat16,
        Dtype::I64 => Kind::Int64,
        Dtype::I32 => Kind::Int,
        Dtype::U8 => Kind::Uint8,
        Dtype::BOOL => Kind::Bool,
        _ => return None,
    })
}

/// Named tensors as safetensors bytes (copied to the CPU).
pub fn to_safetensors(tensors: &[(String, Tensor)]) -> Result<Vec<u8>, TrainError> {
    let mut owned = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let dtype = dtype_of(t.kind()).ok_or_else(|| TrainError::InvalidPlan {
            key: "checkpoint",
            value: name.clone(),
            expected: format!("a tensor of a storable dtype, not {:?}", t.kind()),
        })?;
        let cpu = t.f_detach()?.f_to_device(Device::Cpu)?.f_contiguous()?;
        let bytes = cpu.numel() * t.kind().elt_size_in_bytes();
        let mut data = vec![0u8; bytes];
        cpu.f_copy_data_u8(&mut data, cpu.numel())?;
        let shape: Vec<usize> = cpu.size().iter().map(|&d| d as usize).collect();
        owned.push((name.clone(), dtype, shape, data));
    }
    let views = owned
        .iter()
        .map(|(name, dtype, shape, data)| {
            TensorView::new(*dtype, shape.clone(), data)
                .map(|v| (name.clone(), v))
                .map_err(|e| TrainError::InvalidPlan {
                    key: "checkpoint",
                    value: name.clone(),
                    expected: e.to_string(),
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    safetensors::serialize(views, None).map_err(|e| TrainError::InvalidPlan {
        key: "checkpoint",
        value: "safetensors".to_owned(),
        expected: e.to_string(),
    })
}

/// Named tensors from safetensors bytes, on the CPU, in file order.
pub fn from_safetensors(bytes: &[u8], path: &Path) -> Result<Vec<(String, Tensor)>, TrainError> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| file_error(path, e))?;
    let mut out = vec![];
    for (name, view) in st.tensors() {
        let kind = kind_of(view.dtype())
            .ok_or_else(|| file_error(path, format!("tensor `{name}` has an unsupported dtype")))?;
        let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
        out.push((name, Tensor::f_from_data_size(view.data(), &shape, kind)?));
    }
    Ok(out)
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), TrainError> {
    let mut f = File::create_new(path).map_err(|e| file_error(path, e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| file_error(path, e))
}

fn sync_dir(dir: &Path) -> Result<(), TrainError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| file_error(dir, e))
}

/// What goes into a checkpoint.
#[derive(Debug)]
pub struct Contents<'a> {
    pub model: &'a [(String, Tensor)],
    pub state: &'a [(String, Tensor)],
    pub meta: Meta,
}

/// The directory name of the checkpoint at `step`.
pub fn dir_name(step: u64) -> String {
    format!("step-{step:09}")
}

/// Writes a checkpoint into `checkpoints/step-<N>` atomically and returns its path.
pub fn save(checkpoints: &Path, contents: Contents<'_>) -> Result<PathBuf, TrainError> {
    std::fs::create_dir_all(checkpoints).map_err(|e| file_error(checkpoints, e))?;
    let name = dir_name(contents.meta.step);
    let final_dir = checkpoints.join(&name);
    if final_dir.exists() {
        return Err(file_error(
            &final_dir,
            "a checkpoint of this step exists already; kiln does not overwrite it",
        ));
    }
    let tmp = checkpoints.join(format!("{TMP_PREFIX}{name}-{}", std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| file_error(&tmp, e))?;
    }
    std::fs::create_dir(&tmp).map_err(|e| file_error(&tmp, e))?;
    let mut meta = contents.meta;
    for (file, tensors) in [(MODEL_FILE, contents.model), (STATE_FILE, contents.state)] {
        let bytes = to_safetensors(tensors)?;
        meta.files.insert(file.to_owned(), sha256_hex(&bytes));
        write_synced(&tmp.join(file), &bytes)?;
    }
    meta.meta_sha256 = meta.digest().map_err(|e| file_error(&tmp, e))?;
    let text = serde_json::to_string_pretty(&meta).map_err(|e| file_error(&tmp, e))?;
    write_synced(&tmp.join(META_FILE), text.as_bytes())?;
    sync_dir(&tmp)?;
    std::fs::rename(&tmp, &final_dir).map_err(|e| file_error(&final_dir, e))?;
    sync_dir(checkpoints)?;
    Ok(final_dir)
}

/// A checkpoint read back and verified.
#[derive(Debug)]
pub struct Checkpoint {
    pub dir: PathBuf,
    pub meta: Meta,
    pub model: Vec<(String, Tensor)>,
    pub state: Vec<(String, Tensor)>,
}

/// Reads and verifies the checkpoint in `dir`: every checksum must match.
pub fn load(dir: &Path) -> Result<Checkpoint, TrainError> {
    let meta_path = dir.join(META_FILE);
    let text = std::fs::read_to_string(&meta_path).map_err(|e| file_error(&meta_path, e))?;
    let meta: Meta = serde_json::from_str(&text)
        .map_err(|e| file_error(&meta_path, format!("not a readable checkpoint: {e}")))?;
    if meta.format != FORMAT || meta.version != VERSION {
        return Err(file_error(
            &meta_path,
            format!(
                "format {} version {} (this kiln reads {FORMAT} version {VERSION})",
                meta.format, meta.version
            ),
        ));
    }
    let digest = meta.digest().map_err(|e| file_error(&meta_path, e))?;
    if digest != meta.meta_sha256 {
        return Err(file_error(
            &meta_path,
            "checksum mismatch: the file is corrupted",
        ));
    }
    let read = |file: &str| -> Result<Vec<(String, Tensor)>, TrainError> {
        let path = dir.join(file);
        let bytes = std::fs::read(&path).map_err(|e| file_error(&path, e))?;
        let expected = meta
            .files
            .get(file)
            .ok_or_else(|| file_error(&meta_path, format!("no checksum for {file}")))?;
        if &sha256_hex(&bytes) != expected {
            return Err(file_error(
                &path,
                "checksum mismatch: the file is truncated or corrupted",
            ));
        }
        from_safetensors(&bytes, &path)
    };
    let model = read(MODEL_FILE)?;
    let state = read(STATE_FILE)?;
    Ok(Checkpoint {
        dir: dir.to_owned(),
        meta,
        model,
        state,
    })
}

impl Checkpoint {
    /// Copies the saved weights into `model` (a model's tensors, in name order) by name. The
    /// names and shapes must match; the error names the first tensor at fault.
    pub fn copy_weights_into(&self, model: &[(String, Tensor)]) -> Result<(), TrainError> {
        let mismatch = |expected: String| TrainError::InvalidPlan {
            key: "checkpoint",
            value: self.dir.display().to_string(),
            expected: format!("{expected} (were model settings changed?)"),
        };
        let saved: BTreeMap<&str, &Tensor> =
            self.model.iter().map(|(n, t)| (n.as_str(), t)).collect();
        if saved.len() != model.len() {
            return Err(mismatch(format!(
                "the model has {} tensors, the checkpoint {}",
                model.len(),
                saved.len()
            )));
        }
        let _guard = tch::no_grad_guard();
        for (name, target) in model {
            let source = saved
                .get(name.as_str())
                .ok_or_else(|| mismatch(format!("the checkpoint lacks tensor `{name}`")))?;
            if source.size() != target.size() {
                return Err(mismatch(format!(
                    "tensor `{name}` is {:?} in the model, {:?} in the checkpoint",
                    target.size(),
                    source.size()
                )));
            }
            target.shallow_clone().f_copy_(source)?;
        }
        Ok(())
    }
}

/// The complete checkpoints in `checkpoints`, oldest first (temporary directories of
/// interrupted writes are not checkpoints).
pub fn list(checkpoints: &Path) -> Result<Vec<(u64, PathBuf)>, TrainError> {
    let entries = match std::fs::read_dir(checkpoints) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(file_error(checkpoints, e)),
    };
    let mut out: Vec<(u64, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let step = name.strip_prefix("step-")?.parse().ok()?;
            Some((step, e.path()))
        })
        .collect();
    out.sort();
    Ok(out)
}

/// The newest checkpoint that verifies, with the ones skipped on the way and why.
pub fn latest_good(checkpoints: &Path) -> Result<(Checkpoint, Vec<(PathBuf, String)>), TrainError> {
    newest_good(checkpoints, u64::MAX, vec![])
}

/// The newest checkpoint older than step `below` that verifies; `skipped` (what was passed over
/// already) grows with each one that does not.
fn newest_good(
    checkpoints: &Path,
    below: u64,
    mut skipped: Vec<(PathBuf, String)>,
) -> Result<(Checkpoint, Vec<(PathBuf, String)>), TrainError> {
    for (_, dir) in list(checkpoints)?
        .into_iter()
        .rev()
        .filter(|(step, _)| *step < below)
    {
        match load(&dir) {
            Ok(c) => return Ok((c, skipped)),
            Err(e) => skipped.push((dir, e.to_string())),
        }
    }
    let detail = skipped
        .iter()
        .map(|(_, why)| format!("; {why}"))
        .collect::<String>();
    Err(file_error(
        checkpoints,
        format!("no loadable checkpoint here{detail}"),
    ))
}

/// Removes old checkpoints: keeps the newest `keep_last`, and with `keep_best` the one with the
/// best validation accuracy. Unreadable checkpoints older than the newest are removed too.
pub fn prune(
    checkpoints: &Path,
    keep_last: usize,
    keep_best: bool,
) -> Result<Vec<PathBuf>, TrainError> {
    let all = list(checkpoints)?;
    let keep_from = all.len().saturating_sub(keep_last.max(1));
    let best = if keep_best {
        all.iter()
            .filter_map(|(_, dir)| {
                let text = std::fs::read_to_string(dir.join(META_FILE)).ok()?;
                let meta: Meta = serde_json::from_str(&text).ok()?;
                Some((meta.val_accuracy?, dir.clone()))
            })
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, dir)| dir)
    } else {
        None
    };
    let mut removed = vec![];
    for (_, dir) in &all[..keep_from] {
        if Some(dir) == best.as_ref() {
            continue;
        }
        std::fs::remove_dir_all(dir).map_err(|e| file_error(dir, e))?;
        removed.push(dir.clone());
    }
    Ok(removed)
}

/// Resolves `--resume PATH`: a checkpoint directory, or a run directory (its newest good
/// checkpoint).
pub fn resolve(path: &Path) -> Result<(Checkpoint, Vec<(PathBuf, String)>), TrainError> {
    if path.join(META_FILE).exists() {
        return match load(path) {
            Ok(c) => Ok((c, vec![])),
            Err(e) => {
                // Fall back to the newest good checkpoint older than this one.
                let step = path
                    .file_name()
                    .and_then(|n| n.to_str()?.strip_prefix("step-")?.parse::<u64>().ok());
                match (step, path.parent()) {
                    (Some(step), Some(parent)) => {
                        newest_good(parent, step, vec![(path.to_owned(), e.to_string())])
                    }
                    _ => Err(e),
                }
            }
        };
    }
    let checkpoints = path.join("checkpoints");
    if checkpoints.is_dir() {
        return latest_good(&checkpoints);
    }
    if path.file_name().is_some_and(|n| n == "checkpoints") {
        return latest_good(path);
    }
    Err(file_error(
        path,
        "neither a checkpoint (no checkpoint.json) nor a run directory (no checkpoints/)",
    ))
}
