//! Compiling an exported program for one run (`python/compile_program.py`, run by the
//! provisioned Python: its train step and eval forward as AOTInductor packages) and caching the
//! packages under `<kiln cache>/compiled/<key>/` by everything that makes two compiles differ.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use tch::Device;

use super::check;
use crate::TrainError;

/// The compiler script, written next to the packages it makes when it runs.
const SCRIPT: &str = include_str!("../../python/compile_program.py");

/// Which packages a compile makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Packages {
    /// The train step and the eval forward (training).
    TrainAndEval,
    /// The eval forward alone (inference: the loss plays no part).
    Eval,
}

impl Packages {
    fn files(self) -> &'static [&'static str] {
        match self {
            Packages::TrainAndEval => &[
                "train.pt2",
                "eval.pt2",
                "initial.safetensors",
                check::CHECK_FILE,
            ],
            Packages::Eval => &["eval.pt2", "initial.safetensors", check::CHECK_FILE],
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Packages::TrainAndEval => "the train step and the eval forward",
            Packages::Eval => "the eval forward",
        }
    }

    fn flag(self) -> &'static str {
        match self {
            Packages::TrainAndEval => "both",
            Packages::Eval => "eval",
        }
    }
}

/// What a compile is for; two runs that agree on all of it share the packages. Each cache
/// entry keeps its own as `key.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompileKey {
    pub packages: Packages,
    pub program_sha256: String,
    pub loss: String,
    /// fp32, bf16 or fp16 (autocast inside the graph).
    pub precision: String,
    /// The output the loss uses, for a program with several.
    pub output: Option<String>,
    /// The parameters kept at their values (`model.freeze`), for the train step.
    pub freeze: Option<String>,
    /// `model.attention`: auto, fused or math.
    pub attention: String,
    pub sample_shape: Vec<usize>,
    /// float32 or int64 (token ids).
    pub feature_dtype: String,
    /// For a program fed the dataset's named arrays: the compiler's `--inputs` (each array's
    /// dtype and per-sample shape, by name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inputs: Option<String>,
    pub target_shape: Vec<usize>,
    pub target_dtype: String,
    pub classes: Option<usize>,
    /// `cpu`, or `cuda` with the GPU's compute capability (`cuda sm_90`).
    pub device: String,
    /// The CPU model and its vector features (code is compiled for this CPU).
    pub cpu: String,
    pub threads: usize,
    pub torch: String,
    pub kiln: String,
    /// The compiler script's digest: a changed compiler never reuses an old package.
    pub compiler: String,
    /// The batch the compiler traces with, where not its default: Inductor picks some kernels
    /// by it and bounds the packages' batch sizes to those the kernels are right for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_hint: Option<u64>,
}

fn features_only() -> Vec<String> {
    vec![crate::inputs::FEATURES.to_owned()]
}

/// The digest of the compiler script this kiln carries.
pub fn compiler_digest() -> String {
    hex(&Sha256::digest(SCRIPT.as_bytes()))[..16].to_owned()
}

impl CompileKey {
    /// The cache entry's name: a digest of the whole key.
    pub fn digest(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        hex(&Sha256::digest(json))[..24].to_owned()
    }

    /// The key with the batch it was traced at left out: what two entries that serve the same
    /// runs (at the batches their packages take) agree on.
    pub fn any_batch(&self) -> CompileKey {
        CompileKey {
            batch_hint: None,
            ..self.clone()
        }
    }

    /// The key of the eval forward alone that a train compile's eval package also is: the
    /// same program, precision, output, inputs, device and compiler, without the loss, the
    /// target and the frozen parameters (which only the train step sees).
    pub fn eval_twin(&self) -> CompileKey {
        CompileKey {
            packages: Packages::Eval,
            loss: "-".to_owned(),
            freeze: None,
            target_shape: vec![],
            target_dtype: "-".to_owned(),
            classes: None,
            ..self.clone()
        }
    }
}

