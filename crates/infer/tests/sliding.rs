//! Sliding-window inference against references written here: a pointwise convolutional model's
//! stitched output equals its direct forward over the whole input (any blending), and a model
//! whose output differs per window is blended as a slow voxel-by-voxel reference computes it, for
//! 2-D and 3-D inputs, odd sizes, inputs the size of one window and inputs smaller than it;
//! outputs of another size than the window.

use kiln_config::{BlendMode, PadMode};
use kiln_infer::InferError;
use kiln_infer::sliding::{SlidingWindow, run};
use tch::{Device, Kind, Tensor};

fn settings(roi: &[i64], overlap: f64, mode: BlendMode, batch: usize) -> SlidingWindow {
    SlidingWindow {
        roi: roi.to_vec(),
        overlap,
        mode,
        sigma_scale: 0.125,
        batch_size: batch,
        padding_mode: PadMode::Constant,
        cval: 0.0,
        channels_last: false,
        layout: kiln_infer::sliding::Layout::AsSet,
    }
}

fn stitch(
    input: &Tensor,
    s: &SlidingWindow,
    predict: &mut dyn FnMut(&Tensor) -> Result<Tensor, InferError>,
) -> Tensor {
    run(input, s, Device::Cpu, Device::Cpu, predict).unwrap()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size());
    f64::try_from((a - b).abs().max()).unwrap()
}

/// A pointwise network (1×1 convolutions and a nonlinearity): every window's output at a voxel
/// is the whole input's, so any blend of them is too.
#[test]
fn a_pointwise_model_stitches_to_its_direct_forward() {
    tch::manual_seed(0);
    for (spatial, roi) in [
        (vec![11i64, 7], vec![4i64, 4]),
        (vec![9, 10, 7], vec![4, 6, 3]),
        (vec![5, 6, 4], vec![5, 6, 4]), // one window
        (vec![3, 5], vec![6, 4]),       // smaller than the window: padded, cropped
    ] {
        let d = spatial.len();
        let layer = |c_in: i64, c_out: i64| {
            let mut shape = vec![c_out, c_in];
            shape.extend(vec![1i64; d]);
            let w = Tensor::randn(shape.as_slice(), (Kind::Float, Device::Cpu)) * 0.5;
            (w, Tensor::full([c_out], 0.1, (Kind::Float, Device::Cpu)))
        };
        let ((w1, b1), (w2, b2)) = (layer(2, 4), layer(4, 3));
        let (ones, zeros) = (vec![1i64; d], vec![0i64; d]);
        let pointwise = move |x: &Tensor, w: &Tensor, b: &Tensor| {
            x.convolution(w, Some(b), &ones, &zeros, &ones, false, &zeros, 1)
        };
        let model = move |x: &Tensor| pointwise(&pointwise(x, &w1, &b1).tanh(), &w2, &b2);
        let mut shape = vec![2];
        shape.extend(&spatial);
        let input = Tensor::randn(shape.as_slice(), (Kind::Float, Device::Cpu));
        let direct = model(&input.unsqueeze(0)).squeeze_dim(0);
        for (mode, batch) in [(BlendMode::Constant, 1), (BlendMode::Gaussian, 3)] {
            let s = settings(&roi, 0.5, mode, batch);
            let mut calls = 0;
            let out = stitch(&input, &s, &mut |w| {
                calls += 1;
                Ok(model(w))
            });
            assert!(max_diff(&out, &direct) < 1e-5, "{spatial:?} {roi:?} {mode}");
            assert!(calls >= 1);
        }
    }
}

/// The windows a slow reference finds on its own: every start on the step, and the last one
/// that ends at the edge.
fn reference_starts(size: i64, roi: i64, overlap: f64) -> Vec<i64> {
    if size <= roi {
        return vec![0];
    }
    let step = ((roi as f64 * (1.0 - overlap)) as i64).max(1);
    let mut out: Vec<i64> = (0..)
        .map(|k| k * step)
        .take_while(|&p| p + roi < size)
        .collect();
    out.push(size - roi);
    out
}

