//! The optimizer suite: one AdamW step over the reference transformer's parameters, kiln's
//! fused kernel (`optim-probe`, in its own process) against the per-tensor update and against
//! `torch.optim.AdamW` fused, foreach and single-tensor.

use std::time::Instant;

use clap::Args;
use kiln_benches::args::parse_device;
use kiln_benches::report::{Better, Comparison, SuiteOutput};
use kiln_benches::unfused::UnfusedAdamW;
use kiln_benches::{SuiteArgs, device_name, median, median_of};
use kiln_config::ModelKind;
use kiln_train::model::{InputSpec, parameter_count};
use kiln_train::models::synthetic_shape;
use kiln_train::optim::{Optimizer, Rule, param_groups};
use kiln_train::source::build;
use serde_json::json;
use tch::{Device, Kind, Tensor, nn};

use super::{Opts, Result, model_plan};

/// `optim-probe`'s options.
#[derive(Debug, Args)]
pub struct OptimProbeArgs {
    /// fused (kiln's optimizer) or unfused (the per-tensor update).
    #[arg(long = "impl", default_value = "fused")]
    imp: String,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// cpu, cuda or cuda:N (default: the first CUDA GPU, else the CPU).
    #[arg(long, value_parser = parse_device)]
    device: Option<Device>,
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    #[arg(long, default_value_t = 50)]
    steps: usize,
}

/// The parameters (shapes) the optimizer benchmarks update: the reference transformer's.
pub fn optimizer_store(device: Device) -> Result<nn::VarStore> {
    let vs = nn::VarStore::new(device);
    let (shape, classes) = synthetic_shape(ModelKind::Transformer).ok_or("no synthetic data")?;
    let input = InputSpec {
        sample_shape: shape,
        classes,
        target: None,
        integer_features: false,
    };
    build(
        &model_plan(ModelKind::Transformer, 0.0, &super::REFERENCE),
        &input,
        &vs,
        false,
        0,
    )
    .map_err(|e| e.to_string())?;
    Ok(vs)
}

