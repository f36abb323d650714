//! The inference engine: runs batches of host samples through a [`LoadedModel`] with no
//! autograd, and on CUDA replays a CUDA graph per batch-size bucket (powers of two up to the
//! maximum batch): a batch is padded to its bucket, the graph captured the first time a bucket
//! is seen, and the padding dropped from the output. Where graphs cannot be used the engine
//! runs eagerly and says why, once.

use std::collections::HashMap;

use kiln_config::CudaGraphs;
use kiln_config::keys;
use kiln_torch_ext::CallbackError;
use kiln_torch_ext::graphs::CudaGraph;
use tch::{Device, Kind, Tensor};

use crate::io::check_batch;
use crate::{InferError, LoadedModel};

/// How an engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineOptions {
    /// The most samples one batch may hold.
    pub max_batch: usize,
    pub cuda_graphs: CudaGraphs,
}

/// Whether batches replay CUDA graphs, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GraphStatus {
    /// Graphs are captured per bucket and replayed.
    On { captured: Vec<usize> },
    /// Eager execution, with the reason.
    Off(String),
}

impl std::fmt::Display for GraphStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GraphStatus::On { captured } if captured.is_empty() => {
                f.write_str("on (nothing captured yet)")
            }
            GraphStatus::On { captured } => {
                write!(f, "on (captured for batch buckets {captured:?})")
            }
            GraphStatus::Off(why) => write!(f, "off ({why})"),
        }
    }
}

/// Runs batches through a model. Not `Send`: it lives on the thread that made it.
#[derive(Debug)]
pub struct Engine {
    model: LoadedModel,
    sample_shape: Vec<usize>,
    options: EngineOptions,
    graphs: HashMap<usize, CudaGraph>,
    graph_status: GraphStatus,
}

fn device_name(device: Device) -> String {
    match device {
        Device::Cpu => "the CPU".to_owned(),
        Device::Cuda(i) => format!("cuda:{i}"),
        Device::Mps => "MPS".to_owned(),
        Device::Vulkan => "Vulkan".to_owned(),
    }
}

/// The bucket a batch of `n` samples is padded to: the next power of two, at most `max`.
pub fn bucket(n: usize, max: usize) -> usize {
    n.checked_next_power_of_two().unwrap_or(max).min(max).max(n)
}

impl Engine {
    /// An engine for samples of `sample_shape`. `infer.cuda_graphs = on` is an error where
    /// graphs cannot be used; `auto` falls back to eager execution with a log line.
    pub fn new(
        model: LoadedModel,
        sample_shape: Vec<usize>,
        options: EngineOptions,
    ) -> Result<Self, InferError> {
        if options.max_batch == 0 {
            return Err(InferError::Setting {
                key: keys::infer::batch_size,
                value: "0".to_owned(),
                expected: "must be at least 1".to_owned(),
            });
        }
        if let Some(expected) = model.sample_shape()
            && expected != sample_shape.as_slice()
        {
            return Err(InferError::Input(format!(
                "samples of shape {sample_shape:?} given, {} takes {expected:?}",
                model.description()
            )));
        }
        let graph_status = match (options.cuda_graphs, model.device()) {
            (CudaGraphs::Off, _) => GraphStatus::Off("infer.cuda_graphs = off".to_owned()),
            (_, Device::Cuda(_)) if kiln_torch_ext::cuda::built_with_cuda() => {
                GraphStatus::On { captured: vec![] }
            }
            (CudaGraphs::On, device) => {
                return Err(InferError::Setting {
                    key: keys::infer::cuda_graphs,
                    value: "on".to_owned(),
                    expected: format!(
                        "CUDA graphs need a CUDA device and a CUDA build of kiln; this run is on \
                         {}{} (use auto or off)",
                        device_name(device),
                        if kiln_torch_ext::cuda::built_with_cuda() {
                            ""
                        } else {
                            " and kiln was built without CUDA"
                        }
                    ),
                });
            }
            (CudaGraphs::Auto, Device::Cuda(_)) => {
                GraphStatus::Off("kiln was built without CUDA graph support".to_owned())
            }
            (CudaGraphs::Auto, device) => GraphStatus::Off(format!(
                "CUDA graphs need a CUDA device; this is {}",
                device_name(device)
            )),
        };
        if let GraphStatus::Off(why) = &graph_status
            && options.cuda_graphs == CudaGraphs::Auto
        {
            tracing::info!("CUDA graphs not used: {why}");
        }
        Ok(Self {
            model,
            sample_shape,
            options,
            graphs: HashMap::new(),
            graph_status,
        })
    }

