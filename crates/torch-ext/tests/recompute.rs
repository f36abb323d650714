//! Activation checkpointing through the native autograd function: gradients equal those of
//! the plain computation (random draws included), memory held for backward is lower, the
//! closure is released with the graph, and errors come back as errors.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use kiln_torch_ext::profiler::{self, ProfilerOptions};
use kiln_torch_ext::recompute::checkpoint;
use tch::{Device, Kind, Tensor};

/// The tests take turns: a recompute saves and restores the process-wide CPU generator's state,
/// so one test's backward would move the generator under another test's draws.
fn serial() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn param(shape: &[i64], seed: f64) -> Tensor {
    Tensor::arange(shape.iter().product::<i64>(), (Kind::Float, Device::Cpu))
        .f_mul_scalar(0.37)
        .unwrap()
        .f_add_scalar(seed)
        .unwrap()
        .sin()
        .f_mul_scalar(0.1)
        .unwrap()
        .reshape(shape)
        .set_requires_grad(true)
}

/// A feed-forward block with a wide hidden layer and a random (dropout-like) mask drawn from
/// the default CPU generator.
fn block(x: &Tensor, w1: &Tensor, w2: &Tensor, random: bool) -> Tensor {
    let h = x.matmul(w1).gelu("none");
    let h = if random {
        let mask = h.rand_like().ge(0.2).to_kind(Kind::Float);
        h * mask
    } else {
        h
    };
    x + h.matmul(w2)
}

struct Net {
    layers: Vec<(Tensor, Tensor)>,
}

impl Net {
    fn new(layers: usize, d: i64, hidden: i64) -> Self {
        Self {
            layers: (0..layers)
                .map(|i| {
                    (
                        param(&[d, hidden], i as f64),
                        param(&[hidden, d], 10.0 + i as f64),
                    )
                })
                .collect(),
        }
    }

    fn forward(&self, x: &Tensor, checkpointed: bool, random: bool) -> Tensor {
        let mut x = x.shallow_clone();
        for (w1, w2) in &self.layers {
            x = if checkpointed {
                let (w1, w2) = (w1.shallow_clone(), w2.shallow_clone());
                checkpoint(&x, move |x| Ok(block(x, &w1, &w2, random))).unwrap()
            } else {
                block(&x, w1, w2, random)
            };
        }
        x
    }

    fn zero_grads(&self) {
        for (a, b) in &self.layers {
            for p in [a, b] {
                let mut g = p.grad();
                if g.defined() {
                    let _ = g.zero_();
                }
            }
        }
    }

    fn grads(&self) -> Vec<Tensor> {
        self.layers
            .iter()
            .flat_map(|(a, b)| [a.grad().copy(), b.grad().copy()])
            .collect()
    }
}

fn input(batch: i64, d: i64) -> Tensor {
    param(&[batch, d], 3.0).detach().set_requires_grad(true)
}

#[test]
fn gradients_equal_the_plain_computation_random_draws_included() {
    let _turn = serial();
    let net = Net::new(3, 16, 64);
    for random in [false, true] {
        let x = input(8, 16);
        tch::manual_seed(7);
        let plain_out = net.forward(&x, false, random);
        plain_out.square().sum(Kind::Float).backward();
        let plain = net.grads();
        let plain_x = x.grad().copy();
        net.zero_grads();

        let x2 = input(8, 16);
        tch::manual_seed(7);
        let ckpt_out = net.forward(&x2, true, random);
        assert!(ckpt_out.requires_grad());
        // The recompute in backward draws again: the generator must be replayed for it and
        // must end where the forward left it.
        let after_forward = Tensor::rand([4], (Kind::Float, Device::Cpu));
        tch::manual_seed(7);
        let _ = net.forward(&input(8, 16).detach(), false, random);
        let expected_next = Tensor::rand([4], (Kind::Float, Device::Cpu));
        assert!(after_forward.equal(&expected_next));

        ckpt_out.square().sum(Kind::Float).backward();
        assert!(
            ckpt_out.equal(&plain_out),
            "forward differs (random={random})"
        );
        for (i, (a, b)) in plain.iter().zip(net.grads()).enumerate() {
            assert!(
                a.equal(&b),
                "parameter {i}: gradients differ (random={random})"
            );
        }
        assert!(plain_x.equal(&x2.grad()), "input gradient differs");
        net.zero_grads();
    }
}

