//! PyTorch's default initialisation for layers built on tch, so that a model moved from PyTorch
//! to kiln starts from the same distribution and learns the same. tch's own defaults differ:
//! `nn::linear` and `nn::conv2d` draw weights Kaiming-uniform with ReLU gain, U(±√(6/fan_in)),
//! √6 ≈ 2.45× wider than PyTorch's U(±1/√fan_in); `nn::conv2d` zeroes its bias where PyTorch
//! draws it from U(±1/√fan_in); `nn::batch_norm2d` draws its weight from U(0, 1) where PyTorch
//! sets 1. Each function here creates its tensors in the order PyTorch's module does (weight,
//! then bias), so with the same seed on the CPU the draws are PyTorch's own.

use tch::nn::{self, Init};

/// PyTorch's `kaiming_uniform_(a=√5)` and bias default for a layer of `fan_in` inputs:
/// U(±1/√fan_in).
pub fn uniform_fan_in(fan_in: i64) -> Init {
    let bound = 1.0 / (fan_in.max(1) as f64).sqrt();
    Init::Uniform {
        lo: -bound,
        up: bound,
    }
}

/// `nn.Linear(in_dim, out_dim, bias)`: weight and bias U(±1/√in_dim).
pub fn linear<'a>(
    vs: impl std::borrow::Borrow<nn::Path<'a>>,
    in_dim: i64,
    out_dim: i64,
    bias: bool,
) -> nn::Linear {
    let vs = vs.borrow();
    let ws = vs.var("weight", &[out_dim, in_dim], uniform_fan_in(in_dim));
    let bs = bias.then(|| vs.var("bias", &[out_dim], uniform_fan_in(in_dim)));
    nn::Linear { ws, bs }
}

/// `nn.Conv2d(in_dim, out_dim, kernel, stride, padding, dilation, groups, bias)`: weight and
/// bias U(±1/√fan_in), fan_in = in_dim / groups × kernel². `config`'s own initialisers are
/// ignored.
pub fn conv2d<'a>(
    vs: impl std::borrow::Borrow<nn::Path<'a>>,
    in_dim: i64,
    out_dim: i64,
    kernel: i64,
    config: nn::ConvConfig,
) -> nn::Conv2D {
    let vs = vs.borrow();
    let fan_in = in_dim / config.groups.max(1) * kernel * kernel;
    let mut conv = nn::conv2d(
        vs,
        in_dim,
        out_dim,
        kernel,
        nn::ConvConfig {
            bias: false,
            ws_init: uniform_fan_in(fan_in),
            ..config
        },
    );
    // The bias after the weight, as PyTorch draws them.
    conv.bs = config
        .bias
        .then(|| vs.var("bias", &[out_dim], uniform_fan_in(fan_in)));
    conv
}

/// `nn.Conv3d(in_dim, out_dim, kernel, padding=padding, bias=bias)`, stride 1: weight
/// `[out_dim, in_dim, k, k, k]` and bias U(±1/√fan_in), fan_in = in_dim × kernel³.
pub fn conv3d<'a>(
    vs: impl std::borrow::Borrow<nn::Path<'a>>,
    in_dim: i64,
    out_dim: i64,
    kernel: i64,
    bias: bool,
) -> nn::Linear {
    let vs = vs.borrow();
    let init = uniform_fan_in(in_dim * kernel.pow(3));
    let ws = vs.var("weight", &[out_dim, in_dim, kernel, kernel, kernel], init);
    let bs = bias.then(|| vs.var("bias", &[out_dim], init));
    nn::Linear { ws, bs }
}

/// `nn.ConvTranspose3d(in_dim, out_dim, kernel, stride=kernel)`: weight
/// `[in_dim, out_dim, k, k, k]` and bias U(±1/√fan_in), where PyTorch's fan_in is the weight's
/// second dimension times the kernel's volume: out_dim × kernel³.
pub fn conv_transpose3d<'a>(
    vs: impl std::borrow::Borrow<nn::Path<'a>>,
    in_dim: i64,
    out_dim: i64,
    kernel: i64,
) -> nn::Linear {
    let vs = vs.borrow();
    let init = uniform_fan_in(out_dim * kernel.pow(3));
    let ws = vs.var("weight", &[in_dim, out_dim, kernel, kernel, kernel], init);
    let bs = Some(vs.var("bias", &[out_dim], init));
    nn::Linear { ws, bs }
}

/// `nn.LayerNorm(dim, eps=1e-5)`: weight 1, bias 0.
pub fn layer_norm<'a>(vs: impl std::borrow::Borrow<nn::Path<'a>>, dim: i64) -> nn::LayerNorm {
    nn::layer_norm(
        vs,
        vec![dim],
        nn::LayerNormConfig {
            eps: 1e-5,
            ws_init: Init::Const(1.0),
            bs_init: Init::Const(0.0),
            ..Default::default()
        },
    )
}

/// `nn.BatchNorm2d(channels)`: weight 1, bias 0, running mean 0 and variance 1, eps 1e-5,
/// momentum 0.1.
pub fn batch_norm2d<'a>(
    vs: impl std::borrow::Borrow<nn::Path<'a>>,
    channels: i64,
) -> nn::BatchNorm {
    nn::batch_norm2d(
        vs,
        channels,
        nn::BatchNormConfig {
            eps: 1e-5,
            momentum: 0.1,
            ws_init: Init::Const(1.0),
            bs_init: Init::Const(0.0),
            ..Default::default()
        },
    )
}

/// `nn.Embedding(count, dim)`: weight N(0, 1).
pub fn embedding<'a>(
    vs: impl std::borrow::Borrow<nn::Path<'a>>,
    count: i64,
    dim: i64,
) -> nn::Embedding {
    nn::embedding(
        vs,
        count,
        dim,
        nn::EmbeddingConfig {
            ws_init: Init::Randn {
                mean: 0.0,
                stdev: 1.0,
            },
            ..Default::default()
        },
    )
}
