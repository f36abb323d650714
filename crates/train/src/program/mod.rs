//! The user's model as PyTorch ships it now: a `torch.export` program (`.pt2`), trained through
//! a step compiled ahead of time. The program is wrapped with the run's loss and precision, its
//! joint forward+backward graph is compiled by AOTInductor into a package whose parameters and
//! buffers are inputs ([`compile`]), and each step runs that package from Rust: its gradient
//! outputs become the parameters' gradients, its buffer outputs (batch-norm statistics) are
//! copied back, and kiln's optimizer, scaler, clipping and checkpoints do the rest as for any
//! model. Validation runs a second package, the program in eval mode.

pub mod archive;
pub mod check;
pub mod compile;
pub mod export;
pub mod file;
pub mod pickle;
pub mod zipfile;

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use kiln_config::{AttentionKernel, keys};
use kiln_device::settings::AmpDtype;
use kiln_torch_ext::aoti::{Package, accumulate_grads};
use tch::{Device, Kind, Tensor, nn};

use crate::TrainError;
use crate::inputs::Inputs;
use crate::loss::Loss;
use crate::model::InputSpec;
use crate::model::{CompiledStep, Model};
use compile::{BatchRange, CompileKey, Compiled, Manifest, Packages};
pub use file::{FileKind, ProgramInput, detect, inspect};

/// What a program is compiled for: the run's loss, precision and output, on a device.
#[derive(Debug, Clone)]
pub struct ProgramSpec<'a> {
    pub path: &'a Path,
    pub loss: Loss,
    pub precision: AmpDtype,
    /// The output the loss uses, for a program returning a dict or tuple (`model.output`).
    pub output: Option<String>,
    /// Parameters kept at their values (`model.freeze`: names or prefixes, comma separated).
    pub freeze: Option<String>,
    /// The attention kernel the packages use (`model.attention`; `auto`: measured on the CPU).
    pub attention: AttentionKernel,
    pub threads: usize,
    /// The batch size of the first steps, where known (`train.batch_size`): a program with a
    /// dynamic batch is traced at it (Inductor chooses some kernels by the traced batch and
    /// bounds the sizes a package takes to those they are right for), and a cached entry
    /// compiled at another batch whose packages take this one is used as it is.
    pub batch: Option<u64>,
}

/// The file name of a checkpoint's copy of the program.
pub const PROGRAM_FILE: &str = "model.pt2";

/// A program being trained.
#[derive(Debug)]
pub struct ProgramModel {
    path: PathBuf,
    compiled: Compiled,
    /// What it was compiled for: a batch size no package takes is compiled for with this key.
    key: CompileKey,
    /// The packages, one set per compile: the first, then one for each batch size that the
    /// sets before did not take.
    sets: Mutex<Vec<PackageSet>>,
    /// The VarStore's parameters and buffers, in the packages' input order.
    params: Vec<Tensor>,
    buffers: Vec<Tensor>,
    /// The buffer each of the train step's first outputs is the new value of.
    mutated: Vec<usize>,
    /// The parameter of each gradient output.
    grad_params: Vec<Tensor>,
    /// The loss scale without a scaler (1), made once.
    unit_scale: Tensor,
    /// The dataset arrays the packages take, in their order, for a program fed by name;
    /// `None` for one features tensor.
    input_names: Option<Vec<String>>,
}

/// A `model.*`-keyed error about the program.
fn invalid(path: &Path, expected: String) -> TrainError {
    TrainError::InvalidPlan {
        key: keys::model::name,
        value: path.display().to_string(),
        expected,
    }
}

