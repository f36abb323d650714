//! The model contract, the bottom of the train crate: the small trait the trainer drives
//! (forward, an optional loss of its own, a compiled step, checkpoint hooks), what the data
//! looks like ([`InputSpec`]), how a run gets its model ([`ModelRecipe`]), an adapter for any
//! tch module, and the dropout the reference models share. It never knows a model source.

use std::sync::atomic::{AtomicU64, Ordering};

use tch::{Device, Tensor, nn};

use crate::TrainError;
use crate::inputs::Inputs;
use kiln_config::keys;

/// What the trainer needs from a model. Parameters live in the `nn::VarStore` the model was
/// built from; the trainer gets that store separately.
pub trait Model {
    /// The model's output for a batch of features (logits `[batch, classes]` for a classifier).
    /// `train` switches dropout and batch-norm statistics on.
    fn forward(&self, features: &Tensor, train: bool) -> Result<Tensor, TrainError>;

    /// The model's output for a batch of inputs. Default: the one input through
    /// [`Model::forward`] (an error naming the inputs where there are several). A model that
    /// takes its inputs by name implements it, with [`Model::reads_by_name`].
    fn forward_inputs(&self, inputs: &Inputs, train: bool) -> Result<Tensor, TrainError> {
        self.forward(inputs.single()?, train)
    }

    /// The model's evaluation output for a batch whose targets are at hand (validation,
    /// forecasts of a known horizon). Default: [`Model::forward_inputs`] out of training mode,
    /// the targets unused; a model whose eval forward takes the targets (an exported program
    /// computing its own loss) gets them.
    fn predict(&self, inputs: &Inputs, _targets: &Tensor) -> Result<Tensor, TrainError> {
        self.forward_inputs(inputs, false)
    }

    /// Whether the model takes a batch's named arrays ([`Model::forward_inputs`] gets the
    /// dataset's arrays by name) rather than one features tensor. Default: no.
    fn reads_by_name(&self) -> bool {
        false
    }

    /// An error unless the model can take samples of the dataset's input `arrays` (names,
    /// stored types, per-sample shapes), naming every mismatch. Default: one array, whatever
    /// its name.
    fn check_inputs(&self, arrays: &[kiln_data::ArraySpec]) -> Result<(), TrainError> {
        one_input(arrays)
    }

    /// The model's own loss, a scalar (`train.loss = "module"`): for losses kiln does not
    /// have (a quantile loss, a Dice loss). Default: the model has none.
    fn loss(&self, _output: &Tensor, _target: &Tensor) -> Result<Tensor, TrainError> {
        Err(TrainError::InvalidPlan {
            key: keys::train::loss,
            value: "module".to_owned(),
            expected: "a model with a loss of its own; this one has none (use cross_entropy, \
                       mse, l1, huber or bce_with_logits)"
                .to_owned(),
        })
    }

    /// Whether [`Model::loss`] is implemented.
    fn has_own_loss(&self) -> bool {
        false
    }

    /// Whether the output that goes with the loss is a prediction the metrics can read (a
    /// program computing its own loss may return the loss alone: then its run reports the
    /// loss only).
    fn predicts(&self) -> bool {
        true
    }

    /// Writes the model as TorchScript to `path`, where it can (a TorchScript model can);
    /// returns whether it did. Checkpoints call it to include `model.pt`.
    fn save_torchscript(&self, _path: &std::path::Path) -> Result<bool, TrainError> {
        Ok(false)
    }

    /// Copies the model's program (a `torch.export` `.pt2`) to `path`, where it has one;
    /// returns whether it did. Checkpoints call it to include `model.pt2`, so that a checkpoint
    /// recompiles on any machine.
    fn save_program(&self, _path: &std::path::Path) -> Result<bool, TrainError> {
        Ok(false)
    }

    /// The model's compiled train step, for a model that trains through one (forward, loss
    /// and backward in one call) instead of `forward` and autograd.
    fn compiled_step(&self) -> Option<&dyn CompiledStep> {
        None
    }

    /// The positions of the model's own random generators (kiln's dropout), for checkpoints.
    fn rng_state(&self) -> Vec<u64> {
        vec![]
    }

    /// Restores positions from [`Model::rng_state`].
    fn set_rng_state(&self, _state: &[u64]) -> Result<(), TrainError> {
        Ok(())
    }
}

