//! A whole training run: the data (a prepared dataset, a built-in model's synthetic one, or
//! the caller's own) and its train/validation split, the model (from a factory: a built-in, a
//! TorchScript file, or the caller's own tch module), the automatic batch size, the trainer,
//! and the run directory that records it. [`train`] is what the CLI runs; [`drive`] is the
//! same run for any model and data (see [`crate::learner`] for the library's front door).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use kiln_config::keys;
use kiln_config::{ModelKind, RunPlan};
use kiln_data::{Dataset, SamplerConfig, ShardedDataset, Subset, Windows};
use tch::nn;

use crate::TrainError;
use crate::checkpoint;
use crate::feed::{loader_config, tch_device};
use crate::model::{InputSpec, ModelRecipe};
use crate::models::synthetic_dataset;
use crate::record::{Observer, Observers, RunReady, Summary};
use crate::rundir::RunDir;
use crate::source::build;
use crate::trainer::{
    CheckpointOptions, FitData, FitOptions, ProfilingOptions, TrainSettings, Trainer,
};

/// Which checkpoint to continue from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resume {
    /// The newest good checkpoint of the newest run named `run.name` under `run.output_dir`.
    Latest,
    /// A checkpoint directory, or a run directory (its newest good checkpoint).
    From(PathBuf),
}

/// Resuming and stopping a run.
#[derive(Debug, Default, Clone)]
pub struct RunControl {
    pub resume: Option<Resume>,
    /// Set by a signal handler: finish the step, checkpoint, stop.
    pub stop: Option<Arc<AtomicBool>>,
    /// Where `train.batch_size = "auto"` caches its answers (`None`: search every time).
    pub cache_dir: Option<PathBuf>,
    /// The ranks of a data-parallel run (`None`: this process trains alone). Rank 0 alone
    /// writes the run directory, metrics and checkpoints.
    pub group: Option<crate::distributed::SharedGroup>,
    /// Metrics reported besides the task's (see [`crate::metrics::Metric`]).
    pub metrics: Vec<Arc<dyn crate::metrics::Metric>>,
    /// The clock of `train.max_time` and `checkpoint.every_seconds` (`None`: wall time).
    pub clock: Option<crate::stopping::Clock>,
}

/// The newest run directory named `<name>-…` under `output_dir` that has checkpoints.
fn latest_run(output_dir: &Path, name: &str) -> Result<PathBuf, TrainError> {
    let prefix = format!("{name}-");
    let mut runs: Vec<PathBuf> = std::fs::read_dir(output_dir)
        .map_err(|e| TrainError::File {
            path: output_dir.to_owned(),
            message: format!("cannot look for a run to resume: {e}"),
        })?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .filter(|p| p.join("checkpoints").is_dir())
        .collect();
    runs.sort();
    runs.pop().ok_or_else(|| TrainError::File {
        path: output_dir.to_owned(),
        message: format!(
            "no run named `{name}` with checkpoints here to resume; pass --resume PATH or --run-name"
        ),
    })
}

/// What a finished run leaves behind.
#[derive(Debug)]
pub struct RunOutcome {
    pub summary: Summary,
    /// `runs/<name>-<timestamp>/`.
    pub run_dir: PathBuf,
    /// Where the data came from, for reports.
    pub data: String,
}

/// The checkpoint a run continues from, verified, and the damaged ones resolve passed over
/// (moved aside here).
pub fn find_resume(
    plan: &RunPlan,
    control: &RunControl,
) -> Result<Option<checkpoint::Checkpoint>, TrainError> {
    let (ckpt, skipped) = match &control.resume {
        None => return Ok(None),
        Some(Resume::Latest) => {
            checkpoint::resolve(&latest_run(&plan.run.output_dir, &plan.run.name)?)?
        }
        Some(Resume::From(path)) => checkpoint::resolve(path)?,
    };
    for (dir, why) in skipped {
        checkpoint::move_aside(&dir, "damaged", &why)?;
    }
    tracing::info!(
        "resuming from {} (step {}, epoch {}, batch {})",
        ckpt.dir.display(),
        ckpt.meta.step,
        ckpt.meta.epoch + 1,
        ckpt.meta.batch
    );
    Ok(Some(ckpt))
}