/// The compile key of `spec`'s `packages` for data of `input` on `device`. The eval forward
/// alone does not depend on the loss or the target.
fn key_of(
    packages: Packages,
    spec: &ProgramSpec<'_>,
    input: &InputSpec,
    program: &ProgramInput,
    by_name: Option<&[String]>,
    device: Device,
) -> Result<CompileKey, TrainError> {
    let eval = packages == Packages::Eval;
    let target = input
        .target
        .clone()
        .unwrap_or(kiln_data::TargetSpec::label(input.classes));
    let classes = !eval && matches!(target, kiln_data::TargetSpec::Classes { .. });
    let cpu = kiln_device::probe::probe_cpu();
    let device_text = match device {
        Device::Cuda(i) => {
            let p = kiln_torch_ext::cuda::device_properties(i)?;
            let (major, minor) = p.compute_capability;
            format!("cuda sm_{major}{minor}")
        }
        _ => "cpu".to_owned(),
    };
    Ok(CompileKey {
        packages,
        program_sha256: compile::sha256_file(spec.path)?,
        loss: if eval { "-" } else { spec.loss.name() }.to_owned(),
        precision: spec.precision.as_str().to_owned(),
        output: spec.output.clone(),
        freeze: if eval { None } else { spec.freeze.clone() },
        attention: spec.attention.as_str().to_owned(),
        sample_shape: input.sample_shape.clone(),
        feature_dtype: program.dtype.clone(),
        inputs: by_name.map(|names| inputs_json(names, &input.arrays)),
        target_shape: if eval {
            vec![]
        } else {
            target.shape().to_vec()
        },
        target_dtype: match (eval, classes) {
            (true, _) => "-",
            (false, true) => "int64",
            (false, false) => "float32",
        }
        .to_owned(),
        classes: classes.then_some(input.classes),
        device: device_text,
        cpu: format!(
            "{} avx512={} avx512_bf16={} amx_bf16={}",
            cpu.model, cpu.avx512, cpu.avx512_bf16, cpu.amx_bf16
        ),
        threads: spec.threads,
        torch: kiln_torch_ext::runtime::torch_version().to_owned(),
        kiln: env!("CARGO_PKG_VERSION").to_owned(),
        compiler: compile::compiler_digest(),
        batch_hint: spec
            .batch
            .filter(|&n| n >= 2 && program.fixed_batch.is_none()),
    })
}