/// What the compiler says about the packages it made.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Manifest {
    /// The packages' parameter inputs, in order, by the program's names.
    pub parameters: Vec<String>,
    /// Their buffer inputs, in order (after the parameters).
    pub buffers: Vec<String>,
    /// The buffers the train step writes (its first outputs), in output order.
    #[serde(default)]
    pub mutated_buffers: Vec<String>,
    /// The packages' batch inputs, in order: `features`, or the dataset arrays the program
    /// takes by name.
    #[serde(default = "features_only")]
    pub inputs: Vec<String>,
    /// The parameter of each gradient output, in output order.
    #[serde(default)]
    pub gradients: Vec<String>,
    /// `"dynamic"`, or the batch size the program was exported with.
    pub batch: serde_json::Value,
    pub compile_s: f64,
    /// Dropout and batch-norm ops exported in eval mode (frozen in the program).
    #[serde(default)]
    pub eval_mode_ops: u64,
    /// The program computes its own loss (`train.loss = module`: it takes the target).
    #[serde(default)]
    pub own_loss: bool,
    /// The step's output is a prediction (false where an own-loss program names none: then
    /// it is the loss).
    #[serde(default = "yes")]
    pub predicts: bool,
    /// The eval package takes the targets too (an own-loss program's validation) and returns
    /// (loss, prediction); otherwise it returns the prediction alone.
    #[serde(default)]
    pub eval_takes_target: bool,
    /// The precision the packages compute in (`fp32`, `bf16`, `fp16`).
    #[serde(default)]
    pub precision: String,
    /// The batch the packages were checked on against eager PyTorch ([`check`]).
    #[serde(default)]
    pub check_batch: u64,
    /// The batch sizes each package is valid for, as its own input check states them:
    /// Inductor chooses kernels on the traced batch and bounds the batch to the sizes they
    /// are right for. Absent from manifests of older compilers.
    #[serde(default)]
    pub batch_range: BatchRanges,
    /// The attention kernel the packages use and why. Absent from manifests of older compilers.
    #[serde(default)]
    pub attention: Option<AttentionChoice>,
}

/// The attention kernel a compile chose (`model.attention`), and on what grounds.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct AttentionChoice {
    /// `fused` or `math`.
    pub kernel: String,
    /// `model.attention`, `measured`, or why nothing was measured.
    pub chosen_by: String,
    /// Where measured: the program's attention calls' forward and backward, each kernel.
    pub fused_ms: Option<f64>,
    pub math_ms: Option<f64>,
}

impl std::fmt::Display for AttentionChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "attention {} ({}", self.kernel, self.chosen_by)?;
        if let (Some(fused), Some(math)) = (self.fused_ms, self.math_ms) {
            write!(f, ": fused {fused:.2} ms, math {math:.2} ms")?;
        }
        write!(f, ")")
    }
}

/// The batch sizes the train and eval packages are valid for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct BatchRanges {
    pub train: Option<BatchRange>,
    pub eval: Option<BatchRange>,
}

/// Batch sizes from `.0` to `.1` (`None`: no limit), as `[lowest, highest]` in the manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct BatchRange(pub u64, pub Option<u64>);

impl BatchRange {
    pub fn contains(self, n: u64) -> bool {
        n >= self.0 && self.1.is_none_or(|hi| n <= hi)
    }
}

impl std::fmt::Display for BatchRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.1 {
            Some(hi) if hi == self.0 => write!(f, "{hi}"),
            Some(hi) => write!(f, "{} to {hi}", self.0),
            None => write!(f, "{} or more", self.0),
        }
    }
}

impl Manifest {
    /// The train package's outputs: the mutated buffers, (scaled loss, loss, prediction), then
    /// a gradient per parameter (fewer where parameters are frozen).
    pub fn train_outputs(&self) -> usize {
        3 + self.mutated_buffers.len() + self.parameters.len()
    }

    /// Whether every package of `packages` takes batches of `n` (any, where the compiler did
    /// not say), as those compiled at `n` do.
    pub fn takes(&self, packages: Packages, n: u64) -> bool {
        let takes = |r: Option<BatchRange>| r.is_none_or(|r| r.contains(n));
        takes(self.batch_range.eval)
            && (packages == Packages::Eval || takes(self.batch_range.train))
    }

    /// The eval package's outputs: (loss, prediction) where it takes the target, else the
    /// prediction.
    pub fn eval_outputs(&self) -> usize {
        if self.eval_takes_target { 2 } else { 1 }
    }
}

fn yes() -> bool {
    true
}

/// Packages ready to load.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub dir: PathBuf,
    pub manifest: Manifest,
    /// Which packages there are.
    pub packages: Packages,
    /// For inference through the eval package of an own-loss program's train compile (which
    /// takes the target): the target's per-sample shape and dtype, fed as zeros, as the eval
    /// forward compiled alone is (the prediction does not read it).
    pub zero_target: Option<(Vec<usize>, String)>,
}

