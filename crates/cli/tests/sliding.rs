//! `kiln infer --sliding-window`: against MONAI's `sliding_window_inference` (pinned with the
//! bench peers) on the same TorchScript segmenters, inputs and settings, 2-D and 3-D, constant
//! and Gaussian blending, padded inputs, outputs half and twice the window's size; the class
//! map and the probabilities; and the settings refused before the input is read.

mod common;

use std::path::Path;

use common::{kiln, kiln_with_env, python, stderr, stdout};
use kiln_data::{DType, NpyArray};
use serde_json::{Value, json};

fn read_npy(path: &Path) -> (DType, Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap();
    let a = NpyArray::parse(&bytes).unwrap();
    (a.dtype, a.shape.clone(), a.to_f32())
}

/// `kiln infer --sliding-window` of `model` over `input` into `output`, on the CPU in fp32,
/// with `sets` (`key=value`) and `extra` arguments.
fn sliding(
    model: &Path,
    input: &Path,
    output: &Path,
    sets: &[String],
    extra: &[&str],
) -> std::process::Output {
    let mut args: Vec<String> = [
        "infer",
        "--sliding-window",
        "--device",
        "cpu",
        "--precision",
        "fp32",
    ]
    .map(str::to_owned)
    .to_vec();
    args.extend(["--model".into(), model.display().to_string()]);
    args.extend(["--inputs".into(), input.display().to_string()]);
    args.extend(["--output".into(), output.display().to_string()]);
    for s in sets {
        args.extend(["--set".into(), s.clone()]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    kiln(&refs)
}

#[test]
#[ignore = "needs Python with torch 2.11 (KILN_PYTHON) and the bench peers' MONAI \
            (KILN_BENCH_PEERS); `cargo xtask test` runs it"]
fn sliding_windows_give_monai_outputs_with_python_torch() {
    let Some(peers) = std::env::var_os("KILN_BENCH_PEERS") else {
        panic!(
            "KILN_BENCH_PEERS names the installed bench peers (MONAI): `cargo xtask test` sets it"
        );
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/sliding_monai.py");
    let o = std::process::Command::new(python())
        .arg(&script)
        .arg(dir)
        .env("PYTHONPATH", peers)
        .output()
        .unwrap();
    assert!(o.status.success(), "sliding_monai.py: {}", stderr(&o));
    let cases: Value =
        serde_json::from_slice(&std::fs::read(dir.join("cases.json")).unwrap()).unwrap();
    for (name, case) in cases
        .as_object()
        .unwrap()
        .iter()
        .filter(|(n, _)| !n.starts_with('_'))
    {
        let dims = case["dims"].as_u64().unwrap();
        let sets: Vec<String> = case
            .as_object()
            .unwrap()
            .iter()
            .filter(|(k, _)| k.starts_with("infer."))
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap()))
            .collect();
        let model = dir.join(format!("{}.pt", case["model"].as_str().unwrap()));
        let input = dir.join(format!("volume{dims}d.npy"));
        let ours = dir.join(format!("kiln-{name}.npy"));
        let o = sliding(&model, &input, &ours, &sets, &[]);
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        let (dtype, shape, got) = read_npy(&ours);
        let (_, want_shape, want) = read_npy(&dir.join(format!("monai-{name}.npy")));
        assert_eq!((dtype, &shape), (DType::F32, &want_shape), "{name}");
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            worst < 1e-5,
            "{name}: largest |kiln − MONAI| {worst:e} ({})",
            cases["_monai"]
        );
        if name == "gaussian-3d" {
            // The same input as an OME-TIFF stack, the scores written as one.
            let (_, vshape, volume) = read_npy(&input);
            let tif = dir.join("volume.tif");
            let bytes: Vec<u8> = volume.iter().flat_map(|v| v.to_ne_bytes()).collect();
            kiln_data::tiff_stack::write_stack(&tif, DType::F32, vshape[0], &vshape[1..], &bytes)
                .unwrap();
            let scores = dir.join("scores.tif");
            let o = sliding(&model, &tif, &scores, &sets, &[]);
            assert!(o.status.success(), "{}", stderr(&o));
            let (tshape, tvalues) = kiln_data::tiff_stack::read_stack(&scores).unwrap();
            assert_eq!(tshape, shape);
            let worst = tvalues
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst < 1e-5, "TIFF in and out: {worst:e}");
            // The class map: MONAI's scores' arg-max, one byte per voxel.
            let map = dir.join("classes.npy");
            let o = sliding(
                &model,
                &input,
                &map,
                &sets,
                &["--class-map", "--format", "json"],
            );
            assert!(o.status.success(), "{}", stderr(&o));
            let report: Value = serde_json::from_str(&stdout(&o)).unwrap();
            assert_eq!(report["output_dtype"], "u8", "{report}");
            let (dtype, map_shape, classes) = read_npy(&map);
            assert_eq!((dtype, &map_shape[..]), (DType::U8, &shape[1..]));
            let voxels = classes.len();
            for (v, &c) in classes.iter().enumerate() {
                let scores: Vec<f32> = (0..shape[0]).map(|k| want[k * voxels + v]).collect();
                let best = scores[c as usize];
                assert!(
                    scores.iter().all(|&s| s <= best + 1e-5),
                    "voxel {v}: {scores:?} → {c}"
                );
            }
            // The probabilities: the softmax over MONAI's scores' channels, voxel by voxel.
            let probs = dir.join("probabilities.npy");
            let o = sliding(&model, &input, &probs, &sets, &["--probabilities"]);
            assert!(o.status.success(), "{}", stderr(&o));
            let (dtype, p_shape, p) = read_npy(&probs);
            assert_eq!((dtype, &p_shape), (DType::F32, &shape));
            for v in 0..voxels {
                let scores: Vec<f64> = (0..shape[0])
                    .map(|k| f64::from(want[k * voxels + v]))
                    .collect();
                let total: f64 = scores.iter().map(|s| s.exp()).sum();
                for (k, s) in scores.iter().enumerate() {
                    let got = f64::from(p[k * voxels + v]);
                    assert!(
                        (got - s.exp() / total).abs() < 1e-5,
                        "voxel {v} class {k}: {got}"
                    );
                }
            }
            let both = sliding(
                &model,
                &input,
                &dir.join("both.npy"),
                &sets,
                &["--probabilities", "--class-map"],
            );
            assert!(!both.status.success() && stderr(&both).contains("cannot be used with"));
        }
    }
}

