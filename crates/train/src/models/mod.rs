//! The reference models kiln is tuned and benchmarked on: an MLP for tabular data, a
//! transformer encoder classifier shaped like a sign-language SignTransformer (sequence 64 × 469
//! features), a small conv net with a channels-last option, and a small 3-D U-Net segmenter
//! ([`unet3d`]). `benches/python/train_step.py`
//! defines the same models in PyTorch for the side-by-side benchmark. Every layer is initialised
//! as PyTorch's module of that kind is by default ([`crate::init`]), in the same order, so with
//! the same seed on the CPU a kiln model starts from its twin's very weights.

use kiln_config::keys;
use kiln_config::{AttentionKernel, ModelKind, ModelPlan};
use kiln_data::{
    Dataset, SyntheticClassification, SyntheticImages, SyntheticSequences, SyntheticVolumes,
};
use std::sync::Arc;

use tch::{Kind, Tensor, nn};

use crate::TrainError;
use crate::init;
use crate::model::{Dropout, InputSpec, Model, dropout_seed, dropout_state, set_dropout_state};

pub mod unet3d;

pub use unet3d::Unet3d;

fn invalid(key: &'static str, value: String, expected: String) -> TrainError {
    TrainError::InvalidPlan {
        key,
        value,
        expected,
    }
}

fn dim(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Whether reference model `kind` predicts `target` for samples of `shape`: the 3-D U-Net a
/// class per voxel, the others one label or a vector of values per sample.
fn check_target(
    kind: ModelKind,
    shape: &[usize],
    target: &kiln_data::TargetSpec,
) -> Result<(), TrainError> {
    use kiln_data::TargetSpec;
    let fits = match (kind, target) {
        (ModelKind::Unet3d, TargetSpec::Classes { shape: t, .. }) => shape.get(1..) == Some(t),
        (ModelKind::Unet3d, TargetSpec::Values { .. }) => false,
        (_, TargetSpec::Values { shape }) => shape.len() <= 1,
        (_, TargetSpec::Classes { shape, .. }) => shape.is_empty(),
    };
    if fits {
        return Ok(());
    }
    let expected = if kind == ModelKind::Unet3d {
        format!(
            "a class map per volume: integer classes of the volume's spatial shape {:?}; \
             targets of {target} need a model of your own (--model model.pt2)",
            shape.get(1..).unwrap_or(&[])
        )
    } else {
        format!(
            "the built-in models predict one label or a vector of values per sample; targets \
             of {target} need a model of your own (--model model.pt)"
        )
    };
    Err(invalid(keys::model::name, kind.to_string(), expected))
}

/// Builds the plan's reference model under `vs`'s root for data of `input`'s shape. `seed`
/// seeds dropout. A model file (TorchScript, an exported program) is built by
/// [`crate::source::build`].
pub fn build_reference(
    plan: &ModelPlan,
    input: &InputSpec,
    vs: &nn::VarStore,
    channels_last: bool,
    seed: u64,
) -> Result<Box<dyn Model>, TrainError> {
    let shape = &input.sample_shape;
    let classes = input.classes as i64;
    let target = input
        .target
        .clone()
        .unwrap_or(kiln_data::TargetSpec::label(input.classes));
    check_target(plan.kind, shape, &target)?;
    let regression = matches!(target, kiln_data::TargetSpec::Values { .. });
    if input.classes < 2 && !regression {
        return Err(invalid(
            keys::model::name,
            plan.kind.to_string(),
            format!("needs at least 2 classes, the data has {}", input.classes),
        ));
    }
    let wrong_shape = |expected: &str| {
        invalid(
            keys::model::name,
            plan.kind.to_string(),
            format!("expects samples of shape {expected}, the data's are {shape:?}"),
        )
    };
    if plan.activation_checkpointing && plan.kind != ModelKind::Transformer {
        tracing::warn!(
            "model.activation_checkpointing applies to the transformer; the {} trains without it",
            plan.kind
        );
    }
    let root = vs.root();
    Ok(match plan.kind {
        ModelKind::TorchScript | ModelKind::Program => {
            return Err(invalid(
                keys::model::name,
                plan.kind.to_string(),
                "a reference model (mlp, transformer, convnet, unet3d): a model file is built by \
                 source::build"
                    .to_owned(),
            ));
        }
        ModelKind::Mlp => {
            let features = shape.iter().product::<usize>() as i64;
            Box::new(Mlp::new(
                &root,
                features,
                &plan.hidden,
                classes,
                plan.dropout,
                seed,
            ))
        }
        ModelKind::Transformer => {
            let [seq_len, features] = shape[..] else {
                return Err(wrong_shape("[sequence, features]"));
            };
            Box::new(
                Transformer::new(
                    &root,
                    &TransformerShape {
                        seq_len: seq_len as i64,
                        features: features as i64,
                        d_model: dim(plan.d_model),
                        heads: dim(plan.heads),
                        layers: dim(plan.layers),
                        ff: dim(plan.ff),
                        classes,
                    },
                    plan.dropout,
                    seed,
                )
                .with_activation_checkpointing(plan.activation_checkpointing)
                .with_attention(plan.attention),
            )
        }
        ModelKind::Unet3d => {
            let [channels, _, _, _] = shape[..] else {
                return Err(wrong_shape("[channels, depth, height, width]"));
            };
            Box::new(Unet3d::new(
                &root,
                channels as i64,
                &plan.channels,
                classes,
                channels_last,
            )?)
        }
        ModelKind::ConvNet => {
            let [channels, _, _] = shape[..] else {
                return Err(wrong_shape("[channels, height, width]"));
            };
            Box::new(ConvNet::new(
                &root,
                channels as i64,
                &plan.channels,
                classes,
                channels_last,
            )?)
        }
    })
}

/// Multi-layer perceptron: Linear → ReLU → Dropout per hidden width, then a Linear head.
#[derive(Debug)]
pub struct Mlp {
    hidden: Vec<nn::Linear>,
    dropout: Vec<Dropout>,
    head: nn::Linear,
}

impl Mlp {
    pub fn new(
        vs: &nn::Path<'_>,
        features: i64,
        hidden: &[u64],
        classes: i64,
        dropout: f64,
        seed: u64,
    ) -> Self {
        let mut layers = vec![];
        let mut width = features;
        for (i, &h) in hidden.iter().enumerate() {
            layers.push(init::linear(vs / format!("fc{i}"), width, dim(h), true));
            width = dim(h);
        }
        Self {
            dropout: (0..hidden.len() as u64)
                .map(|i| Dropout::new(dropout, dropout_seed(seed, i)))
                .collect(),
            hidden: layers,
            head: init::linear(vs / "head", width, classes, true),
        }
    }
}

impl Model for Mlp {
    fn forward(&self, features: &Tensor, train: bool) -> Result<Tensor, TrainError> {
        let mut x = features.f_flatten(1, -1)?;
        for (layer, dropout) in self.hidden.iter().zip(&self.dropout) {
            x = dropout.apply(&linear(&x, layer)?.f_relu()?, train)?;
        }
        linear(&x, &self.head)
    }

    fn rng_state(&self) -> Vec<u64> {
        dropout_state(&self.dropout)
    }

    fn set_rng_state(&self, state: &[u64]) -> Result<(), TrainError> {
        set_dropout_state(&self.dropout, state)
    }
}

/// The transformer's dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransformerShape {
    pub seq_len: i64,
    pub features: i64,
    pub d_model: i64,
    pub heads: i64,
    pub layers: i64,
    pub ff: i64,
    pub classes: i64,
}

