//! The ONNX engine: an `.onnx` file opened in an ONNX Runtime session (CPU provider, or CUDA's
//! where the library has it), its input and output read from the model's own metadata, and
//! batches of host samples run host to host, as the libtorch engine does.

use std::path::{Path, PathBuf};

use ort::session::{Session, builder::GraphOptimizationLevel};
use ort::value::{TensorElementType, TensorRef, ValueType};
use tch::Device;

use super::runtime::{OnnxRuntime, runtime};
use crate::InferError;

/// How an ONNX engine runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OnnxOptions {
    /// The most samples one batch may hold (a model with a fixed batch takes at most that).
    pub max_batch: usize,
    /// Intra-op threads (the same number libtorch uses, so that the two compare fairly).
    pub threads: usize,
    /// The CPU, or a CUDA device (the CUDA execution provider; never a silent CPU fallback).
    pub device: Device,
    /// The shape of one sample where the model leaves a dimension after the batch open (it
    /// must agree with the model's fixed dimensions).
    pub input_shape: Option<Vec<usize>>,
}

/// What `kiln export` recorded in the model's metadata about where it came from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Provenance {
    /// The checkpoint directory it was exported from.
    pub source: Option<PathBuf>,
    /// The SHA-256 of the checkpoint's weights file at export time.
    pub weights_sha256: Option<String>,
}

/// Runs batches through an ONNX model.
pub struct OnnxEngine {
    session: Session,
    runtime: &'static OnnxRuntime,
    input_name: String,
    sample_shape: Vec<usize>,
    /// The batch size the model's input fixes, if it is not dynamic (smaller batches are
    /// padded to it).
    fixed_batch: Option<usize>,
    max_batch: usize,
    description: String,
    provider: String,
    provenance: Provenance,
}

impl std::fmt::Debug for OnnxEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnnxEngine")
            .field("description", &self.description)
            .field("sample_shape", &self.sample_shape)
            .field("fixed_batch", &self.fixed_batch)
            .field("max_batch", &self.max_batch)
            .field("provider", &self.provider)
            .finish_non_exhaustive()
    }
}

fn model_error(path: &Path, message: impl std::fmt::Display) -> InferError {
    InferError::Model {
        model: path.display().to_string(),
        message: message.to_string(),
    }
}

impl OnnxEngine {
    /// Opens `path` in ONNX Runtime. A file onnxruntime cannot parse is a `File` error saying
    /// so; a model kiln cannot feed (not one float32 tensor input) a `Model` error.
    pub fn open(path: &Path, options: &OnnxOptions) -> Result<Self, InferError> {
        if options.max_batch == 0 {
            return Err(InferError::Setting {
                key: kiln_config::keys::infer::batch_size,
                value: "0".to_owned(),
                expected: "must be at least 1".to_owned(),
            });
        }
        let rt = runtime()?;
        let (session, provider) = session(rt, path, options)?;
        let input = input_facts(&session, path, options.input_shape.as_deref())?;
        check_output(&session, path)?;
        let provenance = provenance(&session);
        let max_batch = input
            .fixed_batch
            .map_or(options.max_batch, |b| b.min(options.max_batch));
        if let Some(fixed) = input.fixed_batch {
            tracing::info!(
                "{} takes batches of exactly {fixed}: smaller batches are padded",
                path.display()
            );
        }
        Ok(Self {
            session,
            runtime: rt,
            input_name: input.name,
            sample_shape: input.sample_shape,
            fixed_batch: input.fixed_batch,
            max_batch,
            description: format!("ONNX model {}", path.display()),
            provider,
            provenance,
        })
    }

    pub fn sample_shape(&self) -> &[usize] {
        &self.sample_shape
    }

    pub fn max_batch(&self) -> usize {
        self.max_batch
    }

    pub fn description(&self) -> &str {
        &self.description
    }

    /// The batch size the model's input fixes, if its batch dimension is not dynamic.
    pub fn fixed_batch(&self) -> Option<usize> {
        self.fixed_batch
    }

    pub fn provenance(&self) -> &Provenance {
        &self.provenance
    }

    /// "onnxruntime 1.31.1 (CPU build), CPU provider, 2 threads".
    pub fn status(&self) -> String {
        format!("{}, {}", self.runtime.describe(), self.provider)
    }

