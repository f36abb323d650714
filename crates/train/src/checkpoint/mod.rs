//! Crash-safe checkpoints. A checkpoint is a directory `checkpoints/step-<N>/` holding
//! `model.safetensors` (the weights, readable from Python with `safetensors`),
//! `state.safetensors` (optimizer moments and steps, the CPU generator's state) and
//! `checkpoint.json` (step, data position, loss-scaler state, dropout generator positions,
//! running sums, the resolved configuration, kiln and libtorch versions, and the SHA-256 of
//! every file and of itself). It is written under a temporary name, every file fsynced, then
//! renamed into place, so a crash at any moment leaves the previous checkpoint loadable; older
//! ones are pruned only after the new one is complete. A checkpoint that does not fit on its
//! file system is refused before anything is written ([`kiln_data::NoSpace`]: the path, the
//! bytes needed and free), and a write that fails anyway (the disk filled up meanwhile)
//! removes its temporary directory before it returns the error. A checkpoint that fails its
//! checks is [`TrainError::DamagedCheckpoint`]; [`store`] passes over such ones and moves
//! them aside.

pub mod retention;
mod store;
mod sums;

pub use retention::Retention;
pub use sums::{LegacySums, RankSums, RunningSums, SavedSums};

pub use store::{
    MOVED_NOTE, MovedAside, Pruned, latest_good, list, move_aside, prepare_to_continue, prune,
    resolve,
};

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use kiln_data::NoSpace;
use kiln_data::space;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tch::Tensor;

use crate::TrainError;
pub use crate::weights::{from_safetensors, to_safetensors};

pub const FORMAT: &str = "kiln-checkpoint";
/// The version this kiln writes. Version 1 (running sums as fixed fields, before metrics were
/// named) is still read.
pub const VERSION: u32 = 2;
/// The oldest version this kiln reads.
pub const OLDEST_VERSION: u32 = 1;
pub const MODEL_FILE: &str = "model.safetensors";
pub const STATE_FILE: &str = "state.safetensors";
pub const META_FILE: &str = "checkpoint.json";
/// The trained module as TorchScript, in checkpoints of TorchScript models
/// (`torch.jit.load`-able; `kiln infer`/`kiln serve` run it).
pub const SCRIPT_FILE: &str = "model.pt";
const TMP_PREFIX: &str = ".tmp-";

fn file_error(path: &Path, e: impl std::fmt::Display) -> TrainError {
    TrainError::File {
        path: path.to_owned(),
        message: e.to_string(),
    }
}

fn damaged(path: &Path, e: impl std::fmt::Display) -> TrainError {
    TrainError::DamagedCheckpoint {
        path: path.to_owned(),
        message: e.to_string(),
    }
}

/// A fault opening or reading one file of a checkpoint: a missing file means the checkpoint is
/// incomplete (damaged); any other fault is the file system's and is reported as it is.
fn part_error(path: &Path, e: std::io::Error) -> TrainError {
    match e.kind() {
        std::io::ErrorKind::NotFound => damaged(path, "missing: the checkpoint is incomplete"),
        _ => file_error(path, e),
    }
}

/// Reads one file of a checkpoint (see [`part_error`]); anything but a regular file (a device,
/// a directory, a link to either) is damage, not something to read to its end.
fn read_part(path: &Path) -> Result<Vec<u8>, TrainError> {
    let kind = std::fs::metadata(path).map_err(|e| part_error(path, e))?;
    if !kind.is_file() {
        return Err(damaged(
            path,
            "not a regular file: the checkpoint is corrupted",
        ));
    }
    std::fs::read(path).map_err(|e| part_error(path, e))
}

/// Whether `name`, a file `checkpoint.json` lists, names a file inside the checkpoint's
/// directory: one plain component (no separator, `..` or root).
fn is_plain_name(name: &str) -> bool {
    let mut parts = Path::new(name).components();
    matches!(
        (parts.next(), parts.next()),
        (Some(std::path::Component::Normal(_)), None)
    )
}