impl TransformerShape {
    /// Matrix-multiply FLOPs of one forward pass for one sample: every linear layer and the
    /// two attention products (the work a train step does about 3× of).
    pub fn forward_flops_per_sample(&self) -> u64 {
        let (s, f, d, ff, c) = (
            self.seq_len as u64,
            self.features as u64,
            self.d_model as u64,
            self.ff as u64,
            self.classes as u64,
        );
        let per_layer = 2 * s * (3 * d * d + d * d + 2 * d * ff) + 2 * 2 * s * s * d;
        2 * s * f * d + self.layers as u64 * per_layer + 2 * d * c
    }
}

/// A layer norm's weights.
#[derive(Debug)]
struct Norm {
    ws: Option<Tensor>,
    bs: Option<Tensor>,
}

impl Norm {
    fn new(vs: nn::Path<'_>, d: i64) -> Self {
        let n = init::layer_norm(vs, d);
        Self { ws: n.ws, bs: n.bs }
    }

    fn share(&self) -> Self {
        Self {
            ws: self.ws.as_ref().map(Tensor::shallow_clone),
            bs: self.bs.as_ref().map(Tensor::shallow_clone),
        }
    }
}

fn share_linear(l: &nn::Linear) -> nn::Linear {
    nn::Linear {
        ws: l.ws.shallow_clone(),
        bs: l.bs.as_ref().map(Tensor::shallow_clone),
    }
}