/// A model whose output differs per window: each window's channel k is (k + 1) times the mean of
/// its input, everywhere in the window.
fn window_means(w: &Tensor) -> Tensor {
    let size = w.size();
    let dims: Vec<i64> = (1..size.len() as i64).collect();
    let mean = w.mean_dim(dims.as_slice(), true, Kind::Float);
    let channels = Tensor::from_slice(&[1.0f32, 2.0]).view([1, 2, 1, 1, 1]);
    let mut target = size.clone();
    target[1] = 2;
    (mean.view([size[0], 1, 1, 1, 1]) * channels).expand(target.as_slice(), false)
}

/// Σ weight · window mean / Σ weight, voxel by voxel, in f64 (3-D, one input channel).
fn slow_blend(x: &[f64], size: [i64; 3], roi: [i64; 3], overlap: f64, gaussian: bool) -> Vec<f64> {
    let at = |i: i64, j: i64, k: i64| x[((i * size[1] + j) * size[2] + k) as usize];
    let weight = |d: usize, p: i64| {
        if !gaussian {
            return 1.0;
        }
        let (s, c) = (roi[d] as f64 * 0.125, (roi[d] as f64 - 1.0) / 2.0);
        (-(p as f64 - c).powi(2) / (2.0 * s * s)).exp()
    };
    let n = (size[0] * size[1] * size[2]) as usize;
    let (mut sum, mut total) = (vec![0.0; n], vec![0.0; n]);
    for &a in &reference_starts(size[0], roi[0], overlap) {
        for &b in &reference_starts(size[1], roi[1], overlap) {
            for &c in &reference_starts(size[2], roi[2], overlap) {
                let mut mean = 0.0;
                for (i, j, k) in voxels(roi) {
                    mean += at(a + i, b + j, c + k);
                }
                mean /= (roi[0] * roi[1] * roi[2]) as f64;
                for (i, j, k) in voxels(roi) {
                    let w = (weight(0, i) * weight(1, j) * weight(2, k)).max(1e-3);
                    let v = (((a + i) * size[1] + b + j) * size[2] + c + k) as usize;
                    sum[v] += w * mean;
                    total[v] += w;
                }
            }
        }
    }
    sum.iter().zip(&total).map(|(s, t)| s / t).collect()
}

fn voxels(roi: [i64; 3]) -> impl Iterator<Item = (i64, i64, i64)> {
    (0..roi[0])
        .flat_map(move |i| (0..roi[1]).flat_map(move |j| (0..roi[2]).map(move |k| (i, j, k))))
}

#[test]
fn blending_matches_a_slow_reference_for_both_modes() {
    tch::manual_seed(1);
    let size = [13i64, 9, 10];
    let input = Tensor::rand([1, 13, 9, 10], (Kind::Float, Device::Cpu));
    let x: Vec<f64> = Vec::<f32>::try_from(input.view([-1]))
        .unwrap()
        .into_iter()
        .map(f64::from)
        .collect();
    for (roi, overlap) in [([5i64, 4, 6], 0.25), ([6, 9, 3], 0.6)] {
        for mode in [BlendMode::Constant, BlendMode::Gaussian] {
            let s = settings(&roi, overlap, mode, 2);
            let out = stitch(&input, &s, &mut |w| Ok(window_means(w)));
            assert_eq!(out.size(), [2, 13, 9, 10]);
            let want = slow_blend(&x, size, roi, overlap, mode == BlendMode::Gaussian);
            for channel in 0..2i64 {
                let got = Vec::<f32>::try_from(out.get(channel).view([-1])).unwrap();
                for (v, (g, w)) in got.iter().zip(&want).enumerate() {
                    let w = w * (channel + 1) as f64;
                    assert!(
                        (f64::from(*g) - w).abs() < 1e-5,
                        "{roi:?} {overlap} {mode} channel {channel} voxel {v}: {g} vs {w}"
                    );
                }
            }
        }
    }
}

