//! The trainer's arithmetic: gradient accumulation equals one big batch, clipping happens after
//! unscaling, the fp16 loss scaler skips, backs off and grows, AdamW leaves biases and norms
//! undecayed, the reference models have the shapes their PyTorch twins have, and phase timing
//! accounts for every step.

use std::cell::Cell;

use kiln_config::{LossKind, LossScalePlan, ModelKind, ModelPlan, OptimizerKind, ScheduleKind};
use kiln_device::settings::AmpDtype;
use kiln_train::TrainError;
use kiln_train::feed::DeviceBatch;
use kiln_train::model::{InputSpec, parameter_count};
use kiln_train::model::{Model, TchModule};
use kiln_train::models::TransformerShape;
use kiln_train::source::build;
use kiln_train::trainer::{TrainSettings, Trainer};
use tch::{Device, Kind, Tensor, nn};

fn settings(optimizer: OptimizerKind, precision: AmpDtype) -> TrainSettings {
    TrainSettings {
        epochs: 1,
        precision,
        optimizer,
        lr: 0.1,
        weight_decay: 0.0,
        momentum: 0.0,
        grad_accum_steps: 1,
        clip_grad_norm: 0.0,
        schedule: ScheduleKind::Constant,
        warmup_steps: 0,
        min_lr: 0.0,
        loss_scale: LossScalePlan {
            init: 1024.0,
            growth: 2.0,
            backoff: 0.5,
            growth_interval: 3,
        },
        log_interval: 10,
        empty_cache_interval: 0,
        max_bad_steps: 3,
        loss: LossKind::Auto,
        cuda_graphs: kiln_config::CudaGraphs::Off,
        ..TrainSettings::default()
    }
}

/// [`settings`] for a model that brings its own loss.
fn own_loss(mut s: TrainSettings) -> TrainSettings {
    s.loss = LossKind::Module;
    s
}

fn batch(features: Tensor, targets: Tensor) -> DeviceBatch {
    DeviceBatch {
        inputs: kiln_train::inputs::Inputs::features(features),
        targets,
        indices: vec![],
        number: 0,
    }
}

fn flat_params(vs: &nn::VarStore) -> Vec<f64> {
    let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    vars.iter()
        .flat_map(|(_, t)| Vec::<f64>::try_from(t.to_kind(Kind::Double).flatten(0, -1)).unwrap())
        .collect()
}

fn mlp_store(seed: i64) -> (nn::VarStore, nn::Sequential) {
    tch::manual_seed(seed);
    let vs = nn::VarStore::new(Device::Cpu);
    let root = vs.root();
    let net = nn::seq()
        .add(nn::linear(&root / "fc0", 6, 16, Default::default()))
        .add_fn(|x| x.tanh())
        .add(nn::linear(&root / "fc1", 16, 3, Default::default()));
    (vs, net)
}

