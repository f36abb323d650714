//! A model as PyTorch ships it now, a `torch.export` program saved by the test as a user saves
//! it, trained through kiln's compiled step: per-parameter gradients and batch-norm statistics
//! against PyTorch eager's (an MLP, an attention block with `scaled_dot_product_attention`, a
//! conv net with batch norm), `kiln train` step by step against an eager loop, bf16 learning
//! against eager bf16, exact resume with dropout, a model TorchScript rejects, and the errors.
//! Compiles take tens of seconds on 2 cores: the programs are small and share kiln's cache.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use common::own_data::{
    assert_same_losses, checkpoint, floats, made_once, max_abs_diff, prepare, shape_of, train,
    train_args, values_of,
};
use common::{only_run, python, stderr, step_losses};
use kiln_config::AttentionKernel;
use kiln_train::loss::Loss;
use kiln_train::model::{InputSpec, Model};
use kiln_train::program::compile::AttentionChoice;
use kiln_train::program::{ProgramModel, ProgramSpec};
use serde_json::Value;
use tch::{Kind, Tensor, nn};

/// The directory of the models `programs.py` saves, made once for every test here, and
/// PyTorch's reference values.
fn made_programs() -> (PathBuf, Value) {
    static MADE: OnceLock<(PathBuf, Value)> = OnceLock::new();
    MADE.get_or_init(|| made_once("programs.py")).clone()
}

fn tensor(t: &Value, kind: Kind) -> Tensor {
    let shape: Vec<i64> = shape_of(t).iter().map(|&d| d as i64).collect();
    Tensor::from_slice(&values_of(t))
        .to_kind(kind)
        .reshape(shape)
}

/// ‖a − b‖ / ‖b‖ (absolute where b is all but zero).
fn relative(a: &Tensor, b: &Tensor) -> f64 {
    let diff = (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .norm()
        .double_value(&[]);
    let norm = b.to_kind(Kind::Double).norm().double_value(&[]);
    if norm < 1e-8 { diff } else { diff / norm }
}

/// Samples shaped as `x`'s, labelled with 3 classes.
fn input_of(x: &Tensor) -> InputSpec {
    InputSpec {
        sample_shape: x.size()[1..].iter().map(|&d| d as usize).collect(),
        classes: 3,
        target: Some(kiln_data::TargetSpec::label(3)),
        integer_features: false,
        arrays: vec![],
    }
}

/// The program at `path` for cross-entropy in fp32 on the CPU, its attention through
/// `attention`.
fn spec(path: &Path, attention: AttentionKernel) -> ProgramSpec<'_> {
    ProgramSpec {
        path,
        loss: Loss::CrossEntropy,
        precision: kiln_device::settings::AmpDtype::None,
        output: None,
        freeze: None,
        attention,
        threads: kiln_torch_ext::memory::num_threads().unwrap().0,
        batch: None,
    }
}

/// Inference of `program` (fp32, CPU) through the eval forward its train compile at the case's
/// batch made, and at a batch of 8 outside that forward's range (`low` its lowest size) through
/// one compiled for it: the two agree on the samples they share.
fn infers_outside_the_eval_range(dir: &Path, program: &str, case: &Value, low: u64) {
    let x = tensor(&case["x"], Kind::Float);
    let path = dir.join(program);
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let spec = spec(&path, AttentionKernel::Auto);
    let model = ProgramModel::load_eval(&spec, &input_of(&x), &vs).unwrap();
    let m = &model.compiled().manifest;
    assert!(!m.gradients.is_empty(), "found beside the train step");
    assert_eq!(m.batch_range.eval.map(|r| r.0), Some(low), "{m:?}");
    let all = model.forward(&x, false).unwrap();
    let few = model.forward(&x.narrow(0, 0, 8), false).unwrap();
    let diff = (all.narrow(0, 0, 8) - few).abs().max().double_value(&[]);
    assert!(
        diff < 1e-5,
        "{program}: batches of 8 and {} differ by {diff}",
        x.size()[0]
    );
}

