//! Which engine runs a model for `kiln infer` and `kiln serve` (`infer.engine`): libtorch for
//! checkpoints and TorchScript files, ONNX Runtime for `.onnx` files, and with `auto` and an
//! ONNX file kiln exported from a checkpoint that is still here, both, measured per batch size.

use kiln_config::{InferEngineKind, Layer, RunPlan, keys};
use kiln_device::settings::AmpDtype;
use kiln_infer::choose::AutoEngine;
use kiln_infer::model::{self, ModelSource};
use kiln_infer::onnx::{OnnxEngine, OnnxOptions};
use kiln_infer::{Engine, EngineOptions, InferError, Runner};
use kiln_train::checkpoint::Checkpoint;

/// Everything needed to build the engine (owned: the server builds it on its worker thread).
#[derive(Debug)]
pub struct EngineRequest {
    pub source: ModelSource,
    /// The checkpoint of a checkpoint source, or the one an ONNX file was exported from.
    pub checkpoint: Option<Checkpoint>,
    /// For an ONNX file without a usable checkpoint: why not.
    pub onnx_only: Option<String>,
    pub plan: RunPlan,
    pub device: tch::Device,
    pub precision: AmpDtype,
    /// The batch limit.
    pub max_batch: usize,
    /// The shape of one sample, where the model does not say (TorchScript, open ONNX dims).
    pub input_shape: Option<Vec<usize>>,
}

/// The engine built, the precision it really runs in, and what was chosen and why.
pub struct Built {
    pub runner: Box<dyn Runner>,
    pub precision: AmpDtype,
    pub note: Option<String>,
}

impl std::fmt::Debug for Built {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Built")
            .field("engine", &self.runner.engine())
            .field("precision", &self.precision)
            .field("note", &self.note)
            .finish()
    }
}

fn setting(value: InferEngineKind, expected: String) -> InferError {
    InferError::Setting {
        key: keys::infer::engine,
        value: value.to_string(),
        expected,
    }
}

impl EngineRequest {
    /// Whether the model is an exported program (a `.pt2`, or a checkpoint holding one): it runs
    /// compiled, never in libtorch's eager form.
    fn is_program(&self) -> bool {
        matches!(self.source, ModelSource::Program(_))
            || self
                .checkpoint
                .as_ref()
                .is_some_and(|c| c.program().is_some())
    }

    /// `infer.engine = libtorch` for a program, or `compiled` for a model that is none.
    fn check_compiled(&self, kind: InferEngineKind) -> Result<(), InferError> {
        match (kind, self.is_program()) {
            (InferEngineKind::Libtorch, true) => Err(setting(
                kind,
                "compiled (or auto) for an exported program: libtorch has no eager form of \
                 one, kiln runs its eval forward compiled by AOTInductor"
                    .to_owned(),
            )),
            (InferEngineKind::Compiled, false) => Err(setting(
                kind,
                "libtorch, onnxruntime or auto: compiled runs an exported program (a .pt2, or a \
                 run or checkpoint of one, or an .onnx kiln exported from such a checkpoint)"
                    .to_owned(),
            )),
            _ => Ok(()),
        }
    }

    /// Builds the engine `infer.engine` asks for, or says why it cannot be.
    pub fn build(&self) -> Result<Built, InferError> {
        let kind = self.plan.infer.engine;
        self.check_compiled(kind)?;
        let ModelSource::Onnx(path) = &self.source else {
            if kind == InferEngineKind::Onnxruntime {
                return Err(setting(
                    kind,
                    "onnxruntime runs .onnx files: export this model with `kiln export --model \
                     … --out model.onnx` and pass the .onnx (or use auto or libtorch)"
                        .to_owned(),
                ));
            }
            return self.libtorch(None);
        };
        match (kind, &self.checkpoint) {
            (InferEngineKind::Libtorch | InferEngineKind::Compiled, None) => Err(setting(
                kind,
                format!(
                    "{kind} runs an .onnx file only from the checkpoint kiln exported it from, \
                     and {} has none: {} (use auto or onnxruntime)",
                    path.display(),
                    self.onnx_only.as_deref().unwrap_or("unknown")
                ),
            )),
            (InferEngineKind::Libtorch | InferEngineKind::Compiled, Some(_)) => self.libtorch(None),
            (InferEngineKind::Onnxruntime, _) => self.onnx(path, None),
            (InferEngineKind::Auto, None) => {
                let why = self.onnx_only.as_deref().unwrap_or("unknown");
                self.onnx(
                    path,
                    Some(format!(
                        "engine auto: onnxruntime, the only engine for this file ({why})"
                    )),
                )
            }
            (InferEngineKind::Auto, Some(_)) if self.precision != AmpDtype::None => {
                self.libtorch(Some(format!(
                    "engine auto: libtorch without measuring, because infer.precision = {}{} and \
                     onnxruntime runs the exported fp32 model (set infer.precision = fp32 to \
                     compare the two)",
                    self.precision.as_str(),
                    self.precision_source()
                )))
            }
            (InferEngineKind::Auto, Some(_)) => self.auto(path),
        }
    }

    fn precision_source(&self) -> String {
        self.plan
            .source_of(keys::infer::precision)
            .map_or_else(String::new, |p| format!(" ({})", p.source))
    }

    fn libtorch(&self, note: Option<String>) -> Result<Built, InferError> {
        let engine = self.libtorch_engine(self.precision)?;
        Ok(Built {
            runner: Box::new(engine),
            precision: self.precision,
            note,
        })
    }