#[test]
fn accumulating_k_micro_batches_equals_one_batch_of_k_times_b() {
    tch::manual_seed(3);
    let x = Tensor::randn([12, 6], (Kind::Float, Device::Cpu));
    let y = Tensor::randint(3, [12], (Kind::Int64, Device::Cpu));
    for optimizer in [OptimizerKind::Sgd, OptimizerKind::AdamW] {
        // The same initial weights, copied (the global seed is shared with parallel tests).
        let (vs_one, net_one) = mlp_store(11);
        let (mut vs_acc, net_acc) = mlp_store(11);
        vs_acc.copy(&vs_one).unwrap();
        let initial = flat_params(&vs_one);
        assert_eq!(initial, flat_params(&vs_acc));
        let one = TchModule(net_one);
        let acc = TchModule(net_acc);
        let s = settings(optimizer, AmpDtype::None);
        let mut t_one = Trainer::new(&one, "mlp", &vs_one, s.clone(), Device::Cpu).unwrap();
        let mut t_acc = Trainer::new(&acc, "mlp", &vs_acc, s, Device::Cpu).unwrap();
        // Unequal micro-batches (5 + 4 + 3) must still weigh every sample the same.
        let whole = t_one
            .train_step(&[batch(x.shallow_clone(), y.shallow_clone())], 0.1)
            .unwrap();
        let parts = [(0, 5), (5, 4), (9, 3)]
            .map(|(start, len)| batch(x.narrow(0, start, len), y.narrow(0, start, len)));
        let accumulated = t_acc.train_step(&parts, 0.1).unwrap();
        assert_eq!(whole.samples, accumulated.samples);
        let (a, b) = (flat_params(&vs_one), flat_params(&vs_acc));
        let max_diff = a
            .iter()
            .zip(&b)
            .map(|(p, q)| (p - q).abs())
            .fold(0.0, f64::max);
        let moved = a
            .iter()
            .zip(&initial)
            .map(|(p, q)| (p - q).abs())
            .fold(0.0, f64::max);
        assert!(moved > 1e-3, "{optimizer:?}: the step moved the parameters");
        assert!(max_diff < 1e-5, "{optimizer:?}: max difference {max_diff}");
        let loss_whole = whole.sums.values.double_value(&[0]);
        let loss_acc = accumulated.sums.values.double_value(&[0]);
        assert!((loss_whole - loss_acc).abs() < 1e-4);
    }
}

/// A one-parameter model whose loss is `w · scale_input`, so its gradient is known exactly;
/// `poison` makes the next forward produce an infinite loss.
struct Linear1 {
    w: Tensor,
    poison: Cell<bool>,
}

impl Model for Linear1 {
    fn forward(&self, features: &Tensor, _train: bool) -> Result<Tensor, TrainError> {
        let out = (features * &self.w).sum_dim_intlist(-1, true, Kind::Float);
        Ok(if self.poison.get() {
            out * f64::INFINITY
        } else {
            out
        })
    }

    fn loss(&self, output: &Tensor, _labels: &Tensor) -> Result<Tensor, TrainError> {
        Ok(output.mean(Kind::Float))
    }

    fn has_own_loss(&self) -> bool {
        true
    }
}

fn linear1(dim: i64) -> (nn::VarStore, Linear1) {
    let vs = nn::VarStore::new(Device::Cpu);
    let w = vs.root().var("weight", &[dim], nn::Init::Const(1.0));
    (
        vs,
        Linear1 {
            w,
            poison: Cell::new(false),
        },
    )
}

#[test]
fn clipping_applies_to_unscaled_gradients() {
    // Loss = mean over the batch of x·w, so the gradient is the mean x: here (3, 4), norm 5.
    let x = Tensor::from_slice(&[3.0f32, 4.0]).view([1, 2]);
    let y = Tensor::from_slice(&[0i64]);
    for precision in [AmpDtype::None, AmpDtype::Fp16] {
        let (vs, model) = linear1(2);
        let mut s = own_loss(settings(OptimizerKind::Sgd, precision));
        s.clip_grad_norm = 1.0;
        let mut trainer = Trainer::new(&model, "linear", &vs, s, Device::Cpu).unwrap();
        let out = trainer
            .train_step(&[batch(x.shallow_clone(), y.shallow_clone())], 1.0)
            .unwrap();
        let norm = out.grad_norm.unwrap().double_value(&[]);
        assert!(
            (norm - 5.0).abs() < 1e-3,
            "{precision}: norm before clipping {norm}"
        );
        // SGD with lr 1 moved w by exactly the clipped gradient: (0.6, 0.8).
        let w = Vec::<f64>::try_from(model.w.to_kind(Kind::Double)).unwrap();
        assert!(
            (w[0] - 0.4).abs() < 1e-3 && (w[1] - 0.2).abs() < 1e-3,
            "{precision}: {w:?}"
        );
    }
}