/// One compiled step of `program` on the case's batch, its attention through `attention`; each
/// parameter's gradient and buffer against PyTorch eager's. Returns the compile's choice of
/// attention kernel.
fn check_gradients(
    dir: &Path,
    program: &str,
    case: &Value,
    attention: AttentionKernel,
) -> AttentionChoice {
    let x = tensor(&case["x"], Kind::Float);
    let y = tensor(&case["y"], Kind::Int64);
    let path = dir.join(program);
    let spec = ProgramSpec {
        batch: Some(x.size()[0] as u64),
        ..spec(&path, attention)
    };
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let model = ProgramModel::load(&spec, &input_of(&x), &vs).unwrap();
    let choice = model.compiled().manifest.attention.clone().unwrap();
    let step = Model::compiled_step(&model).unwrap();
    let batch = kiln_train::inputs::Inputs::features(x.shallow_clone());
    let (loss, output) = step.step(&batch, &y, 1.0, None).unwrap();
    assert_eq!(loss.size(), Vec::<i64>::new());
    assert_eq!(output.size(), [x.size()[0], 3]);
    let vars = vs.variables();
    let grads = case["gradients"].as_object().unwrap();
    assert_eq!(
        grads.len(),
        vs.trainable_variables().len(),
        "{program}: parameter count"
    );
    for (name, want) in grads {
        let ours = vars[name].grad();
        let err = relative(&ours, &tensor(want, Kind::Float));
        assert!(
            err <= 1e-5,
            "{program}: {name} gradient off by {err:e} (relative)"
        );
    }
    for (name, want) in case["buffers"].as_object().into_iter().flatten() {
        let err = relative(&vars[name], &tensor(want, Kind::Float));
        assert!(err <= 1e-5, "{program}: buffer {name} off by {err:e}");
    }
    choice
}

#[test]
#[ignore = "needs Python with torch 2.11 (KILN_PYTHON) and a C++ compiler; `cargo xtask test` runs it"]
fn compiled_steps_give_eager_gradients_and_batch_norm_statistics_with_python_torch() {
    let (programs, reference) = made_programs();
    let auto = AttentionKernel::Auto;
    let mlp = check_gradients(&programs, "mlp.pt2", &reference["mlp"], auto);
    assert_eq!(
        (mlp.kernel.as_str(), mlp.chosen_by.as_str()),
        ("fused", "no fused attention in the program")
    );
    // model.attention = auto times both kernels on the program's attention calls; the kernel
    // it did not choose is checked too, set explicitly.
    let attention = &reference["attention"];
    let chosen = check_gradients(&programs, "attention.pt2", attention, auto);
    assert_eq!(chosen.chosen_by, "measured", "{chosen:?}");
    assert!(chosen.fused_ms.unwrap() > 0.0 && chosen.math_ms.unwrap() > 0.0);
    let other = match chosen.kernel.as_str() {
        "math" => AttentionKernel::Fused,
        "fused" => AttentionKernel::Math,
        kernel => panic!("auto chose the attention kernel {kernel:?}"),
    };
    let set = check_gradients(&programs, "attention.pt2", attention, other);
    assert_eq!(
        (set.kernel.as_str(), set.chosen_by.as_str()),
        (other.as_str(), "model.attention")
    );
    check_gradients(&programs, "convbn.pt2", &reference["convbn"], auto);
    // Traced at its 24 samples, the conv net's packages take 16 or more.
    infers_outside_the_eval_range(&programs, "convbn.pt2", &reference["convbn"], 16);
}

