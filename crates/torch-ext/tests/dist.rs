//! c10d on Gloo over loopback, with the ranks as threads of this test: c10d's DDP engine
//! (`Reducer`) leaves every rank with the gradient of the combined batch, also when some
//! micro-batches skip the all-reduce (`no_sync`); ranks that disagree on the model, a rank that
//! leaves and a master that never comes all end in a `Distributed` error, not a hang.

use std::time::{Duration, Instant};

use kiln_torch_ext::dist::{Buckets, ProcessGroup, Rendezvous};
use kiln_torch_ext::{Error, ErrorKind};
use tch::{Device, Kind, Tensor};

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn connect(rank: usize, world: usize, port: u16, timeout: Duration) -> Result<ProcessGroup, Error> {
    ProcessGroup::connect(
        &Rendezvous::loopback(rank, world, port),
        timeout,
        Some("127.0.0.1"),
    )
}

/// One test at a time, with c10d's flight recorder off: it records a process group's first
/// collective into a map without its lock (libtorch 2.11), so groups of one process that start
/// collectives on several threads at once — ranks as threads, as here; never a real run's
/// single group — can corrupt it.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let guard = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    static OFF: std::sync::Once = std::sync::Once::new();
    // SAFETY: set before any group exists, while this test holds the lock and no other thread
    // of this process touches c10d or the environment.
    OFF.call_once(|| unsafe { std::env::set_var("TORCH_FR_BUFFER_SIZE", "0") });
    guard
}

