//! A compiled model's whole train step — its compiled forward and backward, the metric sums,
//! the gradient check, clipping and fused AdamW — captured once as a CUDA graph and replayed
//! every step after: one launch instead of hundreds, which is what a small model on a fast GPU
//! waits on (`train.cuda_graphs`). It applies to a model with a compiled step (an exported
//! program) on CUDA, with AdamW reading its learning rate from the device, without the fp16 loss
//! scaler, at one micro-batch a step and one rank. The first steps run eagerly (libtorch's and
//! the package's lazy initialisation, the allocator's caches); the next is captured and then
//! replayed; every later step copies its batch into the graph's input and replays (phase
//! timing sees such a step as a whole). A step whose batch has another shape runs eagerly:
//! both paths update the same tensors in place.

use std::cell::{Cell, RefCell};

use kiln_config::{CudaGraphs, OptimizerKind, keys};
use kiln_torch_ext::CallbackError;
use kiln_torch_ext::graphs::CudaGraph;
use tch::{Kind, Tensor};

use super::{StepOutcome, Trainer};
use crate::TrainError;
use crate::feed::DeviceBatch;
use crate::inputs::Inputs;
use crate::metrics::BatchSums;
use crate::model::CompiledStep;

/// Eager steps before the capture.
const WARMUP_STEPS: u64 = 3;

/// Where a run's step graph stands.
#[derive(Debug, Default)]
pub(super) enum GraphState {
    /// Not decided yet ([`Trainer::plan_cuda_graph`]): steps run eagerly.
    #[default]
    Unplanned,
    /// Not used: off, or it does not apply (said once).
    Off,
    /// Applies; this many eager steps are left before the capture.
    WarmingUp(u64),
    Captured(Captured),
}

/// A captured step: its graph (whose input is the features), the static targets, and how to
/// read its output (the metric sums, then the gradient norm where clipping is on).
#[derive(Debug)]
pub(super) struct Captured {
    graph: CudaGraph,
    targets: Tensor,
    norm: bool,
}