    pub fn model(&self) -> &LoadedModel {
        &self.model
    }

    pub fn sample_shape(&self) -> &[usize] {
        &self.sample_shape
    }

    pub fn max_batch(&self) -> usize {
        self.options.max_batch
    }

    pub fn graph_status(&self) -> &GraphStatus {
        &self.graph_status
    }

    /// `compiled` for an exported program (its eval forward compiled by AOTInductor), else
    /// `libtorch`: the engine's name in `infer.engine`'s terms.
    pub fn kind_name(&self) -> &'static str {
        if self.model.is_program() {
            "compiled"
        } else {
            "libtorch"
        }
    }

    /// Runs `n` samples (`inputs` holds `n × sample numel` values) and returns the outputs as
    /// f32 values with the shape of one sample's output.
    pub fn run(&mut self, inputs: &[f32], n: usize) -> Result<(Vec<f32>, Vec<usize>), InferError> {
        let numel = check_batch(
            inputs,
            n,
            &self.sample_shape,
            self.options.max_batch,
            "infer.batch_size",
        )?;
        let _no_grad = tch::no_grad_guard();
        let device = self.model.device();
        let use_graph = matches!(self.graph_status, GraphStatus::On { .. });
        let rows = if use_graph {
            bucket(n, self.options.max_batch)
        } else {
            n
        };
        let mut shape: Vec<i64> = Vec::with_capacity(self.sample_shape.len() + 1);
        shape.push(i64::try_from(rows).unwrap_or(i64::MAX));
        shape.extend(self.sample_shape.iter().map(|&d| d as i64));
        let host = if rows == n {
            Tensor::f_from_slice(inputs)?.f_view(shape.as_slice())?
        } else {
            let mut padded = inputs.to_vec();
            padded.resize(rows * numel, 0.0);
            Tensor::f_from_slice(&padded)?.f_view(shape.as_slice())?
        };
        let xs = host.f_to_device(device)?.f_to_kind(self.model.kind())?;
        let output = if use_graph {
            match self.replay(rows, &xs) {
                Ok(out) => out,
                Err(why) => {
                    tracing::warn!("CUDA graphs not used from now on: {why}; running eagerly");
                    self.graphs.clear();
                    self.graph_status = GraphStatus::Off(why);
                    self.model.forward(&xs)?
                }
            }
        } else {
            self.model.forward(&xs)?
        };
        let output = if rows == n {
            output
        } else {
            output.f_narrow(0, 0, n as i64)?
        };
        let out_shape: Vec<usize> = output
            .size()
            .iter()
            .skip(1)
            .map(|&d| usize::try_from(d).unwrap_or(0))
            .collect();
        let host = output
            .f_to_kind(Kind::Float)?
            .f_to_device(Device::Cpu)?
            .f_contiguous()?
            .f_view([-1])?;
        let values = Vec::<f32>::try_from(&host)?;
        Ok((values, out_shape))
    }

    /// Replays (capturing first if needed) the graph of bucket `rows`.
    fn replay(&mut self, rows: usize, xs: &Tensor) -> Result<Tensor, String> {
        if !self.graphs.contains_key(&rows) {
            let model = &self.model;
            let graph =
                CudaGraph::capture(xs, 3, |x| model.forward(x).map_err(CallbackError::from))
                    .map_err(|e| format!("capturing batch bucket {rows} failed: {e}"))?;
            tracing::info!("captured a CUDA graph for batch bucket {rows}");
            self.graphs.insert(rows, graph);
            if let GraphStatus::On { captured } = &mut self.graph_status {
                captured.push(rows);
                captured.sort_unstable();
            }
        }
        let graph = self
            .graphs
            .get(&rows)
            .ok_or_else(|| format!("no graph for bucket {rows}"))?;
        graph.replay(xs).map_err(|e| e.to_string())
    }
}