/// A run's data: training and validation samples, and a line describing where they came from.
pub struct RunData {
    pub train: Arc<Box<dyn Dataset>>,
    pub val: Option<Arc<Box<dyn Dataset>>>,
    pub description: String,
    /// What a windowed dataset forecasts: its metrics replace the task's (besides the loss).
    pub forecast: Option<crate::metrics::ForecastSpec>,
}

impl std::fmt::Debug for RunData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunData")
            .field("train", &self.train.len())
            .field("val", &self.val.as_ref().map(|v| v.len()))
            .field("description", &self.description)
            .finish()
    }
}

impl RunData {
    /// `dataset` split at random into training and validation (`val_fraction` of it, seeded).
    pub fn split(
        dataset: Box<dyn Dataset>,
        val_fraction: f64,
        seed: u64,
        description: String,
    ) -> Result<Self, TrainError> {
        let (train, val) = Subset::split(Arc::new(dataset), val_fraction, seed)?;
        Ok(Self {
            train: Arc::new(Box::new(train)),
            val: Some(Arc::new(Box::new(val))),
            description,
            forecast: None,
        })
    }

    /// The plan's data: the prepared dataset in `data_dir`, or the model's synthetic one.
    pub fn of_plan(plan: &RunPlan, data_dir: Option<&Path>) -> Result<Self, TrainError> {
        let seed = plan.performance.backend.seed;
        let (dataset, text): (Box<dyn Dataset>, String) = match data_dir {
            Some(dir) if Windows::is_windows_dir(dir) => return Self::windows(plan, dir),
            Some(dir) => {
                if set_by_user(plan, keys::data::val_steps) {
                    tracing::warn!(
                        "data.val_steps applies to windowed time-series datasets; {} is split \
                         at random by data.val_fraction",
                        dir.display()
                    );
                }
                if plan.model.quantiles.is_some() {
                    tracing::warn!(
                        "model.quantiles names a forecaster's output levels; {} is not a \
                         windowed dataset, so no forecast metrics judge them",
                        dir.display()
                    );
                }
                let d = ShardedDataset::open(dir)?;
                let shapes = match &d.manifest().inputs[..] {
                    [one] => format!("{:?}", one.shape),
                    many => named_shapes(many),
                };
                let text = format!(
                    "{} ({} samples of {shapes}; {})",
                    dir.display(),
                    d.len(),
                    d.target()
                );
                (Box::new(d), text)
            }
            None => {
                let samples = usize::try_from(plan.data.synthetic_samples).unwrap_or(usize::MAX);
                let d = synthetic_dataset(plan.model.kind, samples, seed)?;
                let text = format!(
                    "synthetic {} data ({} samples of {:?}, {} classes)",
                    plan.model.kind,
                    d.len(),
                    d.sample_shape(),
                    d.classes().unwrap_or(0)
                );
                (d, text)
            }
        };
        Self::split(dataset, plan.data.val_fraction, seed, text)
    }
}

impl RunData {
    /// The windowed time-series dataset in `dir`, split by time: the last `data.val_steps`
    /// steps of every series validate.
    fn windows(plan: &RunPlan, dir: &Path) -> Result<Self, TrainError> {
        if set_by_user(plan, keys::data::val_fraction) {
            tracing::warn!(
                "data.val_fraction does not split a windowed dataset: it is split by time, the \
                 last data.val_steps steps of every series validating"
            );
        }
        let windows = Windows::open(dir)?;
        let m = windows.manifest();
        let val_steps = plan.data.val_steps.map_or(m.horizon, |n| n as usize);
        let (train, val) = windows.split(val_steps)?;
        let arrays = named_shapes(&train.inputs());
        let description = format!(
            "{} (windows of {} series, encoder {} + horizon {} steps: {} train, {} validate with \
             the last {val_steps} steps of every series; {}; target {})",
            dir.display(),
            m.series.len(),
            match m.min_encoder_length {
                Some(min) => format!("{min} to {}", m.encoder_length),
                None => m.encoder_length.to_string(),
            },
            m.horizon,
            train.len(),
            val.len(),
            arrays,
            train.target()
        );
        Ok(Self {
            train: Arc::new(Box::new(train)),
            val: (!val.is_empty()).then(|| Arc::new(Box::new(val) as Box<dyn Dataset>)),
            description,
            forecast: Some(crate::metrics::ForecastSpec {
                horizon: m.horizon,
                levels: plan.model.quantiles.clone(),
            }),
        })
    }
}

