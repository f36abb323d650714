//! The front door, like Lightning's `Trainer.fit`, and the one `kiln train` itself goes
//! through: train a built-in model, your own model file (a `torch.export` program, or a
//! TorchScript module) or your own tch module on your own [`Dataset`] or a prepared dataset,
//! with everything `kiln train` does — hardware detection and the tuned profile, layered
//! settings with provenance, backend flags, joining launched ranks, the automatic batch size,
//! AMP, fused AdamW, checkpoints and resume, the profiler, the monitor and a run directory.
//! [`Learner::fit_plan`] trains what the settings name (the CLI's path), [`Learner::fit_file`]
//! a model file, [`Learner::fit`]/[`Learner::fit_with`] a Rust factory; all of them end in
//! `run::drive`.
//!
//! ```no_run
//! use kiln_train::prelude::*;
//!
//! # fn main() -> Result<(), TrainError> {
//! // y = 2·x₀ − x₁ for 256 samples of 2 features.
//! let xs: Vec<f32> = (0..512).map(|i| (i % 17) as f32 / 17.0).collect();
//! let ys: Vec<f32> = xs.chunks(2).map(|x| 2.0 * x[0] - x[1]).collect();
//! let data = InMemory::with_targets(
//!     xs,
//!     vec![2],
//!     TargetSpec::Values { shape: vec![] },
//!     Targets::Values(ys),
//! )?;
//! let learner = Learner::builder()
//!     .set("train.epochs", 3)
//!     .set("train.lr", 0.01)
//!     .output_dir("runs")
//!     .build()?;
//! let outcome = learner.fit(
//!     "linear",
//!     |vs: &nn::VarStore, input: &InputSpec| {
//!         let layer = nn::linear(vs.root() / "fc", 2, 1, Default::default());
//!         Ok(Box::new(TchModule(layer)) as Box<dyn Model>)
//!     },
//!     data,
//! )?;
//! println!("val MAE {:?} in {}", outcome.summary.final_val.get("mae"), outcome.run_dir.display());
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use kiln_config::keys;
use kiln_config::{ConfigRequest, Machine, Resolution, RunPlan};
use kiln_data::Dataset;
use tch::nn;

use crate::TrainError;
use crate::model::Model;
use crate::model::{InputSpec, ModelFactory, ModelRecipe};
use crate::record::{Observer, Silent};
use crate::run::{self, Resume, RunControl, RunData, RunOutcome};

/// Settings for a [`Learner`]: kiln's defaults and the machine's profile, under what the
/// caller sets (a configuration file, then `key = value` settings, later ones winning), each
/// value keeping where it came from.
#[derive(Debug, Default)]
pub struct LearnerBuilder {
    file: Option<PathBuf>,
    sets: Vec<String>,
    resolution: Option<Resolution>,
    resume: Option<Resume>,
    stop: Option<Arc<AtomicBool>>,
    cache_batch_sizes: bool,
    join_ranks: bool,
    metrics: Vec<Arc<dyn crate::metrics::Metric>>,
}

impl LearnerBuilder {
    /// Sets any configuration key, as `kiln train --set key=value` does: `train.epochs`,
    /// `train.lr`, `train.amp`, `train.batch_size` (a number or `auto`), `train.loss`, …
    /// (`kiln config --explain` lists them). Bad keys and values are errors at [`Self::build`].
    pub fn set(mut self, key: &str, value: impl std::fmt::Display) -> Self {
        self.sets.push(format!("{key}={value}"));
        self
    }