/// What offline inference, the server and the engine choice need of an engine: the libtorch
/// [`Engine`], the [`OnnxEngine`](crate::onnx::OnnxEngine), or both behind
/// [`AutoEngine`](crate::choose::AutoEngine).
pub trait Runner {
    /// Runs `n` samples (`inputs` holds `n × sample numel` values) and returns the outputs as
    /// f32 values with the shape of one sample's output.
    fn run(&mut self, inputs: &[f32], n: usize) -> Result<(Vec<f32>, Vec<usize>), InferError>;
    /// The shape of one input sample.
    fn sample_shape(&self) -> &[usize];
    /// The most samples one batch may hold.
    fn max_batch(&self) -> usize;
    /// The model, for reports ("kiln mlp checkpoint …", "ONNX model m.onnx").
    fn description(&self) -> String;
    /// Which engine runs and how ("libtorch", "onnxruntime 1.31.1 (CPU build), CPU provider, 2
    /// threads", or the automatic choice per batch size).
    fn engine(&self) -> String;
    /// Whether CUDA graphs are replayed, and if not, why.
    fn cuda_graphs(&self) -> String;
}

impl Runner for Engine {
    fn run(&mut self, inputs: &[f32], n: usize) -> Result<(Vec<f32>, Vec<usize>), InferError> {
        Engine::run(self, inputs, n)
    }
    fn sample_shape(&self) -> &[usize] {
        &self.sample_shape
    }
    fn max_batch(&self) -> usize {
        self.options.max_batch
    }
    fn description(&self) -> String {
        self.model.description().to_owned()
    }
    fn engine(&self) -> String {
        match self.kind_name() {
            "compiled" => "compiled (the program's eval forward, AOTInductor)".to_owned(),
            name => name.to_owned(),
        }
    }
    fn cuda_graphs(&self) -> String {
        self.graph_status.to_string()
    }
}

impl Runner for crate::onnx::OnnxEngine {
    fn run(&mut self, inputs: &[f32], n: usize) -> Result<(Vec<f32>, Vec<usize>), InferError> {
        crate::onnx::OnnxEngine::run(self, inputs, n)
    }
    fn sample_shape(&self) -> &[usize] {
        crate::onnx::OnnxEngine::sample_shape(self)
    }
    fn max_batch(&self) -> usize {
        crate::onnx::OnnxEngine::max_batch(self)
    }
    fn description(&self) -> String {
        crate::onnx::OnnxEngine::description(self).to_owned()
    }
    fn engine(&self) -> String {
        self.status()
    }
    fn cuda_graphs(&self) -> String {
        "off (not used by onnxruntime)".to_owned()
    }
}

impl<R: Runner + ?Sized> Runner for Box<R> {
    fn run(&mut self, inputs: &[f32], n: usize) -> Result<(Vec<f32>, Vec<usize>), InferError> {
        (**self).run(inputs, n)
    }
    fn sample_shape(&self) -> &[usize] {
        (**self).sample_shape()
    }
    fn max_batch(&self) -> usize {
        (**self).max_batch()
    }
    fn description(&self) -> String {
        (**self).description()
    }
    fn engine(&self) -> String {
        (**self).engine()
    }
    fn cuda_graphs(&self) -> String {
        (**self).cuda_graphs()
    }
}

/// The server's worker runs batches through any engine.
impl<R: Runner> crate::serve::BatchRunner for R {
    fn sample_shape(&self) -> &[usize] {
        Runner::sample_shape(self)
    }

    fn run(&mut self, inputs: &[f32], n: usize) -> Result<(Vec<f32>, Vec<usize>), String> {
        Runner::run(self, inputs, n).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::bucket;

    #[test]
    fn buckets_are_powers_of_two_capped_at_the_maximum() {
        assert_eq!(bucket(1, 64), 1);
        assert_eq!(bucket(3, 64), 4);
        assert_eq!(bucket(33, 64), 64);
        assert_eq!(bucket(64, 64), 64);
        assert_eq!(bucket(48, 48), 48);
    }
}