/// `checkpoint.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// The base learning rate the run trains with (what `train.lr = "auto"` found, for a
    /// resume). Absent from the JSON when unknown, so that the checksum of a checkpoint written
    /// before kiln recorded it (computed over the JSON as kiln writes it) still holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    /// The number of data-parallel ranks that wrote it (absent: one).
    #[serde(default)]
    pub world_size: Option<u64>,
    pub loss_scale: Option<f64>,
    pub loss_scale_growth_tracker: Option<i64>,
    /// The model's own generator positions (dropout).
    pub model_rng: Vec<u64>,
    /// Validation accuracy of the epoch this checkpoint ends, if it ends one.
    pub val_accuracy: Option<f64>,
    /// Validation loss of the epoch this checkpoint ends, if it ends one.
    #[serde(default)]
    pub val_loss: Option<f64>,
    /// Every validation value of the epoch this checkpoint ends, by metric name (`val_loss`,
    /// `val_accuracy`, `val_mae`, `val_rmse`); absent from checkpoints of earlier versions.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub val_metrics: BTreeMap<String, f64>,
    /// Training sums that span steps (by metric name; fixed fields in version 1).
    pub sums: SavedSums,
    /// The resolved configuration with provenance.
    pub config: serde_json::Value,
    /// The shape of the model's input and its classes (absent in checkpoints from before
    /// inference existed).
    #[serde(default)]
    pub input: Option<crate::model::InputSpec>,
    /// SHA-256 of each file (the tensors, and `model.pt` for TorchScript models).
    pub files: BTreeMap<String, String>,
    /// Lengths of the files without a length header of their own (`model.pt`), for the quick
    /// check.
    #[serde(default)]
    pub file_bytes: BTreeMap<String, u64>,
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
    /// The checksum `meta_sha256` records: SHA-256 of the JSON with the checksum empty. It
    /// finds damage, not tampering: anyone can recompute it.
    pub fn digest(&self) -> Result<String, serde_json::Error> {
        let mut copy = self.clone();
        copy.meta_sha256 = String::new();
        Ok(sha256_hex(serde_json::to_string(&copy)?.as_bytes()))
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), TrainError> {
    let mut f = File::create_new(path).map_err(|e| write_error(path, e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| write_error(path, e))
}

/// What a run whose checkpoint does not fit is told to do.
const NO_SPACE_HINT: &str = "The run stops here, its earlier checkpoints intact: free some \
     space (or set run.output_dir to a file system with more room) and continue with --resume";

/// A failed write of `path`: [`NoSpace`] (its amounts filled in by [`save`]) where the file
/// system is full, else the I/O error.
fn write_error(path: &Path, e: std::io::Error) -> TrainError {
    if space::is_full(&e) {
        return no_space(path, 0).into();
    }
    file_error(path, e)
}

fn no_space(path: &Path, needed: u64) -> NoSpace {
    NoSpace {
        path: path.to_owned(),
        what: "the checkpoint",
        needed,
        available: 0,
        hint: NO_SPACE_HINT,
    }
    .at(path)
}

/// Bytes of the safetensors file of `tensors`: the data, and a generous header.
fn safetensors_bytes(tensors: &[(String, Tensor)]) -> u64 {
    let each = |(name, t): &(String, Tensor)| {
        let data = t.numel() as u64 * t.kind().elt_size_in_bytes() as u64;
        128 + name.len() as u64 + data
    };
    8 + tensors.iter().map(each).sum::<u64>()
}

/// Room for `checkpoint.json` beyond its text without checksums: one per file, and its own.
const META_CHECKSUMS_BYTES: u64 = 4096;

/// The length of each file a checkpoint of `contents` writes (the tensors and
/// `checkpoint.json`; `model.pt` and `model.pt2`, which their writers alone know, are not
/// counted).
fn file_lengths(contents: &Contents<'_>) -> Result<[u64; 3], TrainError> {
    let meta = serde_json::to_string_pretty(&contents.meta)
        .map_err(|e| file_error(Path::new(META_FILE), e))?;
    Ok([
        safetensors_bytes(contents.model),
        safetensors_bytes(contents.state),
        meta.len() as u64 + META_CHECKSUMS_BYTES,
    ])
}

/// The lengths of the files directly in `dir` (what a failed write left).
fn bytes_in(dir: &Path) -> Vec<u64> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| Some(e.metadata().ok()?.len()))
                .collect()
        })
        .unwrap_or_default()
}