    /// The libtorch engine in `precision`.
    pub fn libtorch_engine(&self, precision: AmpDtype) -> Result<Engine, InferError> {
        let model = model::load(
            &self.source,
            self.checkpoint.as_ref(),
            &self.plan,
            self.device,
            precision,
        )?;
        let shape = match (model.sample_shape(), &self.input_shape) {
            (Some(known), _) => known.to_vec(),
            (None, Some(given)) => given.clone(),
            (None, None) => {
                return Err(InferError::Input(
                    "the shape of one sample is needed for a TorchScript module (--input-shape, \
                     e.g. 784 or 64,469)"
                        .to_owned(),
                ));
            }
        };
        let options = EngineOptions {
            max_batch: self.max_batch,
            cuda_graphs: self.plan.infer.cuda_graphs,
        };
        Engine::new(model, shape, options)
    }

    /// ONNX Runtime runs the file in fp32: a reduced precision the user asked for is an error,
    /// the profile's is set aside with a note.
    fn onnx(&self, path: &std::path::Path, note: Option<String>) -> Result<Built, InferError> {
        let (engine, line) = self.open_onnx(path)?;
        let note = match (note, line) {
            (Some(n), Some(l)) => Some(format!("{n}; {l}")),
            (n, l) => n.or(l),
        };
        Ok(Built {
            runner: Box::new(engine),
            precision: AmpDtype::None,
            note,
        })
    }

    /// `path` opened in ONNX Runtime (fp32), with a note where the profile's reduced precision
    /// is set aside; a reduced precision the user asked for is an error naming the key.
    pub fn open_onnx(
        &self,
        path: &std::path::Path,
    ) -> Result<(OnnxEngine, Option<String>), InferError> {
        let mut note = None;
        if self.precision != AmpDtype::None {
            let layer = self.plan.source_of(keys::infer::precision).map(|p| p.layer);
            if !matches!(layer, None | Some(Layer::Default | Layer::Profile)) {
                return Err(InferError::Setting {
                    key: keys::infer::precision,
                    value: self.precision.as_str().to_owned(),
                    expected: format!(
                        "onnxruntime runs the ONNX file in fp32{}: set infer.precision = fp32, or \
                         infer.engine = libtorch for a kiln-exported model",
                        self.precision_source()
                    ),
                });
            }
            note = Some(format!(
                "onnxruntime runs the model in fp32 (the profile's infer.precision = {} applies \
                 to libtorch)",
                self.precision.as_str()
            ));
        }
        Ok((OnnxEngine::open(path, &self.onnx_options())?, note))
    }

    fn onnx_options(&self) -> OnnxOptions {
        OnnxOptions {
            max_batch: self.max_batch,
            threads: usize::try_from(tch::get_num_threads()).unwrap_or(1),
            device: self.device,
            input_shape: self.input_shape.clone(),
        }
    }

    /// Both engines, measured per batch bucket (or the cached answer).
    fn auto(&self, path: &std::path::Path) -> Result<Built, InferError> {
        let torch = self.libtorch_engine(AmpDtype::None)?;
        let onnx = match OnnxEngine::open(path, &self.onnx_options()) {
            Ok(onnx) => onnx,
            // ONNX Runtime cannot use this GPU (a CPU build, no CUDA provider): libtorch can.
            Err(e) if self.device.is_cuda() => {
                return Ok(Built {
                    runner: Box::new(torch),
                    precision: AmpDtype::None,
                    note: Some(format!(
                        "engine auto: libtorch, because onnxruntime cannot run here: {e}"
                    )),
                });
            }
            Err(e) => return Err(e),
        };
        let key = self.cache_key(path, &onnx)?;
        let cache = kiln_device::measured::cache_dir();
        let auto = AutoEngine::new(torch, onnx, &key, cache.as_deref())?;
        let note = auto.note().to_owned();
        Ok(Built {
            runner: Box::new(auto),
            precision: AmpDtype::None,
            note: Some(note),
        })
    }

    /// Everything the choice depends on: the ONNX file and the weights, the sample shape, the
    /// hardware and threads, the batch limit, the engines' versions and kiln's.
    fn cache_key(&self, path: &std::path::Path, onnx: &OnnxEngine) -> Result<String, InferError> {
        let hardware = kiln_device::measured::hardware_key(self.device)?;
        let weights = self
            .checkpoint
            .as_ref()
            .and_then(kiln_infer::onnx::weights_digest)
            .unwrap_or_default();
        Ok(format!(
            "onnx {} weights {weights} {:?} | {hardware} | fp32 | max_batch {} | threads {} | {} \
             | libtorch 2.11.0 | kiln {}",
            kiln_infer::onnx::file_digest(path)?,
            onnx.sample_shape(),
            self.max_batch,
            tch::get_num_threads(),
            onnx.status(),
            env!("CARGO_PKG_VERSION"),
        ))
    }
}

/// The checkpoint of a model source (a checkpoint's own; for an ONNX file the one kiln
/// exported it from, or why there is none).
pub fn checkpoint_of(
    source: &ModelSource,
) -> Result<(Option<Checkpoint>, Option<String>), InferError> {
    Ok(match source {
        ModelSource::Checkpoint(path) => (Some(model::open_checkpoint(path)?), None),
        ModelSource::Onnx(path) => match kiln_infer::onnx::exported_from(path) {
            Ok(ckpt) => (Some(ckpt), None),
            Err(why) => (None, Some(why)),
        },
        _ => (None, None),
    })
}