#[derive(Debug)]
struct EncoderLayer {
    norm1: Norm,
    qkv: nn::Linear,
    out: nn::Linear,
    drop1: Arc<Dropout>,
    norm2: Norm,
    ff1: nn::Linear,
    ff2: nn::Linear,
    drop2: Arc<Dropout>,
    heads: i64,
    attention: AttentionKernel,
}

/// Batch norm (PyTorch's defaults: momentum 0.1, eps 1e-5; batch statistics in training,
/// running ones in evaluation), then ReLU: the conv net's and the U-Net's stage.
fn batch_norm_relu(x: &Tensor, bn: &nn::BatchNorm, train: bool) -> Result<Tensor, TrainError> {
    Ok(x.f_batch_norm(
        bn.ws.as_ref(),
        bn.bs.as_ref(),
        Some(&bn.running_mean),
        Some(&bn.running_var),
        train,
        0.1,
        1e-5,
        false,
    )?
    .f_relu()?)
}

fn linear(x: &Tensor, l: &nn::Linear) -> Result<Tensor, TrainError> {
    Ok(x.f_linear(&l.ws, l.bs.as_ref())?)
}

fn layer_norm(x: &Tensor, n: &Norm) -> Result<Tensor, TrainError> {
    Ok(x.f_layer_norm(
        [x.size()[x.dim() - 1]],
        n.ws.as_ref(),
        n.bs.as_ref(),
        1e-5,
        true,
    )?)
}

impl EncoderLayer {
    /// `seeds`: the dropout seeds after attention and after the feed-forward.
    fn new(vs: &nn::Path<'_>, d: i64, heads: i64, ff: i64, dropout: f64, seeds: [u64; 2]) -> Self {
        Self {
            norm1: Norm::new(vs / "norm1", d),
            qkv: init::linear(vs / "qkv", d, 3 * d, true),
            out: init::linear(vs / "out", d, d, true),
            drop1: Arc::new(Dropout::new(dropout, seeds[0])),
            norm2: Norm::new(vs / "norm2", d),
            ff1: init::linear(vs / "ff1", d, ff, true),
            ff2: init::linear(vs / "ff2", ff, d, true),
            drop2: Arc::new(Dropout::new(dropout, seeds[1])),
            heads,
            attention: AttentionKernel::Auto,
        }
    }

    /// The same layer (its weights and dropout generators are shared, not copied), for a
    /// checkpointed block to own.
    fn share(&self) -> Self {
        Self {
            norm1: self.norm1.share(),
            qkv: share_linear(&self.qkv),
            out: share_linear(&self.out),
            drop1: Arc::clone(&self.drop1),
            norm2: self.norm2.share(),
            ff1: share_linear(&self.ff1),
            ff2: share_linear(&self.ff2),
            drop2: Arc::clone(&self.drop2),
            heads: self.heads,
            attention: self.attention,
        }
    }

    /// [`EncoderLayer::forward`] with its activations recomputed in backward instead of kept.
    /// The recompute replays the dropout masks of the forward: the block puts the layer's
    /// generators back where they were for it, then where backward found them.
    fn forward_checkpointed(&self, x: &Tensor, train: bool) -> Result<Tensor, TrainError> {
        let layer = self.share();
        let start = [self.drop1.offset(), self.drop2.offset()];
        let first = std::sync::atomic::AtomicBool::new(true);
        let block = move |x: &Tensor| {
            let now = [layer.drop1.offset(), layer.drop2.offset()];
            layer.drop1.set_offset(start[0]);
            layer.drop2.set_offset(start[1]);
            let out = layer
                .forward(x, train)
                .map_err(kiln_torch_ext::CallbackError::from);
            if !first.swap(false, std::sync::atomic::Ordering::Relaxed) {
                layer.drop1.set_offset(now[0]);
                layer.drop2.set_offset(now[1]);
            }
            out
        };
        Ok(kiln_torch_ext::recompute::checkpoint(x, block)?)
    }