/// Written with a valid header but no data: what fails first must be the settings.
fn header_only_volume(path: &Path, shape: &[usize]) {
    std::fs::write(path, kiln_data::npy_header(DType::F32, shape).unwrap()).unwrap();
}

#[test]
fn bad_settings_are_refused_before_the_input_is_read() {
    let tmp = tempfile::tempdir().unwrap();
    let volume = tmp.path().join("volume.npy");
    header_only_volume(&volume, &[1, 40, 30, 20]);
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v1-run");
    let out = tmp.path().join("out.npy");
    let refused = |sets: &[&str], extra: &[&str], want: &str| {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        let o = sliding(&model, &volume, &out, &sets, extra);
        assert_eq!(o.status.code(), Some(1), "{sets:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{sets:?}: {}", stderr(&o));
        assert!(!out.exists(), "nothing written");
    };
    // The model (an MLP of 64 features) cannot take a window: one trial window says so.
    refused(
        &["infer.sliding_window.roi=16"],
        &[],
        "cannot take a window [1, 1, 16, 16, 16]",
    );
    let o = sliding(&model, &volume, &out, &[], &[]);
    assert!(
        !stderr(&o).contains("Exception raised from"),
        "no C++ stack: {}",
        stderr(&o)
    );
    refused(
        &["infer.sliding_window.roi=16,16"],
        &[],
        "has 2 sizes; the input has 3 spatial",
    );
    refused(
        &["infer.sliding_window.overlap=1"],
        &[],
        "`infer.sliding_window.overlap`",
    );
    refused(
        &["infer.sliding_window.mode=smooth"],
        &[],
        "constant or gaussian",
    );
    let reflect = [
        "infer.sliding_window.roi=128,16,16",
        "infer.sliding_window.padding_mode=reflect",
    ];
    refused(
        &reflect,
        &[],
        "padding_mode = reflect cannot pad the input [40, 30, 20]",
    );
    let circular = [
        "infer.sliding_window.roi=16,16,64",
        "infer.sliding_window.padding_mode=circular",
    ];
    refused(
        &circular,
        &[],
        "padding_mode = circular cannot pad the input [40, 30, 20]",
    );
    // Inputs other than [C, *spatial] with 2 or 3 spatial dimensions, and outputs but .npy.
    header_only_volume(&volume, &[40, 30]);
    refused(
        &[],
        &[],
        "[channels, *spatial] with 2 or 3 spatial dimensions",
    );
    let csv = tmp.path().join("out.csv");
    let o = sliding(&model, &volume, &csv, &[], &[]);
    assert!(
        stderr(&o).contains("name a .npy, .tif or .tiff file"),
        "{}",
        stderr(&o)
    );
    let o = kiln(&[
        "infer",
        "--model",
        "m.pt",
        "--inputs",
        "v.npy",
        "--class-map",
    ]);
    assert!(
        !o.status.success() && stderr(&o).contains("--sliding-window"),
        "{}",
        stderr(&o)
    );
}