#[test]
fn loss_scaler_skips_overflowing_steps_backs_off_and_grows() {
    let x = Tensor::from_slice(&[1.0f32, 2.0]).view([1, 2]);
    let y = Tensor::from_slice(&[0i64]);
    let (vs, model) = linear1(2);
    let mut trainer = Trainer::new(
        &model,
        "linear",
        &vs,
        own_loss(settings(OptimizerKind::AdamW, AmpDtype::Fp16)),
        Device::Cpu,
    )
    .unwrap();
    let step = |t: &mut Trainer<'_>| {
        t.train_step(&[batch(x.shallow_clone(), y.shallow_clone())], 0.01)
            .unwrap();
    };
    let w = || Vec::<f64>::try_from(model.w.to_kind(Kind::Double)).unwrap();
    let adam_step = |t: &Trainer<'_>| {
        t.optimizer()
            .state_tensors()
            .into_iter()
            .find(|(n, _)| n == "weight.step")
            .unwrap()
            .1
            .double_value(&[])
    };
    assert_eq!(trainer.scaler().unwrap().scale().unwrap(), 1024.0);

    model.poison.set(true);
    step(&mut trainer);
    let scaler = trainer.scaler().unwrap();
    assert!(scaler.skipped().unwrap(), "the inf step is flagged");
    assert_eq!(scaler.scale().unwrap(), 512.0, "backed off by 0.5");
    assert_eq!(w(), [1.0, 1.0], "skipped: parameters untouched");
    assert_eq!(adam_step(&trainer), 0.0, "skipped: the step does not count");

    model.poison.set(false);
    step(&mut trainer);
    step(&mut trainer);
    assert_eq!(trainer.scaler().unwrap().scale().unwrap(), 512.0);
    assert!(!trainer.scaler().unwrap().skipped().unwrap());
    assert!(w()[0] < 1.0, "clean steps update the parameters");
    assert_eq!(adam_step(&trainer), 2.0);
    step(&mut trainer);
    assert_eq!(
        trainer.scaler().unwrap().scale().unwrap(),
        1024.0,
        "grown ×2 after 3 clean steps"
    );
    // The unscale is folded into the fused kernel: the AdamW update after k clean steps is the
    // same as without a scaler (AdamW is scale-invariant only if unscaling were skipped AND eps
    // were 0, so compare with an fp32 run instead).
    let (vs32, model32) = linear1(2);
    let mut t32 = Trainer::new(
        &model32,
        "linear",
        &vs32,
        own_loss(settings(OptimizerKind::AdamW, AmpDtype::None)),
        Device::Cpu,
    )
    .unwrap();
    for _ in 0..3 {
        t32.train_step(&[batch(x.shallow_clone(), y.shallow_clone())], 0.01)
            .unwrap();
    }
    let w32 = Vec::<f64>::try_from(model32.w.to_kind(Kind::Double)).unwrap();
    for (a, b) in w().iter().zip(&w32) {
        assert!((a - b).abs() < 1e-3, "fp16-scaled {a} vs fp32 {b}");
    }
}

#[test]
fn adamw_decays_weights_but_not_biases_or_norms() {
    let vs = nn::VarStore::new(Device::Cpu);
    let root = vs.root();
    let lin = nn::linear(&root / "fc", 4, 4, Default::default());
    let norm = nn::layer_norm(&root / "norm", vec![4], Default::default());
    struct Net(nn::Linear, nn::LayerNorm);
    impl Model for Net {
        fn forward(&self, f: &Tensor, _: bool) -> Result<Tensor, TrainError> {
            // Multiplied by zero: every gradient is exactly zero, so only decay moves things.
            Ok(f.apply(&self.0).apply(&self.1) * 0.0)
        }
    }
    let net = Net(lin, norm);
    let before = |name: &str| vs.variables()[name].copy();
    let (w0, b0, n0) = (
        before("fc.weight"),
        before("fc.bias"),
        before("norm.weight"),
    );
    let mut s = settings(OptimizerKind::AdamW, AmpDtype::None);
    s.weight_decay = 0.5;
    let mut t = Trainer::new(&net, "net", &vs, s, Device::Cpu).unwrap();
    let x = Tensor::ones([2, 4], (Kind::Float, Device::Cpu));
    let y = Tensor::from_slice(&[0i64, 1]);
    t.train_step(&[batch(x, y)], 0.1).unwrap();
    let now = vs.variables();
    let shrink = 1.0 - 0.1 * 0.5;
    let expected_w = &w0 * shrink;
    assert!(now["fc.weight"].allclose(&expected_w, 1e-6, 1e-7, false));
    assert!(now["fc.bias"].equal(&b0), "biases are not decayed");
    assert!(now["norm.weight"].equal(&n0), "norm scales are not decayed");
    let groups: Vec<(usize, f64)> = t
        .optimizer()
        .groups()
        .iter()
        .map(|g| (g.params.len(), g.weight_decay))
        .collect();
    assert_eq!(groups, [(1, 0.5), (3, 0.0)]);
}