/// "x [4], cat []": each array's name and per-sample shape.
fn named_shapes(arrays: &[kiln_data::ArraySpec]) -> String {
    arrays
        .iter()
        .map(|a| format!("{} {:?}", a.name, a.shape))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether a layer above kiln's defaults set `key`.
fn set_by_user(plan: &RunPlan, key: &str) -> bool {
    plan.provenance
        .get(key)
        .is_some_and(|p| p.layer != kiln_config::Layer::Default)
}

/// Refuses what kiln cannot do inside a model of the user's own (TorchScript or a program):
/// its own dropout (the model keeps its own; `model.dropout` set by the user is an error,
/// kiln's default is ignored). (`model.activation_checkpointing` is refused where the model is
/// built.)
pub(crate) fn refuse_kiln_dropout(plan: &RunPlan) -> Result<(), TrainError> {
    if set_by_user(plan, keys::model::dropout) {
        return Err(TrainError::InvalidPlan {
            key: keys::model::dropout,
            value: plan.model.dropout.to_string(),
            expected: format!(
                "unset for {}: kiln's dropout is part of its built-in models; your model's own \
                 dropout layers train as it defines them",
                match plan.model.kind {
                    ModelKind::Program => "an exported program",
                    _ => "a TorchScript model",
                }
            ),
        });
    }
    Ok(())
}

/// The plan with its model file's kind told by the file's content (a `.pt` holding an
/// exported program trains as one, and the other way round); an AOTInductor package is
/// refused with what to give instead.
pub fn with_file_kind(plan: &RunPlan) -> Result<RunPlan, TrainError> {
    let Some(path) = &plan.model.script else {
        return Ok(plan.clone());
    };
    let found = crate::program::detect(path)?;
    let kind = match found {
        crate::program::FileKind::ExportedProgram => ModelKind::Program,
        crate::program::FileKind::TorchScript => ModelKind::TorchScript,
        crate::program::FileKind::AotiPackage => {
            return Err(TrainError::InvalidPlan {
                key: keys::model::name,
                value: path.display().to_string(),
                expected: format!(
                    "a program kiln can train; this is {}, built for one machine and without \
                     its backward: give the ExportedProgram it came from ({})",
                    found.describe(),
                    crate::program::file::HOW_TO_EXPORT
                ),
            });
        }
    };
    // Before anything else reads it: nothing in the file may run code when loaded.
    crate::program::archive::vet_file(path)?;
    if kind != plan.model.kind {
        tracing::info!(
            "{} holds {}: training it as one",
            path.display(),
            found.describe()
        );
    }
    let mut plan = plan.clone();
    plan.model.kind = kind;
    Ok(plan)
}

/// A program's fixed batch size becomes the run's `train.batch_size` (said once); a program
/// with a symbolic batch dimension takes any. Its last partial batch is dropped either way
/// (never padded).
fn with_program_batch(mut plan: RunPlan) -> Result<RunPlan, TrainError> {
    let Some(path) = plan.model.script.clone() else {
        return Ok(plan);
    };
    let input = crate::program::inspect(&path)?;
    if let Some(n) = input.fixed_batch {
        let n = n as u64;
        if plan.train.batch_size_auto || plan.train.batch_size != n {
            tracing::warn!(
                "{} was exported with a fixed batch of {n}: training at train.batch_size = {n} \
                 (export with dynamic_shapes to train at any size)",
                path.display()
            );
        }
        plan.train.batch_size = n;
        plan.train.batch_size_auto = false;
    }
    Ok(plan)
}

/// The model file a run loads: a resumed run's checkpoint copy (`file`, saved with it), else
/// the plan's.
fn model_file_to_load(path: &Path, file: &str, resume: Option<&checkpoint::Checkpoint>) -> PathBuf {
    resume
        .map(|c| c.dir.join(file))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| path.to_owned())
}

/// A run of the user's own model file: a TorchScript module or an exported program, told
/// apart by content; the plan as it trains it (the file's kind, a program's fixed batch), and
/// the file it loads (a resumed run's checkpoint copy, else the plan's).
#[derive(Debug)]
pub struct FileModel {
    plan: RunPlan,
    load: PathBuf,
}