type Forward<'a> = dyn Fn(&Tensor) -> Tensor + 'a;

/// A pointwise model followed by `zoom` (2: nearest upsampling; 0.5: 2×2 average pooling): as
/// MONAI scales outputs of another size than the window, the stitched output is the direct
/// forward's, for inputs larger and smaller (padded, then cropped) than the window.
#[test]
fn outputs_of_another_size_than_the_window_stitch_to_the_direct_forward() {
    tch::manual_seed(3);
    let w = Tensor::randn([3, 2, 1, 1], (Kind::Float, Device::Cpu));
    let pointwise = |x: &Tensor| {
        x.conv2d(&w, None::<Tensor>, [1, 1], [0, 0], [1, 1], 1)
            .tanh()
    };
    let up = |x: &Tensor| {
        let size = x.size();
        pointwise(x).upsample_nearest2d([2 * size[2], 2 * size[3]], None, None)
    };
    let down = |x: &Tensor| pointwise(x).avg_pool2d([2, 2], [2, 2], [0, 0], false, true, None);
    let models: [(&str, &Forward<'_>); 2] = [("up", &up), ("down", &down)];
    // Window starts on even positions (overlap 0.5 of 8), so pooling is aligned everywhere.
    for (spatial, roi) in [([12i64, 16], [8i64, 8]), ([4, 6], [8, 8])] {
        let input = Tensor::randn([2, spatial[0], spatial[1]], (Kind::Float, Device::Cpu));
        for (name, model) in models {
            let direct = model(&input.unsqueeze(0)).squeeze_dim(0);
            let s = SlidingWindow {
                padding_mode: PadMode::Replicate,
                ..settings(&roi, 0.5, BlendMode::Gaussian, 3)
            };
            let out = stitch(&input, &s, &mut |w| Ok(model(w)));
            if spatial[0] < roi[0] && name == "down" {
                // Pooling mixes the padding into the edge: only the shape can be compared. The
                // padding (2, 2) and (1, 1) is cropped as MONAI crops it, rounding half to even:
                // rows round(1) to round(3), columns round(0.5) = 0 to round(3.5) = 4.
                assert_eq!(out.size(), [3, 2, 4], "{name} {spatial:?}");
                continue;
            }
            assert!(max_diff(&out, &direct) < 1e-5, "{name} {spatial:?}");
        }
    }
}

#[test]
fn outputs_that_do_not_land_evenly_or_change_size_are_named_errors() {
    // A zoom of 0.7: the window starting at 80 would land on int(56.000…01) = 56 to
    // int(62.999…) = 62, six voxels, not seven.
    let input = Tensor::rand([1, 90, 10], (Kind::Float, Device::Cpu));
    let s = settings(&[10], 0.2, BlendMode::Constant, 4);
    let e = run(&input, &s, Device::Cpu, Device::Cpu, &mut |w| {
        Ok(w.narrow(2, 0, 7).narrow(3, 0, 7))
    })
    .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("starting at 80") && text.contains("infer.sliding_window.roi"),
        "{e}"
    );
    let input = Tensor::rand([1, 8, 8], (Kind::Float, Device::Cpu));
    let s = settings(&[4], 0.25, BlendMode::Constant, 2);
    let e = run(&input, &s, Device::Cpu, Device::Cpu, &mut |w| {
        Ok(w.sum_dim_intlist(2, false, Kind::Float))
    })
    .unwrap_err();
    assert!(
        e.to_string().contains("[windows, channels, *spatial]"),
        "{e}"
    );
    let mut calls = 0;
    let e = run(&input, &s, Device::Cpu, Device::Cpu, &mut |w| {
        calls += 1;
        Ok(if calls == 1 {
            w.shallow_clone()
        } else {
            w.narrow(2, 0, 2)
        })
    })
    .unwrap_err();
    assert!(e.to_string().contains("one size per window"), "{e}");
    let e = run(
        &Tensor::rand([8], (Kind::Float, Device::Cpu)),
        &s,
        Device::Cpu,
        Device::Cpu,
        &mut |w| Ok(w.shallow_clone()),
    )
    .unwrap_err();
    assert!(e.to_string().contains("[channels, *spatial]"), "{e}");
}

/// `performance.channels_last` on 3-D windows: the model gets them channels-last-3d and a
/// 3-D convolution gives the contiguous windows' outputs.
#[test]
fn channels_last_3d_windows_give_the_contiguous_outputs() {
    tch::manual_seed(2);
    let weight = Tensor::randn([4, 2, 3, 3, 3], (Kind::Float, Device::Cpu)) * 0.3;
    let input = Tensor::randn([2, 11, 9, 10], (Kind::Float, Device::Cpu));
    let mut outputs = vec![];
    for channels_last in [false, true] {
        let s = SlidingWindow {
            channels_last,
            ..settings(&[6, 5, 7], 0.5, BlendMode::Gaussian, 3)
        };
        let out = stitch(&input, &s, &mut |w| {
            let laid_out = kiln_torch_ext::layout::is_channels_last(w).unwrap();
            assert_eq!(laid_out, channels_last);
            Ok(w.conv3d(&weight, None::<Tensor>, [1; 3], [1; 3], [1; 3], 1))
        });
        outputs.push(out);
    }
    assert!(max_diff(&outputs[0], &outputs[1]) < 1e-5);
}

/// A 3-D convolution whose weight can be re-laid out, as a loaded model's can.
struct Conv {
    weight: Tensor,
    relayable: bool,
    /// Each forward's weight layout: channels-last or not.
    seen: Vec<bool>,
}

impl kiln_infer::volume::WindowModel for Conv {
    fn description(&self) -> &str {
        "a 3-D convolution"
    }
    fn device(&self) -> Device {
        Device::Cpu
    }
    fn kind(&self) -> Kind {
        Kind::Float
    }
    fn forward(&mut self, w: &Tensor) -> Result<Tensor, InferError> {
        let laid_out = kiln_torch_ext::layout::is_channels_last(&self.weight)?;
        self.seen.push(laid_out);
        Ok(w.f_conv3d(&self.weight, None::<Tensor>, [1; 3], [1; 3], [1; 3], 1)?)
    }
    fn set_channels_last(&mut self, on: bool) -> Result<bool, InferError> {
        if self.relayable {
            self.weight = match on {
                true => kiln_torch_ext::layout::to_channels_last(&self.weight)?,
                false => self.weight.f_contiguous()?,
            };
        }
        Ok(self.relayable)
    }
}

/// A two-channel volume `[2, 13, 11, 12]` in `dir` (two channels: a weight of one input channel
/// is channels-last and contiguous at once, so a one-channel test could not tell them apart).
fn two_channel_volume(dir: &std::path::Path) -> std::path::PathBuf {
    let input = dir.join("volume.npy");
    let values = Tensor::randn([2, 13, 11, 12], (Kind::Float, Device::Cpu));
    let bytes: Vec<u8> = Vec::<f32>::try_from(values.flatten(0, -1))
        .unwrap()
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    kiln_data::write_npy(&input, kiln_data::DType::F32, &[2, 13, 11, 12], &bytes).unwrap();
    input
}

/// `input` through `model` with `layout`, written to `out`: the report and the scores.
fn slide_conv(
    model: &mut Conv,
    input: &std::path::Path,
    layout: kiln_infer::sliding::Layout,
    out: &std::path::Path,
) -> (kiln_infer::volume::VolumeReport, Vec<f32>) {
    use kiln_infer::volume::{VolumeOutput, VolumeValues, infer_volume};
    let s = SlidingWindow {
        layout,
        ..settings(&[8, 6, 7], 0.25, BlendMode::Gaussian, 2)
    };
    let output = VolumeOutput {
        path: Some(out),
        device: kiln_config::OutputDevice::Cpu,
        device_memory: None,
        values: VolumeValues::Scores,
    };
    let report = infer_volume(model, input, &s, output).unwrap();
    let bytes = std::fs::read(out).unwrap();
    (report, kiln_data::NpyArray::parse(&bytes).unwrap().to_f32())
}

/// Whether every forward of `model` after its first `skip` ran in the layout `report` kept.
fn ran_as_reported(model: &Conv, report: &kiln_infer::volume::VolumeReport, skip: usize) {
    let kept = report.layout == "channels-last";
    assert!(model.seen.len() > skip, "{:?}", model.seen);
    assert!(
        model.seen[skip..].iter().all(|&cl| cl == kept),
        "{:?}",
        model.seen
    );
}

/// Without `performance.channels_last` set, kiln times a batch of windows in both layouts on
/// the trial, keeps the faster for every batch after it, says so in the report, and writes what
/// the contiguous run writes; a model that cannot be re-laid runs contiguous, unmeasured.
#[test]
fn the_measured_layout_is_kept_for_the_run_and_changes_no_output() {
    use kiln_infer::sliding::Layout;
    tch::manual_seed(3);
    let tmp = tempfile::tempdir().unwrap();
    let input = two_channel_volume(tmp.path());
    let weight = Tensor::randn([3, 2, 3, 3, 3], (Kind::Float, Device::Cpu)) * 0.3;
    let mut outputs = vec![];
    for (measure, relayable) in [(false, true), (true, true), (true, false)] {
        let layout = match measure {
            true => Layout::Measured { cache: None },
            false => Layout::AsSet,
        };
        let mut model = Conv {
            weight: weight.copy(),
            relayable,
            seen: vec![],
        };
        let out = tmp.path().join(format!("out-{measure}-{relayable}.npy"));
        let (report, scores) = slide_conv(&mut model, &input, layout, &out);
        let measured = report.layout_measured;
        assert_eq!(measured.is_some(), measure && relayable);
        assert!(measured.is_none_or(|t| !t.cached));
        let kept = report.layout == "channels-last";
        assert_eq!(kept, measured.is_some_and(|t| t.channels_last()));
        // The trial window, then (measuring) one batch in each layout.
        ran_as_reported(&model, &report, if measured.is_some() { 3 } else { 1 });
        outputs.push(scores);
    }
    for other in &outputs[1..] {
        let diff = outputs[0]
            .iter()
            .zip(other)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(diff < 1e-5, "{diff}");
    }
}

/// A measured layout is kept in kiln's cache under the model's identity: the next run of the
/// same model takes it without measuring (its report says so), another model measures anew.
#[test]
fn a_measured_layout_is_cached_per_model() {
    use kiln_infer::sliding::{Layout, LayoutCache};
    tch::manual_seed(4);
    let tmp = tempfile::tempdir().unwrap();
    let input = two_channel_volume(tmp.path());
    let weight = Tensor::randn([3, 2, 3, 3, 3], (Kind::Float, Device::Cpu)) * 0.3;
    let layout = |model: &str| Layout::Measured {
        cache: Some(LayoutCache {
            dir: tmp.path().join("cache"),
            model: model.to_owned(),
        }),
    };
    let mut runs = vec![];
    for (i, id) in ["conv a", "conv a", "conv b"].into_iter().enumerate() {
        let mut model = Conv {
            weight: weight.copy(),
            relayable: true,
            seen: vec![],
        };
        let out = tmp.path().join(format!("out-{i}.npy"));
        let (report, _) = slide_conv(&mut model, &input, layout(id), &out);
        let times = report.layout_measured.expect("measured or cached");
        // Measuring runs the trial window and a batch in each layout; a cached answer only
        // the trial window.
        ran_as_reported(&model, &report, if times.cached { 1 } else { 3 });
        runs.push((times, report.layout));
    }
    assert_eq!(
        runs.iter().map(|(t, _)| t.cached).collect::<Vec<_>>(),
        [false, true, false]
    );
    assert_eq!(runs[1].0.contiguous_ms, runs[0].0.contiguous_ms);
    assert_eq!(runs[1].1, runs[0].1);
    assert!(tmp.path().join("cache/layout-choice.json").is_file());
}