    /// A configuration file (TOML, YAML or JSON) under the [`Self::set`] values.
    pub fn config_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.file = Some(path.into());
        self
    }

    /// Where run directories go (`run.output_dir`).
    pub fn output_dir(self, dir: impl AsRef<Path>) -> Self {
        let dir = dir.as_ref().display().to_string();
        self.set(keys::run::output_dir, dir)
    }

    /// Settings already resolved (with layers of the caller's own, as `kiln train`'s flags
    /// are): used as they are, in place of [`Self::set`] and [`Self::config_file`].
    pub fn resolution(mut self, resolution: Resolution) -> Self {
        self.resolution = Some(resolution);
        self
    }

    /// Continues a run: its newest good checkpoint, or one named.
    pub fn resume(mut self, resume: Resume) -> Self {
        self.resume = Some(resume);
        self
    }

    /// A flag that, once set (from a signal handler, say), ends the run after the current
    /// step with a checkpoint.
    pub fn stop_flag(mut self, stop: Arc<AtomicBool>) -> Self {
        self.stop = Some(stop);
        self
    }

    /// Caches `train.batch_size = "auto"` answers in kiln's cache directory.
    pub fn cache_batch_sizes(mut self, on: bool) -> Self {
        self.cache_batch_sizes = on;
        self
    }

    /// Trains data-parallel with the ranks a launcher started (torchrun, SLURM, Kubernetes,
    /// `kiln train --nproc-per-node`), as `kiln train` does: when `RANK` and `WORLD_SIZE` are
    /// set, [`Self::build`] joins them over c10d (Gloo; NCCL on GPU `LOCAL_RANK` when the
    /// device is CUDA). Without those variables the learner trains alone. Rank 0 alone writes
    /// the run.
    pub fn join_launched_ranks(mut self, on: bool) -> Self {
        self.join_ranks = on;
        self
    }

    /// Reports `metric` besides the task's (the loss, and accuracy or MAE and RMSE): in the
    /// records, the summary, `metrics.jsonl` and checkpoints, by its name. A metric is a type
    /// implementing [`crate::metrics::Metric`]: sums per batch on the device, a value from them.
    pub fn metric(mut self, metric: Arc<dyn crate::metrics::Metric>) -> Self {
        self.metrics.push(metric);
        self
    }

    /// Detects the machine, picks the device and profile, and resolves the settings (and
    /// joins the launched ranks, see [`Self::join_launched_ranks`]).
    pub fn build(self) -> Result<Learner, TrainError> {
        let mut resolution = match self.resolution {
            Some(r) => r,
            None => {
                let mut req = ConfigRequest::new(Machine::Probed(kiln_device::probe::probe()?));
                req.file = self.file;
                req.sets = self.sets;
                kiln_config::load(&req)?
            }
        };
        let group = if self.join_ranks {
            join(&mut resolution)?
        } else {
            None
        };
        Ok(Learner {
            resolution,
            control: RunControl {
                resume: self.resume,
                stop: self.stop,
                cache_dir: if self.cache_batch_sizes {
                    kiln_device::measured::cache_dir()
                } else {
                    None
                },
                group,
                metrics: self.metrics,
                clock: None,
            },
        })
    }
}

/// The launched ranks joined, the device made this rank's GPU on CUDA; `None` without a
/// launcher.
fn join(
    resolution: &mut Resolution,
) -> Result<Option<crate::distributed::SharedGroup>, TrainError> {
    let cuda = matches!(resolution.selection.device, kiln_device::Device::Cuda(_));
    let timeout = resolution.plan.distributed.timeout;
    let Some((group, rdv)) = crate::distributed::connect_from_env(timeout, cuda)? else {
        return Ok(None);
    };
    if cuda {
        resolution.selection.device = kiln_device::Device::Cuda(rdv.local_rank);
    }
    if rdv.rank == 0 {
        let plan = &resolution.plan;
        let (backend, each) = if cuda {
            ("NCCL", "its own GPU (cuda:LOCAL_RANK)".to_owned())
        } else {
            ("Gloo", resolution.selection.device.to_string())
        };
        tracing::info!(
            "data-parallel: {} ranks on c10d/{backend} (rendezvous {}:{}), each on {each}; \
             global batch {}",
            rdv.world_size,
            rdv.master_addr,
            rdv.master_port,
            plan.train.batch_size * plan.train.grad_accum_steps * rdv.world_size as u64
        );
    }
    Ok(Some(group))
}

/// Trains models on this machine with a resolved configuration (see [`LearnerBuilder`]).
#[derive(Debug)]
pub struct Learner {
    resolution: Resolution,
    control: RunControl,
}

impl Learner {
    /// Settings to build a learner from.
    pub fn builder() -> LearnerBuilder {
        LearnerBuilder::default()
    }

    /// This process's rank and the world size (0 and 1 when it trains alone).
    pub fn rank(&self) -> (usize, usize) {
        self.control.group.as_ref().map_or((0, 1), |g| {
            let g = crate::distributed::lock(g);
            (g.rank(), g.world_size())
        })
    }

    /// A learner with kiln's defaults and this machine's profile.
    pub fn new() -> Result<Self, TrainError> {
        Self::builder().build()
    }

    /// The whole resolution: the settings, the device chosen and why, the profile and its
    /// adjustments.
    pub fn resolution(&self) -> &Resolution {
        &self.resolution
    }

    /// The resolved settings, each with its provenance in `plan().provenance`.
    pub fn plan(&self) -> &RunPlan {
        &self.resolution.plan
    }

    /// The device the run trains on, and why it was chosen.
    pub fn device(&self) -> (kiln_device::Device, &str) {
        (
            self.resolution.selection.device,
            &self.resolution.selection.reason,
        )
    }

