//! The optimizer suite: one AdamW step over the reference transformer's parameters, kiln's
//! fused kernel (`optim-probe`) against the per-tensor update and `torch.optim.AdamW`.

use std::collections::BTreeMap;

use clap::Args;
use kiln_benches::args::Place;
use kiln_benches::report::{MS_STEP, SuiteOutput};
use kiln_benches::unfused::UnfusedAdamW;
use kiln_benches::{Msg, SuiteArgs, device_name, interleaved, median, median_of};
use kiln_config::ModelKind;
use kiln_train::model::parameter_count;
use kiln_train::optim::{Optimizer, Rule, param_groups};
use kiln_train::source::build;
use serde_json::json;
use tch::{Device, Kind, Tensor, nn};

use super::probe::{fastest, synthetic_input, time_calls};
use super::{Opts, REFERENCE, Result, at_most, by_name, model_plan, words};

/// `optim-probe`'s options.
#[derive(Debug, Args)]
pub struct OptimProbeArgs {
    /// fused (kiln's optimizer) or unfused (the per-tensor update).
    #[arg(long = "impl", default_value = "fused")]
    imp: String,
    #[command(flatten)]
    place: Place,
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    #[arg(long, default_value_t = 50)]
    steps: usize,
}

/// The parameters (shapes) the optimizer benchmarks update: the reference transformer's.
pub fn optimizer_store(device: Device) -> Result<nn::VarStore> {
    let vs = nn::VarStore::new(device);
    let input = synthetic_input(ModelKind::Transformer, REFERENCE.seq)?;
    let plan = model_plan(ModelKind::Transformer, 0.0, &REFERENCE);
    build(&plan, &input, &vs, false, 0).msg()?;
    Ok(vs)
}

/// The optimizer runs' warm-up and timed steps (fewer in `--quick`).
fn optim_steps(o: &Opts) -> (usize, usize) {
    if o.quick { (3, 10) } else { (10, 100) }
}

/// An optimizer run's arguments: `FLAG IMP`, the implementation it times, and the step counts.
pub fn optim_args(o: &Opts, (flag, imp): (&str, &str)) -> Vec<String> {
    let (warmup, steps) = optim_steps(o);
    words(&format!("{flag} {imp} --warmup {warmup} --steps {steps}"))
}

/// Times one AdamW step over the transformer's parameters: kiln's optimizer (the fused kernel,
/// one call per parameter group) or the per-tensor update.
pub fn optim_probe(a: &OptimProbeArgs) -> Result<()> {
    let device = a.place.device();
    let fused = match a.imp.as_str() {
        "fused" => true,
        "unfused" => false,
        other => return Err(format!("--impl `{other}`: expected fused or unfused")),
    };
    let threads = a.place.set_threads()?;
    tch::manual_seed(0);
    let vs = optimizer_store(device)?;
    let groups = param_groups(&vs, 0.01);
    let (params, decays): (Vec<Tensor>, Vec<f64>) = groups
        .iter()
        .flat_map(|g| g.params.iter().map(|p| (p.shallow_clone(), g.weight_decay)))
        .unzip();
    // Fixed random gradients, set through autograd (d/dp Σ p·g = g).
    let grads: Vec<Tensor> = params.iter().map(Tensor::randn_like).collect();
    for (p, g) in params.iter().zip(&grads) {
        p.f_mul(g)
            .and_then(|t| t.f_sum(Kind::Float)?.f_backward())
            .msg()?;
    }
    let step: Box<dyn FnMut() -> Result<()>> = if fused {
        let config = kiln_torch_ext::optim::AdamWConfig {
            lr: 1e-3,
            weight_decay: 0.01,
            ..Default::default()
        };
        let mut opt = Optimizer::new(Rule::AdamW(config), groups).msg()?;
        Box::new(move || opt.step(None, None).msg())
    } else {
        let mut opt = UnfusedAdamW::new(&params, decays, 1e-3).msg()?;
        Box::new(move || opt.step(&params, &grads).msg())
    };
    let times = time_calls(device, (a.warmup, a.steps.max(1)), step)?;
    let run = json!({
        "framework": "kiln", "impl": a.imp, "device": device_name(device), "threads": threads,
        "tensors": vs.variables().len(), "params": parameter_count(&vs),
        "step_s_median": median(times.clone()), "step_s_min": fastest(&times),
    });
    println!("{run}");
    Ok(())
}