fn plan(kind: ModelKind) -> ModelPlan {
    ModelPlan {
        dropout: 0.1,
        ..ModelPlan::builtin(kind)
    }
}

#[test]
fn reference_models_match_their_pytorch_twins_in_size_and_shape() {
    // Parameter counts of benches/python/train_step.py's models at default sizes.
    for (kind, shape, classes, params) in [
        (ModelKind::Mlp, vec![64], 10, 85_002),
        (ModelKind::Transformer, vec![64, 469], 100, 3_321_956),
        (ModelKind::ConvNet, vec![3, 32, 32], 10, 94_762),
    ] {
        let vs = nn::VarStore::new(Device::Cpu);
        let input = InputSpec {
            sample_shape: shape.clone(),
            classes,
            target: None,
            integer_features: false,
            arrays: vec![],
        };
        let model = build(&plan(kind), &input, &vs, false, 0).unwrap();
        assert_eq!(parameter_count(&vs), params, "{kind}");
        let mut dims = vec![2i64];
        dims.extend(shape.iter().map(|&d| d as i64));
        let x = Tensor::randn(dims.as_slice(), (Kind::Float, Device::Cpu));
        let out = model.forward(&x, true).unwrap();
        assert_eq!(out.size(), [2, classes as i64], "{kind}");
        // Evaluation is deterministic (no dropout); training with dropout is not.
        let a = model.forward(&x, false).unwrap();
        let b = model.forward(&x, false).unwrap();
        assert!(a.equal(&b), "{kind}");
    }
    let flops = TransformerShape {
        seq_len: 64,
        features: 469,
        d_model: 256,
        heads: 8,
        layers: 4,
        ff: 1024,
        classes: 100,
    }
    .forward_flops_per_sample();
    assert_eq!(flops, 434_849_792, "the Python script's count");
}

#[test]
fn models_reject_data_of_the_wrong_shape() {
    let vs = nn::VarStore::new(Device::Cpu);
    let input = InputSpec {
        sample_shape: vec![64],
        classes: 10,
        target: None,
        integer_features: false,
        arrays: vec![],
    };
    let err = build(&plan(ModelKind::Transformer), &input, &vs, false, 0)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("model.name") && err.contains("[sequence, features]"),
        "{err}"
    );
    let err = build(
        &plan(ModelKind::ConvNet),
        &InputSpec {
            sample_shape: vec![3, 8, 8],
            classes: 1,
            target: None,
            integer_features: false,
            arrays: vec![],
        },
        &vs,
        false,
        0,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("at least 2 classes"), "{err}");
}

