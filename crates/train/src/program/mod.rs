//! The user's model as PyTorch ships it now: a `torch.export` program (`.pt2`), trained through
//! a step compiled ahead of time. The program is wrapped with the run's loss and precision, its
//! joint forward+backward graph is compiled by AOTInductor into a package whose parameters and
//! buffers are inputs ([`compile`]), and each step runs that package from Rust: its gradient
//! outputs become the parameters' gradients, its buffer outputs (batch-norm statistics) are
//! copied back, and kiln's optimizer, scaler, clipping and checkpoints do the rest as for any
//! model. Validation runs a second package, the program in eval mode.

pub mod check;
pub mod compile;
pub mod export;
pub mod file;

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use kiln_config::keys;
use kiln_device::settings::AmpDtype;
use kiln_torch_ext::aoti::{Package, accumulate_grads};
use tch::{Device, Kind, Tensor, nn};

use crate::TrainError;
use crate::loss::Loss;
use crate::model::InputSpec;
use crate::model::{CompiledStep, Model};
use compile::{CompileKey, Compiled, Packages};
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
    pub threads: usize,
}

/// The file name of a checkpoint's copy of the program.
pub const PROGRAM_FILE: &str = "model.pt2";

/// A program being trained.
#[derive(Debug)]
pub struct ProgramModel {
    path: PathBuf,
    compiled: Compiled,
    /// The train step (absent where only the eval forward was compiled, for inference).
    train: Option<Mutex<Package>>,
    eval: Mutex<Package>,
    /// The VarStore's parameters and buffers, in the packages' input order.
    params: Vec<Tensor>,
    buffers: Vec<Tensor>,
    /// The buffer each of the train step's first outputs is the new value of.
    mutated: Vec<usize>,
    /// The parameter of each gradient output.
    grad_params: Vec<Tensor>,
    /// The loss scale without a scaler (1), made once.
    unit_scale: Tensor,
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
        sample_shape: input.sample_shape.clone(),
        feature_dtype: program.dtype.clone(),
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
    })
}

/// The program's input against the dataset's samples: the same per-sample shape and dtype.
fn check_input(path: &Path, program: &ProgramInput, input: &InputSpec) -> Result<(), TrainError> {
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
        check_input(spec.path, &program, input)?;
        let device = vs.device();
        let key = key_of(packages, spec, input, &program, device)?;
        let compiled = compile::compiled(spec.path, &key, device)?;
        if compiled.manifest.eval_mode_ops > 0 {
            tracing::warn!(
                "{} was exported in eval mode: {} dropout or batch-norm op(s) in it are frozen \
                 (export model.train() to train them)",
                spec.path.display(),
                compiled.manifest.eval_mode_ops
            );
        }
        Self::from_compiled(spec.path, compiled, vs)
    }

    fn from_compiled(
        path: &Path,
        compiled: Compiled,
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
        let train = match compiled.packages {
            Packages::TrainAndEval => Some(Mutex::new(Package::load(
                &compiled.train_package(),
                device,
                m.train_outputs(),
            )?)),
            Packages::Eval => None,
        };
        let eval = Package::load(&compiled.eval_package(), device, m.eval_outputs())?;
        Ok(Self {
            path: path.to_owned(),
            compiled,
            train,
            eval: Mutex::new(eval),
            params,
            buffers,
            mutated,
            grad_params,
            unit_scale: Tensor::f_ones([], (Kind::Float, device))?,
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
        let mut inputs = self.state_inputs();
        inputs.push(features.shallow_clone());
        let mut outputs = lock(&self.eval).run(&inputs)?;
        outputs
            .pop()
            .ok_or_else(|| self.error("the compiled eval forward returned nothing".to_owned()))
    }

    fn has_own_loss(&self) -> bool {
        self.compiled.manifest.own_loss
    }

    fn predicts(&self) -> bool {
        self.compiled.manifest.predicts
    }

    fn compiled_step(&self) -> Option<&dyn CompiledStep> {
        self.train.is_some().then_some(self as &dyn CompiledStep)
    }

    fn save_program(&self, path: &Path) -> Result<bool, TrainError> {
        std::fs::copy(&self.path, path).map_err(|e| TrainError::File {
            path: path.to_owned(),
            message: format!("cannot copy the program {}: {e}", self.path.display()),
        })?;
        Ok(true)
    }
}

fn lock(p: &Mutex<Package>) -> std::sync::MutexGuard<'_, Package> {
    p.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl CompiledStep for ProgramModel {
    fn evaluate(
        &self,
        features: &Tensor,
        targets: &Tensor,
    ) -> Result<Option<(Tensor, Tensor)>, TrainError> {
        if !self.compiled.manifest.eval_takes_target {
            return Ok(None);
        }
        let mut inputs = self.state_inputs();
        inputs.extend([features.shallow_clone(), targets.shallow_clone()]);
        let outputs = lock(&self.eval).run(&inputs)?;
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
        features: &Tensor,
        targets: &Tensor,
        weight: f64,
        scale: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor), TrainError> {
        let mut inputs = self.state_inputs();
        let scale = match scale {
            Some(s) => s.f_reshape([])?.f_to_kind(Kind::Float)?,
            None => self.unit_scale.shallow_clone(),
        };
        inputs.extend([features.shallow_clone(), targets.shallow_clone(), scale]);
        let train = self.train.as_ref().ok_or_else(|| TrainError::Model {
            what: self.path.display().to_string(),
            message: "only its eval forward was compiled (for inference)".to_owned(),
        })?;
        let outputs = lock(train).run(&inputs)?;
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
