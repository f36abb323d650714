//! gpu-check step about data-parallel training on CUDA: a one-rank c10d group with NCCL (one
//! GPU can hold only one NCCL rank) all-reduces a CUDA tensor, c10d's Reducer averages CUDA
//! gradients during backward, and a training run joined to the group learns exactly as the
//! same run alone.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use kiln_torch_ext::dist::{Buckets, ProcessGroup, Rendezvous};
use kiln_train::distributed::SharedGroup;
use kiln_train::run::RunControl;
use tch::{Device, Kind, Tensor};

use super::training::{Record, plan, train};
use super::{Ctx, Outcome};

/// World size 1 on 127.0.0.1 at a port free now.
fn rendezvous() -> anyhow::Result<Rendezvous> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    Ok(Rendezvous::loopback(0, 1, port))
}

fn connect() -> anyhow::Result<ProcessGroup> {
    let timeout = Duration::from_secs(60);
    Ok(ProcessGroup::connect_nccl(
        &rendezvous()?,
        timeout,
        Some("127.0.0.1"),
        0,
    )?)
}

/// NCCL's all-reduce of a CUDA tensor, and a Reducer step's gradients against plain backward's.
fn collectives() -> anyhow::Result<f64> {
    let mut pg = connect()?;
    check_collectives(&mut pg, Device::Cuda(0))
}

/// In a one-rank group: a mean all-reduce of a tensor on `device` leaves it as it is, and the
/// largest gap between the Reducer's gradients and plain backward's.
fn check_collectives(pg: &mut ProcessGroup, device: Device) -> anyhow::Result<f64> {
    let t = Tensor::f_arange(8, (Kind::Float, device))?;
    pg.all_reduce(std::slice::from_ref(&t), true)?;
    let want = Tensor::f_arange(8, (Kind::Float, device))?;
    anyhow::ensure!(
        t.f_equal(&want)?,
        "the mean all-reduce over one rank changed the tensor"
    );
    let w = Tensor::f_randn([32, 8], (Kind::Float, device))?.set_requires_grad(true);
    let x = Tensor::f_randn([16, 32], (Kind::Float, device))?;
    let mut reducer = pg.reducer(std::slice::from_ref(&w), Buckets::default())?;
    reducer.before_forward(true)?;
    let loss = x.f_mm(&w)?.f_tanh()?.f_sum(Kind::Float)?;
    reducer.before_backward(&[])?;
    loss.f_backward()?;
    let reduced = w.grad().f_detach_copy()?;
    // A fresh leaf with w's values: detach first (`detach_copy` of a tensor that requires
    // grad records an op without a derivative, and backward through it fails).
    let mut plain = w.f_detach()?.f_zeros_like()?;
    plain.f_copy_(&w.f_detach()?)?;
    let plain = plain.set_requires_grad(true);
    x.f_mm(&plain)?.f_tanh()?.f_sum(Kind::Float)?.f_backward()?;
    Ok(reduced
        .f_sub(&plain.grad())?
        .f_abs()?
        .f_max()?
        .f_double_value(&[])?)
}

pub fn nccl(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let gap = collectives().context("NCCL collectives")?;
    let sets = [
        "model.name=mlp",
        "model.dropout=0",
        "data.num_workers=2",
        "checkpoint.enabled=false",
        "data.synthetic_samples=1712",
        "train.batch_size=64",
        "train.epochs=1",
        "train.log_interval=1",
        "train.amp=fp32",
    ];
    let mut alone = Record::default();
    train(
        &plan(ctx.device_key(), &ctx.dir.join("alone"), &sets)?,
        &mut alone,
        RunControl::default(),
    )?;
    let group: SharedGroup = Arc::new(Mutex::new(connect()?));
    let control = RunControl {
        group: Some(group),
        ..RunControl::default()
    };
    let mut joined = Record::default();
    train(
        &plan(ctx.device_key(), &ctx.dir.join("joined"), &sets)?,
        &mut joined,
        control,
    )?;
    let worst = alone
        .steps
        .iter()
        .zip(&joined.steps)
        .map(|(a, b)| {
            (a.metrics.loss() - b.metrics.loss()).abs() / a.metrics.loss().abs().max(1e-12)
        })
        .fold(0.0, f64::max);
    let same_length = alone.steps.len() == joined.steps.len() && !alone.steps.is_empty();
    let pass = gap < 1e-5 && same_length && worst <= 1e-5;
    Ok(Outcome::new(
        pass,
        format!(
            "NCCL world size 1: Reducer gradients within {gap:.1e} of plain backward; a run in \
             the group logs {} steps, losses within {worst:.1e} (relative) of the run alone",
            joined.steps.len()
        ),
    )
    .figure("reducer_max_abs_grad_gap", gap)
    .figure("max_relative_loss_gap", worst)
    .figure("steps", joined.steps.len() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The step's collective checks, on a one-rank Gloo group on the CPU.
    #[test]
    fn the_collective_checks_pass_on_a_one_rank_gloo_group() {
        let mut pg = ProcessGroup::connect(
            &rendezvous().unwrap(),
            Duration::from_secs(60),
            Some("127.0.0.1"),
        )
        .unwrap();
        let gap = check_collectives(&mut pg, Device::Cpu).unwrap();
        assert!(
            gap < 1e-6,
            "Reducer gradients {gap:e} from plain backward's"
        );
    }
}