#[test]
fn channels_last_convnet_lays_weights_out_nhwc_and_computes_the_same() {
    let x = Tensor::randn([2, 3, 16, 16], (Kind::Float, Device::Cpu));
    let input = InputSpec {
        sample_shape: vec![3, 16, 16],
        classes: 10,
        target: None,
        integer_features: false,
        arrays: vec![],
    };
    let vs_a = nn::VarStore::new(Device::Cpu);
    let a = build(&plan(ModelKind::ConvNet), &input, &vs_a, false, 0).unwrap();
    let mut vs_b = nn::VarStore::new(Device::Cpu);
    let b = build(&plan(ModelKind::ConvNet), &input, &vs_b, true, 0).unwrap();
    vs_b.copy(&vs_a).unwrap();
    let w = &vs_b.variables()["conv1.weight"];
    assert!(kiln_torch_ext::layout::is_channels_last(w).unwrap());
    assert!(!kiln_torch_ext::layout::is_channels_last(&vs_a.variables()["conv1.weight"]).unwrap());
    let (ya, yb) = (a.forward(&x, false).unwrap(), b.forward(&x, false).unwrap());
    assert!(ya.allclose(&yb, 1e-4, 1e-5, false));
}

fn unet_input(side: usize) -> InputSpec {
    InputSpec {
        sample_shape: vec![1, side, side, side],
        classes: 2,
        target: Some(kiln_data::TargetSpec::Classes {
            classes: 2,
            shape: vec![side; 3],
        }),
        integer_features: false,
        arrays: vec![],
    }
}

#[test]
fn unet3d_scores_every_voxel_and_matches_its_twin_in_size() {
    let vs = nn::VarStore::new(Device::Cpu);
    let p = ModelPlan {
        channels: vec![16, 32, 64],
        ..plan(ModelKind::Unet3d)
    };
    let model = build(&p, &unet_input(8), &vs, false, 0).unwrap();
    // UNet3d(1, [16, 32, 64], 2) of benches/python/train_step.py.
    assert_eq!(parameter_count(&vs), 339_586);
    let x = Tensor::randn([2, 1, 8, 12, 4], (Kind::Float, Device::Cpu));
    assert_eq!(model.forward(&x, true).unwrap().size(), [2, 2, 8, 12, 4]);
    let a = model.forward(&x, false).unwrap();
    assert!(a.equal(&model.forward(&x, false).unwrap()));
    // Sides that do not divide by 4 (two halvings) are named errors, not a crash in a conv.
    let odd = Tensor::randn([1, 1, 8, 6, 8], (Kind::Float, Device::Cpu));
    let err = model.forward(&odd, false).err().unwrap().to_string();
    assert!(
        err.contains("divide by 4") && err.contains("[1, 1, 8, 6, 8]"),
        "{err}"
    );
    // Targets of one label per volume are not what it predicts.
    let labels = InputSpec {
        target: None,
        ..unet_input(8)
    };
    let err = build(&p, &labels, &nn::VarStore::new(Device::Cpu), false, 0)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("a class map per volume"), "{err}");
}

#[test]
fn channels_last_unet3d_lays_weights_out_ndhwc_and_computes_the_same() {
    let x = Tensor::randn([2, 1, 8, 8, 8], (Kind::Float, Device::Cpu));
    let p = ModelPlan {
        channels: vec![4, 8],
        ..plan(ModelKind::Unet3d)
    };
    let vs_a = nn::VarStore::new(Device::Cpu);
    let a = build(&p, &unet_input(8), &vs_a, false, 0).unwrap();
    let mut vs_b = nn::VarStore::new(Device::Cpu);
    let b = build(&p, &unet_input(8), &vs_b, true, 0).unwrap();
    vs_b.copy(&vs_a).unwrap();
    let w = &vs_b.variables()["down1.conv0.weight"];
    assert!(kiln_torch_ext::layout::is_channels_last(w).unwrap());
    let (ya, yb) = (a.forward(&x, false).unwrap(), b.forward(&x, false).unwrap());
    assert!(ya.allclose(&yb, 1e-4, 1e-5, false));
}

