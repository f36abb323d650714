//! The reference 3-D U-Net segmenter (`--model unet3d`): an encoder of double-convolution blocks
//! with 2× max-pooling between levels, a decoder of 2× transposed convolutions with skip
//! connections, and a 1×1×1 head giving a score per class and voxel. Its PyTorch twin is
//! `UNet3d` in `benches/python/train_step.py`, built in the same order, so that with the same
//! seed on the CPU both start from the same weights.

use tch::{Tensor, nn};

use super::{batch_norm_relu, dim};
use crate::TrainError;
use crate::init;
use crate::model::Model;

/// Conv3d(3×3×3, padding 1, no bias) → BatchNorm3d → ReLU, twice.
#[derive(Debug)]
struct Block {
    convs: [(nn::Linear, nn::BatchNorm); 2],
}

impl Block {
    fn new(vs: &nn::Path<'_>, in_dim: i64, out_dim: i64) -> Self {
        let stage = |i: usize, from: i64| {
            let conv = init::conv3d(vs / format!("conv{i}"), from, out_dim, 3, false);
            // BatchNorm3d's parameters and buffers are BatchNorm2d's.
            let bn = init::batch_norm2d(vs / format!("bn{i}"), out_dim);
            (conv, bn)
        };
        let first = stage(0, in_dim);
        Self {
            convs: [first, stage(1, out_dim)],
        }
    }

    fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor, TrainError> {
        let mut x = x.shallow_clone();
        for (conv, bn) in &self.convs {
            let y = x.f_conv3d(&conv.ws, None::<&Tensor>, [1; 3], [1; 3], [1; 3], 1)?;
            x = batch_norm_relu(&y, bn, train)?;
        }
        Ok(x)
    }

    fn weights(&self) -> impl Iterator<Item = &Tensor> {
        self.convs.iter().map(|(c, _)| &c.ws)
    }
}

/// A 3-D U-Net of `channels.len()` levels for inputs `[B, C, D, H, W]` whose sides divide by
/// 2^(levels − 1); the output is `[B, classes, D, H, W]`.
#[derive(Debug)]
pub struct Unet3d {
    down: Vec<Block>,
    /// Per decoder level, deepest first: the 2× transposed convolution and the block after
    /// the skip connection.
    up: Vec<(nn::Linear, Block)>,
    head: nn::Linear,
    channels_last: bool,
}

impl Unet3d {
    pub fn new(
        vs: &nn::Path<'_>,
        in_channels: i64,
        channels: &[u64],
        classes: i64,
        channels_last: bool,
    ) -> Result<Self, TrainError> {
        let widths: Vec<i64> = channels.iter().map(|&c| dim(c)).collect();
        let mut down = vec![];
        let mut from = in_channels;
        for (i, &w) in widths.iter().enumerate() {
            down.push(Block::new(&(vs / format!("down{i}")), from, w));
            from = w;
        }
        let mut up = vec![];
        for i in (0..widths.len().saturating_sub(1)).rev() {
            let path = vs / format!("up{i}");
            let upsample = init::conv_transpose3d(&path / "upsample", widths[i + 1], widths[i], 2);
            up.push((
                upsample,
                Block::new(&(&path / "block"), 2 * widths[i], widths[i]),
            ));
        }
        let head = init::conv3d(vs / "head", widths[0], classes, 1, true);
        let net = Self {
            down,
            up,
            head,
            channels_last,
        };
        if channels_last {
            for w in net.conv_weights() {
                kiln_torch_ext::layout::param_to_channels_last(w)?;
            }
        }
        Ok(net)
    }

    /// How many times each side must divide by 2.
    pub fn halvings(&self) -> usize {
        self.down.len() - 1
    }

    fn conv_weights(&self) -> impl Iterator<Item = &Tensor> {
        self.down
            .iter()
            .flat_map(Block::weights)
            .chain(
                self.up
                    .iter()
                    .flat_map(|(t, b)| std::iter::once(&t.ws).chain(b.weights())),
            )
            .chain(std::iter::once(&self.head.ws))
    }

    fn check_sides(&self, x: &Tensor) -> Result<(), TrainError> {
        let size = x.size();
        let step = 1i64 << self.halvings();
        if size.len() != 5 || size[2..].iter().any(|s| s % step != 0) {
            return Err(TrainError::ShapeMismatch {
                what: format!("the 3-D U-Net of {} levels", self.down.len()),
                expected: format!(
                    "inputs [batch, channels, depth, height, width] whose sides divide by {step}"
                ),
                got: format!("got {size:?}"),
            });
        }
        Ok(())
    }
}

impl Model for Unet3d {
    fn forward(&self, features: &Tensor, train: bool) -> Result<Tensor, TrainError> {
        self.check_sides(features)?;
        let mut x = if self.channels_last {
            kiln_torch_ext::layout::to_channels_last(features)?
        } else {
            features.shallow_clone()
        };
        // Every level's output but the deepest's, for the decoder's skip connections.
        let mut skips = vec![];
        for (i, block) in self.down.iter().enumerate() {
            if i > 0 {
                skips.push(x.shallow_clone());
                x = x.f_max_pool3d([2; 3], [2; 3], [0; 3], [1; 3], false)?;
            }
            x = block.forward(&x, train)?;
        }
        // The decoder runs deepest first, as `up` holds it.
        for ((upsample, block), skip) in self.up.iter().zip(skips.into_iter().rev()) {
            let y = x.f_conv_transpose3d(
                &upsample.ws,
                upsample.bs.as_ref(),
                [2; 3],
                [0; 3],
                [0; 3],
                1,
                [1; 3],
            )?;
            x = block.forward(&Tensor::f_cat(&[skip, y], 1)?, train)?;
        }
        Ok(x.f_conv3d(
            &self.head.ws,
            self.head.bs.as_ref(),
            [1; 3],
            [0; 3],
            [1; 3],
            1,
        )?)
    }
}