    /// Pre-norm: `x + drop(attn(ln1(x)))`, then `h + drop(ff2(gelu(ff1(ln2(h)))))`.
    fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor, TrainError> {
        let size = x.size();
        // The batch dimension stays -1, so a traced module (TorchScript, ONNX) takes any batch.
        let (s, d) = (size[1], size[2]);
        let dh = d / self.heads;
        let qkv = linear(&layer_norm(x, &self.norm1)?, &self.qkv)?;
        // One split (its backward is a single concatenation, where three narrows would each
        // zero-fill and copy a full-size gradient).
        let parts = qkv.f_split(d, -1)?;
        let heads = |t: &Tensor| -> Result<Tensor, TrainError> {
            Ok(t.f_view([-1, s, self.heads, dh])?.f_transpose(1, 2)?)
        };
        let (q, k, v) = (heads(&parts[0])?, heads(&parts[1])?, heads(&parts[2])?);
        let explicit = match self.attention {
            AttentionKernel::Math => true,
            AttentionKernel::Fused => false,
            // On the CPU in reduced precision, libtorch's flash-attention backward is slow at
            // these sizes (in bf16 it was half the train step); the explicit product, whose
            // backward is two batched GEMMs and a softmax, is much faster. In fp32 the fused
            // kernel won on the CPUs measured when this was chosen.
            AttentionKernel::Auto => x.device() == tch::Device::Cpu && q.kind() != Kind::Float,
        };
        let attended = if explicit {
            let scale = 1.0 / (dh as f64).sqrt();
            q.f_matmul(&k.f_transpose(-2, -1)?)?
                .f_mul_scalar(scale)?
                .f_softmax(-1, None::<Kind>)?
                .f_matmul(&v)?
        } else {
            Tensor::f_scaled_dot_product_attention::<Tensor>(
                &q, &k, &v, None, 0.0, false, None, false,
            )?
        }
        .f_transpose(1, 2)?
        .f_reshape([-1, s, d])?;
        let h = x.f_add(&self.drop1.apply(&linear(&attended, &self.out)?, train)?)?;
        let inner = linear(&layer_norm(&h, &self.norm2)?, &self.ff1)?.f_gelu("none")?;
        Ok(h.f_add(&self.drop2.apply(&linear(&inner, &self.ff2)?, train)?)?)
    }
}

/// Transformer encoder classifier: features → d_model, learned positions, pre-norm encoder
/// layers (fused QKV, scaled-dot-product attention, GELU feed-forward), final norm, mean over
/// the sequence, linear head.
#[derive(Debug)]
pub struct Transformer {
    shape: TransformerShape,
    embed: nn::Linear,
    positions: Tensor,
    drop: Dropout,
    layers: Vec<EncoderLayer>,
    norm: Norm,
    head: nn::Linear,
    /// Recompute each layer's activations in backward (activation checkpointing).
    checkpointing: bool,
}

impl Transformer {
    pub fn new(vs: &nn::Path<'_>, shape: &TransformerShape, dropout: f64, seed: u64) -> Self {
        let d = shape.d_model;
        Self {
            shape: *shape,
            embed: init::linear(vs / "embed", shape.features, d, true),
            positions: vs.var(
                "positions",
                &[shape.seq_len, d],
                nn::Init::Randn {
                    mean: 0.0,
                    stdev: 0.02,
                },
            ),
            drop: Dropout::new(dropout, dropout_seed(seed, 0)),
            layers: (0..shape.layers)
                .map(|i| {
                    EncoderLayer::new(
                        &(vs / format!("layer{i}")),
                        d,
                        shape.heads,
                        shape.ff,
                        dropout,
                        [1 + 2 * i as u64, 2 + 2 * i as u64].map(|s| dropout_seed(seed, s)),
                    )
                })
                .collect(),
            norm: Norm::new(vs / "norm", d),
            head: init::linear(vs / "head", d, shape.classes, true),
            checkpointing: false,
        }
    }

    /// With `on`, each encoder layer keeps only its input for backward and recomputes the
    /// rest there: activation memory drops from every layer's intermediates to one layer's,
    /// for about one more forward pass of compute. Gradients are unchanged.
    pub fn with_activation_checkpointing(mut self, on: bool) -> Self {
        self.checkpointing = on;
        self
    }

    /// With `kernel`, every layer's attention is PyTorch's fused kernel or the explicit
    /// product (`model.attention`); `auto` chooses by device and precision.
    pub fn with_attention(mut self, kernel: AttentionKernel) -> Self {
        for layer in &mut self.layers {
            layer.attention = kernel;
        }
        self
    }

    pub fn shape(&self) -> &TransformerShape {
        &self.shape
    }

    fn dropouts(&self) -> impl Iterator<Item = &Dropout> {
        std::iter::once(&self.drop).chain(
            self.layers
                .iter()
                .flat_map(|l| [l.drop1.as_ref(), l.drop2.as_ref()]),
        )
    }
}