/// The transformer's parameter shapes as `train_step.py --shapes` takes them, in name order.
fn shapes_arg() -> Result<String> {
    let vars: BTreeMap<_, _> = optimizer_store(Device::Cpu)?
        .variables()
        .into_iter()
        .collect();
    let dims = |t: &Tensor| t.size().iter().map(i64::to_string).collect::<Vec<_>>();
    let shapes: Vec<String> = vars.values().map(|t| dims(t).join("x")).collect();
    Ok(shapes.join(","))
}

/// The suite's sides: each one's name in the details, the implementation it times
/// (`optim-probe --impl` for kiln's, `train_step.py --optimizer` for PyTorch's) and what it is.
const SIDES: [(&str, &str, &str); 5] = [
    ("kiln_fused", "fused", "kiln's fused AdamW"),
    ("kiln_unfused", "unfused", "kiln AdamW as per-tensor ops"),
    ("torch_fused", "fused", "torch.optim.AdamW(fused=True)"),
    (
        "torch_foreach",
        "foreach",
        "torch.optim.AdamW() (foreach, its default)",
    ),
    ("torch_single", "single", "torch.optim.AdamW(foreach=False)"),
];

/// Each row: what kiln's fused step is set against, that side, the goal. The headline rows: the
/// same kernel as `AdamW(fused=True)` and PyTorch's default; the rows without a goal: ablation.
const ROWS: [(&str, usize, Option<f64>); 4] = [
    ("PyTorch fused (the same kernel)", 2, Some(1.05)),
    ("PyTorch default (foreach)", 3, Some(0.6)),
    ("kiln unfused", 1, None),
    ("PyTorch single-tensor", 4, None),
];

pub fn optimizer_suite(a: &SuiteArgs) -> Result<()> {
    let o = &Opts::new(a)?;
    let shapes = ["--shapes".to_owned(), shapes_arg()?];
    let runs = interleaved(o.repeats, SIDES.len(), |i| match SIDES[i] {
        (side, imp, _) if side.starts_with("kiln") => {
            o.kiln("optim-probe", &optim_args(o, ("--impl", imp)))
        }
        (_, imp, _) => o.torch(&[optim_args(o, ("--optimizer", imp)), shapes.to_vec()].concat()),
    })?;
    let (kiln, torch) = (&runs[0][0], &runs[2][0]);
    if kiln["params"] != torch["params"] {
        return Err(format!(
            "the two sides updated different parameter counts ({} vs {})",
            kiln["params"], torch["params"]
        ));
    }
    let what = format!(
        "one AdamW step over the reference transformer's {} parameters in {} tensors on {}: \
         kiln's fused kernel against the per-tensor update and torch.optim.AdamW",
        kiln["params"],
        kiln["tensors"],
        device_name(o.device)
    );
    let mut out = SuiteOutput::new("optimizer", &what);
    let ms = |i: usize| median_of(&runs[i], "step_s_median") * 1e3;
    for (vs, other, goal) in ROWS {
        let ablation = if goal.is_none() { "ablation: " } else { "" };
        let name = format!("{ablation}AdamW kiln fused vs {vs}");
        let (kiln, theirs, base) = (ms(0), ms(other), SIDES[other].2);
        let c = out.row("optimizer step", name, MS_STEP, (kiln, theirs), base);
        out.push(at_most(c.detail("speedup", json!(theirs / kiln)), goal));
    }
    let (warmup, steps) = optim_steps(o);
    let runs = by_name(SIDES.iter().map(|s| s.0).zip(&runs));
    out.details = json!({"warmup_steps": warmup, "timed_steps": steps, "repeats": o.repeats,
                         "runs": runs});
    out.write(&a.out_or("optimizer"))
}