fn sync_dir(dir: &Path) -> Result<(), TrainError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| file_error(dir, e))
}

impl std::fmt::Debug for Contents<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Contents")
            .field("model", &self.model.len())
            .field("state", &self.state.len())
            .field("meta", &self.meta)
            .field("script", &self.script.is_some())
            .field("program", &self.program.is_some())
            .finish()
    }
}

/// Writes a model as TorchScript to the path given; returns whether it did.
pub type ScriptWriter<'a> = &'a dyn Fn(&Path) -> Result<bool, TrainError>;

/// What goes into a checkpoint.
pub struct Contents<'a> {
    pub model: &'a [(String, Tensor)],
    pub state: &'a [(String, Tensor)],
    pub meta: Meta,
    /// Writes `model.pt` (TorchScript models).
    pub script: Option<ScriptWriter<'a>>,
    /// Writes `model.pt2` (exported programs: the program, so that a checkpoint recompiles on
    /// any machine).
    pub program: Option<ScriptWriter<'a>>,
}

/// The directory name of the checkpoint at `step`.
pub fn dir_name(step: u64) -> String {
    format!("step-{step:09}")
}

/// Writes a checkpoint into `checkpoints/step-<N>` atomically and returns its path. Refuses
/// with [`NoSpace`] before writing where the file system lacks room for it; a write that fails
/// removes its temporary directory first (so no half-written checkpoint is left), and is
/// [`NoSpace`] too where the file system filled up.
pub fn save(checkpoints: &Path, contents: Contents<'_>) -> Result<PathBuf, TrainError> {
    save_in_background(checkpoints, contents, |_| Ok(()))?.wait()
}

/// [`save`], returning once the checkpoint is in memory: the tensors are serialized (a
/// snapshot: training may change them at once) and a model's TorchScript or program file is
/// written here; the files are written, synced and renamed into place on a thread of their
/// own, which then runs `then` on the checkpoints directory (pruning older ones: never before
/// the new one is complete). Refusals before the thread starts ([`NoSpace`], an existing
/// checkpoint of the step) return here; the write's own error comes from [`Writing::wait`].
pub fn save_in_background(
    checkpoints: &Path,
    contents: Contents<'_>,
    then: impl FnOnce(&Path) -> Result<(), TrainError> + Send + 'static,
) -> Result<Writing, TrainError> {
    std::fs::create_dir_all(checkpoints).map_err(|e| write_error(checkpoints, e))?;
    let name = dir_name(contents.meta.step);
    let final_dir = checkpoints.join(&name);
    if final_dir.exists() {
        return Err(file_error(
            &final_dir,
            "a checkpoint of this step exists already; kiln does not overwrite it",
        ));
    }
    let files = file_lengths(&contents)?;
    NoSpace::check(checkpoints, &files, "the checkpoint", NO_SPACE_HINT).map_err(|e| NoSpace {
        path: final_dir.clone(),
        ..e
    })?;
    let tmp = checkpoints.join(format!("{TMP_PREFIX}{name}-{}", std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| file_error(&tmp, e))?;
    }
    std::fs::create_dir(&tmp).map_err(|e| write_error(&tmp, e))?;
    let snapshot = match Snapshot::take(&tmp, contents) {
        Ok(snapshot) => snapshot,
        Err(e) => return Err(failed(e, &tmp, &final_dir, &files)),
    };
    let (dir, parent) = (final_dir.clone(), checkpoints.to_owned());
    let thread = std::thread::Builder::new()
        .name("kiln-checkpoint".to_owned())
        .spawn(move || {
            let written = snapshot.write(&tmp).and_then(|()| {
                std::fs::rename(&tmp, &dir).map_err(|e| file_error(&dir, e))?;
                sync_dir(&parent)
            });
            match written {
                Ok(()) => then(&parent).map(|()| dir),
                Err(e) => Err(failed(e, &tmp, &dir, &files)),
            }
        })
        .map_err(|e| write_error(&final_dir, e))?;
    Ok(Writing {
        dir: final_dir,
        thread: Some(thread),
    })
}