/// An error unless `arrays` is one array: what a model of one input tensor can take.
pub fn one_input(arrays: &[kiln_data::ArraySpec]) -> Result<(), TrainError> {
    match arrays {
        [_] => Ok(()),
        _ => Err(TrainError::ShapeMismatch {
            what: "the dataset's inputs".to_owned(),
            expected: "one input array: this model takes one tensor (a TorchScript module \
                       whose forward takes a Dict[str, Tensor] or one argument per array, or a \
                       program exported with a dict or several tensor arguments, takes several)"
                .to_owned(),
            got: format!(
                "{} named arrays ({})",
                arrays.len(),
                arrays
                    .iter()
                    .map(|a| a.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }),
    }
}

/// A train step compiled ahead of time: the loss (with its autocast) and the backward are
/// inside it, so the trainer calls it instead of `forward` and autograd.
pub trait CompiledStep {
    /// Forward, loss and backward on one micro-batch: adds `weight` × the gradient of the
    /// (scaled, where `scale` is given) mean loss to each parameter's gradient, writes the
    /// buffers the step updates (batch-norm statistics), and returns the unscaled mean loss
    /// and the model's output, both detached.
    fn step(
        &self,
        inputs: &Inputs,
        targets: &Tensor,
        weight: f64,
        scale: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor), TrainError>;

    /// The mean loss and the output of one batch in eval mode, for a model whose loss is
    /// inside its compiled code (it takes the targets); `None` where validation goes through
    /// `forward` and kiln's loss.
    fn evaluate(
        &self,
        _inputs: &Inputs,
        _targets: &Tensor,
    ) -> Result<Option<(Tensor, Tensor)>, TrainError> {
        Ok(None)
    }
}

/// The generator positions of a list of dropout layers.
pub fn dropout_state<'a>(layers: impl IntoIterator<Item = &'a Dropout>) -> Vec<u64> {
    layers.into_iter().map(Dropout::offset).collect()
}

/// Restores [`dropout_state`]; the count must match.
pub fn set_dropout_state<'a>(
    layers: impl IntoIterator<Item = &'a Dropout>,
    state: &[u64],
) -> Result<(), TrainError> {
    let layers: Vec<&Dropout> = layers.into_iter().collect();
    if layers.len() != state.len() {
        return Err(TrainError::InvalidPlan {
            key: "checkpoint",
            value: format!("{} dropout positions", state.len()),
            expected: format!("{} for this model", layers.len()),
        });
    }
    for (layer, &offset) in layers.iter().zip(state) {
        layer.set_offset(offset);
    }
    Ok(())
}

/// Any tch module (`nn::Module` or `nn::ModuleT`) as a [`Model`]; the loss comes from
/// `train.loss` (by default from the dataset's target).
#[derive(Debug)]
pub struct TchModule<M>(pub M);

impl<M: nn::ModuleT> Model for TchModule<M> {
    fn forward(&self, features: &Tensor, train: bool) -> Result<Tensor, TrainError> {
        Ok(self.0.forward_t(features, train))
    }
}

/// Dropout with a fast, reproducible mask: on the CPU kiln's native one-pass dropout, whose
/// mask comes from a counter-based generator and is regenerated in backward instead of stored
/// (libtorch's CPU `bernoulli_` is slow); on CUDA libtorch's fused dropout. CPU masks depend on
/// `(seed, call count)` only.
#[derive(Debug)]
pub struct Dropout {
    p: f64,
    seed: u64,
    offset: AtomicU64,
}

