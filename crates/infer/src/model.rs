//! The models inference runs: a kiln checkpoint (the reference model rebuilt from the settings
//! it was trained with, its weights loaded and verified; for a TorchScript model, the trained
//! module the checkpoint holds; for an exported program, its eval forward compiled for this
//! machine with the checkpoint's weights), a `torch.export` program (`.pt2`) or a TorchScript
//! module exported from PyTorch (`torch.jit.script` or `torch.jit.trace`, then `.save`). All
//! run in eval mode, in the precision asked for (weights converted once, not per call; a
//! program's autocast is compiled in).

use std::path::{Path, PathBuf};

use kiln_config::ModelPlan;
use kiln_device::settings::AmpDtype;
use kiln_train::checkpoint::{self, Checkpoint};
use kiln_train::inputs::Inputs;
use kiln_train::model::InputSpec;
use kiln_train::model::Model;
use tch::{Device, Kind, Tensor, nn};

use crate::InferError;

/// What a model's description says once its convolutions' weights are re-laid channels-last.
const CHANNELS_LAST_NOTE: &str = ", weights channels-last";

/// Where a model comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A checkpoint directory, a run directory (its newest good checkpoint) or its
    /// `checkpoints/` directory.
    Checkpoint(PathBuf),
    /// A TorchScript file.
    TorchScript(PathBuf),
    /// A `torch.export` program (`.pt2`), run by its eval forward compiled for this machine.
    Program(PathBuf),
    /// An ONNX file (`.onnx`), run by ONNX Runtime, or by libtorch from the checkpoint that
    /// `kiln export` recorded in it.
    Onnx(PathBuf),
}

impl ModelSource {
    /// A directory is a kiln checkpoint or run; a `.onnx` file an ONNX model; another file an
    /// exported program or a TorchScript module, told apart by its content (an AOTInductor
    /// package is refused: kiln runs only packages it compiled itself).
    pub fn detect(path: &Path) -> Result<Self, InferError> {
        use kiln_train::program::FileKind;
        let onnx = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("onnx"));
        if path.is_dir() {
            Ok(ModelSource::Checkpoint(path.to_owned()))
        } else if path.is_file() && onnx {
            Ok(ModelSource::Onnx(path.to_owned()))
        } else if path.is_file() {
            match kiln_train::program::detect(path) {
                Ok(FileKind::ExportedProgram) => {
                    // Before anything else reads it: nothing in it may run code when loaded.
                    kiln_train::program::archive::vet_file(path)?;
                    Ok(ModelSource::Program(path.to_owned()))
                }
                Ok(FileKind::AotiPackage) => Err(InferError::file(
                    path,
                    "an AOTInductor package (native code compiled for one machine): kiln runs \
                     the program it came from (torch.export.save), compiled here",
                )),
                // TorchScript, or no model at all: loading it as TorchScript says which.
                _ => Ok(ModelSource::TorchScript(path.to_owned())),
            }
        } else {
            Err(InferError::file(
                path,
                "no such file or directory (expected a kiln checkpoint or run directory, an \
                 exported program (.pt2), a TorchScript .pt file or an .onnx file)",
            ))
        }
    }
}

/// Opens and verifies the checkpoint `path` names (see [`checkpoint::resolve`]); damaged
/// checkpoints that were skipped are logged.
pub fn open_checkpoint(path: &Path) -> Result<Checkpoint, InferError> {
    let (ckpt, skipped) = checkpoint::resolve(path)?;
    for (dir, why) in skipped {
        tracing::warn!("skipped damaged checkpoint {}: {why}", dir.display());
    }
    Ok(ckpt)
}

/// The `model.*` settings a checkpoint was trained with, as (key, value) text, for the
/// configuration's checkpoint layer. An optional key the run left unset (shown as
/// [`kiln_config::UNSET`] in the checkpoint's `config.json`: `model.output`, `model.freeze`)
/// stays unset.
pub fn model_settings(ckpt: &Checkpoint) -> Vec<(String, String)> {
    let Some(entries) = ckpt.meta.config.as_array() else {
        return vec![];
    };
    entries
        .iter()
        .filter_map(|e| {
            let key = e.get("key")?.as_str()?;
            let value = e.get("value")?.as_str()?;
            (key.starts_with("model.") && value != kiln_config::UNSET)
                .then(|| (key.to_owned(), value.to_owned()))
        })
        .collect()
}