#[test]
fn bf16_autocast_runs_the_transformer_in_bf16_on_this_thread() {
    let vs = nn::VarStore::new(Device::Cpu);
    let mut p = plan(ModelKind::Transformer);
    (p.d_model, p.heads, p.layers, p.ff) = (32, 4, 1, 64);
    let input = InputSpec {
        sample_shape: vec![8, 12],
        classes: 5,
        target: None,
        integer_features: false,
        arrays: vec![],
    };
    let model = build(&p, &input, &vs, false, 0).unwrap();
    let mut trainer = Trainer::new(
        model.as_ref(),
        "transformer",
        &vs,
        settings(OptimizerKind::AdamW, AmpDtype::Bf16),
        Device::Cpu,
    )
    .unwrap();
    let x = Tensor::randn([4, 8, 12], (Kind::Float, Device::Cpu));
    let y = Tensor::from_slice(&[0i64, 1, 2, 3]);
    let before = flat_params(&vs);
    let out = trainer.train_step(&[batch(x, y)], 1e-3).unwrap();
    assert!(out.sums.values.double_value(&[0]).is_finite());
    assert_ne!(before, flat_params(&vs));
    // The parameters stay fp32 (autocast casts per op, not the weights).
    assert!(vs.variables().values().all(|t| t.kind() == Kind::Float));
    assert!(
        !kiln_torch_ext::autocast::is_enabled(kiln_torch_ext::autocast::DeviceType::Cpu).unwrap()
    );
}