impl FileModel {
    /// The run of `plan.model.script`, continuing from `resume` where given.
    pub fn new(
        plan: &RunPlan,
        resume: Option<&checkpoint::Checkpoint>,
    ) -> Result<Self, TrainError> {
        let mut plan = with_file_kind(plan)?;
        refuse_kiln_dropout(&plan)?;
        let path = plan
            .model
            .script
            .clone()
            .ok_or_else(|| TrainError::InvalidPlan {
                key: keys::model::name,
                value: plan.model.kind.to_string(),
                expected: "the path of your model file".to_owned(),
            })?;
        let file = match plan.model.kind {
            ModelKind::Program => {
                plan = with_program_batch(plan)?;
                crate::program::PROGRAM_FILE
            }
            _ => checkpoint::SCRIPT_FILE,
        };
        let load = model_file_to_load(&path, file, resume);
        Ok(Self { plan, load })
    }

    /// The plan as the run trains it.
    pub fn plan(&self) -> &RunPlan {
        &self.plan
    }

    /// Builds the model under `vs` for data of `input`.
    pub fn build(
        &self,
        vs: &nn::VarStore,
        input: &InputSpec,
    ) -> Result<Box<dyn crate::model::Model>, TrainError> {
        match self.plan.model.kind {
            ModelKind::Program => program_model(&self.plan, &self.load, vs, input),
            _ => {
                let mut model = self.plan.model.clone();
                model.script = Some(self.load.clone());
                build(&model, input, vs, false, self.plan.performance.backend.seed)
            }
        }
    }

    /// The recipe of a run whose factory is `build` (this file model's [`Self::build`]).
    pub fn recipe<'a>(&self, build: crate::model::ModelFactory<'a>) -> ModelRecipe<'a> {
        let script = self.plan.model.kind == ModelKind::TorchScript;
        ModelRecipe {
            name: crate::source::display_name(&self.plan.model),
            identity: crate::source::identity(&self.plan),
            build,
            warmup_steps: if script {
                crate::script::WARMUP_STEPS
            } else {
                1
            },
            init_on_cpu: false,
        }
    }
}

/// The factory of a program run: the program compiled for the run's loss, precision and
/// output on this machine (or found in the cache).
fn program_model(
    plan: &RunPlan,
    path: &Path,
    vs: &nn::VarStore,
    input: &InputSpec,
) -> Result<Box<dyn crate::model::Model>, TrainError> {
    if plan.model.activation_checkpointing {
        return Err(TrainError::InvalidPlan {
            key: keys::model::activation_checkpointing,
            value: "true".to_owned(),
            expected: "false for an exported program: kiln recomputes activations only inside \
                       its built-in transformer"
                .to_owned(),
        });
    }
    let target = input
        .target
        .clone()
        .unwrap_or(kiln_data::TargetSpec::label(input.classes));
    let spec = crate::program::ProgramSpec {
        path,
        loss: crate::loss::Loss::resolve(plan.train.loss, &target)?,
        precision: plan.train.amp,
        output: plan.model.output.clone(),
        freeze: plan.model.freeze.clone(),
        attention: plan.model.attention,
        threads: kiln_torch_ext::memory::num_threads()?.0,
        batch: (!plan.train.batch_size_auto).then_some(plan.train.batch_size),
    };
    Ok(Box::new(crate::program::ProgramModel::load(
        &spec, input, vs,
    )?))
}

/// Trains `plan.model` (a built-in model, or the model file `model.name` gives) on `device`
/// over `data_dir` (a prepared dataset) or the model's synthetic dataset, recording into a new
/// run directory under `plan.run.output_dir`, and reporting to `observer` as it goes (its
/// `on_ready` first, with the run directory and the data).
pub fn train(
    plan: &RunPlan,
    device: kiln_device::Device,
    data_dir: Option<&Path>,
    control: RunControl,
    observer: &mut dyn Observer,
) -> Result<RunOutcome, TrainError> {
    // Find and verify the checkpoint first: a bad --resume fails before anything else.
    let resume = find_resume(plan, &control)?;
    with_recipe(plan, data_dir, resume, |plan, recipe, data, resume| {
        let job = RunJob {
            plan,
            device,
            recipe,
            data,
            resume,
            control,
        };
        drive(job, observer)
    })
}