/// The value of `key` the checkpoint's run was configured with, as shown.
fn setting_of<'a>(ckpt: &'a Checkpoint, key: &str) -> Option<&'a str> {
    ckpt.meta
        .config
        .as_array()?
        .iter()
        .find(|e| e.get("key").and_then(|k| k.as_str()) == Some(key))?
        .get("value")?
        .as_str()
}

/// Rebuilds the checkpoint's model from `plan` (the settings it was trained with, see
/// [`model_settings`]) in a new `VarStore` on `device` and copies its weights in, in fp32 and
/// trainable; also returns the input the checkpoint was trained on.
pub fn rebuild(
    ckpt: &Checkpoint,
    plan: &ModelPlan,
    channels_last: bool,
    device: Device,
) -> Result<(nn::VarStore, Box<dyn Model>, InputSpec), InferError> {
    let input = ckpt.meta.input.clone().ok_or_else(|| InferError::Model {
        model: ckpt.dir.display().to_string(),
        message: "the checkpoint does not record its input shape (it predates kiln inference); \
                  train again, or export the model to TorchScript"
            .to_owned(),
    })?;
    let vs = nn::VarStore::new(device);
    let model = kiln_train::source::build(plan, &input, &vs, channels_last, 0)?;
    copy_weights(ckpt, &vs)?;
    Ok((vs, model, input))
}

/// Copies the checkpoint's weights into `vs`'s variables, by name and shape.
pub(crate) fn copy_weights(ckpt: &Checkpoint, vs: &nn::VarStore) -> Result<(), InferError> {
    let mut current: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    current.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(ckpt.copy_weights_into(&current)?)
}

/// "kiln mlp checkpoint runs/x/checkpoints/step-40 (step 40)", for reports.
pub(crate) fn checkpoint_description(ckpt: &Checkpoint, plan: &ModelPlan) -> String {
    format!(
        "kiln {} checkpoint {} (step {})",
        plan.kind,
        ckpt.dir.display(),
        ckpt.meta.step
    )
}

/// The tensor element type of a precision.
pub fn kind_of(precision: AmpDtype) -> Kind {
    match precision {
        AmpDtype::None => Kind::Float,
        AmpDtype::Fp16 => Kind::Half,
        AmpDtype::Bf16 => Kind::BFloat16,
    }
}

enum Inner {
    Kiln {
        // The parameters' owner; the model holds handles into it.
        vs: nn::VarStore,
        model: Box<dyn Model>,
    },
    Script(tch::CModule),
}

/// A model ready for inference.
pub struct LoadedModel {
    inner: Inner,
    description: String,
    sample_shape: Option<Vec<usize>>,
    kind: Kind,
    device: Device,
    /// An exported program's compiled eval forward (no TorchScript or ONNX export from it).
    program: bool,
}