#[test]
fn non_finite_steps_are_skipped_and_too_many_in_a_row_stop_the_run() {
    use kiln_data::{InMemory, LoaderConfig, SamplerConfig};
    use kiln_train::record::Silent;
    use kiln_train::trainer::{FitData, FitOptions};
    use std::sync::Arc;

    let data = || {
        Arc::new(
            InMemory::new(
                (0..32).map(|i| i as f32 / 32.0).collect(),
                vec![0; 16],
                vec![2],
            )
            .unwrap(),
        )
    };
    let loader = LoaderConfig {
        batch_size: 4,
        num_workers: 0,
        prefetch_factor: 2,
        drop_last: true,
        sampler: SamplerConfig::default(),
        inline_threads: 1,
        by_name: false,
    };
    let fit = |trainer: &mut Trainer<'_>| {
        trainer.fit(
            FitData::<InMemory, InMemory> {
                train: data(),
                val: None,
                loader,
                workers_auto: false,
            },
            &mut Silent,
            FitOptions::default(),
        )
    };
    let mut s = own_loss(settings(OptimizerKind::Sgd, AmpDtype::None));
    s.log_interval = 1;
    s.max_bad_steps = 3;

    // Always bad: three skipped steps in a row stop the run; the weights never moved.
    let (vs, model) = linear1(2);
    model.poison.set(true);
    let mut trainer = Trainer::new(&model, "linear", &vs, s.clone(), Device::Cpu).unwrap();
    let err = fit(&mut trainer).unwrap_err();
    assert!(
        matches!(
            err,
            TrainError::NonFinite {
                steps: 3,
                limit: 3,
                step: 3
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("train.max_bad_steps"), "{err}");
    assert_eq!(
        Vec::<f64>::try_from(model.w.to_kind(Kind::Double)).unwrap(),
        [1.0, 1.0]
    );

    // With the fp16 scaler, bad steps back the scale off instead of stopping the run.
    let (vs, model) = linear1(2);
    model.poison.set(true);
    let mut fp16 = s.clone();
    fp16.precision = AmpDtype::Fp16;
    let mut trainer = Trainer::new(&model, "linear", &vs, fp16, Device::Cpu).unwrap();
    let summary = fit(&mut trainer).unwrap();
    assert_eq!(summary.skipped_steps, 4);
    assert_eq!(trainer.scaler().unwrap().scale().unwrap(), 1024.0 / 16.0);

    // Fine: no step skipped, the run completes.
    let (vs, model) = linear1(2);
    let mut trainer = Trainer::new(&model, "linear", &vs, s, Device::Cpu).unwrap();
    let summary = fit(&mut trainer).unwrap();
    assert_eq!((summary.steps, summary.skipped_steps), (4, 0));
    assert!(Vec::<f64>::try_from(model.w.to_kind(Kind::Double)).unwrap()[0] < 1.0);
}

/// A classifier that runs out of memory (the way libtorch reports it) whenever a forward gets
/// more than `limit` samples; `forwards` counts the batch sizes it saw.
struct MemoryBound<M> {
    inner: TchModule<M>,
    limit: i64,
    seen: std::cell::RefCell<Vec<i64>>,
}

impl<M: nn::ModuleT> Model for MemoryBound<M> {
    fn forward(&self, features: &Tensor, train: bool) -> Result<Tensor, TrainError> {
        let n = features.size()[0];
        self.seen.borrow_mut().push(n);
        if n > self.limit {
            return Err(TrainError::Tch(tch::TchError::Torch(
                "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.11 GiB total)".into(),
            )));
        }
        self.inner.forward(features, train)
    }
}

#[test]
fn out_of_memory_retries_the_step_in_micro_batches_with_the_same_result() {
    tch::manual_seed(5);
    let x = Tensor::randn([20, 6], (Kind::Float, Device::Cpu));
    let y = Tensor::randint(3, [20], (Kind::Int64, Device::Cpu));
    let (vs_ref, net_ref) = mlp_store(13);
    let (mut vs_oom, net_oom) = mlp_store(13);
    vs_oom.copy(&vs_ref).unwrap();
    let reference = TchModule(net_ref);
    let bounded = MemoryBound {
        inner: TchModule(net_oom),
        limit: 5,
        seen: Default::default(),
    };
    let s = settings(OptimizerKind::AdamW, AmpDtype::None);
    let mut t_ref = Trainer::new(&reference, "mlp", &vs_ref, s.clone(), Device::Cpu).unwrap();
    let mut t_oom = Trainer::new(&bounded, "mlp", &vs_oom, s.clone(), Device::Cpu).unwrap();
    // Two batches of a step (4 + 16): the first fits, the second fails after the first's
    // backward, so the retry must start from clean gradients.
    let parts = || {
        [(0, 4), (4, 16)]
            .map(|(start, len)| batch(x.narrow(0, start, len), y.narrow(0, start, len)))
    };
    let a = t_ref.train_step(&parts(), 0.1).unwrap();
    let b = t_oom.train_step(&parts(), 0.1).unwrap();
    assert_eq!(
        t_oom.micro_batch_split(),
        4,
        "16 → 8 → 4 samples per micro-batch"
    );
    assert_eq!(t_oom.oom_retries(), 2);
    assert_eq!(
        *bounded.seen.borrow(),
        [4, 16, 2, 2, 8, 1, 1, 1, 1, 4, 4, 4, 4]
    );
    assert_eq!(a.samples, b.samples);
    let (pa, pb) = (flat_params(&vs_ref), flat_params(&vs_oom));
    let max_diff = pa
        .iter()
        .zip(&pb)
        .map(|(p, q)| (p - q).abs())
        .fold(0.0, f64::max);
    assert!(max_diff < 1e-5, "max difference {max_diff}");
    assert_eq!(t_oom.steps_done(), 1);
    // The split stays: the next step goes straight to micro-batches.
    bounded.seen.borrow_mut().clear();
    t_oom.train_step(&parts(), 0.1).unwrap();
    assert_eq!(t_oom.oom_retries(), 2);
    assert!(bounded.seen.borrow().iter().all(|&n| n <= 5));

    // Nothing fits, not even one sample: a clear error naming the settings to change, and no
    // step was taken.
    let (vs_none, net_none) = mlp_store(13);
    let hopeless = MemoryBound {
        inner: TchModule(net_none),
        limit: 0,
        seen: Default::default(),
    };
    let before = flat_params(&vs_none);
    let mut t = Trainer::new(&hopeless, "mlp", &vs_none, s, Device::Cpu).unwrap();
    let err = t.train_step(&parts(), 0.1).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(
            err,
            TrainError::OutOfMemory {
                step: 1,
                micro_batch: 1,
                ..
            }
        ),
        "{text}"
    );
    for key in [
        "train.batch_size",
        "model.activation_checkpointing",
        "performance.memory_fraction",
    ] {
        assert!(text.contains(key), "{key} not named: {text}");
    }
    assert_eq!(before, flat_params(&vs_none));
    assert_eq!(t.steps_done(), 0);
}