/// A checkpoint being written on its own thread ([`save_in_background`]). Dropping it waits for
/// the write (a checkpoint is never left half-written by the process that began it).
#[derive(Debug)]
pub struct Writing {
    dir: PathBuf,
    thread: Option<std::thread::JoinHandle<Result<PathBuf, TrainError>>>,
}

impl Writing {
    /// Where the checkpoint will be once written.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the write has ended (well or not): [`Writing::wait`] then returns at once.
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Waits for the write; its path, or why it failed.
    pub fn wait(mut self) -> Result<PathBuf, TrainError> {
        match self.thread.take().map(std::thread::JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(file_error(&self.dir, "the checkpoint writer panicked")),
            None => Ok(self.dir.clone()),
        }
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The error of a checkpoint write that failed, once its temporary directory `tmp` is removed:
/// [`NoSpace`] where the write ran out of space or the file system is full now, needing at
/// least the estimate `files` and what was written before the failure.
fn failed(e: TrainError, tmp: &Path, final_dir: &Path, files: &[u64]) -> TrainError {
    let full_now = space::free(tmp).is_some_and(|s| s.available < s.block);
    let full = full_now || matches!(e, TrainError::NoSpace(_));
    let written = bytes_in(tmp);
    match std::fs::remove_dir_all(tmp) {
        Err(rm) if rm.kind() != std::io::ErrorKind::NotFound => tracing::warn!(
            "{}: cannot remove this unfinished checkpoint: {rm}",
            tmp.display()
        ),
        _ => {}
    }
    if !full {
        return e;
    }
    let block = space::free(final_dir).map_or(1, |s| s.block);
    let needed = space::needed(files.iter().copied(), block)
        .max(space::needed(written, block).saturating_add(block));
    no_space(final_dir, needed).into()
}

/// A checkpoint in memory: its tensors serialized, its model file (TorchScript or program)
/// already in the temporary directory, its metadata but for the checksums still to come.
struct Snapshot {
    meta: Meta,
    parts: Vec<(&'static str, Vec<u8>)>,
}

impl Snapshot {
    /// Serializes `contents`' tensors and writes its model file into `tmp`.
    fn take(tmp: &Path, contents: Contents<'_>) -> Result<Self, TrainError> {
        let mut meta = contents.meta;
        let parts = vec![
            (MODEL_FILE, to_safetensors(contents.model)?),
            (STATE_FILE, to_safetensors(contents.state)?),
        ];
        let writers = [
            (SCRIPT_FILE, contents.script),
            (crate::program::PROGRAM_FILE, contents.program),
        ];
        for (file, write) in writers {
            let Some(write) = write else { continue };
            let path = tmp.join(file);
            if write(&path)? {
                let bytes = read_part(&path)?;
                File::open(&path)
                    .and_then(|f| f.sync_all())
                    .map_err(|e| write_error(&path, e))?;
                meta.files.insert(file.to_owned(), sha256_hex(&bytes));
            }
        }
        Ok(Self { meta, parts })
    }

    /// Writes the tensors' files and then `checkpoint.json` into `tmp`, each synced.
    fn write(self, tmp: &Path) -> Result<(), TrainError> {
        let mut meta = self.meta;
        for (file, bytes) in &self.parts {
            meta.files.insert((*file).to_owned(), sha256_hex(bytes));
            write_synced(&tmp.join(file), bytes)?;
            crate::fault::reached(crate::fault::Point::CheckpointWrite);
        }
        meta.meta_sha256 = meta.digest().map_err(|e| file_error(tmp, e))?;
        let text = serde_json::to_string_pretty(&meta).map_err(|e| file_error(tmp, e))?;
        write_synced(&tmp.join(META_FILE), text.as_bytes())?;
        sync_dir(tmp)
    }
}

/// A checkpoint read back and verified.
#[derive(Debug)]
pub struct Checkpoint {
    pub dir: PathBuf,
    pub meta: Meta,
    pub model: Vec<(String, Tensor)>,
    pub state: Vec<(String, Tensor)>,
}

/// Reads and checks `dir`'s `checkpoint.json`: readable, a checkpoint this kiln reads, and its
/// own checksum holds. A newer format is an error of its own, not damage.
pub fn read_meta(dir: &Path) -> Result<Meta, TrainError> {
    let path = dir.join(META_FILE);
    let bytes = read_part(&path)?;
    let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
        damaged(
            &path,
            format!("not valid JSON ({e}): the file is truncated or corrupted"),
        )
    })?;
    let version = value.get("version").and_then(serde_json::Value::as_u64);
    if value.get("format").and_then(serde_json::Value::as_str) == Some(FORMAT)
        && let Some(version) =
            version.filter(|v| !(u64::from(OLDEST_VERSION)..=u64::from(VERSION)).contains(v))
    {
        return Err(file_error(
            &path,
            format!(
                "{FORMAT} version {version}, but this kiln reads versions \
                 {OLDEST_VERSION} to {VERSION}; resume it with the kiln that wrote it"
            ),
        ));
    }
    let meta: Meta = serde_json::from_value(value).map_err(|e| {
        damaged(
            &path,
            format!("not a readable {FORMAT} ({e}): the file is corrupted"),
        )
    })?;
    if meta.format != FORMAT {
        return Err(damaged(
            &path,
            format!(
                "format `{}`, not {FORMAT}: the file is corrupted",
                meta.format
            ),
        ));
    }
    if meta.digest().map_err(|e| file_error(&path, e))? != meta.meta_sha256 {
        return Err(damaged(&path, "checksum mismatch: the file is corrupted"));
    }
    let names = meta.files.keys().chain(meta.file_bytes.keys());
    if let Some(name) = names.into_iter().find(|n| !is_plain_name(n)) {
        return Err(damaged(
            &path,
            format!(
                "it lists the file {name:?}, which is not a file name inside the checkpoint's \
                 directory: the file is corrupted"
            ),
        ));
    }
    Ok(meta)
}

/// Reads the file `file` of the checkpoint in `dir` and checks it against `meta`'s checksum.
fn check_sha(dir: &Path, meta: &Meta, file: &str) -> Result<Vec<u8>, TrainError> {
    let expected = meta
        .files
        .get(file)
        .ok_or_else(|| damaged(&dir.join(META_FILE), format!("no checksum for {file}")))?;
    let path = dir.join(file);
    let bytes = read_part(&path)?;
    if &sha256_hex(&bytes) != expected {
        return Err(damaged(
            &path,
            "checksum mismatch: the file is truncated or corrupted",
        ));
    }
    Ok(bytes)
}

/// Reads the tensor file `file` of the checkpoint in `dir` and checks it against `meta`.
fn read_tensors(dir: &Path, meta: &Meta, file: &str) -> Result<Vec<(String, Tensor)>, TrainError> {
    let bytes = check_sha(dir, meta, file)?;
    from_safetensors(&bytes, &dir.join(file))
}

/// Reads and verifies the checkpoint in `dir`: every checksum must match. Missing files and
/// failed checks are [`TrainError::DamagedCheckpoint`].
pub fn load(dir: &Path) -> Result<Checkpoint, TrainError> {
    let meta = read_meta(dir)?;
    let model = read_tensors(dir, &meta, MODEL_FILE)?;
    let state = read_tensors(dir, &meta, STATE_FILE)?;
    for file in [SCRIPT_FILE, crate::program::PROGRAM_FILE] {
        if meta.files.contains_key(file) {
            check_sha(dir, &meta, file)?;
        }
    }
    Ok(Checkpoint {
        dir: dir.to_owned(),
        meta,
        model,
        state,
    })
}

/// The cheap check of a checkpoint, without reading its tensors: `checkpoint.json` verifies and
/// every tensor file it lists is there at the length its safetensors header declares (which
/// catches a file cut short by a full disk or a crash), and `model.pt`, if listed, matches
/// its checksum. Flipped bits inside the tensor data are
/// found by [`load`] alone.
pub fn check_quick(dir: &Path) -> Result<Meta, TrainError> {
    let meta = read_meta(dir)?;
    for file in meta.files.keys() {
        if !file.ends_with(".safetensors") {
            // A TorchScript file has no length header: its recorded length is the quick check
            // (its checksum, in `load`).
            check_length(dir, &meta, file)?;
            continue;
        }
        let path = dir.join(file);
        let (declared, actual) = safetensors_lengths(&path)?;
        if declared != actual {
            return Err(damaged(
                &path,
                format!(
                    "{actual} bytes where its header declares {declared}: the file is truncated \
                     or corrupted"
                ),
            ));
        }
    }
    Ok(meta)
}

/// Checks `file` against the length `meta` recorded for it (checkpoints without lengths: its
/// checksum).
fn check_length(dir: &Path, meta: &Meta, file: &str) -> Result<(), TrainError> {
    let Some(&want) = meta.file_bytes.get(file) else {
        return check_sha(dir, meta, file).map(drop);
    };
    let path = dir.join(file);
    let actual = std::fs::metadata(&path)
        .map_err(|e| part_error(&path, e))?
        .len();
    if actual != want {
        return Err(damaged(
            &path,
            format!("{actual} bytes where the checkpoint recorded {want}: the file is truncated"),
        ));
    }
    Ok(())
}

/// The length a safetensors file's header declares, and the file's actual length.
fn safetensors_lengths(path: &Path) -> Result<(u64, u64), TrainError> {
    use std::io::Read;
    let mut f = File::open(path).map_err(|e| part_error(path, e))?;
    let actual = f.metadata().map_err(|e| file_error(path, e))?.len();
    let short = || {
        damaged(
            path,
            "too short for its safetensors header: the file is truncated",
        )
    };
    let mut len = [0u8; 8];
    f.read_exact(&mut len).map_err(|_| short())?;
    let header_len = u64::from_le_bytes(len);
    if header_len > actual.saturating_sub(8) {
        return Err(short());
    }
    let mut header = vec![0u8; header_len as usize];
    f.read_exact(&mut header).map_err(|_| short())?;
    let header: BTreeMap<String, serde_json::Value> = serde_json::from_slice(&header)
        .map_err(|e| damaged(path, format!("unreadable safetensors header ({e})")))?;
    let data_end = header
        .iter()
        .filter(|(name, _)| name.as_str() != "__metadata__")
        .filter_map(|(_, t)| t.get("data_offsets")?.get(1)?.as_u64())
        .max()
        .unwrap_or(0);
    // The offsets are the file's to claim: past any length, they must not overflow.
    Ok(((8 + header_len).saturating_add(data_end), actual))
}

impl Checkpoint {
    /// This checkpoint with its EMA weights (`train.ema`) as its model's weights, for
    /// `infer.ema`; an error naming the key when it holds none.
    pub fn with_ema_weights(mut self) -> Result<Self, TrainError> {
        let weights =
            crate::ema::weights_in(&self.state).ok_or_else(|| TrainError::InvalidPlan {
                key: "infer.ema",
                value: "true".to_owned(),
                expected: format!(
                    "a checkpoint with EMA weights; {} has none (train with train.ema.decay > 0)",
                    self.dir.display()
                ),
            })?;
        self.model = weights;
        Ok(self)
    }