impl std::fmt::Debug for LoadedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedModel")
            .field("description", &self.description)
            .field("sample_shape", &self.sample_shape)
            .field("kind", &self.kind)
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl LoadedModel {
    /// Rebuilds the checkpoint's model from `plan` (the settings it was trained with, see
    /// [`model_settings`]) on `device`, loads its weights, and converts them to `precision`.
    pub fn from_checkpoint(
        ckpt: &Checkpoint,
        plan: &ModelPlan,
        channels_last: bool,
        device: Device,
        precision: AmpDtype,
    ) -> Result<Self, InferError> {
        if let Some(path) = ckpt.program() {
            return Self::program(&path, Some(ckpt), plan.output.clone(), device, precision);
        }
        let takes_arrays = ckpt.meta.input.as_ref().is_some_and(|i| i.arrays.len() > 1);
        if ckpt.meta.files.contains_key(checkpoint::SCRIPT_FILE) && takes_arrays {
            // A module taking several arrays (a dict, or positional arguments by name).
            let vs = nn::VarStore::new(device);
            let names = plan
                .inputs
                .as_ref()
                .map(|n| n.split(',').map(|s| s.trim().to_owned()).collect());
            let path = ckpt.dir.join(checkpoint::SCRIPT_FILE);
            let model = kiln_train::script::ScriptModel::load(&path, &vs)?.with_inputs(names);
            let description = format!(
                "kiln TorchScript checkpoint {} (step {})",
                ckpt.dir.display(),
                ckpt.meta.step
            );
            let shape = ckpt.meta.input.as_ref().map(|i| i.sample_shape.clone());
            let model = Box::new(model);
            return Ok(Self::from_kiln(
                vs,
                model,
                description,
                shape.unwrap_or_default(),
                precision,
            ));
        }
        if ckpt.meta.files.contains_key(checkpoint::SCRIPT_FILE) {
            // A TorchScript model's checkpoint holds the trained module itself.
            let mut loaded =
                Self::torchscript(&ckpt.dir.join(checkpoint::SCRIPT_FILE), device, precision)?;
            loaded.description = format!(
                "kiln TorchScript checkpoint {} (step {})",
                ckpt.dir.display(),
                ckpt.meta.step
            );
            loaded.sample_shape = ckpt.meta.input.as_ref().map(|i| i.sample_shape.clone());
            if channels_last {
                loaded.set_channels_last(true)?;
            }
            return Ok(loaded);
        }
        let (vs, model, input) = rebuild(ckpt, plan, channels_last, device)?;
        Ok(Self::from_kiln(
            vs,
            model,
            checkpoint_description(ckpt, plan),
            input.sample_shape,
            precision,
        ))
    }

    /// A kiln model already built in `vs` (for programs that build their own), converted to
    /// `precision`.
    pub fn from_kiln(
        mut vs: nn::VarStore,
        model: Box<dyn Model>,
        description: impl Into<String>,
        sample_shape: Vec<usize>,
        precision: AmpDtype,
    ) -> Self {
        let kind = kind_of(precision);
        match kind {
            Kind::Half => vs.half(),
            Kind::BFloat16 => vs.bfloat16(),
            _ => {}
        }
        vs.freeze();
        let device = vs.device();
        Self {
            inner: Inner::Kiln { vs, model },
            description: description.into(),
            sample_shape: Some(sample_shape),
            kind,
            device,
            program: false,
        }
    }

    /// An exported program's eval forward, compiled for `device` with `precision` (autocast
    /// inside the compiled code; the weights stay in the program's dtype), with the weights of
    /// `ckpt` where given (a trained program), else the program's own.
    pub fn program(
        path: &Path,
        ckpt: Option<&Checkpoint>,
        output: Option<String>,
        device: Device,
        precision: AmpDtype,
    ) -> Result<Self, InferError> {
        let facts = kiln_train::program::inspect(path)?;
        let input = ckpt
            .and_then(|c| c.meta.input.clone())
            .unwrap_or(InputSpec {
                sample_shape: facts.sample_shape.clone(),
                classes: 0,
                target: None,
                integer_features: facts.dtype == "int64",
                arrays: vec![],
            });
        // A program trained with its own loss takes the target too (its eval forward with it).
        let own_loss = ckpt.is_some_and(|c| setting_of(c, "train.loss") == Some("module"));
        let spec = kiln_train::program::ProgramSpec {
            path,
            loss: match own_loss {
                true => kiln_train::loss::Loss::Module,
                false => kiln_train::loss::Loss::CrossEntropy,
            },
            precision,
            output,
            freeze: None,
            // As the run was trained: its packages are the ones in the compile cache.
            attention: ckpt
                .and_then(|c| setting_of(c, kiln_config::keys::model::attention))
                .and_then(|v| v.parse().ok())
                .unwrap_or(kiln_config::AttentionKernel::Auto),
            threads: kiln_torch_ext::memory::num_threads()?.0,
            batch: None,
        };
        let vs = nn::VarStore::new(device);
        let model = kiln_train::program::ProgramModel::load_eval(&spec, &input, &vs)?;
        let description = match ckpt {
            Some(ckpt) => {
                copy_weights(ckpt, &vs)?;
                format!(
                    "kiln exported-program checkpoint {} (step {})",
                    ckpt.dir.display(),
                    ckpt.meta.step
                )
            }
            None => format!("exported program {}", path.display()),
        };
        Ok(Self {
            inner: Inner::Kiln {
                vs,
                model: Box::new(model),
            },
            description,
            sample_shape: Some(input.sample_shape),
            // Fed in float32 (or the program's own input dtype), as it was exported.
            kind: Kind::Float,
            device,
            program: true,
        })
    }

    /// Loads a TorchScript module onto `device` in eval mode, its floating-point parameters in
    /// `precision`.
    pub fn torchscript(
        path: &Path,
        device: Device,
        precision: AmpDtype,
    ) -> Result<Self, InferError> {
        kiln_train::program::archive::vet_file(path)?;
        let mut module = tch::CModule::load_on_device(path, device).map_err(|e| {
            InferError::file(
                path,
                format!("not a loadable TorchScript module (torch.jit.script/trace + save): {e}"),
            )
        })?;
        module.f_set_eval()?;
        let kind = kind_of(precision);
        if kind != Kind::Float {
            // tch's `to` panics on a libtorch error; keep that a plain error.
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                module.to(device, kind, false)
            }))
            .map_err(|_| {
                InferError::file(path, format!("cannot convert the module to {kind:?}"))
            })?;
        }
        Ok(Self {
            inner: Inner::Script(module),
            description: format!("TorchScript {}", path.display()),
            sample_shape: None,
            kind,
            device,
            program: false,
        })
    }

    /// Whether this is an exported program's compiled eval forward.
    pub fn is_program(&self) -> bool {
        self.program
    }

    /// What was loaded, for reports.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// The shape of one input sample, where the model records it (kiln checkpoints do).
    pub fn sample_shape(&self) -> Option<&[usize]> {
        self.sample_shape.as_deref()
    }

    /// The number of parameters: a kiln model's trainable tensors (batch-norm statistics are
    /// not parameters), a TorchScript module's `named_parameters`.
    pub fn parameters(&self) -> Result<usize, InferError> {
        Ok(match &self.inner {
            Inner::Kiln { vs, .. } => kiln_train::model::parameter_count(vs),
            Inner::Script(module) => module
                .named_parameters()?
                .iter()
                .map(|(_, t)| t.numel())
                .sum(),
        })
    }

    /// The element type the model computes in.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Re-lays the model's 4-D and 5-D parameters (its convolutions' weights) out channels-last
    /// (`on`) or contiguous, in place: a convolution with a channels-last weight runs
    /// channels-last whatever its input's layout, which is the only way a window of one channel
    /// gets there (its channels-last and contiguous strides are the same). Returns whether the
    /// model can be re-laid: an exported program's compiled forward cannot. While any weight is
    /// channels-last, the model's description says so.
    pub fn set_channels_last(&mut self, on: bool) -> Result<bool, InferError> {
        let params = match &self.inner {
            _ if self.program => return Ok(false),
            Inner::Kiln { vs, .. } => vs.variables().into_values().collect(),
            Inner::Script(module) => module
                .named_parameters()?
                .into_iter()
                .map(|(_, p)| p)
                .collect::<Vec<_>>(),
        };
        let mut relaid = 0;
        for p in params.iter().filter(|p| matches!(p.dim(), 4 | 5)) {
            match on {
                true => kiln_torch_ext::layout::param_to_channels_last(p)?,
                false => kiln_torch_ext::layout::param_to_contiguous(p)?,
            }
            relaid += 1;
        }
        let base = self.description.strip_suffix(CHANNELS_LAST_NOTE);
        self.description = base.unwrap_or(&self.description).to_owned();
        if on && relaid > 0 {
            self.description.push_str(CHANNELS_LAST_NOTE);
        }
        Ok(true)
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// Writes the model as a TorchScript file at `path`: a kiln model traced on `example` (a
    /// batch of the model's input; the trace keeps no batch size), a TorchScript module saved
    /// in eval mode as it is.
    pub fn save_torchscript(&self, path: &Path, example: &Tensor) -> Result<(), InferError> {
        let module = match &self.inner {
            Inner::Kiln { model, .. } => {
                let _guard = tch::no_grad_guard();
                let mut failure = None;
                let traced = tch::CModule::create_by_tracing(
                    "KilnModel",
                    "forward",
                    std::slice::from_ref(example),
                    &mut |xs| match model.forward(&xs[0], false) {
                        Ok(y) => vec![y],
                        Err(e) => {
                            failure = Some(e);
                            vec![xs[0].shallow_clone()]
                        }
                    },
                )?;
                if let Some(e) = failure {
                    return Err(e.into());
                }
                traced
            }
            Inner::Script(module) => return Ok(module.save(path)?),
        };
        Ok(module.save(path)?)
    }

    /// The model's output for a batch of named inputs whose targets are at hand (a program
    /// computing its own loss takes them), on its device. Call under `tch::no_grad_guard`.
    pub fn predict(&self, inputs: &Inputs, targets: &Tensor) -> Result<Tensor, InferError> {
        match &self.inner {
            Inner::Kiln { model, .. } => Ok(model.predict(inputs, targets)?),
            Inner::Script(_) => self.forward(inputs.single()?),
        }
    }

    /// The model's output for a batch already on its device and in its element type. Call
    /// under `tch::no_grad_guard`.
    pub fn forward(&self, xs: &Tensor) -> Result<Tensor, InferError> {
        match &self.inner {
            Inner::Kiln { model, .. } => Ok(model.forward(xs, false)?),
            // Running out of memory stays a libtorch error, which says what it is.
            Inner::Script(module) => module.forward_ts(&[xs]).map_err(|e| {
                if kiln_torch_ext::tch_out_of_memory(&e) {
                    return InferError::Tch(e);
                }
                InferError::Model {
                    model: self.description.clone(),
                    message: format!(
                        "forward failed (it must take one tensor and return one tensor): {e}"
                    ),
                }
            }),
        }
    }
}