/// How the dataset feeds the program: one features tensor (`None`) or, for a dataset of named
/// arrays, the arrays its inputs are named after, in the program's order. Every mismatch
/// (a missing array, another dtype or per-sample shape) is named before anything compiles.
fn program_inputs(
    spec: &ProgramSpec<'_>,
    program: &ProgramInput,
    input: &InputSpec,
) -> Result<Option<Vec<String>>, TrainError> {
    let path = spec.path;
    if input.arrays.is_empty() {
        one_features_input(path, program, input)?;
        return Ok(None);
    }
    let arrays = &input.arrays;
    let leaves = &program.leaves;
    let by_name = |name: &str| arrays.iter().find(|a| a.name == name);
    let unmatched: Vec<&str> = leaves
        .iter()
        .map(|l| l.name.as_str())
        .filter(|n| by_name(n).is_none())
        .collect();
    // With the program's own loss, its last input is the target, named after no array.
    let own_loss = spec.loss == Loss::Module;
    let target_last = matches!(unmatched[..], [t] if leaves.last().is_some_and(|l| l.name == t));
    let the_target = own_loss && target_last;
    let mut wrong: Vec<String> = vec![];
    if !unmatched.is_empty() && !the_target {
        wrong.push(format!(
            "no dataset array is named {} (the dataset's arrays: {}; only the program's last \
             input may be named otherwise: the target, for train.loss = module)",
            unmatched.join(", "),
            arrays
                .iter()
                .map(|a| a.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let mut names = vec![];
    for leaf in leaves {
        let Some(array) = by_name(&leaf.name) else {
            continue;
        };
        let dtype = torch_name(array.dtype.model());
        if leaf.sample_shape != array.shape || leaf.dtype != dtype {
            wrong.push(format!(
                "input `{}` takes [batch, {}] {}; the array is {:?} {dtype} per sample",
                leaf.name,
                leaf.sample_shape
                    .iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                leaf.dtype,
                array.shape
            ));
        }
        names.push(leaf.name.clone());
    }
    if let (true, Some(leaf), Some(target)) = (the_target, leaves.last(), &input.target) {
        let dtype = match target {
            kiln_data::TargetSpec::Classes { .. } => "int64",
            kiln_data::TargetSpec::Values { .. } => "float32",
        };
        if leaf.sample_shape != target.shape() || leaf.dtype != dtype {
            wrong.push(format!(
                "its target input `{}` takes [batch{}] {}; the dataset's targets are {:?} {dtype} \
                 per sample",
                leaf.name,
                leaf.sample_shape
                    .iter()
                    .map(|d| format!(", {d}"))
                    .collect::<String>(),
                leaf.dtype,
                target.shape()
            ));
        }
    }
    if names.is_empty() {
        wrong.push(format!(
            "no input of the program is named after a dataset array ({})",
            arrays
                .iter()
                .map(|a| a.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if wrong.is_empty() {
        return Ok(Some(names));
    }
    Err(TrainError::ShapeMismatch {
        what: format!("{} and the dataset's arrays", path.display()),
        expected: "each input of the program an array of its name, of its dtype and shape"
            .to_owned(),
        got: wrong.join("; "),
    })
}

/// How PyTorch names the dtype a dataset array reaches the model as.
fn torch_name(dtype: kiln_data::DType) -> &'static str {
    match dtype {
        kiln_data::DType::F16 => "float16",
        kiln_data::DType::Bf16 => "bfloat16",
        kiln_data::DType::Bool => "bool",
        kiln_data::DType::I64 => "int64",
        _ => "float32",
    }
}

/// The compiler's `--inputs`: each named array's dtype (as it reaches the model) and shape.
fn inputs_json(names: &[String], arrays: &[kiln_data::ArraySpec]) -> String {
    let map: serde_json::Map<String, serde_json::Value> = arrays
        .iter()
        .filter(|a| names.contains(&a.name))
        .map(|a| {
            let spec = serde_json::json!({"dtype": torch_name(a.dtype.model()), "shape": a.shape});
            (a.name.clone(), spec)
        })
        .collect();
    serde_json::Value::Object(map).to_string()
}

/// The program's input against the dataset's samples of one features array: one input (or
/// two, the second the target), of the same per-sample shape and dtype.
fn one_features_input(
    path: &Path,
    program: &ProgramInput,
    input: &InputSpec,
) -> Result<(), TrainError> {
    if program.leaves.len() > 2 {
        let names: Vec<&str> = program.leaves.iter().map(|l| l.name.as_str()).collect();
        return Err(file::file_error(
            path,
            format!(
                "the program takes {} tensor inputs ({}); a dataset of one features array feeds \
                 one (or features and targets, for train.loss = module): prepare the arrays by \
                 name (kiln data prepare --array NAME=…) to feed each input the array of its \
                 name",
                names.len(),
                names.join(", ")
            ),
        ));
    }
    let dtype = if input.integer_features {
        "int64"
    } else {
        "float32"
    };
    if program.sample_shape != input.sample_shape || program.dtype != dtype {
        return Err(TrainError::ShapeMismatch {
            what: format!("{} and the dataset", path.display()),
            expected: format!(
                "the program to take samples of {:?} ({dtype}), as the dataset holds",
                input.sample_shape
            ),
            got: format!(
                "the program takes samples of {:?} ({})",
                program.sample_shape, program.dtype
            ),
        });
    }
    Ok(())
}

impl ProgramModel {
    /// Compiles (or finds in the cache) the program of `spec` for data of `input` and the
    /// device of `vs`, and registers its parameters and buffers in `vs` under the program's
    /// own names, with the program's initial weights.
    pub fn load(
        spec: &ProgramSpec<'_>,
        input: &InputSpec,
        vs: &nn::VarStore,
    ) -> Result<Self, TrainError> {
        Self::load_packages(Packages::TrainAndEval, spec, input, vs)
    }

    /// Like [`Self::load`], with the eval forward alone (inference; `spec.loss` plays no part).
    pub fn load_eval(
        spec: &ProgramSpec<'_>,
        input: &InputSpec,
        vs: &nn::VarStore,
    ) -> Result<Self, TrainError> {
        Self::load_packages(Packages::Eval, spec, input, vs)
    }

    fn load_packages(
        packages: Packages,
        spec: &ProgramSpec<'_>,
        input: &InputSpec,
        vs: &nn::VarStore,
    ) -> Result<Self, TrainError> {
        archive::vet_file(spec.path)?;
        let kind = detect(spec.path)?;
        if kind != FileKind::ExportedProgram {
            return Err(invalid(
                spec.path,
                format!(
                    "an ExportedProgram; this file is {}: {}",
                    kind.describe(),
                    file::HOW_TO_EXPORT
                ),
            ));
        }
        let program = inspect(spec.path)?;
        let by_name = program_inputs(spec, &program, input)?;
        let device = vs.device();
        let key = key_of(packages, spec, input, &program, by_name.as_deref(), device)?;
        let compiled = compile::compiled(spec.path, &key, device)?;
        if compiled.manifest.eval_mode_ops > 0 {
            tracing::warn!(
                "{} was exported in eval mode: {} dropout or batch-norm op(s) in it are frozen \
                 (export model.train() to train them)",
                spec.path.display(),
                compiled.manifest.eval_mode_ops
            );
        }
        Self::from_compiled(spec.path, (compiled, key), vs)
    }

    fn from_compiled(
        path: &Path,
        (compiled, key): (Compiled, CompileKey),
        vs: &nn::VarStore,
    ) -> Result<Self, TrainError> {
        let m = &compiled.manifest;
        let initial = std::fs::read(compiled.initial_weights()).map_err(|e| TrainError::File {
            path: compiled.initial_weights(),
            message: e.to_string(),
        })?;
        let state: std::collections::HashMap<String, Tensor> =
            crate::weights::from_safetensors(&initial, &compiled.initial_weights())?
                .into_iter()
                .collect();
        let add = |name: &str, trainable: bool| register(vs, &state, name, trainable);
        // A frozen parameter (`model.freeze`) is an input of the step without a gradient:
        // not trainable, so the optimizer never sees it.
        let params = m
            .parameters
            .iter()
            .map(|n| add(n, m.gradients.is_empty() || m.gradients.contains(n)))
            .collect::<Result<Vec<_>, _>>()?;
        let buffers = m
            .buffers
            .iter()
            .map(|n| add(n, false))
            .collect::<Result<Vec<_>, _>>()?;
        let index_of = |list: &[String], name: &str| list.iter().position(|n| n == name);
        let mutated = m
            .mutated_buffers
            .iter()
            .map(|n| index_of(&m.buffers, n).ok_or_else(|| missing(path, n)))
            .collect::<Result<Vec<_>, _>>()?;
        let grad_params = m
            .gradients
            .iter()
            .map(|n| {
                index_of(&m.parameters, n)
                    .map(|i| params[i].shallow_clone())
                    .ok_or_else(|| missing(path, n))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let device = vs.device();
        let input_names = (m.inputs != [crate::inputs::FEATURES]).then(|| m.inputs.clone());
        let first = PackageSet::load(&compiled, device)?;
        Ok(Self {
            path: path.to_owned(),
            compiled,
            key,
            sets: Mutex::new(vec![first]),
            params,
            buffers,
            mutated,
            grad_params,
            unit_scale: Tensor::f_ones([], (Kind::Float, device))?,
            input_names,
        })
    }

    /// The program file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The compiled packages.
    pub fn compiled(&self) -> &Compiled {
        &self.compiled
    }

    fn error(&self, message: String) -> TrainError {
        TrainError::Model {
            what: self.path.display().to_string(),
            message,
        }
    }

    fn state_inputs(&self) -> Vec<Tensor> {
        self.params
            .iter()
            .chain(&self.buffers)
            .map(|t| t.detach())
            .collect()
    }

    /// Runs the `which` package of the first set that takes the batch of `inputs`; where
    /// none does, compiles a set for that batch size first (Inductor bounds a package's batch
    /// where it chose kernels by the traced size; run outside those bounds, a package would
    /// run kernels chosen for other sizes).
    fn run(&self, which: Which, inputs: &[Tensor]) -> Result<Vec<Tensor>, TrainError> {
        let batch = inputs.get(self.params.len() + self.buffers.len());
        let n = batch.and_then(|t| t.size().first().copied()).unwrap_or(0);
        let n = u64::try_from(n).unwrap_or(0);
        let mut sets = lock(&self.sets);
        let i = match sets.iter().position(|set| set.takes(which, n)) {
            Some(i) => i,
            None => {
                let set = self.compile_for(which, n, &sets[0])?;
                sets.push(set);
                sets.len() - 1
            }
        };
        let package = sets[i].package(which).ok_or_else(|| {
            self.error("only its eval forward was compiled (for inference)".to_owned())
        })?;
        Ok(package.run(inputs)?)
    }

    /// A set of packages compiled for batches of `n` (the trace's batch), for a batch the
    /// sets so far (`first` among them) do not take.
    fn compile_for(
        &self,
        which: Which,
        n: u64,
        first: &PackageSet,
    ) -> Result<PackageSet, TrainError> {
        let range = first
            .range(which)
            .map_or("its one size".to_owned(), |r| r.to_string());
        let refused = |range: String| {
            self.error(format!(
                "its compiled {} takes batches of {range} samples (Inductor chose its kernels \
                 for those sizes), and this batch has {n}: use a batch size in that range, or \
                 export the program with its batch fixed at {n}",
                which.describe()
            ))
        };
        if self.compiled.manifest.batch != "dynamic" || n == 0 {
            return Err(refused(range));
        }
        tracing::info!(
            "{}: its compiled {} takes batches of {range} samples; compiling it for batches of \
             {n} too",
            self.path.display(),
            which.describe()
        );
        let key = CompileKey {
            batch_hint: Some(n),
            ..self.key.clone()
        };
        let compiled = compile::compiled(&self.path, &key, self.unit_scale.device())?;
        let (a, b) = (&compiled.manifest, &self.compiled.manifest);
        type Names<'a> = &'a [String];
        fn inputs(m: &Manifest) -> (Names<'_>, Names<'_>, Names<'_>, bool) {
            (&m.parameters, &m.buffers, &m.inputs, m.eval_takes_target)
        }
        fn outputs(m: &Manifest) -> (Names<'_>, Names<'_>) {
            (&m.mutated_buffers, &m.gradients)
        }
        // For inference only the eval forward matters: a set found beside a train step (whose
        // manifest names gradients too) and one compiled alone serve alike.
        let same = inputs(a) == inputs(b)
            && compiled.zero_target == self.compiled.zero_target
            && (self.compiled.packages == Packages::Eval || outputs(a) == outputs(b));
        if !same {
            return Err(self.error(format!(
                "compiled for batches of {n}, its packages take other inputs or give other \
                 outputs than those compiled first ({})",
                compiled.dir.display()
            )));
        }
        let set = PackageSet::load(&compiled, self.unit_scale.device())?;
        match set.takes(which, n) {
            true => Ok(set),
            false => Err(refused(set.range(which).map_or(range, |r| r.to_string()))),
        }
    }

    /// The packages' inputs for a batch: the parameters and buffers, then the batch's
    /// tensors (one features tensor, or the named arrays in the program's order).
    fn with_batch(&self, inputs: &Inputs) -> Result<Vec<Tensor>, TrainError> {
        let mut all = self.state_inputs();
        match &self.input_names {
            None => all.push(inputs.single()?.shallow_clone()),
            Some(names) => {
                for name in names {
                    let t = inputs.get(name).ok_or_else(|| {
                        self.error(format!(
                            "the batch has no array `{name}` (it has {})",
                            inputs.names().join(", ")
                        ))
                    })?;
                    all.push(t.shallow_clone());
                }
            }
        }
        Ok(all)
    }
}

fn missing(path: &Path, name: &str) -> TrainError {
    TrainError::File {
        path: path.to_owned(),
        message: format!("the compiled step names `{name}`, which the program does not have"),
    }
}

/// Registers the program's tensor `name` in `vs` (path segments split at dots, so the
/// VarStore and checkpoints use the program's own names) with its initial value.
fn register(
    vs: &nn::VarStore,
    state: &std::collections::HashMap<String, Tensor>,
    name: &str,
    trainable: bool,
) -> Result<Tensor, TrainError> {
    let value = state.get(name).ok_or_else(|| TrainError::File {
        path: PathBuf::from(name),
        message: "missing from the program's initial weights".to_owned(),
    })?;
    let mut path = vs.root();
    let mut parts: Vec<&str> = name.split('.').collect();
    let last = parts.pop().unwrap_or(name);
    for part in parts {
        path = path / part;
    }
    let tensor = value.f_to_device(vs.device())?.f_detach()?.f_contiguous()?;
    Ok(path.add(last, tensor, trainable))
}

impl Model for ProgramModel {
    fn forward(&self, features: &Tensor, train: bool) -> Result<Tensor, TrainError> {
        if !train && self.compiled.zero_target.is_some() {
            return self.forward_inputs(&Inputs::features(features.shallow_clone()), false);
        }
        let refused = if train {
            Some("a compiled program trains through its compiled step, not forward")
        } else if self.compiled.manifest.eval_takes_target {
            Some("its eval forward takes the targets too (it computes its own loss)")
        } else {
            None
        };
        if let Some(message) = refused {
            return Err(self.error(message.to_owned()));
        }
        let inputs = self.with_batch(&Inputs::features(features.shallow_clone()))?;
        self.eval_forward(&inputs)
    }

    fn forward_inputs(&self, inputs: &Inputs, train: bool) -> Result<Tensor, TrainError> {
        if let (Some(target), false) = (&self.compiled.zero_target, train) {
            return self.predict_without_target(inputs, target);
        }
        if self.input_names.is_none() || train || self.compiled.manifest.eval_takes_target {
            return self.forward(inputs.single()?, train);
        }
        let inputs = self.with_batch(inputs)?;
        self.eval_forward(&inputs)
    }

    fn predict(&self, inputs: &Inputs, targets: &Tensor) -> Result<Tensor, TrainError> {
        match CompiledStep::evaluate(self, inputs, targets)? {
            Some((_, output)) => Ok(output),
            None => self.forward_inputs(inputs, false),
        }
    }

    fn reads_by_name(&self) -> bool {
        self.input_names.is_some()
    }

    fn check_inputs(&self, arrays: &[kiln_data::ArraySpec]) -> Result<(), TrainError> {
        let Some(names) = &self.input_names else {
            return crate::model::one_input(arrays);
        };
        let missing: Vec<&str> = names
            .iter()
            .filter(|n| !arrays.iter().any(|a| &a.name == *n))
            .map(String::as_str)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(self.error(format!(
            "it takes the arrays {}, which the dataset does not have",
            missing.join(", ")
        )))
    }

    fn has_own_loss(&self) -> bool {
        self.compiled.manifest.own_loss
    }

    fn predicts(&self) -> bool {
        self.compiled.manifest.predicts
    }

    fn compiled_step(&self) -> Option<&dyn CompiledStep> {
        (self.compiled.packages == Packages::TrainAndEval).then_some(self as &dyn CompiledStep)
    }

    fn save_program(&self, path: &Path) -> Result<bool, TrainError> {
        std::fs::copy(&self.path, path).map_err(|e| TrainError::File {
            path: path.to_owned(),
            message: format!("cannot copy the program {}: {e}", self.path.display()),
        })?;
        Ok(true)
    }
}

impl ProgramModel {
    /// The eval package's last output (the prediction) for its `inputs`.
    fn eval_forward(&self, inputs: &[Tensor]) -> Result<Tensor, TrainError> {
        let mut outputs = self.run(Which::Eval, inputs)?;
        outputs
            .pop()
            .ok_or_else(|| self.error("the compiled eval forward returned nothing".to_owned()))
    }
}

/// One of a program's two packages.
#[derive(Debug, Clone, Copy)]
enum Which {
    Train,
    Eval,
}

impl Which {
    fn describe(self) -> &'static str {
        match self {
            Which::Train => "train step",
            Which::Eval => "eval forward",
        }
    }
}

/// The packages of one compile, and the batch sizes they take.
#[derive(Debug)]
struct PackageSet {
    ranges: compile::BatchRanges,
    /// The train step (absent where only the eval forward was compiled, for inference).
    train: Option<Package>,
    eval: Package,
}

impl PackageSet {
    fn load(compiled: &Compiled, device: Device) -> Result<Self, TrainError> {
        let m = &compiled.manifest;
        let train = match compiled.packages {
            Packages::TrainAndEval => Some(Package::load(
                &compiled.train_package(),
                device,
                m.train_outputs(),
            )?),
            Packages::Eval => None,
        };
        let eval = Package::load(&compiled.eval_package(), device, m.eval_outputs())?;
        Ok(Self {
            ranges: m.batch_range,
            train,
            eval,
        })
    }

    fn range(&self, which: Which) -> Option<BatchRange> {
        match which {
            Which::Train => self.ranges.train,
            Which::Eval => self.ranges.eval,
        }
    }

    /// Whether its `which` package takes batches of `n` (any, where the compiler did not say).
    fn takes(&self, which: Which, n: u64) -> bool {
        self.range(which).is_none_or(|r| r.contains(n))
    }

    fn package(&mut self, which: Which) -> Option<&mut Package> {
        match which {
            Which::Train => self.train.as_mut(),
            Which::Eval => Some(&mut self.eval),
        }
    }
}

fn lock<T>(p: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    p.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl ProgramModel {
    /// The prediction of an eval package that takes the target too (an own-loss program's,
    /// compiled beside its train step), fed a target of zeros of the `(shape, dtype)` given, as
    /// the eval forward compiled alone for inference is.
    fn predict_without_target(
        &self,
        inputs: &Inputs,
        (shape, dtype): &(Vec<usize>, String),
    ) -> Result<Tensor, TrainError> {
        let kind = if dtype == "int64" {
            Kind::Int64
        } else {
            Kind::Float
        };
        let dims: Vec<i64> = std::iter::once(inputs.rows())
            .chain(shape.iter().map(|&d| d as i64))
            .collect();
        let zeros = Tensor::f_zeros(dims.as_slice(), (kind, self.unit_scale.device()))?;
        match CompiledStep::evaluate(self, inputs, &zeros)? {
            Some((_loss, prediction)) => Ok(prediction),
            None => Err(self.error("its eval forward takes no target".to_owned())),
        }
    }
}

impl CompiledStep for ProgramModel {
    fn evaluate(
        &self,
        batch: &Inputs,
        targets: &Tensor,
    ) -> Result<Option<(Tensor, Tensor)>, TrainError> {
        if !self.compiled.manifest.eval_takes_target {
            return Ok(None);
        }
        let mut inputs = self.with_batch(batch)?;
        inputs.push(targets.shallow_clone());
        let outputs = self.run(Which::Eval, &inputs)?;
        match outputs.as_slice() {
            [loss, output] => Ok(Some((loss.shallow_clone(), output.shallow_clone()))),
            _ => Err(self.error(format!(
                "its eval forward returned {} outputs, expected the loss and the prediction",
                outputs.len()
            ))),
        }
    }

    fn step(
        &self,
        batch: &Inputs,
        targets: &Tensor,
        weight: f64,
        scale: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor), TrainError> {
        let mut inputs = self.with_batch(batch)?;
        let scale = match scale {
            Some(s) => s.f_reshape([])?.f_to_kind(Kind::Float)?,
            None => self.unit_scale.shallow_clone(),
        };
        inputs.extend([targets.shallow_clone(), scale]);
        let outputs = self.run(Which::Train, &inputs)?;
        let n_mut = self.mutated.len();
        if outputs.len() != n_mut + 3 + self.grad_params.len() {
            return Err(TrainError::Model {
                what: self.path.display().to_string(),
                message: format!(
                    "the compiled step returned {} outputs, expected {}",
                    outputs.len(),
                    n_mut + 3 + self.grad_params.len()
                ),
            });
        }
        let _no_grad = tch::no_grad_guard();
        for (&b, value) in self.mutated.iter().zip(&outputs[..n_mut]) {
            self.buffers[b].shallow_clone().f_copy_(value)?;
        }
        accumulate_grads(&self.grad_params, &outputs[n_mut + 3..], weight)?;
        Ok((
            outputs[n_mut + 1].shallow_clone(),
            outputs[n_mut + 2].shallow_clone(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_data::{ArraySpec, DType, TargetSpec};

    fn leaf(name: &str, shape: &[usize], dtype: &str) -> file::ProgramLeaf {
        file::ProgramLeaf {
            name: name.to_owned(),
            sample_shape: shape.to_vec(),
            dtype: dtype.to_owned(),
        }
    }

    fn program(leaves: Vec<file::ProgramLeaf>) -> ProgramInput {
        ProgramInput {
            fixed_batch: None,
            sample_shape: leaves[0].sample_shape.clone(),
            dtype: leaves[0].dtype.clone(),
            target: None,
            leaves,
            torch_version: "2.11.0".to_owned(),
        }
    }

    fn arrays() -> InputSpec {
        let array = |name: &str, dtype, shape: &[usize]| ArraySpec {
            name: name.to_owned(),
            dtype,
            shape: shape.to_vec(),
            ids: false,
        };
        let mut input = InputSpec::of(&[8, 3], &TargetSpec::Values { shape: vec![3] });
        input.arrays = vec![
            array("encoder_cont", DType::F32, &[8, 3]),
            array("static_cat", DType::I64, &[1]),
            array("mask", DType::Bool, &[8]),
            array("half", DType::F64, &[2]),
        ];
        input
    }

    fn spec(loss: Loss) -> ProgramSpec<'static> {
        ProgramSpec {
            path: Path::new("forecaster.pt2"),
            loss,
            precision: AmpDtype::None,
            output: None,
            freeze: None,
            attention: AttentionKernel::Auto,
            threads: 1,
            batch: None,
        }
    }

    #[test]
    fn inputs_match_arrays_by_name_and_every_mismatch_is_named() {
        let input = arrays();
        let good = program(vec![
            leaf("static_cat", &[1], "int64"),
            leaf("encoder_cont", &[8, 3], "float32"),
            leaf("mask", &[8], "bool"),
            leaf("half", &[2], "float32"),
            leaf("target", &[3], "float32"),
        ]);
        let names = program_inputs(&spec(Loss::Module), &good, &input).unwrap();
        assert_eq!(
            names.unwrap(),
            ["static_cat", "encoder_cont", "mask", "half"],
            "the program's order; f64 reaches the model as f32"
        );
        // Without the program's own loss, the input named after no array is refused.
        let e = program_inputs(&spec(Loss::Mse), &good, &input)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no dataset array is named target"), "{e}");
        let bad = program(vec![
            leaf("encoder_cont", &[8, 4], "float32"),
            leaf("static_cat", &[1], "float32"),
            leaf("categories", &[1], "int64"),
            leaf("target", &[3], "float32"),
        ]);
        let wrong_target = program(vec![
            leaf("encoder_cont", &[8, 3], "float32"),
            leaf("target", &[4], "int64"),
        ]);
        let e = program_inputs(&spec(Loss::Module), &wrong_target, &input).unwrap_err();
        let want = "its target input `target` takes [batch, 4] int64; the dataset's targets are \
                    [3] float32";
        assert!(e.to_string().contains(want), "{e}");
        let e = program_inputs(&spec(Loss::Module), &bad, &input)
            .unwrap_err()
            .to_string();
        for want in [
            "no dataset array is named categories, target",
            "input `encoder_cont` takes [batch, 8, 4] float32; the array is [8, 3] float32",
            "input `static_cat` takes [batch, 1] float32; the array is [1] int64",
        ] {
            assert!(e.contains(want), "{want}: {e}");
        }
        let only_target = program(vec![leaf("target", &[3], "float32")]);
        let e = program_inputs(&spec(Loss::Module), &only_target, &input).unwrap_err();
        assert!(
            e.to_string().contains("no input of the program is named"),
            "{e}"
        );
    }

    #[test]
    fn a_train_compiles_eval_forward_is_the_one_inference_asks_for() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("m.pt2");
        std::fs::write(&path, "program bytes").unwrap();
        let features = program(vec![leaf("x", &[8, 3], "float32")]);
        let key = |packages, loss, freeze: Option<&str>, input: &InputSpec| {
            let spec = ProgramSpec {
                path: &path,
                freeze: freeze.map(str::to_owned),
                ..spec(loss)
            };
            key_of(packages, &spec, input, &features, None, Device::Cpu).unwrap()
        };
        let labels = InputSpec::of(&[8, 3], &TargetSpec::label(5));
        let values = InputSpec::of(&[8, 3], &TargetSpec::Values { shape: vec![3] });
        let eval = key(Packages::Eval, Loss::CrossEntropy, None, &labels);
        for (loss, freeze, input) in [
            (Loss::CrossEntropy, None, &labels),
            (Loss::CrossEntropy, Some("head"), &labels),
            (Loss::Mse, None, &values),
        ] {
            let train = key(Packages::TrainAndEval, loss, freeze, input);
            assert_ne!(train.digest(), eval.digest());
            assert_eq!(train.eval_twin(), eval, "{loss:?} {freeze:?}");
        }
    }
}