    /// Runs `n` samples (`inputs` holds `n × sample numel` values) and returns the outputs as
    /// f32 values with the shape of one sample's output.
    pub fn run(&mut self, inputs: &[f32], n: usize) -> Result<(Vec<f32>, Vec<usize>), InferError> {
        let limit = if self.fixed_batch.is_some_and(|b| b == self.max_batch) {
            "the model's fixed batch size"
        } else {
            "infer.batch_size"
        };
        let numel = crate::io::check_batch(inputs, n, &self.sample_shape, self.max_batch, limit)?;
        let rows = self.fixed_batch.unwrap_or(n);
        let mut shape: Vec<i64> = Vec::with_capacity(self.sample_shape.len() + 1);
        shape.push(rows as i64);
        shape.extend(self.sample_shape.iter().map(|&d| d as i64));
        let padded;
        let data = if rows == n {
            inputs
        } else {
            padded = {
                let mut v = inputs.to_vec();
                v.resize(rows * numel, 0.0);
                v
            };
            &padded
        };
        let fail = |e: &dyn std::fmt::Display| InferError::Model {
            model: self.description.clone(),
            message: e.to_string(),
        };
        let x = TensorRef::from_array_view((shape, data)).map_err(|e| fail(&e))?;
        let outputs = self
            .session
            .run(ort::inputs![self.input_name.as_str() => x])
            .map_err(|e| InferError::Model {
                model: self.description.clone(),
                message: e.to_string(),
            })?;
        let (out_shape, values) =
            outputs[0]
                .try_extract_tensor::<f32>()
                .map_err(|e| InferError::Model {
                    model: self.description.clone(),
                    message: format!("its first output is not a float32 tensor: {e}"),
                })?;
        let per_sample: Vec<usize> = out_shape
            .iter()
            .skip(1)
            .map(|&d| usize::try_from(d).unwrap_or(0))
            .collect();
        let per: usize = per_sample.iter().product();
        if values.len() < n * per {
            return Err(InferError::Model {
                model: self.description.clone(),
                message: format!(
                    "returned {} values for {n} samples of output shape {per_sample:?}",
                    values.len()
                ),
            });
        }
        Ok((values[..n * per].to_vec(), per_sample))
    }
}