/// Calls `f` with the plan's model recipe (a model file's, read with `resume`'s settings
/// where given, or a built-in model's), the plan's data, and `resume`.
fn with_recipe<T>(
    plan: &RunPlan,
    data_dir: Option<&Path>,
    resume: Option<checkpoint::Checkpoint>,
    f: impl FnOnce(
        &RunPlan,
        &ModelRecipe<'_>,
        RunData,
        Option<checkpoint::Checkpoint>,
    ) -> Result<T, TrainError>,
) -> Result<T, TrainError> {
    if plan.model.script.is_some() {
        let file = FileModel::new(plan, resume.as_ref())?;
        let data = RunData::of_plan(file.plan(), data_dir)?;
        let build = |vs: &nn::VarStore, input: &InputSpec| file.build(vs, input);
        let recipe = file.recipe(&build);
        return f(file.plan(), &recipe, data, resume);
    }
    let data = RunData::of_plan(plan, data_dir)?;
    let (channels_last, seed) = (
        plan.performance.channels_last,
        plan.performance.backend.seed,
    );
    let factory =
        |vs: &nn::VarStore, input: &InputSpec| build(&plan.model, input, vs, channels_last, seed);
    let recipe = ModelRecipe {
        name: crate::source::display_name(&plan.model),
        identity: crate::source::identity(plan),
        build: &factory,
        warmup_steps: 1,
        init_on_cpu: true,
    };
    f(plan, &recipe, data, resume)
}

/// The batch size `train.batch_size = "auto"` resolves to: a resumed run keeps the size it
/// chose; a new one asks the cache or searches (with the CPU generator put back after, so the
/// model starts the same). Returns the plan with the size, and the report's line.
fn auto_batch_size(
    plan: &RunPlan,
    recipe: &ModelRecipe<'_>,
    input: &InputSpec,
    data: &RunData,
    device: tch::Device,
    resume: Option<&checkpoint::Checkpoint>,
    cache_dir: Option<&Path>,
) -> Result<(RunPlan, Option<String>), TrainError> {
    if !plan.train.batch_size_auto {
        return Ok((plan.clone(), None));
    }
    let (size, note) = match resume.and_then(|c| c.meta.batch_size) {
        Some(size) => (size, format!("auto: {size}, as the resumed run chose")),
        None => {
            let _generator = kiln_torch_ext::rng::cpu_generator_lock();
            let rng = kiln_torch_ext::rng::cpu_rng_state()?;
            let found = crate::batch_search::resolve_auto(
                plan,
                recipe,
                input,
                Arc::clone(&data.train),
                device,
                cache_dir,
            );
            kiln_torch_ext::rng::set_cpu_rng_state(&rng)?;
            found?
        }
    };
    tracing::info!("train.batch_size {note}");
    let mut chosen = plan.clone();
    chosen.train.batch_size = size;
    Ok((chosen, Some(note)))
}

/// What the model of a run on `data` is built for.
fn input_of(data: &RunData) -> InputSpec {
    let mut input = InputSpec::of(data.train.sample_shape(), &data.train.target());
    input.integer_features = data.train.integer_features();
    let arrays = data.train.inputs();
    if arrays.len() > 1 {
        input.arrays = arrays;
    }
    input
}

/// `kiln lr-find`: the range test of `train.lr = "auto"` alone, for the model and data of
/// `plan` (after `train.batch_size = "auto"`'s search where asked), whatever the cache holds;
/// its answer is cached in `control.cache_dir` and its curve written into `out`
/// (`lr_find.json`, `lr_find.png`). Returns what it found.
pub fn find_lr(
    plan: &RunPlan,
    device: kiln_device::Device,
    data_dir: Option<&Path>,
    control: &RunControl,
    out: &Path,
) -> Result<crate::lr_find::LrFound, TrainError> {
    let tch_device = tch_device(device);
    let cache_dir = control.cache_dir.as_deref();
    let find = |plan: &RunPlan, recipe: &ModelRecipe<'_>, data: RunData| {
        let input = input_of(&data);
        let (plan, _) = auto_batch_size(plan, recipe, &input, &data, tch_device, None, cache_dir)?;
        let key = crate::lr_find::key_for(&plan, recipe, &input, data.train.as_ref(), tch_device)?;
        let mut cache = cache_dir.map(crate::lr_find::open_lr_cache);
        let found = crate::lr_find::measure(
            &plan,
            (recipe, &input, Arc::clone(&data.train)),
            tch_device,
            &crate::lr_find::RangeTest::default(),
            cache.as_mut().map(|c| (c, key.as_str())),
        )?;
        if let Some(curve) = &found.curve {
            std::fs::create_dir_all(out).map_err(|e| TrainError::File {
                path: out.to_owned(),
                message: e.to_string(),
            })?;
            crate::lr_find::write_curve(out, curve)?;
        }
        Ok(found)
    };
    with_recipe(plan, data_dir, None, |plan, recipe, data, _| {
        find(plan, recipe, data)
    })
}