    /// Trains the model `build` makes on `data` (split into training and validation by
    /// `data.val_fraction`), reporting nothing as it goes; see [`Self::fit_with`].
    pub fn fit<F, D>(&self, name: &str, build: F, data: D) -> Result<RunOutcome, TrainError>
    where
        F: Fn(&nn::VarStore, &InputSpec) -> Result<Box<dyn Model>, TrainError>,
        D: Dataset,
    {
        let plan = self.plan();
        let seed = plan.performance.backend.seed;
        let description = format!("{name}'s data ({} samples)", data.len());
        let data = RunData::split(Box::new(data), plan.data.val_fraction, seed, description)?;
        self.fit_with(name, &build, data, &mut Silent)
    }

    /// Trains the model `build` makes (its layers under the `VarStore` given, for data of the
    /// [`InputSpec`] given) on `data`, reporting to `observer`. The backend settings are
    /// applied first; the run directory is `run.output_dir/<run.name>-<time>`. `name` also
    /// keys cached automatic batch sizes: give a changed model a new name.
    pub fn fit_with(
        &self,
        name: &str,
        build: ModelFactory<'_>,
        data: RunData,
        observer: &mut dyn Observer,
    ) -> Result<RunOutcome, TrainError> {
        let resume = run::find_resume(self.plan(), &self.control)?;
        let recipe = ModelRecipe {
            name: name.to_owned(),
            identity: format!("{name} (library model)"),
            build,
            warmup_steps: 1,
            init_on_cpu: false,
        };
        self.drive(&recipe, data, resume, observer)
    }

    fn drive(
        &self,
        recipe: &ModelRecipe<'_>,
        data: RunData,
        resume: Option<crate::checkpoint::Checkpoint>,
        observer: &mut dyn Observer,
    ) -> Result<RunOutcome, TrainError> {
        self.drive_plan(self.plan(), recipe, data, resume, observer)
    }

    fn drive_plan(
        &self,
        plan: &RunPlan,
        recipe: &ModelRecipe<'_>,
        data: RunData,
        resume: Option<crate::checkpoint::Checkpoint>,
        observer: &mut dyn Observer,
    ) -> Result<RunOutcome, TrainError> {
        let device = self.resolution.selection.device;
        run::apply_backend(plan, device);
        let job = run::RunJob {
            plan,
            device,
            recipe,
            data,
            resume,
            control: self.control.clone(),
        };
        run::drive(job, observer)
    }

    /// Trains the model the settings name (`model.name`: a built-in model, or your own model
    /// file, told apart by content) on the prepared dataset in `data_dir`, or on the built-in
    /// model's synthetic data without one, as `kiln train` does (which is this).
    pub fn fit_plan(
        &self,
        data_dir: Option<&Path>,
        observer: &mut dyn Observer,
    ) -> Result<RunOutcome, TrainError> {
        let device = self.resolution.selection.device;
        run::apply_backend(self.plan(), device);
        run::train(
            self.plan(),
            device,
            data_dir,
            self.control.clone(),
            observer,
        )
    }

    /// Trains your own model file on `data`, as `kiln train --model path` does: a program
    /// saved with `torch.export.save(torch.export.export(model.train(), (batch,),
    /// dynamic_shapes=…), path)`, trained through a step compiled for this machine, or a
    /// TorchScript module (`torch.jit.script(model.train()).save(path)`, the older format);
    /// which one is told by the file's content. A resumed run continues from the file its
    /// checkpoint saved.
    pub fn fit_file<D: Dataset>(
        &self,
        path: &Path,
        data: D,
        observer: &mut dyn Observer,
    ) -> Result<RunOutcome, TrainError> {
        let resume = run::find_resume(self.plan(), &self.control)?;
        let mut plan = self.plan().clone();
        plan.model.script = Some(path.to_owned());
        let file = run::FileModel::new(&plan, resume.as_ref())?;
        let plan = file.plan();
        let description = format!("{} samples", data.len());
        let seed = plan.performance.backend.seed;
        let data = RunData::split(Box::new(data), plan.data.val_fraction, seed, description)?;
        let build = |vs: &nn::VarStore, input: &InputSpec| file.build(vs, input);
        let recipe = file.recipe(&build);
        self.drive_plan(plan, &recipe, data, resume, observer)
    }

    /// [`Self::fit_file`] under its older name.
    pub fn fit_torchscript<D: Dataset>(
        &self,
        path: &Path,
        data: D,
        observer: &mut dyn Observer,
    ) -> Result<RunOutcome, TrainError> {
        self.fit_file(path, data, observer)
    }
}