/// Loads `source` (with its checkpoint already opened, for a checkpoint) for inference.
pub fn load(
    source: &ModelSource,
    checkpoint: Option<&Checkpoint>,
    plan: &kiln_config::RunPlan,
    device: Device,
    precision: AmpDtype,
) -> Result<LoadedModel, InferError> {
    match (source, checkpoint) {
        (ModelSource::Checkpoint(_) | ModelSource::Onnx(_), Some(ckpt)) => {
            LoadedModel::from_checkpoint(
                ckpt,
                &plan.model,
                plan.performance.channels_last,
                device,
                precision,
            )
        }
        (ModelSource::Onnx(path), None) => Err(InferError::Model {
            model: path.display().to_string(),
            message: "libtorch cannot run an ONNX file by itself; only one kiln exported from a \
                      checkpoint that is still there (use infer.engine = onnxruntime)"
                .to_owned(),
        }),
        (ModelSource::Checkpoint(path), None) => {
            let ckpt = open_checkpoint(path)?;
            LoadedModel::from_checkpoint(
                &ckpt,
                &plan.model,
                plan.performance.channels_last,
                device,
                precision,
            )
        }
        (ModelSource::TorchScript(path), _) => {
            let mut loaded = LoadedModel::torchscript(path, device, precision)?;
            // kiln's own models are built channels-last; a module's weights are re-laid here.
            if plan.performance.channels_last {
                loaded.set_channels_last(true)?;
            }
            Ok(loaded)
        }
        (ModelSource::Program(path), _) => {
            LoadedModel::program(path, None, plan.model.output.clone(), device, precision)
        }
    }
}