/// The rate `train.lr = "auto"` would take from the cache in `cache_dir` for the model and
/// data of `plan` on `device`, without testing anything (`kiln config --explain`); `None`
/// where the cache has no answer (or `train.batch_size = "auto"`'s has none yet).
pub fn cached_lr(
    plan: &RunPlan,
    device: kiln_device::Device,
    data_dir: Option<&Path>,
    cache_dir: &Path,
) -> Result<Option<f64>, TrainError> {
    if !plan.train.lr_auto {
        return Ok(None);
    }
    let tch_device = tch_device(device);
    with_recipe(plan, data_dir, None, |plan, recipe, data, _| {
        let input = input_of(&data);
        let mut plan = plan.clone();
        if plan.train.batch_size_auto {
            let hardware = kiln_device::measured::hardware_key(tch_device)?;
            let key = crate::batch_search::cache_key(&plan, &recipe.identity, &input, &hardware);
            let cache = crate::batch_search::open_batch_size_cache(cache_dir);
            let Some(answer) = cache.get(&key) else {
                return Ok(None);
            };
            plan.train.batch_size = answer.batch_size;
        }
        let full = crate::lr_find::key_for(&plan, recipe, &input, data.train.as_ref(), tch_device)?;
        let planned = crate::lr_find::planned_steps(&plan, data.train.len());
        let test = crate::lr_find::RangeTest::for_run(planned);
        let keys = crate::lr_find::run_keys(full, test.as_ref());
        let cache = crate::lr_find::open_lr_cache(cache_dir);
        Ok(crate::lr_find::lookup(&cache, &keys).map(|c| c.lr))
    })
}

/// The learning rate `train.lr = "auto"` resolves to, once the batch size is known: a resumed
/// run keeps the rate its checkpoint records; a new one asks the cache or runs a range test
/// ([`crate::lr_find`]) on a model of its own (the run's weights, optimizer and generators are
/// as they were). A test is refused for a data-parallel run of more than one rank (`ranks`),
/// whose ranks would each test their own shard. Returns the plan with the rate, and what was
/// found (the curve, when a test ran, goes into the run directory).
fn auto_lr(
    plan: RunPlan,
    (recipe, input, data): (&ModelRecipe<'_>, &InputSpec, &RunData),
    device: tch::Device,
    (ranks, resume): (bool, Option<&checkpoint::Checkpoint>),
    cache_dir: Option<&Path>,
) -> Result<(RunPlan, Option<crate::lr_find::LrFound>), TrainError> {
    if !plan.train.lr_auto {
        return Ok((plan, None));
    }
    if let Some(lr) = resume.and_then(|c| c.meta.lr) {
        let note = format!("auto: {lr:e}, as the resumed run found");
        tracing::info!("train.lr {note}");
        let mut kept = plan;
        kept.train.lr = lr;
        let found = crate::lr_find::LrFound {
            lr,
            note,
            curve: None,
        };
        return Ok((kept, Some(found)));
    }
    if ranks {
        return Err(TrainError::InvalidPlan {
            key: keys::train::lr,
            value: "\"auto\"".to_owned(),
            expected: "a number for a data-parallel run (its range test runs on one process: \
                       run `kiln lr-find` or a one-process run first and set the rate it finds)"
                .to_owned(),
        });
    }
    let mut found = crate::lr_find::resolve_auto(
        &plan,
        recipe,
        input,
        Arc::clone(&data.train),
        device,
        cache_dir,
    )?;
    if found.lr < plan.train.min_lr {
        found.note.push_str(&format!(
            "; raised to {} = {}",
            keys::train::min_lr,
            plan.train.min_lr
        ));
        found.lr = plan.train.min_lr;
    }
    tracing::info!("train.lr {}", found.note);
    let mut chosen = plan;
    chosen.train.lr = found.lr;
    Ok((chosen, Some(found)))
}

/// One run to train: the model `recipe` builds on `data` with the settings of `plan`, on
/// `device`, continuing `resume` where given.
#[derive(Debug)]
pub struct RunJob<'a> {
    pub plan: &'a RunPlan,
    pub device: kiln_device::Device,
    pub recipe: &'a ModelRecipe<'a>,
    pub data: RunData,
    pub resume: Option<checkpoint::Checkpoint>,
    pub control: RunControl,
}