impl Compiled {
    pub fn train_package(&self) -> PathBuf {
        self.dir.join("train.pt2")
    }

    pub fn eval_package(&self) -> PathBuf {
        self.dir.join("eval.pt2")
    }

    pub fn initial_weights(&self) -> PathBuf {
        self.dir.join("initial.safetensors")
    }
}

/// The packages for `program` and `key`: from the cache, or compiled now into it (with a line
/// before and the time after), checked against eager PyTorch ([`check`]) before they are used.
/// With `key.batch_hint` set (the batch the caller runs first), an entry compiled for another
/// batch whose packages take that one serves too. Only packages under kiln's own cache are
/// ever loaded; packages that failed their check are refused.
pub fn compiled(program: &Path, key: &CompileKey, device: Device) -> Result<Compiled, TrainError> {
    let root = cache_root()?;
    let (dir, manifest, shared) = match cached_entry(&root, key) {
        Some(found) => found,
        None => compile_locked(program, key, device, &root)?,
    };
    let verdict = match check::kept(&dir) {
        Some(v) if v.version == check::VERSION => v,
        // No verdict yet, or one by another check: check the packages (again).
        _ => check::verify(&dir, &manifest, key.packages, device)?,
    };
    if !verdict.passed {
        return Err(refused(program, key.packages, &manifest, &dir, &verdict));
    }
    let attention = manifest
        .attention
        .as_ref()
        .map(|a| format!("; {a}"))
        .unwrap_or_default();
    let with_step = if shared.is_some() {
        ", with the train step"
    } else {
        ""
    };
    tracing::info!(
        "compiled program: cached at {} (compiled in {:.1} s{with_step}{attention}; checked {})",
        dir.display(),
        manifest.compile_s,
        verdict.summary
    );
    let zero_target = shared
        .filter(|_| manifest.eval_takes_target)
        .map(|k| (k.target_shape, k.target_dtype));
    Ok(Compiled {
        dir,
        manifest,
        packages: key.packages,
        zero_target,
    })
}

/// Compiles `key` into `root`, one process at a time: data-parallel ranks on one machine (or
/// two runs) compile it once, and those that waited find it published.
fn compile_locked(
    program: &Path,
    key: &CompileKey,
    device: Device,
    root: &Path,
) -> Result<(PathBuf, Manifest, Option<CompileKey>), TrainError> {
    let _lock = compile_lock(root, &key.digest())?;
    if let Some(found) = cached_entry(root, key) {
        return Ok(found);
    }
    let dir = root.join(key.digest());
    compile_into(program, key, device, root, &dir)?;
    let manifest = read_manifest(&dir, key.packages.files()).ok_or_else(|| {
        file_message(
            &dir.join("manifest.json"),
            "the compiled entry has no readable manifest",
        )
    })?;
    Ok((dir, manifest, None))
}

/// The complete cache entry for `key`: its own first; else, where the key names the batch it
/// runs first (`batch_hint`), one compiled for another batch whose package takes that batch;
/// for the eval forward alone also the eval package a train compile made beside its step (the
/// same forward: `kiln infer` of a run compiles nothing its training compiled). Of several,
/// the oldest, so that a resumed run finds the packages its first run used. With the train
/// compile's key where the entry is one serving the eval forward alone.
fn cached_entry(root: &Path, key: &CompileKey) -> Option<(PathBuf, Manifest, Option<CompileKey>)> {
    let takes = |m: &Manifest| key.batch_hint.is_none_or(|n| m.takes(key.packages, n));
    let dir = root.join(key.digest());
    if let Some(m) = read_manifest(&dir, key.packages.files()).filter(takes) {
        return Some((dir, m, None));
    }
    let eval = key.packages == Packages::Eval;
    if key.batch_hint.is_none() && !eval {
        return None;
    }
    let any_batch = key.any_batch();
    // An own-loss program's eval package takes the target: it serves where the program names
    // its prediction and the package takes every batch (packages compiled for other batches
    // would not take the target).
    let every_batch = |m: &Manifest| m.batch_range.eval.is_none_or(|r| r.0 == 1 && r.1.is_none());
    std::fs::read_dir(root)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let dir = e.path();
            let text = std::fs::read_to_string(dir.join(KEY_FILE)).ok()?;
            let theirs: CompileKey = serde_json::from_str(&text).ok()?;
            let shared = eval && theirs.packages == Packages::TrainAndEval;
            let serves = if shared {
                theirs.eval_twin()
            } else {
                theirs.clone()
            };
            if serves.any_batch() != any_batch {
                return None;
            }
            let m = read_manifest(&dir, theirs.packages.files())
                .filter(takes)
                .filter(|m| !(shared && m.eval_takes_target && !(m.predicts && every_batch(m))))?;
            let made = std::fs::metadata(dir.join("manifest.json")).and_then(|f| f.modified());
            Some((made.ok()?, dir, m, shared.then_some(theirs)))
        })
        .min_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)))
        .map(|(_, dir, m, shared)| (dir, m, shared))
}

