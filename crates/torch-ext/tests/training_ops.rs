//! Fused SGD, loss-scaler unscale/update, gradient-norm clipping and the fast dropout mask,
//! each against what it is defined to compute.

use kiln_torch_ext::dropout::{dropout, dropout_mask};
use kiln_torch_ext::optim::{
    SgdConfig, amp_unscale, amp_update_scale, clear_grads, clip_grad_norm, foreach_add_,
    fused_sgd_step,
};
use tch::{Kind, Tensor};

fn values(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(t.to_kind(Kind::Double).flatten(0, -1)).unwrap()
}

fn scalar(v: f32) -> Tensor {
    Tensor::from_slice(&[v])
}

#[test]
fn fused_sgd_with_momentum_and_weight_decay_matches_the_definition() {
    let config = SgdConfig {
        lr: 0.05,
        momentum: 0.9,
        dampening: 0.1,
        weight_decay: 0.01,
        nesterov: false,
        maximize: false,
    };
    let mut reference: Vec<f64> = (0..7).map(|i| 0.3 * i as f64 - 1.0).collect();
    let mut buf = [0.0f64; 7];
    let param = Tensor::from_slice(&reference.iter().map(|&v| v as f32).collect::<Vec<_>>());
    let momentum = Tensor::zeros([7], (Kind::Float, tch::Device::Cpu));
    for step in 0..50 {
        let grads: Vec<f64> = (0..7)
            .map(|i| ((step * 7 + i) as f64 * 0.37).sin())
            .collect();
        let grad = Tensor::from_slice(&grads.iter().map(|&v| v as f32).collect::<Vec<_>>());
        fused_sgd_step(
            std::slice::from_ref(&param),
            std::slice::from_ref(&grad),
            std::slice::from_ref(&momentum),
            &config,
            step == 0,
            None,
            None,
        )
        .unwrap();
        for i in 0..7 {
            let g = grads[i] + config.weight_decay * reference[i];
            buf[i] = if step == 0 {
                g
            } else {
                config.momentum * buf[i] + (1.0 - config.dampening) * g
            };
            reference[i] -= config.lr * buf[i];
        }
    }
    for (got, want) in values(&param).iter().zip(&reference) {
        assert!((got - want).abs() < 1e-4, "{got} vs {want}");
    }
}

#[test]
fn fused_sgd_rejects_mismatched_state() {
    let p = Tensor::zeros([3], (Kind::Float, tch::Device::Cpu));
    let g = Tensor::zeros([4], (Kind::Float, tch::Device::Cpu));
    let err = fused_sgd_step(
        std::slice::from_ref(&p),
        std::slice::from_ref(&g),
        std::slice::from_ref(&p),
        &SgdConfig::default(),
        true,
        None,
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("grad has shape [4]"), "{err}");
    let err = fused_sgd_step(
        std::slice::from_ref(&p),
        std::slice::from_ref(&p),
        &[],
        &SgdConfig::default(),
        true,
        None,
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("momentum_buffers must hold 1"), "{err}");
}

#[test]
fn unscale_divides_gradients_and_flags_non_finite_ones() {
    let a = Tensor::from_slice(&[2.0f32, 4.0]);
    let b = Tensor::from_slice(&[8.0f32]);
    let found_inf = scalar(0.0);
    amp_unscale(
        &[a.shallow_clone(), b.shallow_clone()],
        &found_inf,
        &scalar(0.5),
    )
    .unwrap();
    assert_eq!(values(&a), [1.0, 2.0]);
    assert_eq!(values(&b), [4.0]);
    assert_eq!(values(&found_inf), [0.0]);
    let c = Tensor::from_slice(&[1.0f32, f32::INFINITY]);
    amp_unscale(&[c], &found_inf, &scalar(0.5)).unwrap();
    assert_eq!(values(&found_inf), [1.0]);
}

#[test]
fn update_scale_backs_off_on_inf_and_grows_after_clean_interval() {
    let scale = scalar(1024.0);
    let tracker = Tensor::from_slice(&[0i32]);
    let clean = scalar(0.0);
    let inf = scalar(1.0);
    amp_update_scale(&scale, &tracker, &inf, 2.0, 0.5, 3).unwrap();
    assert_eq!(values(&scale), [512.0]);
    for _ in 0..2 {
        amp_update_scale(&scale, &tracker, &clean, 2.0, 0.5, 3).unwrap();
        assert_eq!(values(&scale), [512.0]);
    }
    amp_update_scale(&scale, &tracker, &clean, 2.0, 0.5, 3).unwrap();
    assert_eq!(values(&scale), [1024.0], "grows on the third clean step");
    assert_eq!(values(&tracker), [0.0], "and the count starts again");
}