fn shapes_arg(vs: &nn::VarStore) -> String {
    let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    vars.iter()
        .map(|(_, t)| {
            t.size()
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join("x")
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Times one AdamW step over the transformer's parameters: kiln's optimizer (the fused kernel,
/// one call per parameter group) or the per-tensor update.
pub fn optim_probe(a: &OptimProbeArgs) -> Result<()> {
    let device = a.device.unwrap_or_else(Device::cuda_if_available);
    let threads = a.threads.max(1);
    let (warmup, steps) = (a.warmup, a.steps.max(1));
    let fused = match a.imp.as_str() {
        "fused" => true,
        "unfused" => false,
        other => return Err(format!("--impl `{other}`: expected fused or unfused")),
    };
    kiln_torch_ext::memory::set_num_threads(threads).map_err(|e| e.to_string())?;
    tch::manual_seed(0);
    let vs = optimizer_store(device)?;
    let groups = param_groups(&vs, 0.01);
    let params: Vec<Tensor> = groups
        .iter()
        .flat_map(|g| g.params.iter().map(Tensor::shallow_clone))
        .collect();
    let decays: Vec<f64> = groups
        .iter()
        .flat_map(|g| g.params.iter().map(|_| g.weight_decay))
        .collect();
    // Fixed random gradients, set through autograd (d/dp Σ p·g = g).
    let grads: Vec<Tensor> = params.iter().map(Tensor::randn_like).collect();
    let mut total = Tensor::f_zeros([], (Kind::Float, device)).map_err(|e| e.to_string())?;
    for (p, g) in params.iter().zip(&grads) {
        let term = p
            .f_mul(g)
            .and_then(|t| t.f_sum(Kind::Float))
            .map_err(|e| e.to_string())?;
        total = total.f_add(&term).map_err(|e| e.to_string())?;
    }
    total.f_backward().map_err(|e| e.to_string())?;
    let mut step: Box<dyn FnMut() -> Result<()>> = if fused {
        let config = kiln_torch_ext::optim::AdamWConfig {
            lr: 1e-3,
            weight_decay: 0.01,
            ..Default::default()
        };
        let mut opt = Optimizer::new(Rule::AdamW(config), groups).map_err(|e| e.to_string())?;
        Box::new(move || opt.step(None, None).map_err(|e| e.to_string()))
    } else {
        let mut opt = UnfusedAdamW::new(&params, decays, 1e-3).map_err(|e| e.to_string())?;
        Box::new(move || opt.step(&params, &grads).map_err(|e| e.to_string()))
    };
    let sync = || kiln_torch_ext::cuda::synchronize(device).map_err(|e| e.to_string());
    for _ in 0..warmup {
        step()?;
    }
    sync()?;
    let mut times = vec![];
    for _ in 0..steps {
        let start = Instant::now();
        step()?;
        sync()?;
        times.push(start.elapsed().as_secs_f64());
    }
    println!(
        "{}",
        json!({
            "framework": "kiln",
            "impl": if fused { "fused" } else { "unfused" },
            "device": device_name(device),
            "threads": threads,
            "tensors": vs.variables().len(),
            "params": parameter_count(&vs),
            "step_s_median": median(times.clone()),
            "step_s_min": times.iter().copied().fold(f64::INFINITY, f64::min),
        })
    );
    Ok(())
}

pub fn optimizer_suite(a: &SuiteArgs) -> Result<()> {
    let o = &Opts::new(a)?;
    let (warmup, steps) = if o.quick { (3, 10) } else { (10, 100) };
    let (warm, timed) = (warmup.to_string(), steps.to_string());
    let shapes = shapes_arg(&optimizer_store(Device::Cpu)?);
    let kiln_cmd = |imp: &'static str| {
        let (warm, timed) = (&warm, &timed);
        move || {
            let mut c = o.kiln("optim-probe");
            c.args(["--impl", imp, "--warmup", warm, "--steps", timed]);
            c
        }
    };
    let torch_cmd = |imp: &'static str| {
        let (warm, timed, shapes) = (&warm, &timed, &shapes);
        move || {
            let mut c = o.torch();
            c.args(["--optimizer", imp, "--shapes", shapes])
                .args(["--warmup", warm, "--steps", timed]);
            c
        }
    };
    let (kf, ku) = (kiln_cmd("fused"), kiln_cmd("unfused"));
    let (tf, te, ts) = (
        torch_cmd("fused"),
        torch_cmd("foreach"),
        torch_cmd("single"),
    );
    let runs = o.interleaved(&[&kf, &ku, &tf, &te, &ts])?;
    if runs[0][0]["params"] != runs[2][0]["params"] {
        return Err(format!(
            "the two sides updated different parameter counts ({} vs {})",
            runs[0][0]["params"], runs[2][0]["params"]
        ));
    }
    let ms: Vec<f64> = runs
        .iter()
        .map(|r| median_of(r, "step_s_median") * 1e3)
        .collect();
    let mut out = SuiteOutput::new(
        "optimizer",
        &format!(
            "one AdamW step over the reference transformer's {} parameters in {} tensors on {}: \
             kiln's fused kernel against the per-tensor update and torch.optim.AdamW",
            runs[0][0]["params"],
            runs[0][0]["tensors"],
            device_name(o.device)
        ),
    );
    let c = |name: &str, other: usize, baseline: &str| {
        Comparison::new(
            "optimizer",
            "optimizer step",
            name,
            "ms/step",
            Better::Lower,
            (ms[0], ms[other]),
            baseline,
        )
        .detail("speedup", json!(ms[other] / ms[0]))
    };
    // The headline: the same kernel as `AdamW(fused=True)` (kiln must add nothing around it),
    // and PyTorch's default implementation (foreach). The per-tensor rows are the ablation.
    out.push(
        c(
            "AdamW kiln fused vs PyTorch fused (the same kernel)",
            2,
            "torch.optim.AdamW(fused=True)",
        )
        .at_most(1.05),
    );
    out.push(
        c(
            "AdamW kiln fused vs PyTorch default (foreach)",
            3,
            "torch.optim.AdamW() (foreach, its default)",
        )
        .at_most(0.6),
    );
    out.push(c(
        "ablation: AdamW kiln fused vs kiln unfused",
        1,
        "kiln AdamW as per-tensor ops",
    ));
    out.push(c(
        "ablation: AdamW kiln fused vs PyTorch single-tensor",
        4,
        "torch.optim.AdamW(foreach=False)",
    ));
    out.details = json!({"warmup_steps": warmup, "timed_steps": steps, "repeats": o.repeats,
                         "runs": {"kiln_fused": runs[0], "kiln_unfused": runs[1],
                                  "torch_fused": runs[2], "torch_foreach": runs[3],
                                  "torch_single": runs[4]}});
    out.write(&a.out_or("optimizer"))
}