/// The segmenter's path from the two commands' world: `kiln train --model unet3d` on its
/// synthetic 32³ volumes, then `kiln infer --sliding-window` of the run on a larger volume of
/// odd sides: blended scores of every class per voxel, and the class map as their arg-max.
/// A run of `kiln train --model unet3d` (small: two levels of 4 and 8 channels, one epoch of 40
/// volumes) under `dir`.
fn trained_unet3d(dir: &Path) -> std::path::PathBuf {
    let runs = dir.join("runs");
    let o = kiln(&[
        "train",
        "--model",
        "unet3d",
        "--device",
        "cpu",
        "--precision",
        "fp32",
        "--run-name",
        "seg",
        "--set",
        "model.channels=4,8",
        "--set",
        "data.synthetic_samples=40",
        "--set",
        "train.epochs=1",
        "--set",
        &format!("run.output_dir={}", runs.display()),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::read_dir(&runs)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
}

/// A `[1, d, h, w]` f32 volume of a fixed pattern at `path`.
fn pattern_volume(path: &Path, (d, h, w): (usize, usize, usize)) {
    let values: Vec<f32> = (0..d * h * w)
        .map(|i| ((i * 7919) % 13) as f32 / 6.0 - 1.0)
        .collect();
    let bytes = kiln_data::npy_f32_bytes(&[1, d, h, w], &values).unwrap();
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_trained_unet3d_segments_a_larger_volume_by_sliding_windows() {
    let tmp = tempfile::tempdir().unwrap();
    let run = trained_unet3d(tmp.path());
    let volume = tmp.path().join("volume.npy");
    let (d, h, w) = (40usize, 36, 44);
    pattern_volume(&volume, (d, h, w));
    let roi = "infer.sliding_window.roi=32".to_owned();
    let scores = tmp.path().join("scores.npy");
    let o = sliding(&run, &volume, &scores, std::slice::from_ref(&roi), &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (dtype, shape, s) = read_npy(&scores);
    assert_eq!((dtype, shape), (DType::F32, vec![2, d, h, w]));
    assert!(s.iter().all(|v| v.is_finite()));
    let map = tmp.path().join("map.npy");
    let o = sliding(&run, &volume, &map, &[roi], &["--class-map"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (dtype, shape, m) = read_npy(&map);
    assert_eq!((dtype, shape), (DType::U8, vec![d, h, w]));
    let voxels = d * h * w;
    for (i, class) in m.iter().enumerate() {
        let expected = if s[voxels + i] > s[i] { 1.0 } else { 0.0 };
        assert!(*class == expected || s[voxels + i] == s[i], "voxel {i}");
    }
    layout_is_measured_once_or_as_set(&run, &volume, tmp.path());
}

/// The layout of `run`'s windows over `volume`: measured by the first run and cached under the
/// weights' digest for the next, or as `performance.channels_last` says when the user sets it.
fn layout_is_measured_once_or_as_set(run: &Path, volume: &Path, tmp: &Path) {
    let cache = tmp.join("cache");
    let report = |name: &str, sets: &[&str]| -> Value {
        let out = tmp.join(name);
        let mut args = vec![
            "infer",
            "--sliding-window",
            "--device",
            "cpu",
            "--format",
            "json",
        ];
        args.extend(["--set", "infer.sliding_window.roi=32"]);
        for set in sets {
            args.extend(["--set", set]);
        }
        let (run, volume, out) = (run.to_str(), volume.to_str(), out.to_str());
        args.extend(["--model", run.unwrap(), "--inputs", volume.unwrap()]);
        args.extend(["--output", out.unwrap(), "--precision", "fp32"]);
        let o = kiln_with_env(&args, &[("KILN_CACHE_DIR", cache.to_str().unwrap())]);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_str(&stdout(&o)).unwrap()
    };
    let first = report("first.npy", &[]);
    let second = report("second.npy", &[]);
    for (r, cached) in [(&first, false), (&second, true)] {
        let times = &r["layout_measured"];
        assert_eq!(times["cached"], cached, "{r}");
        let faster = times["channels_last_ms"].as_f64() < times["contiguous_ms"].as_f64();
        assert!(faster || r["layout"] == "contiguous", "{r}");
    }
    assert_eq!(first["layout"], second["layout"]);
    for (on, layout) in [("true", "channels-last"), ("false", "contiguous")] {
        let set = format!("performance.channels_last={on}");
        let r = report(&format!("set-{on}.npy"), &[&set]);
        assert_eq!(
            (&r["layout"], &r["layout_measured"]),
            (&json!(layout), &Value::Null)
        );
    }
}

/// The same U-Net exported to ONNX runs by sliding windows in ONNX Runtime with the checkpoint's
/// blended scores; a window the file's fixed input does not take is refused, naming it.
#[test]
#[ignore = "needs Python with torch 2.11 and the ONNX export packages (KILN_PYTHON, \
            KILN_ONNX_PYTHONPATH); `cargo xtask test` runs it"]
fn an_onnx_unet3d_slides_as_its_checkpoint_with_python_torch() {
    let tmp = tempfile::tempdir().unwrap();
    let run = trained_unet3d(tmp.path());
    let onnx = tmp.path().join("unet.onnx");
    let o = kiln(&[
        "export",
        "--model",
        run.to_str().unwrap(),
        "--out",
        onnx.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let volume = tmp.path().join("volume.npy");
    pattern_volume(&volume, (40, 36, 44));
    let sets = ["infer.sliding_window.roi=32".to_owned()];
    let scores = |model: &Path, name: &str| {
        let out = tmp.path().join(name);
        let o = sliding(model, &volume, &out, &sets, &["--format", "json"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let report: Value = serde_json::from_str(&stdout(&o)).unwrap();
        (read_npy(&out).2, report)
    };
    let (ours, _) = scores(&run, "ckpt.npy");
    let (ort, report) = scores(&onnx, "onnx.npy");
    assert_eq!(ours.len(), ort.len());
    let gap = ours
        .iter()
        .zip(&ort)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(gap < 1e-4, "onnxruntime's stitched scores differ by {gap}");
    assert!(report["model"].as_str().unwrap().contains("ONNX model"));

    let o = sliding(
        &onnx,
        &volume,
        &tmp.path().join("refused.npy"),
        &["infer.sliding_window.roi=16".to_owned()],
        &[],
    );
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(
        err.contains("infer.sliding_window.roi gives windows [1, 16, 16, 16]"),
        "{err}"
    );
    assert!(!tmp.path().join("refused.npy").exists());
}