/// Trains `job`, as [`train`] does: the automatic batch size, the trainer with every setting
/// of the plan, checkpoints and resume, the profiler, and a run directory (new, or the resumed
/// run's); `observer` hears of it from `on_ready` on.
pub fn drive(job: RunJob<'_>, observer: &mut dyn Observer) -> Result<RunOutcome, TrainError> {
    crate::fault::from_env()?;
    let RunJob {
        plan,
        device,
        recipe,
        data,
        resume,
        control,
    } = job;
    let seed = plan.performance.backend.seed;
    let input = input_of(&data);
    let tch_device = tch_device(device);
    let (plan, batch_note) = auto_batch_size(
        plan,
        recipe,
        &input,
        &data,
        tch_device,
        resume.as_ref(),
        control.cache_dir.as_deref(),
    )?;
    let (plan, batch_note) = agree_on_batch_size(plan, batch_note, control.group.as_ref())?;
    let ranks = control
        .group
        .as_ref()
        .is_some_and(|g| crate::distributed::lock(g).world_size() > 1);
    let (plan, lr_found) = auto_lr(
        plan,
        (recipe, &input, &data),
        tch_device,
        (ranks, resume.as_ref()),
        control.cache_dir.as_deref(),
    )?;
    let generator = kiln_torch_ext::rng::cpu_generator_lock();
    tch::manual_seed(i64::from_ne_bytes(seed.to_ne_bytes()));
    let mut vs = nn::VarStore::new(if recipe.init_on_cpu {
        tch::Device::Cpu
    } else {
        tch_device
    });
    let model = (recipe.build)(&vs, &input)?;
    // Before the run directory exists: the dataset's arrays are what the model takes.
    model.check_inputs(&data.train.inputs())?;
    if vs.device() != tch_device {
        vs.set_device(tch_device);
    }
    drop(generator);
    let settings = TrainSettings::from_plan(&plan.train, plan.performance.empty_cache_interval);
    let mut trainer = Trainer::new(model.as_ref(), &recipe.name, &vs, settings, tch_device)?;
    for metric in &control.metrics {
        trainer.add_metric(metric.clone())?;
    }
    if let Some(forecast) = &data.forecast {
        trainer.set_forecast(Arc::new(forecast.clone()))?;
    }
    let (rank, world_size) = match &control.group {
        Some(group) => {
            crate::distributed::check_same_setup(group, &setup_of(&plan, &vs, data.train.len()))?;
            trainer.set_group(group.clone(), buckets_of(&plan.distributed))?;
            let g = crate::distributed::lock(group);
            (g.rank(), g.world_size())
        }
        None => (0, 1),
    };
    // Refused here, before the run directory exists, where it cannot apply.
    trainer.plan_cuda_graph()?;
    let sampler = SamplerConfig {
        shuffle: true,
        seed,
        rank,
        world_size,
    };
    let loader = loader_config(&plan, sampler, true)?;
    let fit_data = FitData {
        train: data.train,
        val: data.val,
        loader,
        workers_auto: plan.data.num_workers_auto,
    };
    let mut options = FitOptions {
        checkpoints: None,
        rank0_checkpoints: (rank > 0).then_some(plan.checkpoint),
        resume,
        stop: control.stop,
        batch_size_search: batch_note,
        lr_search: lr_found.as_ref().map(|f| f.note.clone()),
        profiling: None,
        clock: control.clock,
    };
    if rank > 0 {
        // Only rank 0 writes: the run directory, metrics, checkpoints and traces.
        observer.on_ready(&RunReady {
            run_dir: PathBuf::new(),
            data: data.description.clone(),
        })?;
        let summary = trainer.fit(fit_data, observer, options)?;
        return Ok(RunOutcome {
            summary,
            run_dir: PathBuf::new(),
            data: data.description,
        });
    }
    let mut run_dir = open_run_dir(&plan, options.resume.as_ref())?;
    let run_path = run_dir.path().to_owned();
    let summary = crate::model_summary::ModelSummary::of(&recipe.name, &vs);
    tracing::info!("{}", summary.table());
    summary.write(&run_path)?;
    if let Some(curve) = lr_found.and_then(|f| f.curve) {
        crate::lr_find::write_curve(&run_path, &curve)?;
    }
    observer.on_ready(&RunReady {
        run_dir: run_path.clone(),
        data: data.description.clone(),
    })?;
    options.checkpoints = Some(CheckpointOptions {
        dir: run_path.join("checkpoints"),
        plan: plan.checkpoint,
        config: RunDir::config_json(&plan),
        input: Some(input.clone()),
    });
    options.profiling = Some(ProfilingOptions {
        plan: plan.profiling,
        dir: run_path.join("profiler_traces"),
    });
    let summary = trainer.fit(
        fit_data,
        &mut Observers(vec![observer, &mut run_dir]),
        options,
    )?;
    Ok(RunOutcome {
        summary,
        run_dir: run_path,
        data: data.description,
    })
}