impl Model for Transformer {
    fn forward(&self, features: &Tensor, train: bool) -> Result<Tensor, TrainError> {
        let x = linear(features, &self.embed)?.f_add(&self.positions)?;
        let mut x = self.drop.apply(&x, train)?;
        for layer in &self.layers {
            x = if self.checkpointing && train {
                layer.forward_checkpointed(&x, train)?
            } else {
                layer.forward(&x, train)?
            };
        }
        let pooled = layer_norm(&x, &self.norm)?.f_mean_dim(1, false, None::<Kind>)?;
        linear(&pooled, &self.head)
    }

    fn rng_state(&self) -> Vec<u64> {
        dropout_state(self.dropouts())
    }

    fn set_rng_state(&self, state: &[u64]) -> Result<(), TrainError> {
        set_dropout_state(self.dropouts(), state)
    }
}

/// Small conv net: 3×3 conv → batch norm → ReLU per stage (stride 1, then 2), global average
/// pool, linear head. With `channels_last`, weights and inputs are laid out NHWC.
#[derive(Debug)]
pub struct ConvNet {
    stages: Vec<(nn::Conv2D, nn::BatchNorm, i64)>,
    head: nn::Linear,
    channels_last: bool,
}

impl ConvNet {
    pub fn new(
        vs: &nn::Path<'_>,
        in_channels: i64,
        channels: &[u64],
        classes: i64,
        channels_last: bool,
    ) -> Result<Self, TrainError> {
        let mut stages = vec![];
        let mut width = in_channels;
        for (i, &c) in channels.iter().enumerate() {
            let conv = init::conv2d(
                vs / format!("conv{i}"),
                width,
                dim(c),
                3,
                nn::ConvConfig {
                    stride: if i == 0 { 1 } else { 2 },
                    padding: 1,
                    bias: false,
                    ..Default::default()
                },
            );
            if channels_last {
                kiln_torch_ext::layout::param_to_channels_last(&conv.ws)?;
            }
            let bn = init::batch_norm2d(vs / format!("bn{i}"), dim(c));
            stages.push((conv, bn, if i == 0 { 1 } else { 2 }));
            width = dim(c);
        }
        Ok(Self {
            stages,
            head: init::linear(vs / "head", width, classes, true),
            channels_last,
        })
    }
}

impl Model for ConvNet {
    fn forward(&self, features: &Tensor, train: bool) -> Result<Tensor, TrainError> {
        let mut x = if self.channels_last {
            kiln_torch_ext::layout::to_channels_last(features)?
        } else {
            features.shallow_clone()
        };
        for (conv, bn, stride) in &self.stages {
            let y = x.f_conv2d(&conv.ws, conv.bs.as_ref(), [*stride; 2], [1, 1], [1, 1], 1)?;
            x = batch_norm_relu(&y, bn, train)?;
        }
        let pooled = x.f_mean_dim(&[-2i64, -1][..], false, None::<Kind>)?;
        linear(&pooled, &self.head)
    }
}

/// The synthetic dataset each reference model trains on by default: (sample shape, classes);
/// none for a TorchScript model (it needs the user's data).
pub fn synthetic_shape(kind: ModelKind) -> Option<(Vec<usize>, usize)> {
    match kind {
        ModelKind::Transformer => Some((vec![64, 469], 100)),
        ModelKind::Mlp => Some((vec![64], 10)),
        ModelKind::ConvNet => Some((vec![3, 32, 32], 10)),
        ModelKind::Unet3d => Some((vec![1, 32, 32, 32], 2)),
        ModelKind::TorchScript | ModelKind::Program => None,
    }
}

/// The built-in synthetic dataset for `kind`, `samples` long.
pub fn synthetic_dataset(
    kind: ModelKind,
    samples: usize,
    seed: u64,
) -> Result<Box<dyn Dataset>, TrainError> {
    let no_synthetic = || TrainError::InvalidPlan {
        key: keys::model::name,
        value: kind.to_string(),
        expected: "a dataset: a model of your own trains on your data (kiln train --data DIR, \
                   made by kiln data prepare)"
            .to_owned(),
    };
    let (shape, classes) = synthetic_shape(kind).ok_or_else(no_synthetic)?;
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
        ModelKind::Unet3d => Box::new(SyntheticVolumes::new(samples, shape[1], seed)?),
        ModelKind::TorchScript | ModelKind::Program => return Err(no_synthetic()),
    })
}