#[test]
fn phase_timing_counts_every_phase_of_every_step_and_only_while_on() {
    let (vs, net) = mlp_store(5);
    let model = TchModule(net);
    let s = settings(OptimizerKind::AdamW, AmpDtype::None);
    let mut trainer = Trainer::new(&model, "mlp", &vs, s, Device::Cpu).unwrap();
    let x = Tensor::randn([8, 6], (Kind::Float, Device::Cpu));
    let y = Tensor::randint(3, [8], (Kind::Int64, Device::Cpu));
    let step = |t: &mut Trainer<'_>, parts: &[(i64, i64)]| {
        let batches: Vec<DeviceBatch> = parts
            .iter()
            .map(|&(start, len)| batch(x.narrow(0, start, len), y.narrow(0, start, len)))
            .collect();
        t.train_step(&batches, 0.01).unwrap();
    };
    step(&mut trainer, &[(0, 8)]);
    assert_eq!(trainer.phase_times(), None, "timing is off by default");

    trainer.set_phase_timing(true);
    let started = std::time::Instant::now();
    step(&mut trainer, &[(0, 8)]);
    step(&mut trainer, &[(0, 4), (4, 4)]);
    let elapsed = started.elapsed();
    let t = trainer.phase_times().unwrap();
    assert_eq!(t.steps, 2);
    for (name, d) in [
        ("forward", t.forward),
        ("backward", t.backward),
        ("optimizer", t.optimizer),
    ] {
        assert!(!d.is_zero(), "{name} was not timed");
    }
    assert!(t.forward + t.backward + t.optimizer <= elapsed);

    trainer.set_phase_timing(true);
    assert_eq!(
        trainer.phase_times().unwrap().steps,
        0,
        "turning it on starts from zero"
    );
    trainer.set_phase_timing(false);
    step(&mut trainer, &[(0, 8)]);
    assert_eq!(trainer.phase_times(), None);
}

#[test]
fn cuda_graphs_auto_on_the_cpu_trains_eagerly_and_on_is_refused() {
    tch::manual_seed(5);
    let x = Tensor::randn([8, 6], (Kind::Float, Device::Cpu));
    let y = Tensor::randint(3, [8], (Kind::Int64, Device::Cpu));
    let (vs_off, net_off) = mlp_store(13);
    let (mut vs_auto, net_auto) = mlp_store(13);
    vs_auto.copy(&vs_off).unwrap();
    let (off, auto) = (TchModule(net_off), TchModule(net_auto));
    let mut s = settings(OptimizerKind::AdamW, AmpDtype::None);
    let mut t_off = Trainer::new(&off, "mlp", &vs_off, s.clone(), Device::Cpu).unwrap();
    s.cuda_graphs = kiln_config::CudaGraphs::Auto;
    let mut t_auto = Trainer::new(&auto, "mlp", &vs_auto, s.clone(), Device::Cpu).unwrap();
    t_off.plan_cuda_graph().unwrap();
    t_auto.plan_cuda_graph().unwrap();
    for _ in 0..5 {
        t_off
            .train_step(&[batch(x.shallow_clone(), y.shallow_clone())], 0.05)
            .unwrap();
        t_auto
            .train_step(&[batch(x.shallow_clone(), y.shallow_clone())], 0.05)
            .unwrap();
    }
    assert_eq!(flat_params(&vs_off), flat_params(&vs_auto));
    s.cuda_graphs = kiln_config::CudaGraphs::On;
    let (vs_on, net_on) = mlp_store(13);
    let on = TchModule(net_on);
    let mut t_on = Trainer::new(&on, "mlp", &vs_on, s, Device::Cpu).unwrap();
    let err = t_on.plan_cuda_graph().unwrap_err().to_string();
    assert!(
        err.contains("train.cuda_graphs") && err.contains("not on a CUDA device"),
        "{err}"
    );
}
