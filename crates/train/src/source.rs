//! Where a run's model comes from: a reference model by name, or the user's TorchScript file
//! (an exported program is compiled for its run's loss and precision, in [`crate::program`]);
//! what identifies it for the batch-size cache, and the name reports give it.

use kiln_config::{ModelKind, ModelPlan, keys};
use tch::nn;

use crate::TrainError;
use crate::model::{InputSpec, Model};

/// Builds the plan's model under `vs`'s root for data of `input`'s shape: its reference model,
/// or its TorchScript file. `seed` seeds dropout.
pub fn build(
    plan: &ModelPlan,
    input: &InputSpec,
    vs: &nn::VarStore,
    channels_last: bool,
    seed: u64,
) -> Result<Box<dyn Model>, TrainError> {
    match plan.kind {
        ModelKind::TorchScript => script(plan, vs),
        ModelKind::Program => Err(TrainError::InvalidPlan {
            key: keys::model::name,
            value: "program".to_owned(),
            expected: "a run's loss and precision to compile it for: train an exported program \
                       through run::train or the Learner"
                .to_owned(),
        }),
        _ => crate::models::build_reference(plan, input, vs, channels_last, seed),
    }
}

/// The user's TorchScript module (`model.name` = its path), its parameters in `vs`.
fn script(plan: &ModelPlan, vs: &nn::VarStore) -> Result<Box<dyn Model>, TrainError> {
    if plan.activation_checkpointing {
        return Err(TrainError::InvalidPlan {
            key: keys::model::activation_checkpointing,
            value: "true".to_owned(),
            expected: "false for a TorchScript model: kiln recomputes activations only inside \
                       its built-in transformer, not inside a foreign module (use \
                       torch.utils.checkpoint in the module)"
                .to_owned(),
        });
    }
    let path = plan
        .script
        .as_ref()
        .ok_or_else(|| TrainError::InvalidPlan {
            key: keys::model::name,
            value: "torchscript".to_owned(),
            expected: "the path of a TorchScript file".to_owned(),
        })?;
    let inputs = plan.inputs.as_ref().map(|names| {
        names
            .split(',')
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .collect()
    });
    Ok(Box::new(
        crate::script::ScriptModel::load(path, vs)?.with_inputs(inputs),
    ))
}

/// What identifies the plan's model for the batch-size cache: its kind and sizes, or for a
/// TorchScript file its path, size and modification time.
pub fn identity(plan: &kiln_config::RunPlan) -> String {
    let m = &plan.model;
    let flag = |on: bool, text: &'static str| if on { text } else { "" };
    let dims = match m.kind {
        ModelKind::Transformer => format!(
            "d{} h{} l{} ff{}{}",
            m.d_model,
            m.heads,
            m.layers,
            m.ff,
            flag(m.activation_checkpointing, " ckpt")
        ),
        ModelKind::Mlp => format!("hidden {:?}", m.hidden),
        ModelKind::ConvNet => format!(
            "channels {:?}{}",
            m.channels,
            flag(plan.performance.channels_last, " nhwc")
        ),
        ModelKind::Unet3d => format!(
            "channels {:?}{}",
            m.channels,
            flag(plan.performance.channels_last, " nhwc")
        ),
        ModelKind::TorchScript | ModelKind::Program => script_identity(m.script.as_deref()),
    };
    format!("{} ({dims})", m.kind)
}

/// A TorchScript file for the batch-size cache: its path, size and modification time.
pub fn script_identity(path: Option<&std::path::Path>) -> String {
    let Some(path) = path else {
        return "no file".to_owned();
    };
    let meta = std::fs::metadata(path).ok();
    let modified = meta
        .as_ref()
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    format!(
        "{} {} bytes mtime {modified}",
        path.display(),
        meta.map_or(0, |m| m.len())
    )
}

/// The name reports give the plan's model: the built-in's, or the TorchScript file's.
pub fn display_name(plan: &ModelPlan) -> String {
    match &plan.script {
        Some(path) => path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        ),
        None => plan.kind.to_string(),
    }
}
