//! A whole training run from a resolved plan: the dataset (a prepared one, or the model's
//! built-in synthetic one), the train/validation split, the model, the trainer, and the run
//! directory that records it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use kiln_config::{ModelKind, RunPlan};
use kiln_data::{
    Dataset, SamplerConfig, ShardedDataset, Subset, SyntheticClassification, SyntheticImages,
    SyntheticSequences,
};
use tch::nn;

use crate::TrainError;
use crate::checkpoint;
use crate::feed::{loader_config, tch_device};
use crate::models::{InputSpec, build};
use crate::record::{Observer, Observers, Summary};
use crate::rundir::RunDir;
use crate::trainer::{
    CheckpointOptions, FitData, FitOptions, ProfilingOptions, TrainSettings, Trainer,
};

/// The synthetic dataset each reference model trains on by default: (sample shape, classes).
pub fn synthetic_shape(kind: ModelKind) -> (Vec<usize>, usize) {
    match kind {
        ModelKind::Transformer => (vec![64, 469], 100),
        ModelKind::Mlp => (vec![64], 10),
        ModelKind::ConvNet => (vec![3, 32, 32], 10),
    }
}

/// The built-in synthetic dataset for `kind`, `samples` long.
pub fn synthetic_dataset(
    kind: ModelKind,
    samples: usize,
    seed: u64,
) -> Result<Box<dyn Dataset>, TrainError> {
    let (shape, classes) = synthetic_shape(kind);
    Ok(match kind {
        ModelKind::Transformer => Box::new(SyntheticSequences::new(
            samples, shape[0], shape[1], classes, seed,
        )?),
        ModelKind::Mlp => Box::new(SyntheticClassification::new(
            samples, shape, classes, seed, 3.0,
        )?),
        ModelKind::ConvNet => Box::new(SyntheticImages::new(
            samples, shape[0], shape[1], classes, seed,
        )?),
    })
}

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

/// Trains `plan.model` on `device` over `data_dir` (a prepared dataset) or the model's synthetic
/// dataset, recording into a new run directory under `plan.run.output_dir`, and reporting to
/// `observer` as it goes. `on_ready` is told the run directory and data before training starts.
pub fn train(
    plan: &RunPlan,
    device: kiln_device::Device,
    data_dir: Option<&Path>,
    control: RunControl,
    observer: &mut dyn Observer,
    on_ready: &mut dyn FnMut(&Path, &str),
) -> Result<RunOutcome, TrainError> {
    let seed = plan.performance.backend.seed;
    // Find and verify the checkpoint first: a bad --resume fails before anything else.
    let resume = match &control.resume {
        None => None,
        Some(Resume::Latest) => Some(checkpoint::resolve(&latest_run(
            &plan.run.output_dir,
            &plan.run.name,
        )?)?),
        Some(Resume::From(path)) => Some(checkpoint::resolve(path)?),
    };
    if let Some((ckpt, skipped)) = &resume {
        for (dir, why) in skipped {
            checkpoint::move_aside(dir, "damaged", why)?;
        }
        tracing::info!(
            "resuming from {} (step {}, epoch {}, batch {})",
            ckpt.dir.display(),
            ckpt.meta.step,
            ckpt.meta.epoch + 1,
            ckpt.meta.batch
        );
    }
    let (dataset, data): (Box<dyn Dataset>, String) = match data_dir {
        Some(dir) => {
            let d = ShardedDataset::open(dir)?;
            let text = format!(
                "{} ({} samples of {:?})",
                dir.display(),
                d.len(),
                d.sample_shape()
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
    let classes = dataset.classes().ok_or_else(|| TrainError::InvalidPlan {
        key: "data",
        value: data.clone(),
        expected: "a dataset that knows its number of classes".to_owned(),
    })?;
    let input = InputSpec {
        sample_shape: dataset.sample_shape().to_vec(),
        classes,
    };
    let (train_set, val_set) = Subset::split(Arc::new(dataset), plan.data.val_fraction, seed)?;
    let train_set = Arc::new(train_set);

    let tch_device = tch_device(device);
    // train.batch_size = "auto": a resumed run keeps the size it chose; a new one asks the
    // cache or searches (with the CPU generator put back after, so the model starts the same).
    let mut auto_plan;
    let mut batch_note = None;
    let plan = if plan.train.batch_size_auto {
        let (size, note) = match resume.as_ref().and_then(|(c, _)| c.meta.batch_size) {
            Some(size) => (size, format!("auto: {size}, as the resumed run chose")),
            None => {
                let rng = kiln_torch_ext::rng::cpu_rng_state()?;
                let found = crate::batch_search::resolve_auto(
                    plan,
                    &input,
                    Arc::clone(&train_set),
                    tch_device,
                    control.cache_dir.as_deref(),
                );
                kiln_torch_ext::rng::set_cpu_rng_state(&rng)?;
                found?
            }
        };
        tracing::info!("train.batch_size {note}");
        auto_plan = plan.clone();
        auto_plan.train.batch_size = size;
        batch_note = Some(note);
        &auto_plan
    } else {
        plan
    };
    tch::manual_seed(i64::from_ne_bytes(seed.to_ne_bytes()));
    let vs = nn::VarStore::new(tch_device);
    let model = build(
        &plan.model,
        &input,
        &vs,
        plan.performance.channels_last,
        seed,
    )?;
    let settings = TrainSettings::from_plan(&plan.train, plan.performance.empty_cache_interval);
    let mut trainer = Trainer::new(
        model.as_ref(),
        plan.model.kind.as_str(),
        &vs,
        settings,
        tch_device,
    )?;

    let sampler = SamplerConfig {
        shuffle: true,
        seed,
        ..SamplerConfig::default()
    };
    let loader = loader_config(plan, sampler, true)?;
    let mut run_dir = match &resume {
        Some((ckpt, _)) => {
            let dir = ckpt
                .dir
                .parent()
                .and_then(Path::parent)
                .ok_or_else(|| TrainError::File {
                    path: ckpt.dir.clone(),
                    message: "a checkpoint must sit in <run>/checkpoints/".to_owned(),
                })?;
            RunDir::reopen(dir, &plan.run.name, ckpt.meta.step, ckpt.meta.epoch)?
        }
        None => RunDir::create(&plan.run.output_dir, &plan.run.name, plan)?,
    };
    let run_path = run_dir.path().to_owned();
    on_ready(&run_path, &data);
    let summary = {
        let mut observers = Observers(vec![observer, &mut run_dir]);
        trainer.fit(
            FitData {
                train: train_set,
                val: Some(Arc::new(val_set)),
                loader,
            },
            &mut observers,
            FitOptions {
                checkpoints: Some(CheckpointOptions {
                    dir: run_path.join("checkpoints"),
                    plan: plan.checkpoint,
                    config: RunDir::config_json(plan),
                    input: Some(input.clone()),
                }),
                resume: resume.map(|(c, _)| c),
                stop: control.stop,
                batch_size_search: batch_note,
                profiling: Some(ProfilingOptions {
                    plan: plan.profiling,
                    dir: run_path.join("profiler_traces"),
                }),
            },
        )?
    };
    Ok(RunOutcome {
        summary,
        run_dir: run_path,
        data,
    })
}
