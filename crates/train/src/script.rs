//! The user's own PyTorch model, saved as TorchScript
//! (`torch.jit.script(model.train()).save("model.pt")`), as a [`Model`] kiln trains: its
//! parameters join the run's `VarStore` (so fused AdamW, clipping, checkpoints and resume see
//! them), train/eval mode follows the step, and its own `loss(output, target)` method can be
//! the loss. Checkpoints also hold the trained module as TorchScript (`model.pt`).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tch::{Tensor, TrainableCModule, nn};

use crate::TrainError;
use crate::error::first_line;
use crate::model::Model;
use kiln_config::keys;

/// Untimed steps before a TorchScript module's batch-size trial is timed: its profiling
/// executor runs the first steps 2–3× slower while it settles.
pub const WARMUP_STEPS: usize = 3;

/// The name of the module's optional loss method (`train.loss = "module"`).
pub const LOSS_METHOD: &str = "loss";

/// A TorchScript module being trained.
#[derive(Debug)]
pub struct ScriptModel {
    /// The module and whether it is in training mode now.
    module: Mutex<(TrainableCModule, bool)>,
    path: PathBuf,
    has_loss: bool,
}

/// The line of a TorchScript error that says what went wrong (its last, after the traceback).
fn reason(e: &tch::TchError) -> String {
    let text = e.to_string();
    text.lines()
        .map(str::trim)
        .rev()
        .find(|l| !l.is_empty() && !l.starts_with('~') && !l.starts_with('^'))
        .unwrap_or("unknown error")
        .to_owned()
}

impl ScriptModel {
    /// Loads the TorchScript file `path` onto `vs`'s device, registering its parameters in
    /// `vs`. A module saved in eval mode is switched to train mode for training, with a
    /// warning (validation runs it in eval mode either way).
    pub fn load(path: &Path, vs: &nn::VarStore) -> Result<Self, TrainError> {
        let not_script = |message: String| TrainError::File {
            path: path.to_owned(),
            message: format!(
                "not a TorchScript module kiln can train ({message}); save one with \
                 torch.jit.script(model.train()).save(path)"
            ),
        };
        if !path.is_file() {
            return Err(not_script("no such file".to_owned()));
        }
        let facts = kiln_torch_ext::script::inspect(path, LOSS_METHOD)
            .map_err(|e| not_script(first_line(&e.to_string())))?;
        if facts.parameters == 0 {
            return Err(not_script("it has no parameters to train".to_owned()));
        }
        if !facts.training {
            tracing::warn!(
                "{} was saved in eval mode; kiln trains it in train mode (dropout and batch-norm \
                 statistics on) and validates it in eval mode",
                path.display()
            );
        }
        if vs.device() == tch::Device::Cpu {
            // TorchScript's graph optimizations (autodiff subgraphs, fusion) make a CPU train
            // step ~10 % slower than eager PyTorch on the same module (measured on the
            // reference transformer, in Python as from Rust); without them the interpreter
            // runs the eager kernels and matches eager. The setting is libtorch's, for the
            // whole process; CUDA keeps libtorch's default.
            tch::jit::f_set_graph_executor_optimize(false)?;
        }
        let mut module =
            TrainableCModule::load(path, vs.root()).map_err(|e| not_script(reason(&e)))?;
        module.f_set_train()?;
        Ok(Self {
            module: Mutex::new((module, true)),
            path: path.to_owned(),
            has_loss: facts.has_method,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (TrainableCModule, bool)> {
        self.module
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A libtorch error from inside the module: an allocator running out of memory stays a libtorch
/// error (so the trainer's out-of-memory retry and the batch-size search see it); anything
/// else is named with `what` and its reason.
fn model_error(e: tch::TchError, what: impl FnOnce() -> String) -> TrainError {
    if kiln_torch_ext::tch_out_of_memory(&e) {
        return TrainError::Tch(e);
    }
    TrainError::Model {
        what: what(),
        message: reason(&e),
    }
}

impl Model for ScriptModel {
    fn forward(&self, features: &Tensor, train: bool) -> Result<Tensor, TrainError> {
        let mut guard = self.lock();
        let (module, training) = &mut *guard;
        if *training != train {
            if train {
                module.f_set_train()?;
            } else {
                module.f_set_eval()?;
            }
            *training = train;
        }
        module.forward_ts(&[features]).map_err(|e| {
            model_error(e, || {
                format!(
                    "{}: forward on a batch of shape {:?} ({:?})",
                    self.path.display(),
                    features.size(),
                    features.kind()
                )
            })
        })
    }

    fn loss(&self, output: &Tensor, target: &Tensor) -> Result<Tensor, TrainError> {
        if !self.has_loss {
            return Err(TrainError::InvalidPlan {
                key: keys::train::loss,
                value: "module".to_owned(),
                expected: format!(
                    "a module with a `{LOSS_METHOD}(output, target)` method; {} has none (add \
                     one, or use cross_entropy, mse, l1, huber or bce_with_logits)",
                    self.path.display()
                ),
            });
        }
        self.lock()
            .0
            .method_ts(LOSS_METHOD, &[output, target])
            .map_err(|e| {
                model_error(e, || {
                    format!(
                        "{}: {LOSS_METHOD}(output {:?}, target {:?})",
                        self.path.display(),
                        output.size(),
                        target.size()
                    )
                })
            })
    }

    fn has_own_loss(&self) -> bool {
        self.has_loss
    }

    fn save_torchscript(&self, path: &Path) -> Result<bool, TrainError> {
        let mut guard = self.lock();
        let (module, training) = &mut *guard;
        // Saved in train mode (validation may have left it in eval), as the user saved it and
        // as a resumed run continues it.
        if !*training {
            module.f_set_train()?;
            *training = true;
        }
        module.save(path).map_err(|e| TrainError::File {
            path: path.to_owned(),
            message: format!("cannot save the TorchScript module: {}", reason(&e)),
        })?;
        Ok(true)
    }
}