/// Runs `f(rank, group)` on `world` ranks, one thread each, and returns their results in rank
/// order.
fn on_ranks<R: Send>(world: usize, f: impl Fn(usize, ProcessGroup) -> R + Sync) -> Vec<R> {
    let port = free_port();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let f = &f;
                s.spawn(move || {
                    f(
                        rank,
                        connect(rank, world, port, Duration::from_secs(30)).unwrap(),
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// A small perceptron's parameters, different on every rank until broadcast (made without
/// the global generator, which threads share).
fn params(seed: i64) -> Vec<Tensor> {
    [[6, 16], [16, 16], [16, 3], [3, 3]]
        .iter()
        .map(|s| {
            let n = s[0] * s[1];
            let t = (Tensor::arange(n, (Kind::Float, Device::Cpu)) * 0.7 + seed as f64).sin() * 0.5;
            t.view([s[0], s[1]]).set_requires_grad(true)
        })
        .collect()
}

fn forward(p: &[Tensor], x: &Tensor) -> Tensor {
    x.mm(&p[0]).tanh().mm(&p[1]).tanh().mm(&p[2]).mm(&p[3])
}

/// The step's batch, the same on every rank (which takes its own rows of it); made without
/// the global generator, which the rank threads share.
fn batch(step: i64, rows: i64) -> (Tensor, Tensor) {
    let wave = |n: i64, f: f64| {
        (Tensor::arange(n, (Kind::Float, Device::Cpu)) * f + step as f64 * 0.5).sin()
    };
    (
        wave(rows * 6, 0.37).view([rows, 6]),
        wave(rows * 3, 1.13).view([rows, 3]),
    )
}

/// The largest |a − b| relative to the largest |b| (float32 sums in another order differ by
/// a few ulps of the values' size).
fn max_diff(a: &[Tensor], b: &[Tensor]) -> f64 {
    let largest = |ts: &[Tensor]| {
        ts.iter()
            .map(|t| t.abs().max().double_value(&[]))
            .fold(1e-12, f64::max)
    };
    let gap = a
        .iter()
        .zip(b)
        .map(|(a, b)| (a - b).abs().max().double_value(&[]))
        .fold(0.0, f64::max);
    gap / largest(b)
}

/// Each rank's gradients after `steps` steps of `micro` micro-batches of `rows` rows each, the
/// last one synchronised; and the gradients one process gets from the whole global batch.
fn reduced_and_reference(rank: usize, mut pg: ProcessGroup, micro: i64) -> (f64, f64) {
    let (world, rows) = (2_i64, 4_i64);
    let p = params(1000 + rank as i64);
    pg.verify_params(&p).unwrap();
    pg.broadcast_coalesced(&p, 1 << 20, 0).unwrap();
    let reference: Vec<Tensor> = p
        .iter()
        .map(|t| t.detach().copy().set_requires_grad(true))
        .collect();
    let tiny = Buckets {
        cap_mb: 512.0 / (1024.0 * 1024.0),
        first_mb: 256.0 / (1024.0 * 1024.0),
        find_unused_parameters: false,
    };
    let mut reducer = pg.reducer(&p, tiny).unwrap();
    let (mut worst, mut local_gap) = (0.0_f64, 0.0_f64);
    for step in 0..3 {
        let (x, y) = batch(step, world * rows * micro);
        for m in 0..micro {
            let sync = m == micro - 1;
            let start = (m * world + rank as i64) * rows;
            let (xs, ys) = (x.narrow(0, start, rows), y.narrow(0, start, rows));
            reducer.before_forward(sync).unwrap();
            let loss = forward(&p, &xs).mse_loss(&ys, tch::Reduction::Mean) / micro as f64;
            if sync {
                reducer.before_backward(&[]).unwrap();
            }
            loss.backward();
        }
        forward(&reference, &x)
            .mse_loss(&y, tch::Reduction::Mean)
            .backward();
        let grads: Vec<Tensor> = p.iter().map(Tensor::grad).collect();
        let want: Vec<Tensor> = reference.iter().map(Tensor::grad).collect();
        worst = worst.max(max_diff(&grads, &want));
        // Without the all-reduce this rank's own rows would give another gradient.
        let mine: Vec<Tensor> = p
            .iter()
            .map(|t| t.detach().copy().set_requires_grad(true))
            .collect();
        let xs = x.narrow(0, rank as i64 * rows, rows);
        forward(&mine, &xs)
            .mse_loss(&y.narrow(0, rank as i64 * rows, rows), tch::Reduction::Mean)
            .backward();
        let own: Vec<Tensor> = mine.iter().map(Tensor::grad).collect();
        local_gap = local_gap.max(max_diff(&own, &want));
        tch::no_grad(|| {
            for t in p.iter().chain(&reference) {
                let _ = t.shallow_clone().f_sub_(&(t.grad() * 0.1)).unwrap();
                let _ = t.grad().zero_();
            }
        });
    }
    (worst, local_gap)
}

#[test]
fn the_reducer_gives_every_rank_the_gradient_of_the_global_batch() {
    let _serial = serial();
    for (worst, local_gap) in on_ranks(2, |rank, pg| reduced_and_reference(rank, pg, 1)) {
        assert!(worst < 1e-5, "max |grad − reference| = {worst}");
        assert!(
            local_gap > 1e-3,
            "a rank's own gradient already equals the global one"
        );
    }
}

#[test]
fn micro_batches_that_skip_the_all_reduce_accumulate_like_one_batch() {
    let _serial = serial();
    for (worst, _) in on_ranks(2, |rank, pg| reduced_and_reference(rank, pg, 3)) {
        assert!(worst < 1e-5, "max |grad − reference| = {worst}");
    }
}

#[test]
fn ranks_with_different_models_all_fail_naming_the_difference() {
    let _serial = serial();
    let errors = on_ranks(2, |rank, mut pg| {
        let mut p = params(1);
        if rank == 1 {
            p.pop();
        }
        pg.verify_params(&p).unwrap_err()
    });
    for e in errors {
        assert!(e.to_string().contains("params"), "{e}");
    }
}

#[test]
fn a_rank_that_leaves_ends_the_other_with_an_error_not_a_hang() {
    let _serial = serial();
    let timeout = Duration::from_secs(5);
    let port = free_port();
    let results = std::thread::scope(|s| {
        let leaver = s.spawn(move || {
            let mut pg = connect(1, 2, port, timeout).unwrap();
            pg.barrier().unwrap();
            drop(pg);
        });
        let stayer = s.spawn(move || {
            let mut pg = connect(0, 2, port, timeout).unwrap();
            pg.barrier().unwrap();
            let start = Instant::now();
            let t = Tensor::ones([4], (Kind::Float, Device::Cpu));
            let mut last = Ok(());
            for _ in 0..50 {
                last = pg.all_reduce(std::slice::from_ref(&t), true);
                if last.is_err() {
                    break;
                }
            }
            (last, start.elapsed())
        });
        leaver.join().unwrap();
        stayer.join().unwrap()
    });
    let (result, took) = results;
    let e = result.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Distributed, "{e}");
    assert!(took < timeout + Duration::from_secs(10), "took {took:?}");
}

#[test]
fn a_master_that_never_comes_times_out_with_a_distributed_error() {
    let _serial = serial();
    let start = Instant::now();
    let e = connect(1, 2, free_port(), Duration::from_secs(2)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Distributed, "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "took {:?}",
        start.elapsed()
    );
}