#[test]
fn checkpointing_holds_less_memory_for_backward() {
    let _turn = serial();
    let net = Net::new(6, 128, 1024);
    let peak = |checkpointed: bool| {
        let x = input(256, 128);
        let ((), bytes) = profiler::peak_allocated_during(ProfilerOptions::default(), || {
            let out = net.forward(&x, checkpointed, false);
            out.square().sum(Kind::Float).backward();
        })
        .unwrap();
        net.zero_grads();
        bytes
    };
    let plain = peak(false);
    let checkpointed = peak(true);
    eprintln!("peak allocated: plain {plain} B, checkpointed {checkpointed} B");
    // Plain keeps two 256×1024 activations per layer (4 MiB of the six layers' 24); the
    // checkpointed net keeps each layer's 128 KiB input and one layer's activations at a time.
    assert!(
        (checkpointed as f64) < 0.6 * plain as f64,
        "checkpointed {checkpointed} B vs plain {plain} B"
    );
}

#[test]
fn parameters_get_gradients_when_the_input_needs_none() {
    let _turn = serial();
    let w = param(&[4, 4], 1.0);
    let x = param(&[2, 4], 2.0).detach();
    let w2 = w.shallow_clone();
    let out = checkpoint(&x, move |x| Ok(x.matmul(&w2).tanh())).unwrap();
    out.sum(Kind::Float).backward();
    let plain_w = w.detach().set_requires_grad(true);
    x.matmul(&plain_w).tanh().sum(Kind::Float).backward();
    assert!(w.grad().allclose(&plain_w.grad(), 1e-6, 1e-7, false));
}

#[test]
fn the_closure_is_released_with_the_graph() {
    let _turn = serial();
    let alive = Arc::new(AtomicUsize::new(0));
    let token = Arc::clone(&alive);
    let x = input(2, 4);
    let out = checkpoint(&x, move |x| {
        token.fetch_add(1, Ordering::SeqCst);
        Ok(x * 2.0)
    })
    .unwrap();
    assert_eq!(alive.load(Ordering::SeqCst), 1, "forward ran once");
    assert_eq!(Arc::strong_count(&alive), 2, "the graph holds the closure");
    out.sum(Kind::Float).backward();
    assert_eq!(alive.load(Ordering::SeqCst), 2, "backward recomputed once");
    drop(out);
    assert_eq!(Arc::strong_count(&alive), 1, "released with the graph");

    // Without grad mode there is no graph: the block runs once and is released at once.
    let counter = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&counter);
    let _guard = tch::no_grad_guard();
    let y = checkpoint(&x, move |x| {
        c.fetch_add(1, Ordering::SeqCst);
        Ok(x + 1.0)
    })
    .unwrap();
    assert!(!y.requires_grad());
    assert_eq!(Arc::strong_count(&counter), 1);
}

#[test]
fn errors_in_forward_and_in_the_recompute_come_back_as_errors() {
    let _turn = serial();
    let x = input(2, 4);
    let err = checkpoint(&x, |_| Err("layer 3 is broken".into()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("layer 3 is broken"), "{err}");

    let calls = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&calls);
    let out = checkpoint(&x, move |x| {
        if c.fetch_add(1, Ordering::SeqCst) == 0 {
            Ok(x * 3.0)
        } else {
            Err("recompute failed".into())
        }
    })
    .unwrap();
    let err = out.sum(Kind::Float).f_backward().unwrap_err().to_string();
    assert!(err.contains("recompute failed"), "{err}");

    let err = checkpoint(&x, |_| panic!("boom")).unwrap_err().to_string();
    assert!(err.contains("panicked"), "{err}");
}