/// What every rank of a data-parallel run must agree on, as numbers.
fn setup_of(plan: &RunPlan, vs: &nn::VarStore, train_samples: usize) -> Vec<(&'static str, f64)> {
    let shapes: f64 = vs
        .variables()
        .values()
        .map(|t| t.size().iter().product::<i64>() as f64)
        .sum();
    vec![
        ("the model's parameter count", shapes),
        (
            "the number of parameter tensors",
            vs.variables().len() as f64,
        ),
        ("train.batch_size", plan.train.batch_size as f64),
        ("train.grad_accum_steps", plan.train.grad_accum_steps as f64),
        ("train.epochs", plan.train.epochs as f64),
        ("performance.seed", plan.performance.backend.seed as f64),
        ("the training set's size", train_samples as f64),
    ]
}

/// The run directory: the resumed run's, or a new one.
fn open_run_dir(
    plan: &RunPlan,
    resume: Option<&checkpoint::Checkpoint>,
) -> Result<RunDir, TrainError> {
    match resume {
        Some(ckpt) => {
            let dir = ckpt
                .dir
                .parent()
                .and_then(Path::parent)
                .ok_or_else(|| TrainError::File {
                    path: ckpt.dir.clone(),
                    message: "a checkpoint must sit in <run>/checkpoints/".to_owned(),
                })?;
            RunDir::reopen(
                dir,
                &plan.run.name,
                (ckpt.meta.step, ckpt.meta.epoch),
                plan.run.tensorboard,
            )
        }
        None => RunDir::create(&plan.run.output_dir, &plan.run.name, plan),
    }
}

/// Applies the plan's backend settings (threads, TF32, matmul precision, determinism, seed)
/// for `device`, logging each: what a run does before it builds its model.
pub fn apply_backend(plan: &RunPlan, device: kiln_device::Device) {
    use kiln_device::settings::Outcome;
    for a in kiln_device::settings::apply(&plan.performance.backend, device) {
        match &a.outcome {
            Outcome::Applied => tracing::debug!("applied {} = {}", a.setting, a.value),
            Outcome::NotApplicable(why) => {
                tracing::debug!("not applied {} = {}: {why}", a.setting, a.value)
            }
            Outcome::Failed(why) => {
                tracing::warn!("could not apply {} = {}: {why}", a.setting, a.value)
            }
        }
    }
}

/// The gradient buckets the `distributed` section asks for.
fn buckets_of(d: &kiln_config::DistributedPlan) -> crate::distributed::Buckets {
    crate::distributed::Buckets {
        cap_mb: d.bucket_cap_mb,
        first_mb: d.first_bucket_mb,
        find_unused_parameters: d.find_unused_parameters,
    }
}

/// With `train.batch_size = "auto"` each rank measured its own device; every rank then trains
/// with the smallest of their answers (the ranks' batches must be alike).
fn agree_on_batch_size(
    mut plan: RunPlan,
    note: Option<String>,
    group: Option<&crate::distributed::SharedGroup>,
) -> Result<(RunPlan, Option<String>), TrainError> {
    let (Some(group), Some(note)) = (group, note.as_ref()) else {
        return Ok((plan, note));
    };
    let mine = plan.train.batch_size;
    let agreed = crate::distributed::min_over_ranks(group, mine)?;
    if agreed == mine {
        return Ok((plan, Some(note.clone())));
    }
    plan.train.batch_size = agreed;
    let note = format!("{note}; {agreed} per rank, the smallest any rank found");
    tracing::info!("train.batch_size {note}");
    Ok((plan, Some(note)))
}