    /// The exported program a program run's checkpoint holds (`model.pt2`), if it holds one.
    pub fn program(&self) -> Option<PathBuf> {
        let file = crate::program::PROGRAM_FILE;
        self.meta
            .files
            .contains_key(file)
            .then(|| self.dir.join(file))
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(step: u64) -> Meta {
        Meta {
            format: FORMAT.to_owned(),
            version: VERSION,
            kiln_version: "test".into(),
            libtorch_version: "test".into(),
            step,
            epoch: 0,
            batch: 0,
            batch_size: None,
            lr: None,
            world_size: None,
            loss_scale: None,
            loss_scale_growth_tracker: None,
            model_rng: vec![],
            val_accuracy: None,
            val_loss: None,
            val_metrics: Default::default(),
            sums: Default::default(),
            config: serde_json::json!([{"key": "train.lr", "value": "0.001"}]),
            input: None,
            files: Default::default(),
            file_bytes: Default::default(),
            meta_sha256: String::new(),
        }
    }

    fn tensors() -> Vec<(String, Tensor)> {
        vec![
            (
                "layer.weight".to_owned(),
                Tensor::ones([64, 33], tch::kind::FLOAT_CPU),
            ),
            (
                "layer.bias".to_owned(),
                Tensor::ones([64], tch::kind::DOUBLE_CPU),
            ),
            ("steps".to_owned(), Tensor::ones([3], tch::kind::INT64_CPU)),
        ]
    }

    #[test]
    fn the_estimate_covers_each_file_a_checkpoint_writes() {
        let tmp = tempfile::tempdir().unwrap();
        let (model, mut state) = (tensors(), tensors());
        state.truncate(1);
        let contents = || Contents {
            model: &model,
            state: &state,
            meta: meta(7),
            script: None,
            program: None,
        };
        let estimate = file_lengths(&contents()).unwrap();
        let dir = save(tmp.path(), contents()).unwrap();
        for (file, want) in [MODEL_FILE, STATE_FILE, META_FILE].iter().zip(estimate) {
            let got = std::fs::metadata(dir.join(file)).unwrap().len();
            assert!(got <= want, "{file}: {got} bytes, estimated {want}");
            assert!(
                want - got <= 4096 + 512,
                "{file}: {got} bytes, estimated {want}"
            );
        }
        assert_eq!(
            safetensors_bytes(&model[..1]),
            8 + 128 + 12 + 64 * 33 * 4,
            "the data and a header"
        );
    }

    /// An injected ENOSPC midway (the pre-check passed, then the disk filled up): the staged
    /// directory is removed and the error names the checkpoint, needing at least what it
    /// wrote before failing.
    #[test]
    fn a_write_that_runs_out_of_space_is_no_space_naming_the_checkpoint() {
        let tmp = tempfile::tempdir().unwrap();
        let staged = tmp.path().join(".tmp-step-000000001-1");
        std::fs::create_dir(&staged).unwrap();
        std::fs::write(staged.join(MODEL_FILE), vec![0u8; 20_000]).unwrap();
        let enospc = std::io::Error::from_raw_os_error(28);
        let final_dir = tmp.path().join(dir_name(1));
        let e = failed(
            write_error(&staged.join(STATE_FILE), enospc),
            &staged,
            &final_dir,
            &[100, 100, 100],
        );
        let TrainError::NoSpace(full) = &e else {
            panic!("not NoSpace: {e}");
        };
        assert_eq!(full.path, final_dir);
        assert!(full.needed > 20_000, "{e}");
        assert!(!staged.exists());
        assert!(e.to_string().contains("continue with --resume"), "{e}");
    }

    #[test]
    fn a_failed_write_leaves_no_temporary_directory_and_keeps_its_error() {
        let tmp = tempfile::tempdir().unwrap();
        let model = tensors();
        let failing = |path: &Path| -> Result<bool, TrainError> {
            std::fs::write(path, b"half a module").unwrap();
            Err(file_error(path, "the writer failed"))
        };
        let e = save(
            tmp.path(),
            Contents {
                model: &model,
                state: &[],
                meta: meta(3),
                script: Some(&failing),
                program: None,
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("the writer failed"), "{e}");
        let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().collect();
        assert!(left.is_empty(), "left behind: {left:?}");
    }
}