impl Trainer<'_> {
    /// Decides, before the first step, whether the run's steps go through a graph: `on`
    /// refuses a run where it cannot (saying why), `auto` says so once and runs eagerly.
    /// `fit` calls it (once decided, later calls change nothing); a program that drives
    /// [`Trainer::train_step`] itself calls it after joining its ranks.
    pub fn plan_cuda_graph(&mut self) -> Result<(), TrainError> {
        if !matches!(self.graph, GraphState::Unplanned) {
            return Ok(());
        }
        let mode = self.settings.cuda_graphs;
        if mode == CudaGraphs::Off {
            self.graph = GraphState::Off;
            return Ok(());
        }
        match self.graph_obstacle() {
            None => {
                self.optimizer.read_lr_from_device(self.device)?;
                self.graph = GraphState::WarmingUp(WARMUP_STEPS);
                Ok(())
            }
            Some(why) if mode == CudaGraphs::On => Err(TrainError::InvalidPlan {
                key: keys::train::cuda_graphs,
                value: "on".to_owned(),
                expected: format!("off or auto: {why}"),
            }),
            Some(why) => {
                tracing::info!("train.cuda_graphs = auto: the step runs eagerly ({why})");
                self.graph = GraphState::Off;
                Ok(())
            }
        }
    }

    /// Why this run's step cannot be one graph, if it cannot.
    fn graph_obstacle(&self) -> Option<String> {
        let why = if !self.device.is_cuda() {
            "this run is not on a CUDA device"
        } else if self.model.compiled_step().is_none() {
            "this model's step goes through autograd (only an exported program's compiled \
             step is captured whole)"
        } else if self.scaler.is_some() {
            "fp16's loss scaler decides on the host (use bf16)"
        } else if self.settings.optimizer != OptimizerKind::AdamW {
            "only AdamW reads its learning rate from the device"
        } else if self.settings.grad_accum_steps > 1 {
            "a step of several micro-batches (train.grad_accum_steps > 1) is not one graph"
        } else if self.ranks.group.is_some() {
            "data-parallel ranks all-reduce between the step's parts"
        } else {
            return None;
        };
        Some(why.to_owned())
    }

    /// The step through the graph, or `None` where this step runs eagerly (warming up, a
    /// batch of another shape, micro-batches after an out-of-memory retry).
    pub(super) fn graphed_step(
        &mut self,
        batches: &[DeviceBatch],
        lr: f64,
    ) -> Result<Option<StepOutcome>, TrainError> {
        let [batch] = batches else {
            return Ok(None);
        };
        // One features tensor is what the graph's static input holds.
        let Ok(features) = batch.inputs.single() else {
            return Ok(None);
        };
        if self.oom.split > 1 {
            return Ok(None);
        }
        match &mut self.graph {
            GraphState::Unplanned | GraphState::Off => return Ok(None),
            GraphState::WarmingUp(left) if *left > 0 => {
                *left -= 1;
                return Ok(None);
            }
            GraphState::WarmingUp(_) => {
                self.graph = GraphState::Captured(self.capture(features, &batch.targets)?);
                tracing::info!("the train step is captured in one CUDA graph and replayed");
            }
            GraphState::Captured(c) if c.graph.shape() != features.size() => {
                return Ok(None);
            }
            GraphState::Captured(_) => {}
        }
        self.optimizer.set_lr(lr)?;
        let GraphState::Captured(c) = &self.graph else {
            return Ok(None);
        };
        c.targets.shallow_clone().f_copy_(&batch.targets)?;
        let out = c.graph.replay(features)?;
        let sums_len = self.metrics.sums_len() as i64;
        let values = out.f_narrow(0, 0, sums_len)?;
        let grad_norm = if c.norm {
            Some(out.f_narrow(0, sums_len, 1)?.f_view([])?)
        } else {
            None
        };
        let sums = BatchSums { values };
        self.count_step()?;
        Ok(Some(StepOutcome {
            sums,
            samples: batch.targets.size()[0] as u64,
            grad_norm,
        }))
    }

    /// Captures the step for `batch`'s shapes. Capturing runs nothing: the caller replays it
    /// for this step.
    fn capture(
        &mut self,
        features: &Tensor,
        batch_targets: &Tensor,
    ) -> Result<Captured, TrainError> {
        let model = self.model;
        let step = model.compiled_step().ok_or_else(|| TrainError::Model {
            what: self.model_name.clone(),
            message: "has no compiled step to capture".to_owned(),
        })?;
        let mut targets = Tensor::f_empty_like(batch_targets)?;
        targets.f_copy_(batch_targets)?;
        let norm = Cell::new(false);
        let this = RefCell::new(&mut *self);
        let graph = CudaGraph::capture_relaxed(features, 0, |x| {
            let mut t = this.borrow_mut();
            let (sums, grad_norm) = t.step_on_device(step, x, &targets)?;
            norm.set(grad_norm.is_some());
            packed(&sums, grad_norm.as_ref()).map_err(CallbackError::from)
        })?;
        Ok(Captured {
            graph,
            targets,
            norm: norm.get(),
        })
    }

    /// What the graph holds: the compiled step on the static batch, its metric sums, and the
    /// optimizer's update at the learning rate on the device.
    fn step_on_device(
        &mut self,
        step: &dyn CompiledStep,
        features: &Tensor,
        targets: &Tensor,
    ) -> Result<(BatchSums, Option<Tensor>), TrainError> {
        let inputs = Inputs::features(features.shallow_clone());
        let (loss, output) = step.step(&inputs, targets, 1.0, None)?;
        let sums = self.metrics.batch_sums(&loss, &output, targets)?;
        let grad_norm = self.update_on_device()?;
        Ok((sums, grad_norm))
    }
}

/// The graph's one output: the metric sums, then the gradient norm where there is one.
fn packed(sums: &BatchSums, grad_norm: Option<&Tensor>) -> Result<Tensor, TrainError> {
    let mut parts = vec![sums.values.f_to_kind(Kind::Float)?];
    if let Some(n) = grad_norm {
        parts.push(n.f_to_kind(Kind::Float)?.f_view([1])?);
    }
    Ok(Tensor::f_cat(&parts, 0)?)
}
