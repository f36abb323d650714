//! The user's own PyTorch model, saved as TorchScript
//! (`torch.jit.script(model.train()).save("model.pt")`), as a [`Model`] kiln trains: its
//! parameters join the run's `VarStore` (so fused AdamW, clipping, checkpoints and resume see
//! them), train/eval mode follows the step, and its own `loss(output, target)` method can be
//! the loss. Checkpoints also hold the trained module as TorchScript (`model.pt`).
//!
//! A module whose `forward` takes a `Dict[str, Tensor]` gets every array of a dataset of named
//! arrays by name; one whose `forward` takes several tensors gets one array per argument, by
//! the argument's name or in the order `model.inputs` gives.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use kiln_data::ArraySpec;
use kiln_torch_ext::script::ForwardArg;
use tch::{IValue, Tensor, TrainableCModule, nn};

use crate::TrainError;
use crate::error::first_line;
use crate::inputs::Inputs;
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
    takes: Takes,
    /// `model.inputs`: the arrays its positional arguments get, in order.
    explicit: Option<Vec<String>>,
    /// The arrays a `forward` of tensors gets, in order, as [`Model::check_inputs`] decided for
    /// the dataset; `None`: one tensor, a dataset's one array whatever its name.
    order: Mutex<Option<Vec<String>>>,
}

/// How the module's `forward` takes a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Takes {
    /// A `Dict[str, Tensor]` of every array, by name.
    Dict,
    /// One tensor per argument: its leading `Tensor` arguments (and `Optional[Tensor]` ones
    /// with a default); any arguments after them keep their defaults.
    Tensors(Vec<ForwardArg>),
}

