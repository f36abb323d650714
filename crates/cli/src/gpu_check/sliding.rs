//! gpu-check step: sliding-window inference with the windows on the device (on a GPU the next
//! batch gathered on a thread of its own while the model runs), stitched on the device and on
//! the CPU, each equal to the whole run on the CPU.

use kiln_config::{BlendMode, PadMode};
use kiln_infer::InferError;
use kiln_infer::sliding::{SlidingWindow, run};
use kiln_torch_ext::flags::{self, Flag};
use tch::{Device, Kind, Tensor};

use super::{Ctx, Outcome, timed};

/// The largest |Δ| allowed between the device's stitched scores and the CPU's (fp32, TF32 off).
const TOLERANCE: f64 = 1e-4;

/// A small 3-D segmenter's weights on `device`: convolutions 1 → 8 → 2, 3³ kernels.
fn weights(device: Device) -> [Tensor; 4] {
    tch::manual_seed(0);
    let w1 = Tensor::randn([8, 1, 3, 3, 3], (Kind::Float, Device::Cpu)) * 0.3;
    let w2 = Tensor::randn([2, 8, 3, 3, 3], (Kind::Float, Device::Cpu)) * 0.2;
    let b1 = Tensor::full([8], 0.05, (Kind::Float, Device::Cpu));
    let b2 = Tensor::full([2], -0.05, (Kind::Float, Device::Cpu));
    [w1, b1, w2, b2].map(|t| t.to_device(device))
}

/// The blended scores of `volume` through the segmenter with its windows on `device`, stitched
/// on `output`; and the seconds it took.
fn slide(volume: &Tensor, device: Device, output: Device) -> anyhow::Result<(Tensor, f64)> {
    let [w1, b1, w2, b2] = weights(device);
    let settings = SlidingWindow {
        roi: vec![48],
        overlap: 0.25,
        mode: BlendMode::Gaussian,
        sigma_scale: 0.125,
        batch_size: 4,
        padding_mode: PadMode::Constant,
        cval: 0.0,
        channels_last: false,
        layout: kiln_infer::sliding::Layout::AsSet,
    };
    let mut predict = |x: &Tensor| -> Result<Tensor, InferError> {
        let conv =
            |x: &Tensor, w: &Tensor, b: &Tensor| x.f_conv3d(w, Some(b), [1; 3], [1; 3], [1; 3], 1);
        Ok(conv(&conv(x, &w1, &b1)?.f_relu()?, &w2, &b2)?)
    };
    let (scores, seconds) = timed(device, || {
        Ok(run(volume, &settings, device, output, &mut predict)?)
    })?;
    Ok((scores.to_device(Device::Cpu), seconds))
}

pub fn sliding_window(ctx: &Ctx) -> anyhow::Result<Outcome> {
    if ctx.cuda() {
        flags::set_flag(Flag::Tf32CuDnn, false)?;
        flags::set_flag(Flag::Tf32CuBlas, false)?;
    }
    tch::manual_seed(1);
    let volume = Tensor::randn([1, 96, 88, 80], (Kind::Float, Device::Cpu));
    let (reference, cpu_s) = slide(&volume, Device::Cpu, Device::Cpu)?;
    let mut worst = 0f64;
    let mut times = vec![];
    for output in [ctx.device, Device::Cpu] {
        // The first run warms the device's kernels; the second is timed.
        let _ = slide(&volume, ctx.device, output)?;
        let (scores, seconds) = slide(&volume, ctx.device, output)?;
        worst = worst.max(f64::try_from((&scores - &reference).abs().max())?);
        times.push(seconds);
    }
    let pass = worst <= TOLERANCE;
    Ok(Outcome::new(
        pass,
        format!(
            "96×88×80 volume, 48³ windows (18), overlap 0.25, Gaussian, 4 a batch: stitched on \
             {} in {:.3} s and on the CPU in {:.3} s (all on the CPU: {cpu_s:.3} s); largest \
             |Δ| against the CPU's {worst:.1e} (tolerance {TOLERANCE:e})",
            ctx.device_key(),
            times[0],
            times[1]
        ),
    )
    .figure("max_abs_diff", worst)
    .figure("device_output_s", times[0])
    .figure("cpu_output_s", times[1])
    .figure("cpu_only_s", cpu_s))
}