/// The model files of a run's newest checkpoint.
fn files(ckpt: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(ckpt)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
#[ignore = "needs Python with torch 2.11 (KILN_PYTHON) and a C++ compiler; `cargo xtask test` runs it"]
fn a_program_trains_as_pytorch_eager_and_resumes_exactly_with_python_torch() {
    let tmp = tempfile::tempdir().unwrap();
    let (programs, reference) = made_programs();
    let case = &reference["mlp"];
    let data = prepare(tmp.path(), "classify", &case["x"], &case["y"], true);

    // 20 full-batch steps from the program's own weights: PyTorch eager's losses.
    let runs = tmp.path().join("runs");
    let o = train(
        &programs.join("mlp.pt2"),
        &data,
        &runs,
        64,
        &["--epochs", "20"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let run = only_run(&runs);
    let ours = step_losses(&run);
    assert_eq!(ours.len(), 20);
    assert_same_losses(&ours, &case["losses"], 1e-4);
    // Two ranks of 32 (kiln's own launcher, c10d/Gloo): the compiled step's gradients are
    // averaged after the step, and the run learns as one rank of 64 did.
    let ranks = tmp.path().join("ranks");
    let two = ["--epochs", "20", "--nproc-per-node", "2"];
    let o = train(&programs.join("mlp.pt2"), &data, &ranks, 32, &two);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("data-parallel: 2 ranks"),
        "{}",
        stderr(&o)
    );
    let shared = step_losses(&only_run(&ranks));
    assert_eq!(shared.len(), 20);
    for (step, (a, b)) in ours.iter().zip(&shared).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * a.abs(),
            "step {}: 1×64 {a} vs 2×32 {b}",
            step + 1
        );
    }

    // The checkpoint holds the weights under the program's names and the program itself.
    let ckpt = checkpoint(&run, 20);
    assert!(
        files(&ckpt).contains(&"model.pt2".to_owned()),
        "{:?}",
        files(&ckpt)
    );
    let weights = std::fs::read(ckpt.join("model.safetensors")).unwrap();
    let names = safetensors::SafeTensors::deserialize(&weights)
        .unwrap()
        .names()
        .len();
    assert_eq!(names, case["gradients"].as_object().unwrap().len());
    // Predicting compiles nothing: the eval forward compiled beside the step is found.
    let (said, trained) = infers_as_pytorch(tmp.path(), &ckpt, &case["x"]);
    assert!(
        said.contains("with the train step") && !said.contains("compiling"),
        "{said}"
    );
    exports_the_trained_program(tmp.path(), &ckpt, &trained);
    // The checkpoint's compiled step, timed as profile-model times a train step.
    let o = common::kiln(&[
        "profile-model",
        "--model",
        ckpt.to_str().unwrap(),
        "--mode",
        "train",
        "--precision",
        "fp32",
        "--batch-size",
        "16",
        "--iterations",
        "3",
        "--warmup",
        "1",
        "--device",
        "cpu",
    ]);
    let text = format!("{}{}", common::stdout(&o), stderr(&o));
    assert!(o.status.success(), "{text}");
    assert!(
        text.contains("exported-program checkpoint") && text.contains("train (forward, loss"),
        "{text}"
    );

    // With dropout on: resumed from step 10, the same step-20 weights and losses, bit for bit.
    let runs = tmp.path().join("dropout-runs");
    let model = programs.join("dropout.pt2");
    let o = train(&model, &data, &runs, 32, &["--epochs", "10"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let run = only_run(&runs);
    let first = step_losses(&run);
    let last = std::fs::read(checkpoint(&run, 20).join("model.safetensors")).unwrap();
    let ckpt = checkpoint(&run, 10);
    let resume = ["--epochs", "10", "--resume", ckpt.to_str().unwrap()];
    let o = train(&model, &data, &runs, 32, &resume);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        std::fs::read(checkpoint(&run, 20).join("model.safetensors")).unwrap() == last,
        "resumed weights differ"
    );
    assert_eq!(
        step_losses(&run),
        first,
        "the resumed run logs what the first one did"
    );
    exports_in_eval_mode(tmp.path(), &checkpoint(&run, 20), &case["x"]);
}

/// `kiln infer` on the program checkpoint `ckpt` (its eval forward, fp32) gives what PyTorch
/// computes with the program and the checkpoint's weights; what kiln said, and PyTorch's output.
fn infers_as_pytorch(dir: &Path, ckpt: &Path, x: &Value) -> (String, Value) {
    let (out, said) = kiln_infer(dir, ckpt, x);
    let weights = ckpt.join("model.safetensors");
    let theirs = pytorch_output(dir, &ckpt.join("model.pt2"), weights.to_str().unwrap());
    let diff = max_abs_diff(&out, &theirs);
    assert!(
        diff < 1e-5,
        "kiln infer vs PyTorch on the trained program: max |Δ| {diff}"
    );
    (said, theirs)
}

/// `kiln infer` (fp32, CPU) of `model` on the inputs `x`, which it writes to `dir/x.npy` and
/// `dir/x.json` (for [`pytorch_output`]); the path of its outputs, and what it said.
fn kiln_infer(dir: &Path, model: &Path, x: &Value) -> (PathBuf, String) {
    let (inputs, x_json, out) = (dir.join("x.npy"), dir.join("x.json"), dir.join("out.npy"));
    let xs: Vec<f32> = values_of(x).iter().map(|&v| v as f32).collect();
    let bytes = kiln_data::npy_f32_bytes(&shape_of(x), &xs).unwrap();
    std::fs::write(&inputs, bytes).unwrap();
    std::fs::write(&x_json, x.to_string()).unwrap();
    let o = infer_fp32(model, &inputs, &out, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    (out, stderr(&o))
}

/// `kiln infer` of `model` on the CPU in fp32 over `inputs` into `out` (removed first), with
/// `extra` arguments.
fn infer_fp32(model: &Path, inputs: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    let _ = std::fs::remove_file(out);
    let mut args = vec![
        "infer",
        "--model",
        model.to_str().unwrap(),
        "--inputs",
        inputs.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
        "--precision",
        "fp32",
        "--device",
        "cpu",
    ];
    args.extend(extra);
    common::kiln(&args)
}

/// `programs.py run` on each (program, weights) of `pairs` (weights a safetensors file, or "-"
/// for the program's own) and the inputs `dir/x.json`, in one Python: PyTorch's outputs (each
/// program as exported).
fn pytorch_outputs(dir: &Path, pairs: &[(&Path, &str)]) -> Vec<Value> {
    let out = dir.join("pytorch-output.json");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/programs.py");
    let mut cmd = Command::new(python());
    cmd.arg(&script)
        .arg("run")
        .arg(dir.join("x.json"))
        .arg(&out);
    for (program, weights) in pairs {
        cmd.arg(program).arg(weights);
    }
    let p = cmd.output().unwrap();
    assert!(p.status.success(), "{}", stderr(&p));
    serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap()
}

/// What `program` computes with `weights` on `dir/x.json` in PyTorch (see [`pytorch_outputs`]).
fn pytorch_output(dir: &Path, program: &Path, weights: &str) -> Value {
    pytorch_outputs(dir, &[(program, weights)]).remove(0)
}

/// `kiln export` of the program checkpoint `ckpt` with `extra` arguments.
fn export(ckpt: &Path, extra: &[&str]) -> std::process::Output {
    let args = [&["export", "--model", ckpt.to_str().unwrap()][..], extra].concat();
    common::kiln(&args)
}

/// `kiln export` of the program checkpoint `ckpt` (a program without dropout or batch norm,
/// whose modes agree): a `.pt2` in eval and in train mode that PyTorch loads and that computes
/// `trained` (what the program with the checkpoint's weights computes on `dir/x.json`), and
/// ONNX that ONNX Runtime runs as kiln does; never over an existing file, and never as
/// TorchScript.
fn exports_the_trained_program(dir: &Path, ckpt: &Path, trained: &Value) {
    let exported = [dir.join("trained.pt2"), dir.join("trained-train.pt2")];
    for (out, mode) in exported.iter().zip(["eval", "train"]) {
        let o = export(ckpt, &["--out", out.to_str().unwrap(), "--mode", mode]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(stderr(&o).contains("equal bit for bit"), "{}", stderr(&o));
    }
    let program = ckpt.join("model.pt2");
    let [untrained, eval, train]: [Value; 3] = pytorch_outputs(
        dir,
        &[(&program, "-"), (&exported[0], "-"), (&exported[1], "-")],
    )
    .try_into()
    .unwrap();
    assert_ne!(&untrained, trained, "training changed the weights");
    assert_eq!(&eval, trained, "the eval-mode export");
    assert_eq!(&train, trained, "the train-mode export");

    let onnx = dir.join("trained.onnx");
    let o = export(ckpt, &["--out", onnx.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("checked in onnxruntime"),
        "{}",
        stderr(&o)
    );
    engines_of_a_program(dir, ckpt, &onnx);

    let out = dir.join("trained.pt2");
    let before = std::fs::read(&out).unwrap();
    let o = export(ckpt, &["--out", out.to_str().unwrap()]);
    assert!(!o.status.success() && stderr(&o).contains("exists already"));
    assert_eq!(std::fs::read(&out).unwrap(), before, "nothing overwritten");
    let script = dir.join("trained.pt");
    let o = export(ckpt, &["--out", script.to_str().unwrap()]);
    assert!(!o.status.success() && stderr(&o).contains("--format program"));
    assert!(!script.exists());
}

/// `kiln infer` of the program checkpoint `ckpt` and its ONNX export `onnx`: `auto` measures
/// the compiled eval forward against ONNX Runtime, `compiled` runs the checkpoint, and
/// `libtorch` is refused for a program.
fn engines_of_a_program(dir: &Path, ckpt: &Path, onnx: &Path) {
    let infer = |model: &Path, engine: &str| {
        let out = dir.join(format!("engine-{engine}.npy"));
        infer_fp32(model, &dir.join("x.npy"), &out, &["--engine", engine])
    };
    let o = infer(onnx, "auto");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("onnxruntime vs compiled"),
        "{}",
        stderr(&o)
    );
    let o = infer(onnx, "compiled");
    assert!(o.status.success(), "{}", stderr(&o));
    let o = infer(ckpt, "libtorch");
    assert!(!o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("compiled (or auto)"), "{}", stderr(&o));
}

/// A program with dropout exported in eval mode: PyTorch's output is kiln's eval forward's.
fn exports_in_eval_mode(dir: &Path, ckpt: &Path, x: &Value) {
    let (ours, _) = kiln_infer(dir, ckpt, x);
    let out = dir.join("dropout-eval.pt2");
    let o = export(ckpt, &["--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let diff = max_abs_diff(&ours, &pytorch_output(dir, &out, "-"));
    assert!(
        diff < 1e-5,
        "the eval-mode export vs kiln infer: max |Δ| {diff}"
    );
}

#[test]
#[ignore = "needs Python with torch 2.11 (KILN_PYTHON) and a C++ compiler; `cargo xtask test` runs it"]
fn a_bf16_compiled_step_learns_as_eager_bf16_with_python_torch() {
    let tmp = tempfile::tempdir().unwrap();
    let (programs, reference) = made_programs();
    let case = &reference["bf16"];
    let data = prepare(tmp.path(), "bf16", &case["x"], &case["y"], true);
    let runs = tmp.path().join("runs");
    let args = ["--epochs", "40", "--set", "train.amp=bf16"];
    let o = train(&programs.join("mlp_bf16.pt2"), &data, &runs, 256, &args);
    assert!(o.status.success(), "{}", stderr(&o));
    let run = only_run(&runs);
    let ours = step_losses(&run);
    let theirs = floats(&case["losses"]);
    // bf16 gradients legitimately differ from eager's (Inductor rounds its fused kernels
    // otherwise): judged by learning, as the learning suite judges bf16.
    let (a, b) = (ours[39], theirs[39]);
    assert!(
        (a - b).abs() <= 0.02,
        "final loss: kiln {a} vs PyTorch eager bf16 {b}"
    );
    assert!(a < 0.6 * ours[0], "it learned: {ours:?}");
    // And on held-out data, both sides' weights predicting in fp32: accuracy within 2 points.
    let held_out = &case["held_out"];
    let ours = held_out_accuracy(tmp.path(), &checkpoint(&run, 40), held_out);
    let theirs = held_out["accuracy"].as_f64().unwrap();
    assert!(
        (ours - theirs).abs() <= 0.02,
        "held-out accuracy: kiln {ours} vs PyTorch eager bf16 {theirs}"
    );
}

/// The one cache entry under `cache`.
fn only_entry(cache: &Path) -> PathBuf {
    let entries: Vec<PathBuf> = std::fs::read_dir(cache)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("manifest.json").is_file())
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    entries[0].clone()
}

/// The cache entry a run's log says its packages came from.
fn cached_at(log: &str) -> PathBuf {
    let (_, rest) = log
        .split_once("compiled program: cached at ")
        .unwrap_or_else(|| panic!("no cache entry named in: {log}"));
    PathBuf::from(rest.split(" (").next().unwrap())
}

#[test]
#[ignore = "needs Python with torch 2.11 (KILN_PYTHON) and a C++ compiler; `cargo xtask test` runs it"]
fn packages_that_compute_otherwise_than_pytorch_are_refused_with_python_torch() {
    use kiln_train::program::check;
    use kiln_train::program::compile::{Manifest, Packages};
    let tmp = tempfile::tempdir().unwrap();
    let (programs, reference) = made_programs();
    let case = &reference["mlp"];
    let data = prepare(tmp.path(), "classify", &case["x"], &case["y"], true);
    let (program, runs) = (programs.join("mlp.pt2"), tmp.path().join("runs"));
    let args = |runs: &Path| train_args(&program, &data, runs, &["--set", "train.batch_size=16"]);
    let o = common::kiln_with_env(&args(&runs), &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    // The step as compiled (or found) in the shared cache, copied into a cache of this test's
    // own, where what is changed below is seen by no other test.
    let cache = tmp.path().join("cache");
    let shared = cached_at(&stderr(&o));
    common::copy_tree(&shared, &cache.join(shared.file_name().unwrap()));
    let env = [("KILN_COMPILE_CACHE", cache.to_str().unwrap())];
    let run = |runs: &Path| common::kiln_with_env(&args(runs), &env);
    // The compile was checked against eager PyTorch, and passed with its figures.
    let entry = only_entry(&cache);
    let kept = check::kept(&entry).expect("a verdict beside the packages");
    assert!(kept.passed, "{}", kept.summary);
    for part in [
        "on 8 samples",
        "train step loss",
        "gradients",
        "eval outputs",
    ] {
        assert!(
            kept.summary.contains(part),
            "`{part}` not in {}",
            kept.summary
        );
    }
    // Eager's loss moved by 0.1: the same packages now fail the check, and kiln refuses them.
    let file = entry.join(check::CHECK_FILE);
    let mut tensors =
        kiln_train::weights::from_safetensors(&std::fs::read(&file).unwrap(), &file).unwrap();
    for (name, t) in tensors.iter_mut() {
        if name == "train.loss" {
            *t = &*t + 0.1;
        }
    }
    std::fs::write(
        &file,
        kiln_train::weights::to_safetensors(&tensors).unwrap(),
    )
    .unwrap();
    let text = std::fs::read_to_string(entry.join("manifest.json")).unwrap();
    let manifest: Manifest = serde_json::from_str(&text).unwrap();
    let verdict =
        check::verify(&entry, &manifest, Packages::TrainAndEval, tch::Device::Cpu).unwrap();
    assert!(!verdict.passed, "{}", verdict.summary);
    assert_eq!(check::kept(&entry).as_ref(), Some(&verdict));
    let refused_runs = tmp.path().join("refused");
    let o = run(&refused_runs);
    let err = stderr(&o);
    assert!(!o.status.success() && !err.contains("panicked"), "{err}");
    for part in [
        "do not compute what PyTorch computes",
        "train step loss",
        "mlp.pt2",
    ] {
        assert!(err.contains(part), "`{part}` not in: {err}");
    }
    assert!(err.contains(&entry.display().to_string()), "{err}");
    let left = refused_runs.exists() && std::fs::read_dir(&refused_runs).unwrap().next().is_some();
    assert!(!left, "a refused run left a run directory");
}

/// The share of `held_out` samples whose class PyTorch gets right in fp32 with the program and
/// the weights of `ckpt` (as eager's accuracy was measured with eager's weights).
fn held_out_accuracy(dir: &Path, ckpt: &Path, held_out: &Value) -> f64 {
    std::fs::write(dir.join("x.json"), held_out["x"].to_string()).unwrap();
    let weights = ckpt.join("model.safetensors");
    let logits = pytorch_output(dir, &ckpt.join("model.pt2"), weights.to_str().unwrap());
    let classes = shape_of(&logits)[1];
    let labels = values_of(&held_out["y"]);
    let right = values_of(&logits)
        .chunks(classes)
        .zip(&labels)
        .filter(|(row, y)| {
            let best = (0..classes).max_by(|&i, &j| row[i].total_cmp(&row[j]));
            best == Some(**y as usize)
        })
        .count();
    right as f64 / labels.len() as f64
}

/// `kiln train` on `model` that must fail, naming each of `expected`; no run is left.
fn refused(model: &Path, data: &Path, runs: &Path, extra: &[&str], expected: &[&str]) {
    let o = train(model, data, runs, 16, extra);
    let err = stderr(&o);
    assert!(
        !o.status.success(),
        "{} should fail: {err}",
        model.display()
    );
    assert!(!err.contains("panicked"), "{err}");
    for e in expected {
        assert!(err.contains(e), "`{e}` not in: {err}");
    }
    assert!(
        !runs.exists() || std::fs::read_dir(runs).unwrap().next().is_none(),
        "a run that never started left a run directory"
    );
}

/// An AOTInductor package kiln compiled (any, from its cache).
fn a_package() -> PathBuf {
    let cache = kiln_train::program::compile::cache_root().unwrap();
    std::fs::read_dir(&cache)
        .unwrap()
        .flatten()
        .map(|e| e.path().join("train.pt2"))
        .find(|p| p.is_file())
        .expect("a compiled package in kiln's cache")
}

#[test]
#[ignore = "needs Python with torch 2.11 (KILN_PYTHON) and a C++ compiler; `cargo xtask test` runs it"]
fn what_torchscript_rejects_trains_and_what_kiln_cannot_train_is_named_with_python_torch() {
    let tmp = tempfile::tempdir().unwrap();
    let (programs, reference) = made_programs();
    let case = &reference["mlp"];
    let data = prepare(tmp.path(), "classify", &case["x"], &case["y"], true);
    let path = |name: &str| programs.join(name);
    let runs = tmp.path().join("runs");

    // Keyword arguments and a dict of mixed outputs: TorchScript refuses it, kiln trains it
    // once told which output the loss uses and to freeze the head the loss never reaches.
    assert_eq!(reference["dict_scripts"], false);
    let dict = path("dict.pt2");
    let none = tmp.path().join("no-runs");
    refused(
        &dict,
        &data,
        &none,
        &[],
        &["dict.pt2", "logits, features, aux", "model.output"],
    );
    let logits = ["--set", "model.output=logits"];
    refused(
        &dict,
        &data,
        &none,
        &logits,
        &["aux.weight", "aux.bias", "no gradient", "model.freeze"],
    );
    refused(
        &dict,
        &data,
        &none,
        &[&logits[..], &["--set", "model.freeze=auxiliary"]].concat(),
        &[
            "model.freeze = 'auxiliary'",
            "fc1.weight, fc1.bias, fc2.weight, fc2.bias, aux.weight, aux.bias",
        ],
    );
    // Exported in eval mode and with a fixed batch: both said, trained at 16 (not the 32
    // asked); frozen, the unused head keeps its exported values while the rest trains.
    let ok = runs.join("ok");
    let args = [&logits[..], &["--epochs", "1", "--set", "model.freeze=aux"]].concat();
    let o = train(&dict, &data, &ok, 32, &args);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("exported in eval mode") && err.contains("fixed batch of 16"),
        "{err}"
    );
    let run = only_run(&ok);
    assert_eq!(step_losses(&run).len(), 4);
    let weights = |step: u64, name: &str| {
        let bytes = std::fs::read(checkpoint(&run, step).join("model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        st.tensor(name).unwrap().data().to_vec()
    };
    assert_eq!(weights(1, "aux.weight"), weights(4, "aux.weight"));
    assert_eq!(weights(1, "aux.bias"), weights(4, "aux.bias"));
    assert_ne!(weights(1, "fc2.weight"), weights(4, "fc2.weight"));

    // Told apart by content: a TorchScript file named .pt2 trains as TorchScript.
    let scripted = runs.join("scripted");
    let o = train(
        &path("scripted.pt2"),
        &data,
        &scripted,
        16,
        &["--epochs", "1"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("holds a TorchScript module"),
        "{}",
        stderr(&o)
    );

    refused(
        &a_package(),
        &data,
        &none,
        &[],
        &["an AOTInductor package", "ExportedProgram"],
    );
    refused(
        &path("eleven.pt2"),
        &data,
        &none,
        &[],
        &["eleven.pt2", "[11]", "[10]"],
    );
    let text = tmp.path().join("notes.pt2");
    std::fs::write(&text, "not a model").unwrap();
    refused(
        &text,
        &data,
        &none,
        &[],
        &[
            "notes.pt2",
            "not a zip archive",
            "torch.export.save",
            "torch.jit.script",
        ],
    );
}

#[test]
#[ignore = "needs Python with torch 2.11 (KILN_PYTHON) and a C++ compiler; `cargo xtask test` runs it"]
fn a_program_with_its_own_loss_trains_validates_and_predicts_with_python_torch() {
    let tmp = tempfile::tempdir().unwrap();
    let (programs, reference) = made_programs();
    let case = &reference["quantiles"];
    let data = prepare(tmp.path(), "values", &case["x"], &case["y"], false);
    let model = programs.join("quantiles.pt2");
    let own = [
        "--set",
        "train.loss=module",
        "--set",
        "model.output=prediction",
    ];

    // The pinball loss inside the program: 20 full-batch steps as PyTorch eager takes them.
    let runs = tmp.path().join("runs");
    let args = [&own[..], &["--epochs", "20"]].concat();
    let o = train(&model, &data, &runs, 64, &args);
    assert!(o.status.success(), "{}", stderr(&o));
    let run = only_run(&runs);
    assert_same_losses(&step_losses(&run), &case["losses"], 1e-4);
    // Predicting needs no target: kiln infer gives what PyTorch's program does, through the
    // eval forward compiled beside the step (fed zeros for the target it does not read).
    let (said, _) = infers_as_pytorch(tmp.path(), &checkpoint(&run, 20), &case["x"]);
    assert!(said.contains("with the train step"), "{said}");

    // Validation runs the program's own loss in eval mode.
    let val = tmp.path().join("val");
    let split = ["--epochs", "3", "--set", "data.val_fraction=0.25"];
    let o = train(&model, &data, &val, 16, &[&own[..], &split[..]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let metrics = std::fs::read_to_string(only_run(&val).join("metrics.jsonl")).unwrap();
    let val_losses: Vec<f64> = metrics
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter_map(|v| v["val_loss"].as_f64())
        .collect();
    assert_eq!(val_losses.len(), 3, "{metrics}");
    assert!(val_losses.iter().all(|l| l.is_finite() && *l > 0.0));

    // The loss and the program must go together; a machine without a C++ compiler is told
    // what to install (a cache of its own, so that nothing compiled before is found).
    let none = tmp.path().join("no-runs");
    refused(
        &model,
        &data,
        &none,
        &[],
        &["quantiles.pt2", "train.loss = module"],
    );
    let mlp = prepare(
        tmp.path(),
        "classify",
        &reference["mlp"]["x"],
        &reference["mlp"]["y"],
        true,
    );
    refused(
        &programs.join("mlp.pt2"),
        &mlp,
        &none,
        &["--set", "train.loss=module"],
        &["mlp.pt2", "forward(features, target)"],
    );
    let no_cxx = common::kiln_with_env(
        &train_args(&model, &data, &none, &own[..]),
        &[
            ("CXX", "/nonexistent/c++"),
            (
                "KILN_COMPILE_CACHE",
                tmp.path().join("cold").to_str().unwrap(),
            ),
        ],
    );
    assert!(!no_cxx.status.success());
    let err = stderr(&no_cxx);
    assert!(err.contains("C++ compiler") && err.contains("g++"), "{err}");
}