impl Takes {
    /// What `args` (a forward's arguments after `self`) take, or why kiln cannot feed them.
    fn of(args: &[ForwardArg]) -> Result<Self, String> {
        let tensor = |a: &ForwardArg| {
            a.type_name == "Tensor" || (a.has_default && a.type_name == "Optional[Tensor]")
        };
        let leading = args.iter().take_while(|a| tensor(a)).count();
        let rest_defaults = args[leading..].iter().all(|a| a.has_default);
        match args {
            [one, rest @ ..]
                if one.type_name == "Dict[str, Tensor]" && rest.iter().all(|a| a.has_default) =>
            {
                Ok(Takes::Dict)
            }
            _ if leading > 0 && rest_defaults && !args[0].has_default => {
                Ok(Takes::Tensors(args[..leading].to_vec()))
            }
            _ => Err(format!(
                "its forward takes ({}); kiln passes one Tensor, a Dict[str, Tensor] of the \
                 dataset's arrays, or one Tensor per argument",
                args.iter()
                    .map(|a| format!("{}: {}", a.name, a.type_name))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
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
        crate::program::archive::vet_file(path)?;
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
        let takes = Takes::of(&facts.forward_args).map_err(not_script)?;
        let mut module =
            TrainableCModule::load(path, vs.root()).map_err(|e| not_script(reason(&e)))?;
        module.f_set_train()?;
        Ok(Self {
            module: Mutex::new((module, true)),
            path: path.to_owned(),
            has_loss: facts.has_method,
            takes,
            explicit: None,
            order: Mutex::new(None),
        })
    }

    /// The dataset arrays a positional `forward` gets, in order (`model.inputs`), instead of
    /// the arrays named as its arguments.
    pub fn with_inputs(mut self, names: Option<Vec<String>>) -> Self {
        self.explicit = names;
        self
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

impl ScriptModel {
    /// The module, in training mode when `train`.
    fn in_mode(
        &self,
        train: bool,
    ) -> Result<std::sync::MutexGuard<'_, (TrainableCModule, bool)>, TrainError> {
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
        Ok(guard)
    }

    /// The arrays a positional `forward` gets for a dataset of `arrays`: `model.inputs`, or
    /// each argument's namesake (optional arguments while the dataset has them); an error
    /// naming every argument or name without an array.
    fn positional_order(
        &self,
        args: &[ForwardArg],
        arrays: &[&str],
    ) -> Result<Vec<String>, TrainError> {
        let has = |n: &str| arrays.contains(&n);
        let required = args.iter().filter(|a| !a.has_default).count();
        let order: Vec<String> = match &self.explicit {
            Some(names) => names.clone(),
            None => args
                .iter()
                .take_while(|a| !a.has_default || has(&a.name))
                .map(|a| a.name.clone())
                .collect(),
        };
        let missing: Vec<&str> = order
            .iter()
            .map(String::as_str)
            .filter(|n| !has(n))
            .collect();
        let count_ok = (required..=args.len()).contains(&order.len());
        if missing.is_empty() && count_ok {
            return Ok(order);
        }
        let names = |v: &[&str]| v.join(", ");
        let what = match (&self.explicit, missing.is_empty()) {
            (_, false) => format!("no dataset array is named {}", names(&missing)),
            (Some(_), true) => format!(
                "model.inputs gives {} arrays for {} to {} arguments",
                order.len(),
                required,
                args.len()
            ),
            (None, true) => "the arguments and the arrays differ".to_owned(),
        };
        Err(TrainError::ShapeMismatch {
            what: format!("{}: forward's inputs", self.path.display()),
            expected: format!(
                "an array per argument ({}) among the dataset's ({}); set model.inputs = \
                 a,b,… to give the arrays in the arguments' order",
                args.iter()
                    .map(|a| a.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                names(arrays)
            ),
            got: what,
        })
    }

    fn forward_error(&self, e: tch::TchError, inputs: &Inputs) -> TrainError {
        model_error(e, || {
            let shapes: Vec<String> = inputs
                .iter()
                .map(|(n, t)| format!("{n} {:?} ({:?})", t.size(), t.kind()))
                .collect();
            format!("{}: forward on {}", self.path.display(), shapes.join(", "))
        })
    }
}

impl ScriptModel {
    fn lock_order(&self) -> std::sync::MutexGuard<'_, Option<Vec<String>>> {
        self.order
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The error for `model.inputs` given to a module whose forward takes a dict.
    fn explicit_for_dict(&self) -> TrainError {
        TrainError::InvalidPlan {
            key: keys::model::inputs,
            value: self.explicit.clone().unwrap_or_default().join(","),
            expected: format!(
                "unset: {} takes a Dict[str, Tensor] of every array by name (model.inputs \
                 orders the arguments of a forward of several tensors)",
                self.path.display()
            ),
        }
    }
}

impl Model for ScriptModel {
    fn reads_by_name(&self) -> bool {
        self.takes == Takes::Dict || self.lock_order().is_some()
    }

    fn check_inputs(&self, arrays: &[ArraySpec]) -> Result<(), TrainError> {
        let names: Vec<&str> = arrays.iter().map(|a| a.name.as_str()).collect();
        let order = match &self.takes {
            Takes::Dict if self.explicit.is_some() => return Err(self.explicit_for_dict()),
            Takes::Dict => return Ok(()),
            // One array for one required argument: it goes there, whatever its name.
            Takes::Tensors(args)
                if self.explicit.is_none()
                    && names.len() == 1
                    && args.iter().filter(|a| !a.has_default).count() == 1 =>
            {
                None
            }
            Takes::Tensors(args) => {
                let order = self.positional_order(args, &names)?;
                let unused: Vec<&str> = names
                    .iter()
                    .copied()
                    .filter(|n| !order.iter().any(|o| o == n))
                    .collect();
                if !unused.is_empty() {
                    tracing::warn!(
                        "{}'s forward takes {}; the dataset's {} go unused",
                        self.path.display(),
                        order.join(", "),
                        unused.join(", ")
                    );
                }
                Some(order)
            }
        };
        *self.lock_order() = order;
        Ok(())
    }

    fn forward_inputs(&self, inputs: &Inputs, train: bool) -> Result<Tensor, TrainError> {
        let out = match &self.takes {
            Takes::Dict => {
                let dict: Vec<(IValue, IValue)> = inputs
                    .iter()
                    .map(|(n, t)| {
                        (
                            IValue::String(n.to_owned()),
                            IValue::Tensor(t.shallow_clone()),
                        )
                    })
                    .collect();
                let guard = self.in_mode(train)?;
                guard.0.forward_is(&[IValue::GenericDict(dict)])
            }
            Takes::Tensors(args) => {
                let order = match self.lock_order().clone() {
                    Some(order) => order,
                    // Never checked against a dataset (a library caller): by the inputs' names.
                    None if inputs.names().len() > 1 => {
                        self.positional_order(args, &inputs.names())?
                    }
                    None => return self.forward(inputs.single()?, train),
                };
                let tensors = order
                    .iter()
                    .map(|n| {
                        inputs.get(n).ok_or_else(|| TrainError::ShapeMismatch {
                            what: format!("{}: forward's inputs", self.path.display()),
                            expected: format!("an input named {n}"),
                            got: format!("inputs {}", inputs.names().join(", ")),
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let guard = self.in_mode(train)?;
                guard.0.forward_ts(&tensors).map(IValue::Tensor)
            }
        };
        match out.map_err(|e| self.forward_error(e, inputs))? {
            IValue::Tensor(t) => Ok(t),
            other => Err(TrainError::Model {
                what: format!("{}: forward", self.path.display()),
                message: format!(
                    "returned a {}, where kiln needs one Tensor (the output the loss takes)",
                    match other {
                        IValue::Tuple(_) => "tuple",
                        IValue::GenericDict(_) => "dict",
                        IValue::GenericList(_) | IValue::TensorList(_) => "list",
                        _ => "value that is not a Tensor",
                    }
                ),
            }),
        }
    }

    fn forward(&self, features: &Tensor, train: bool) -> Result<Tensor, TrainError> {
        let mut guard = self.in_mode(train)?;
        let (module, _) = &mut *guard;
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