/// The seed of dropout stream `stream` (a model's `stream`-th dropout) in a run seeded `seed`:
/// a hash of both, so that no two streams coincide within a run or across runs (with
/// `seed + stream`, run `s + 1`'s first stream was run `s`'s second, and six runs seeded 0…5
/// shared 15 streams among 54 dropouts).
pub fn dropout_seed(seed: u64, stream: u64) -> u64 {
    fn mix(mut z: u64) -> u64 {
        // SplitMix64's finaliser (a bijection on u64).
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    mix(mix(seed).wrapping_add(mix(stream.wrapping_add(0x9E37_79B9_7F4A_7C15))))
}

impl Dropout {
    pub fn new(p: f64, seed: u64) -> Self {
        Self {
            p,
            seed,
            offset: AtomicU64::new(0),
        }
    }

    pub fn p(&self) -> f64 {
        self.p
    }

    /// How far this layer's generator has advanced.
    pub fn offset(&self) -> u64 {
        self.offset.load(Ordering::Relaxed)
    }

    pub fn set_offset(&self, offset: u64) {
        self.offset.store(offset, Ordering::Relaxed);
    }

    /// `xs` with elements zeroed with probability `p` and the rest scaled by `1/(1-p)` when
    /// training; `xs` itself otherwise.
    pub fn apply(&self, xs: &Tensor, train: bool) -> Result<Tensor, TrainError> {
        if !train || self.p == 0.0 {
            return Ok(xs.shallow_clone());
        }
        if xs.device() == Device::Cpu {
            let numel = xs.numel() as u64;
            let offset = self.offset.fetch_add(numel, Ordering::Relaxed);
            Ok(kiln_torch_ext::dropout::dropout(
                xs, self.p, self.seed, offset,
            )?)
        } else {
            Ok(xs.f_native_dropout(self.p, true)?.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::dropout_seed;

    #[test]
    fn dropout_streams_are_distinct_within_and_across_runs() {
        let mut seen = std::collections::HashSet::new();
        for seed in 0..200u64 {
            for stream in 0..64u64 {
                assert!(
                    seen.insert(dropout_seed(seed, stream)),
                    "run {seed} stream {stream} repeats another's"
                );
            }
        }
        // What `seed + stream` gave: run 1's first stream was run 0's second.
        assert_ne!(dropout_seed(1, 0), dropout_seed(0, 1));
    }
}

/// What the data looks like: the shape of one sample, the number of outputs per sample (the
/// classes of a classifier, the values of a regression), and the target. Stored in
/// checkpoints, so that inference can rebuild the model without the training data.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputSpec {
    pub sample_shape: Vec<usize>,
    pub classes: usize,
    /// The dataset's target (absent in checkpoints from before other targets: a class label).
    #[serde(default)]
    pub target: Option<kiln_data::TargetSpec>,
    /// Features are integer token ids (fed as int64), not float32 values.
    #[serde(default)]
    pub integer_features: bool,
    /// The dataset's named arrays, where it has several (a model taking its inputs by name
    /// gets them); empty for a dataset of one features array.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub arrays: Vec<kiln_data::ArraySpec>,
}

impl InputSpec {
    /// The input of a dataset: a built-in model predicts one class label (`classes` outputs)
    /// or a vector of values (one output per value); a class map or a value tensor of more
    /// than one dimension needs a model of the user's own.
    pub fn of(sample_shape: &[usize], target: &kiln_data::TargetSpec) -> Self {
        let classes = match target {
            kiln_data::TargetSpec::Classes { classes, .. } => *classes,
            kiln_data::TargetSpec::Values { shape } => shape.iter().product::<usize>().max(1),
        };
        Self {
            sample_shape: sample_shape.to_vec(),
            classes,
            target: Some(target.clone()),
            integer_features: false,
            arrays: vec![],
        }
    }
}

/// Builds a model's layers under a `VarStore` for data of an [`InputSpec`].
pub type ModelFactory<'a> =
    &'a dyn Fn(&nn::VarStore, &InputSpec) -> Result<Box<dyn Model>, TrainError>;

/// How a run gets its model: a name for reports, what identifies it for the batch-size cache,
/// and the factory (called once for training and once per batch-size trial).
pub struct ModelRecipe<'a> {
    pub name: String,
    /// The model's kind and sizes, or its file: a changed model must not reuse a cached
    /// batch size.
    pub identity: String,
    pub build: ModelFactory<'a>,
    /// Untimed steps before a batch-size trial is timed: 1, or
    /// [`crate::script::WARMUP_STEPS`] for TorchScript.
    pub warmup_steps: usize,
    /// Draw the initial weights on the CPU and then move them to the device, as a PyTorch
    /// module built before `.to(device)` does: one seed gives the same weights on every device
    /// (kiln's own models). Off where the factory may make tensors outside the `VarStore` on
    /// `vs.device()` (a library user's model, a TorchScript module's buffers).
    pub init_on_cpu: bool,
}

impl std::fmt::Debug for ModelRecipe<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelRecipe")
            .field("name", &self.name)
            .field("identity", &self.identity)
            .finish()
    }
}

/// The number of trainable parameters in `vs`.
pub fn parameter_count(vs: &nn::VarStore) -> usize {
    vs.trainable_variables().iter().map(|t| t.numel()).sum()
}