#[test]
fn clip_grad_norm_reports_the_global_norm_and_scales_down_only_when_above() {
    let a = Tensor::from_slice(&[3.0f32]);
    let b = Tensor::from_slice(&[4.0f32, 0.0]);
    let grads = [a.shallow_clone(), b.shallow_clone()];
    let norm = clip_grad_norm(&grads, 10.0).unwrap();
    assert!((values(&norm)[0] - 5.0).abs() < 1e-6);
    assert_eq!(values(&a), [3.0], "norm 5 is under 10: untouched");
    let norm = clip_grad_norm(&grads, 1.0).unwrap();
    assert!(
        (values(&norm)[0] - 5.0).abs() < 1e-6,
        "the norm before clipping"
    );
    let after = values(&clip_grad_norm(&grads, 0.0).unwrap())[0];
    assert!((after - 1.0).abs() < 1e-4, "clipped to 1, got {after}");
    assert!((values(&a)[0] - 0.6).abs() < 1e-4);
    assert!(clip_grad_norm(&[], 1.0).is_err());
    assert!(clip_grad_norm(&grads, f64::NAN).is_err());
}

#[test]
fn dropout_mask_drops_about_p_scales_the_rest_and_is_reproducible() {
    let like = Tensor::zeros([256, 1024], (Kind::Float, tch::Device::Cpu));
    let p = 0.1;
    let mask = dropout_mask(&like, p, 42, 0).unwrap();
    assert_eq!(mask.size(), like.size());
    let v = values(&mask);
    let keep = 1.0 / (1.0 - p);
    assert!(v.iter().all(|&x| x == 0.0 || (x - keep).abs() < 1e-6));
    let dropped = v.iter().filter(|&&x| x == 0.0).count() as f64 / v.len() as f64;
    assert!((dropped - p).abs() < 0.005, "dropped {dropped}");
    // The mean is preserved in expectation: E[mask] = 1.
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    assert!((mean - 1.0).abs() < 0.01, "mean {mean}");
    assert_eq!(v, values(&dropout_mask(&like, p, 42, 0).unwrap()));
    assert_ne!(v, values(&dropout_mask(&like, p, 42, 1).unwrap()));
    assert_ne!(v, values(&dropout_mask(&like, p, 43, 0).unwrap()));
    // Follows the input's dtype, so bf16 activations stay bf16.
    let bf = dropout_mask(&like.to_kind(Kind::BFloat16), 0.5, 1, 0).unwrap();
    assert_eq!(bf.kind(), Kind::BFloat16);
    assert!(dropout_mask(&like, 1.0, 0, 0).is_err());
    // Gradient flows through x * mask like dropout's.
    let x = Tensor::ones([4, 8], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
    let m = dropout_mask(&x, 0.5, 7, 0).unwrap();
    (&x * &m).sum(Kind::Float).backward();
    assert_eq!(values(&x.grad()), values(&m));
}

#[test]
fn clear_grads_drops_gradients_so_the_next_backward_starts_fresh() {
    let x = Tensor::ones([3], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
    (&x * 2.0).sum(Kind::Float).backward();
    assert_eq!(values(&x.grad()), [2.0, 2.0, 2.0]);
    clear_grads(std::slice::from_ref(&x)).unwrap();
    assert!(!x.grad().defined());
    (&x * 3.0).sum(Kind::Float).backward();
    assert_eq!(values(&x.grad()), [3.0, 3.0, 3.0]);
}

#[test]
fn one_pass_dropout_matches_the_mask_forward_and_backward() {
    let x = Tensor::randn([64, 300], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
    let mask = dropout_mask(&x, 0.25, 9, 1234).unwrap();
    let y = dropout(&x, 0.25, 9, 1234).unwrap();
    assert!(y.allclose(&(&x * &mask), 1e-6, 1e-7, false));
    let upstream = Tensor::randn([64, 300], (Kind::Float, tch::Device::Cpu));
    (&y * &upstream).sum(Kind::Float).backward();
    assert!(x.grad().allclose(&(&upstream * &mask), 1e-6, 1e-7, false));
    // bf16 in, bf16 out; and a non-contiguous input gives the same as its contiguous copy.
    let bf = dropout(&x.detach().to_kind(Kind::BFloat16), 0.5, 1, 0).unwrap();
    assert_eq!(bf.kind(), Kind::BFloat16);
    let t = x.detach().transpose(0, 1);
    assert!(
        dropout(&t, 0.5, 3, 0)
            .unwrap()
            .equal(&dropout(&t.contiguous(), 0.5, 3, 0).unwrap())
    );
    assert!(dropout(&x, -0.1, 0, 0).is_err());
}

#[test]
fn foreach_add_adds_one_tensor_to_every_tensor_in_place() {
    let steps: Vec<Tensor> = [0.0f32, 3.0, 7.0].iter().map(|&v| scalar(v)).collect();
    let other = Tensor::from_slice(&[2.0f32]).view([]);
    foreach_add_(&steps, &other).unwrap();
    let got: Vec<f64> = steps.iter().map(|s| s.double_value(&[0])).collect();
    assert_eq!(got, [2.0, 5.0, 9.0]);
    let skipped = Tensor::from_slice(&[0.0f32]).view([]);
    foreach_add_(&steps, &skipped).unwrap();
    assert_eq!(
        steps[2].double_value(&[0]),
        9.0,
        "adding 0 (a skipped step) leaves the counts"
    );
    foreach_add_(&[], &other).unwrap();
    let wrong = Tensor::from_slice(&[1.0f32, 2.0]);
    assert!(
        foreach_add_(&steps, &wrong).is_err(),
        "a two-element addend is an error"
    );
}