/// A session for `path` with kiln's threads, and the provider it runs on.
fn session(
    rt: &OnnxRuntime,
    path: &Path,
    options: &OnnxOptions,
) -> Result<(Session, String), InferError> {
    let threads = options.threads.max(1);
    let e = |e: &dyn std::fmt::Display| model_error(path, format!("ONNX Runtime: {e}"));
    let mut builder = Session::builder(&rt.env)
        .map_err(|x| e(&x))?
        .with_intra_threads(threads)
        .map_err(|x| e(&x))?
        .with_inter_threads(1)
        .map_err(|x| e(&x))?
        .with_optimization_level(GraphOptimizationLevel::All)
        .map_err(|x| e(&x))?;
    let provider = match options.device {
        Device::Cpu => format!("CPU provider, {threads} thread{}", plural(threads)),
        Device::Cuda(i) => {
            builder = with_cuda(rt, builder, path, i)?;
            format!("CUDA provider on cuda:{i}")
        }
        other => {
            return Err(model_error(
                path,
                format!("onnxruntime runs on the CPU or CUDA, not {other:?}; set device = cpu"),
            ));
        }
    };
    let session = builder
        .commit_from_file(path)
        .map_err(|err| InferError::File {
            path: path.to_owned(),
            message: format!("not a loadable ONNX model: {err}"),
        })?;
    Ok((session, provider))
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// Registers the CUDA execution provider for GPU `index`, or says why it cannot be.
fn with_cuda(
    rt: &OnnxRuntime,
    builder: ort::session::builder::SessionBuilder,
    path: &Path,
    index: usize,
) -> Result<ort::session::builder::SessionBuilder, InferError> {
    if !rt.has_cuda {
        return Err(model_error(
            path,
            format!(
                "cannot run on cuda:{index}: the onnxruntime at {} is the CPU build (on a machine \
                 with an NVIDIA driver, `cargo xtask setup` installs onnxruntime-gpu; or set \
                 device = cpu, or infer.engine = libtorch)",
                rt.library.display()
            ),
        ));
    }
    if let Some((cuda, cudnn)) = super::torch_cuda_libraries() {
        // Best effort: libtorch has usually loaded these already.
        let _ = ort::ep::cuda::preload_dylibs(Some(&cuda), Some(&cudnn));
    }
    let cuda = ort::ep::CUDA::default()
        .with_device_id(i32::try_from(index).unwrap_or(0))
        .build()
        .error_on_failure();
    builder.with_execution_providers([cuda]).map_err(|e| {
        model_error(
            path,
            format!("the CUDA execution provider on cuda:{index} failed to start: {e}"),
        )
    })
}

struct InputFacts {
    name: String,
    sample_shape: Vec<usize>,
    fixed_batch: Option<usize>,
}

/// The model's one float32 input: its name, the sample shape (dimensions after the batch,
/// open ones from `given`), and whether its batch dimension is fixed.
fn input_facts(
    session: &Session,
    path: &Path,
    given: Option<&[usize]>,
) -> Result<InputFacts, InferError> {
    let inputs = session.inputs();
    let [input] = inputs else {
        let names: Vec<&str> = inputs.iter().map(|i| i.name()).collect();
        return Err(model_error(
            path,
            format!(
                "takes {} inputs {names:?}; kiln feeds models with one",
                names.len()
            ),
        ));
    };
    let ValueType::Tensor { ty, shape, .. } = input.dtype() else {
        return Err(model_error(
            path,
            format!("input `{}` is not a tensor", input.name()),
        ));
    };
    if *ty != TensorElementType::Float32 {
        return Err(model_error(
            path,
            format!("input `{}` is {ty:?}; kiln feeds float32", input.name()),
        ));
    }
    let dims: &[i64] = shape;
    let Some((&batch, rest)) = dims.split_first() else {
        return Err(model_error(
            path,
            format!("input `{}` is a scalar; kiln feeds batches", input.name()),
        ));
    };
    let sample_shape = sample_shape(rest, given).map_err(|m| {
        model_error(
            path,
            format!("input `{}` {}: {m}", input.name(), show_dims(dims)),
        )
    })?;
    Ok(InputFacts {
        name: input.name().to_owned(),
        sample_shape,
        fixed_batch: usize::try_from(batch).ok().filter(|&b| b > 0),
    })
}

/// "[batch, 64, 469]" for `[-1, 64, 469]`.
fn show_dims(dims: &[i64]) -> String {
    let parts: Vec<String> = dims
        .iter()
        .enumerate()
        .map(|(i, &d)| match (i, d) {
            (0, d) if d <= 0 => "batch".to_owned(),
            (_, d) if d <= 0 => "?".to_owned(),
            (_, d) => d.to_string(),
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

/// The sample shape from the model's dimensions after the batch (`-1` = open) and the shape the
/// user gave, which must agree with every fixed one and fill every open one.
fn sample_shape(model: &[i64], given: Option<&[usize]>) -> Result<Vec<usize>, String> {
    match given {
        Some(given) => {
            let agrees = given.len() == model.len()
                && model
                    .iter()
                    .zip(given)
                    .all(|(&m, &g)| m <= 0 || usize::try_from(m).ok() == Some(g));
            if agrees {
                Ok(given.to_vec())
            } else {
                Err(format!("does not take samples of shape {given:?}"))
            }
        }
        None => model
            .iter()
            .map(|&d| usize::try_from(d).ok().filter(|&d| d > 0))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| {
                "has an open dimension after the batch; give the shape of one sample with \
                 --input-shape"
                    .to_owned()
            }),
    }
}

/// The first output must be a float32 tensor.
fn check_output(session: &Session, path: &Path) -> Result<(), InferError> {
    let Some(output) = session.outputs().first() else {
        return Err(model_error(path, "has no outputs"));
    };
    match output.dtype() {
        ValueType::Tensor { ty, .. } if *ty == TensorElementType::Float32 => Ok(()),
        other => Err(model_error(
            path,
            format!(
                "output `{}` is {other:?}; kiln reads float32 tensors",
                output.name()
            ),
        )),
    }
}

fn provenance(session: &Session) -> Provenance {
    let Ok(metadata) = session.metadata() else {
        return Provenance::default();
    };
    Provenance {
        source: metadata.custom("kiln.source").map(PathBuf::from),
        weights_sha256: metadata.custom("kiln.weights_sha256"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_shapes_come_from_the_model_or_fill_its_open_dimensions() {
        assert_eq!(sample_shape(&[64, 469], None), Ok(vec![64, 469]));
        assert_eq!(sample_shape(&[-1, 469], Some(&[7, 469])), Ok(vec![7, 469]));
        assert!(
            sample_shape(&[-1, 469], None)
                .unwrap_err()
                .contains("--input-shape")
        );
        assert!(
            sample_shape(&[64, 469], Some(&[64, 468]))
                .unwrap_err()
                .contains("[64, 468]")
        );
        assert!(sample_shape(&[4], Some(&[2, 2])).is_err());
        assert_eq!(show_dims(&[-1, 64, 469]), "[batch, 64, 469]");
    }
}