/// The key a cache entry was compiled for, in the entry.
pub const KEY_FILE: &str = "key.json";

/// An exclusive lock on `<root>/locks/<digest>.lock`, held while this process compiles that entry
/// (released when dropped, or when the process ends however it ends). Where the file system
/// takes no locks, compiles go on unlocked: two may then compile the same entry, and the first
/// to publish wins.
fn compile_lock(root: &Path, digest: &str) -> Result<Option<std::fs::File>, TrainError> {
    let locks = root.join("locks");
    std::fs::create_dir_all(&locks).map_err(|e| file_error(&locks, &e))?;
    let path = locks.join(format!("{digest}.lock"));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| file_error(&path, &e))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => {
            tracing::info!(
                "another kiln process is compiling this program for the same run settings; \
                 waiting for it ({})",
                path.display()
            );
            Ok(file.lock().is_ok().then_some(file))
        }
        Err(std::fs::TryLockError::Error(e)) => {
            tracing::debug!("no lock on {} ({e}); compiling unlocked", path.display());
            Ok(None)
        }
    }
}

/// Tells a fresh partial directory's name apart from other compiles in this process.
static PARTIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Compiles `program` for `key` in a partial directory under `root`, checks the packages and
/// moves them to `dir` (where another compile that finished first wins).
fn compile_into(
    program: &Path,
    key: &CompileKey,
    device: Device,
    root: &Path,
    dir: &Path,
) -> Result<(), TrainError> {
    let n = PARTIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let partial = root.join(format!(
        "{}.partial-{}-{n}",
        key.digest(),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&partial);
    std::fs::create_dir_all(&partial).map_err(|e| file_error(&partial, &e))?;
    let started = Instant::now();
    let device_arg = check::device_name(device);
    tracing::info!(
        "compiling {} for {device_arg} with AOTInductor ({}; tens of seconds, once per machine: \
         cached in {})",
        program.display(),
        key.packages.describe(),
        root.display()
    );
    let checked = run_compiler(program, key, &device_arg, &partial).and_then(|()| {
        let key_file = partial.join(KEY_FILE);
        let text = serde_json::to_vec_pretty(key).unwrap_or_default();
        std::fs::write(&key_file, text).map_err(|e| file_error(&key_file, &e))?;
        let path = partial.join("manifest.json");
        let manifest = read_manifest(&partial, &["manifest.json"])
            .ok_or_else(|| file_message(&path, "the compiler left no readable manifest"))?;
        check::verify(&partial, &manifest, key.packages, device)
    });
    if let Err(e) = checked {
        let _ = std::fs::remove_dir_all(&partial);
        return Err(e);
    }
    publish(&partial, dir, key.packages.files())?;
    tracing::info!(
        "compiled {} in {:.1} s",
        program.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn file_message(path: &Path, message: &str) -> TrainError {
    TrainError::File {
        path: path.to_owned(),
        message: message.to_owned(),
    }
}

/// What the error for refused packages says (callers that expect a refusal look for it).
pub const REFUSED: &str = "do not compute what PyTorch computes";

/// The error for packages that computed something else than eager PyTorch.
fn refused(
    program: &Path,
    packages: Packages,
    m: &Manifest,
    dir: &Path,
    verdict: &check::Verdict,
) -> TrainError {
    let advice = match (m.precision.as_str(), packages) {
        ("fp32" | "", _) => String::new(),
        (p, Packages::TrainAndEval) => format!(
            " Training in fp32 (train.amp = none instead of {p}) compiles and checks another \
             step."
        ),
        (p, Packages::Eval) => format!(
            " Predicting in fp32 (infer.precision = fp32 instead of {p}) compiles and checks \
             another forward."
        ),
    };
    TrainError::Model {
        what: program.display().to_string(),
        message: format!(
            "its compiled packages {REFUSED} from it, so kiln will not use them: {}. This is a \
             fault of the compiler (AOTInductor), not of the program.{advice} The packages and \
             the verdict are kept in {}.",
            verdict.summary,
            dir.display()
        ),
    }
}

/// Where compiled packages are cached: `KILN_COMPILE_CACHE`, else `<kiln cache>/compiled`.
pub fn cache_root() -> Result<PathBuf, TrainError> {
    if let Some(dir) = std::env::var_os("KILN_COMPILE_CACHE").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    kiln_device::measured::cache_dir()
        .map(|d| d.join("compiled"))
        .ok_or_else(|| TrainError::File {
            path: PathBuf::from("~/.cache/kiln"),
            message: "no cache directory for compiled programs (set KILN_COMPILE_CACHE, \
                      KILN_CACHE_DIR or HOME)"
                .to_owned(),
        })
}

/// Moves a finished compile into place; another process that finished first wins.
fn publish(partial: &Path, dir: &Path, files: &[&str]) -> Result<(), TrainError> {
    match std::fs::rename(partial, dir) {
        Ok(()) => Ok(()),
        Err(_) if read_manifest(dir, files).is_some() => {
            let _ = std::fs::remove_dir_all(partial);
            Ok(())
        }
        Err(e) => Err(file_error(dir, &e)),
    }
}

/// The manifest of a complete cache entry (every file of `files` there).
fn read_manifest(dir: &Path, files: &[&str]) -> Option<Manifest> {
    let ok = files.iter().all(|f| dir.join(f).is_file());
    let text = std::fs::read_to_string(dir.join("manifest.json")).ok()?;
    ok.then(|| serde_json::from_str(&text).ok()).flatten()
}

fn file_error(path: &Path, e: &std::io::Error) -> TrainError {
    TrainError::File {
        path: path.to_owned(),
        message: e.to_string(),
    }
}

/// Runs the compiler script into `out`; its manifest goes to `out/manifest.json`.
fn run_compiler(
    program: &Path,
    key: &CompileKey,
    device: &str,
    out: &Path,
) -> Result<(), TrainError> {
    let list = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    let mut args: Vec<OsString> = vec!["--program".into(), program.into(), "--out".into()];
    args.push(out.into());
    let mut flag = |name: &str, value: String| args.extend([name.into(), value.into()]);
    flag("--device", device.to_owned());
    flag("--threads", key.threads.to_string());
    flag("--precision", key.precision.clone());
    flag("--sample-shape", list(&key.sample_shape));
    flag("--feature-dtype", key.feature_dtype.clone());
    if let Some(inputs) = &key.inputs {
        flag("--inputs", inputs.clone());
    }
    flag("--what", key.packages.flag().to_owned());
    flag("--attention", key.attention.clone());
    if key.packages == Packages::TrainAndEval {
        flag("--loss", key.loss.clone());
        flag("--target-dtype", key.target_dtype.clone());
        args.push(format!("--target-shape={}", list(&key.target_shape)).into());
    }
    if let Some(c) = key.classes {
        args.extend(["--classes".into(), c.to_string().into()]);
    }
    if let Some(o) = &key.output {
        args.extend(["--output".into(), o.into()]);
    }
    if let Some(f) = &key.freeze {
        args.extend(["--freeze".into(), f.into()]);
    }
    if let Some(n) = key.batch_hint {
        args.extend(["--batch-hint".into(), n.to_string().into()]);
    }
    // Inductor's own caches (precompiled headers, compiled kernels) beside kiln's, and a
    // failure's whole log beside the cache entry (the unfinished entry is removed).
    let mut env = vec![];
    if let Some(cache) = out.parent() {
        env.push(("TORCHINDUCTOR_CACHE_DIR", cache.join("inductor").into()));
        args.push("--log".into());
        args.push(cache.join(format!("{}.log", key.digest())).into());
    }
    let script = out.join("compile_program.py");
    let line = run_script(program, &script, &args, &env)?;
    let manifest = out.join("manifest.json");
    std::fs::write(&manifest, line).map_err(|e| file_error(&manifest, &e))
}

/// Writes the compiler script to `script` and runs it with `args` (and `env`) in the
/// provisioned Python; returns its JSON line, or the error it reports about `program`.
pub(crate) fn run_script(
    program: &Path,
    script: &Path,
    args: &[OsString],
    env: &[(&str, OsString)],
) -> Result<String, TrainError> {
    // Python's torch.export.load can run code a crafted file carries: kiln vets it first.
    super::archive::vet_file(program)?;
    std::fs::write(script, SCRIPT).map_err(|e| file_error(script, &e))?;
    let python = crate::python::python();
    let mut cmd = Command::new(&python);
    cmd.arg(script).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let output = cmd.output().map_err(|e| TrainError::Model {
        what: format!("running {} on {}", script.display(), program.display()),
        message: format!(
            "it needs the Python of kiln's torch, and {} cannot run ({e}); {}",
            python.display(),
            crate::python::HOW_TO_PROVISION
        ),
    })?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'));
    let json: serde_json::Value = line
        .and_then(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| compiler_crash(program, &python, &output))?;
    if let Some(err) = json.get("error") {
        return Err(compile_error(program, err));
    }
    Ok(line.unwrap_or_default().to_owned())
}

/// The compiler died without its JSON line (Python missing torch, killed, …).
fn compiler_crash(program: &Path, python: &Path, output: &std::process::Output) -> TrainError {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let last = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no output")
        .trim();
    let hint = if last.contains("No module named 'torch'") {
        format!("; {}", crate::python::HOW_TO_PROVISION)
    } else {
        String::new()
    };
    TrainError::Model {
        what: format!("compiling {} with {}", program.display(), python.display()),
        message: format!("{last}{hint}"),
    }
}

/// The compiler's own report of what is wrong with the program or the settings.
fn compile_error(program: &Path, err: &serde_json::Value) -> TrainError {
    let kind = err["kind"].as_str().unwrap_or("compile");
    let message = err["message"]
        .as_str()
        .unwrap_or("unknown error")
        .to_owned();
    let what = format!("{} ({kind})", program.display());
    match kind {
        "compile" => TrainError::Model {
            what: format!("AOTInductor could not compile {}", program.display()),
            message: format!(
                "{message}; the whole log is {}",
                err["log"].as_str().unwrap_or("(none)")
            ),
        },
        "unused_parameters" => TrainError::Model {
            what,
            message: format!(
                "{message}; keep them at their exported values with --set model.freeze=NAMES \
                 (names or prefixes, comma separated: they are then not trained), or remove \
                 them from the model (or use them) and export it again"
            ),
        },
        "export" => TrainError::Model {
            what: format!("PyTorch could not write {}", program.display()),
            message: format!(
                "{message}; the whole log is {}",
                err["log"].as_str().unwrap_or("(none)")
            ),
        },
        _ => TrainError::Model { what, message },
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The SHA-256 of a file, in hex.
pub fn sha256_file(path: &Path) -> Result<String, TrainError> {
    let bytes = std::fs::read(path).map_err(|e| file_error(path, &e))?;
    Ok(hex(&Sha256::digest(bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> CompileKey {
        CompileKey {
            packages: Packages::TrainAndEval,
            program_sha256: "ab".repeat(32),
            loss: "cross_entropy".into(),
            precision: "fp32".into(),
            output: None,
            freeze: None,
            attention: "auto".into(),
            sample_shape: vec![16],
            feature_dtype: "float32".into(),
            inputs: None,
            target_shape: vec![],
            target_dtype: "int64".into(),
            classes: Some(4),
            device: "cpu".into(),
            cpu: "AMD EPYC avx512_bf16".into(),
            threads: 2,
            torch: "2.11.0".into(),
            kiln: "0.1.0".into(),
            compiler: compiler_digest(),
            batch_hint: None,
        }
    }

    #[test]
    fn every_part_of_the_key_changes_the_cache_entry() {
        let base = key().digest();
        assert_eq!(base, key().digest(), "the digest is stable");
        let variants: Vec<fn(&mut CompileKey)> = vec![
            |k| k.packages = Packages::Eval,
            |k| k.program_sha256 = "cd".repeat(32),
            |k| k.loss = "mse".into(),
            |k| k.precision = "bf16".into(),
            |k| k.output = Some("logits".into()),
            |k| k.attention = "math".into(),
            |k| k.sample_shape = vec![17],
            |k| k.device = "cuda sm_90".into(),
            |k| k.cpu = "Intel AMX".into(),
            |k| k.threads = 4,
            |k| k.torch = "2.12.0".into(),
            |k| k.kiln = "0.2.0".into(),
            |k| k.compiler = "0".repeat(16),
            |k| k.batch_hint = Some(32),
        ];
        for change in variants {
            let mut k = key();
            change(&mut k);
            assert_ne!(k.digest(), base, "{k:?}");
        }
    }

    #[test]
    fn batch_ranges_read_from_the_manifest_bound_the_sizes_a_package_runs() {
        let read = |json: &str| serde_json::from_str::<BatchRanges>(json).unwrap();
        let ranges = read(r#"{"train": [1, 128], "eval": [1, null]}"#);
        let (train, eval) = (ranges.train.unwrap(), ranges.eval.unwrap());
        assert!(train.contains(1) && train.contains(128));
        assert!(!train.contains(129) && !train.contains(0));
        assert!(eval.contains(1_000_000) && !eval.contains(0));
        assert_eq!(train.to_string(), "1 to 128");
        assert_eq!(eval.to_string(), "1 or more");
        assert_eq!(BatchRange(16, Some(16)).to_string(), "16");
        assert!(
            !read(r#"{"train": [129, 4096]}"#)
                .train
                .unwrap()
                .contains(64)
        );
        assert_eq!(read("{}"), BatchRanges::default());
    }

    #[test]
    fn a_cache_entry_counts_only_when_complete() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let manifest = r#"{"parameters": ["w"], "buffers": [], "batch": "dynamic",
                           "compile_s": 1.5}"#;
        std::fs::write(dir.join("manifest.json"), manifest).unwrap();
        let train = Packages::TrainAndEval.files();
        assert!(read_manifest(dir, train).is_none(), "no packages yet");
        for f in ["eval.pt2", "initial.safetensors"] {
            std::fs::write(dir.join(f), "x").unwrap();
        }
        assert!(
            read_manifest(dir, Packages::Eval.files()).is_none(),
            "no check data yet"
        );
        std::fs::write(dir.join(check::CHECK_FILE), "x").unwrap();
        assert!(read_manifest(dir, Packages::Eval.files()).is_some());
        assert!(read_manifest(dir, train).is_none(), "no train step yet");
        std::fs::write(dir.join("train.pt2"), "x").unwrap();
        let m = read_manifest(dir, train).unwrap();
        assert_eq!(m.parameters, ["w"]);
        assert_eq!(m.batch, "dynamic");
    }

    /// A complete entry for `key` under `root` whose packages take batches `lo..=hi`, its
    /// eval package taking the target (and then giving a prediction or not) or not.
    fn entry(root: &Path, key: &CompileKey, (lo, hi): (u64, u64), takes_target: bool) -> PathBuf {
        own_loss_entry(root, key, (lo, hi), (takes_target, true))
    }

    fn own_loss_entry(
        root: &Path,
        key: &CompileKey,
        (lo, hi): (u64, u64),
        (takes_target, predicts): (bool, bool),
    ) -> PathBuf {
        let dir = root.join(key.digest());
        std::fs::create_dir_all(&dir).unwrap();
        let manifest = serde_json::json!({"parameters": ["w"], "buffers": [], "batch": "dynamic",
            "compile_s": lo as f64, "eval_takes_target": takes_target, "predicts": predicts,
            "batch_range": {"train": [lo, hi], "eval": [lo, hi]}});
        std::fs::write(dir.join("manifest.json"), manifest.to_string()).unwrap();
        for f in key.packages.files() {
            std::fs::write(dir.join(f), "x").unwrap();
        }
        std::fs::write(dir.join(KEY_FILE), serde_json::to_vec(key).unwrap()).unwrap();
        dir
    }

    fn hinted(key: &CompileKey, n: u64) -> CompileKey {
        CompileKey {
            batch_hint: Some(n),
            ..key.clone()
        }
    }

    #[test]
    fn inference_finds_the_eval_forward_a_train_compile_made() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let eval = key().eval_twin();
        assert!(cached_entry(root, &eval).is_none(), "an empty cache");
        let frozen = CompileKey {
            freeze: Some("aux".into()),
            ..key()
        };
        let dir = entry(root, &frozen, (1, 4096), false);
        let (found, m, shared) = cached_entry(root, &eval).expect("the train entry's eval");
        assert_eq!(
            (found, m.compile_s, shared),
            (dir.clone(), 1.0, Some(frozen.clone()))
        );
        // The train step itself is found only under its own key.
        assert_eq!(cached_entry(root, &frozen).map(|e| e.2), Some(None));
        assert!(
            cached_entry(root, &key()).is_none(),
            "another loss's train step"
        );
        // Another precision, thread count or output is another forward.
        let others: Vec<fn(&mut CompileKey)> =
            vec![|k| k.precision = "bf16".into(), |k| k.threads = 1, |k| {
                k.output = Some("logits".into())
            }];
        for change in others {
            let mut k = eval.clone();
            change(&mut k);
            assert!(cached_entry(root, &k).is_none(), "{k:?}");
        }
        // An own-loss program's eval package takes the target: it serves where it predicts
        // (fed zeros for the target, which the compiled forward is told).
        std::fs::remove_dir_all(&dir).unwrap();
        let targets = CompileKey {
            loss: "module".into(),
            target_shape: vec![3],
            target_dtype: "float32".into(),
            classes: None,
            ..key()
        };
        let dir = own_loss_entry(root, &targets, (1, 4096), (true, false));
        assert!(
            cached_entry(root, &eval).is_none(),
            "it names no prediction"
        );
        std::fs::remove_dir_all(&dir).unwrap();
        let dir = own_loss_entry(root, &targets, (1, 4096), (true, true));
        assert!(
            cached_entry(root, &eval).is_none(),
            "its eval takes 1 to 4096 only"
        );
        std::fs::remove_dir_all(&dir).unwrap();
        let dir = own_loss_entry(root, &targets, (1, 4096), (true, true));
        let m = dir.join("manifest.json");
        let text = std::fs::read_to_string(&m).unwrap();
        std::fs::write(&m, text.replace(r#""eval":[1,4096]"#, r#""eval":[1,null]"#)).unwrap();
        assert_eq!(cached_entry(root, &eval).map(|e| e.0), Some(dir));
        // An entry of its own comes first.
        let own = entry(root, &eval, (1, 4096), false);
        assert_eq!(
            cached_entry(root, &eval).map(|e| (e.0, e.2)),
            Some((own, None))
        );
    }

    #[test]
    fn an_entry_compiled_at_another_batch_serves_the_batches_it_takes() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let found = |k: &CompileKey| cached_entry(root, k).map(|e| e.0);
        // Traced at 3 (no hint), its packages take 1 to 15; a run at 24 needs another compile.
        let small = entry(root, &key(), (1, 15), false);
        assert_eq!(found(&hinted(&key(), 8)), Some(small.clone()));
        assert_eq!(found(&hinted(&key(), 24)), None);
        let large = entry(root, &hinted(&key(), 24), (16, 4096), false);
        assert_eq!(found(&hinted(&key(), 20)), Some(large.clone()));
        assert_eq!(found(&hinted(&key(), 24)), Some(large.clone()));
        assert_eq!(
            found(&key()),
            Some(small.clone()),
            "no batch named: its own key only"
        );
        std::fs::remove_dir_all(&small).unwrap();
        assert_eq!(found(&key()), None);
        // Of two that take a batch, the older: a resumed run finds what its first run used.
        let older = entry(root, &hinted(&key(), 64), (16, 4096), false);
        let past = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1 << 30);
        std::fs::File::options()
            .write(true)
            .open(older.join("manifest.json"))
            .unwrap()
            .set_modified(past)
            .unwrap();
        assert_eq!(found(&hinted(&key(), 20)), Some(older));
        // Any other part of the key differs: not served.
        let other = CompileKey {
            precision: "bf16".into(),
            ..hinted(&key(), 20)
        };
        assert_eq!(found(&other), None);
    }

    #[test]
    fn one_process_at_a_time_holds_an_entrys_compile_lock() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("cache");
        let held = compile_lock(&root, "abc")
            .unwrap()
            .expect("a lock on a local disk");
        let other = std::fs::File::open(root.join("locks/abc.lock")).unwrap();
        assert!(matches!(
            other.try_lock(),
            Err(std::fs::TryLockError::WouldBlock)
        ));
        assert!(
            compile_lock(&root, "def").unwrap().is_some(),
            "another entry's lock is free"
        );
        drop(held);
        other.try_lock().expect("free once the compile is done");
    }

    #[test]
    fn the_compilers_errors_name_the_program_and_what_to_do() {
        let p = Path::new("m.pt2");
        let e = compile_error(
            p,
            &serde_json::json!({"kind": "unused_parameters",
                                "message": "1 parameter(s) get no gradient in the step: aux.w"}),
        )
        .to_string();
        assert!(e.contains("m.pt2") && e.contains("aux.w") && e.contains("export it again"));
        let e = compile_error(
            p,
            &serde_json::json!({"kind": "compile", "message": "CppCompileError: boom",
                                "log": "/c/compile.log"}),
        )
        .to_string();
        assert!(e.contains("AOTInductor could not compile m.pt2") && e.contains("/c/compile.log"));
    }
}
