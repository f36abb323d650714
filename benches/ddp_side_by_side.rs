//! `cargo xtask bench --suite ddp`: data-parallel training on the CPU, Gloo over loopback, in
//! one run side by side. The real CLI trains kiln's `transformer` reference model (its default
//! shape, 3.3 M parameters; fp32, dropout 0, one data worker, `--threads` libtorch threads per
//! rank, default 1) on its synthetic sequences: `kiln train` alone (1 rank) and `kiln train
//! --nproc-per-node 2` (2 ranks, c10d Reducer), every rank taking the same batch and steps (the
//! 2-rank run gets twice the samples): ~140 ms of compute per step on one core outweighs the
//! communication (12.7 MiB of gradients in both sides' default buckets: a first of 1 MiB,
//! all-reduced while backward goes on, then the rest), as in a real job. PyTorch trains the
//! same transformer (train_step.py's twin) on the same samples in `python/ddp_step.py`, with
//! every value kiln resolves (shape, lr, weight decay, schedule, clipping, buckets, seed): in
//! `DistributedDataParallel` on 2 ranks under `torch.distributed.run`, and alone as a plain
//! loop (the 1-rank reference). kiln also trains the twin exported by torch.export (the same
//! initial weights) through its compiled step on 1 and 2 ranks: the step returns the gradients,
//! all-reduced in one call after it, and its rows show what that lost overlap costs.
//!
//! Figures: kiln's samples/s over all ranks and mean step time on 2 ranks against 1 (goals
//! ≥ 1.8× and ≤ 1.1×: the all-reduce hidden behind backward), kiln's mean step time against
//! DDP's (goal ≤ 1.0×), and the final train loss of every side (they learn alike); the
//! description adds kiln's time between steps (the ranks' stop vote). `--quick` (CI) runs
//! a few steps of each to check the suite's shape.

use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Subcommand;
use kiln_benches::report::{Better, Comparison, MS_STEP, NATS, SAMPLES_S, SuiteOutput};
use kiln_benches::{Msg, Result, SuiteArgs, alternating, bench_root, datasets, median_of};
use kiln_config::{ModelKind, RunPlan};
use serde_json::{Value, json};

use kiln_benches::run_cli::{
    Cli, exit_on_error, fresh_work_dir, kiln_exe, plan_args, read_summary,
};
use kiln_benches::run_cli::{remove_dir, run};

#[derive(Debug, Subcommand)]
enum Sub {
    /// kiln 1 vs 2 ranks and kiln vs PyTorch DDP on 2 ranks, CPU, Gloo.
    Ddp(SuiteArgs),
}

/// Runs the suite's command line (`args[0]` is its name, as clap takes a program name).
pub fn main(args: Vec<std::ffi::OsString>) {
    let cli = Cli::parse_with(args, "`kiln-bench ddp`: the ddp suite");
    exit_on_error(suite(&cli.command.map_or(cli.suite, |Sub::Ddp(a)| a)));
}

/// The model every side trains.
const MODEL: ModelKind = ModelKind::Transformer;

/// The job; every side and rank count trains the same model on the same steps of the same
/// per-rank batch, with the same gradient buckets.
#[derive(Debug, Clone, Copy)]
struct Size {
    batch: usize,
    steps_per_epoch: usize,
    epochs: usize,
    /// Warmup steps of the lr schedule (then cosine to 0).
    warmup: usize,
}

impl Size {
    fn of(quick: bool) -> Self {
        let (batch, steps_per_epoch, epochs, warmup) =
            if quick { (4, 8, 1, 2) } else { (8, 30, 2, 10) };
        Self {
            batch,
            steps_per_epoch,
            epochs,
            warmup,
        }
    }

    /// The samples of a `world`-rank run: each rank's share is whole batches.
    fn samples(&self, world: usize) -> usize {
        world * self.batch * self.steps_per_epoch
    }

    fn steps(&self) -> usize {
        self.steps_per_epoch * self.epochs
    }
}

/// `kiln train`'s settings for a run on `world` ranks (its rank count comes from the launcher);
/// the plan they resolve to is what the PyTorch side is told.
fn kiln_sets(size: &Size, world: usize, threads: usize, runs: &Path) -> Vec<String> {
    let mut sets: Vec<String> = [
        "device.request=cpu",
        "train.amp=fp32",
        "model.dropout=0",
        "data.num_workers=1",
        "data.val_fraction=0",
        "checkpoint.enabled=false",
        "train.optimizer=adamw",
        "train.schedule=cosine",
        "train.min_lr=0",
        "run.name=ddp",
    ]
    .map(str::to_owned)
    .to_vec();
    sets.extend([
        format!("model.name={MODEL}"),
        format!("train.warmup_steps={}", size.warmup),
        format!("performance.intra_op_threads={threads}"),
        format!("performance.inter_op_threads={threads}"),
        format!("train.batch_size={}", size.batch),
        format!("train.epochs={}", size.epochs),
        format!("data.synthetic_samples={}", size.samples(world)),
        format!("run.output_dir={}", runs.display()),
    ]);
    sets
}

/// The model's synthetic samples of a 1- and a 2-rank run, as `kiln train` makes them,
/// prepared by kiln's data prepare as the datasets `prepared-<ranks>` under `dir` (what the
/// exported program trains on); the 2-rank ones also as `features.npy` and `labels.npy`, which
/// the PyTorch side reads (a 1-rank run their first samples).
fn write_data(dir: &Path, plan: &RunPlan, size: &Size) -> Result<Data> {
    let seed = plan.performance.backend.seed;
    let mut out = Data::default();
    for world in [1, 2] {
        let data = kiln_train::models::synthetic_dataset(MODEL, size.samples(world), seed).msg()?;
        let classes = data
            .classes()
            .ok_or_else(|| format!("the {MODEL}'s synthetic data have no classes"))?;
        let name = format!("prepared-{world}");
        datasets::write_prepared(dir, &name, &*data, None, world == 2)?;
        out = Data {
            sample_shape: data.sample_shape().to_vec(),
            classes,
        };
    }
    Ok(out)
}

/// The samples' shape (`[sequence, features]`) and classes.
#[derive(Debug, Default)]
struct Data {
    sample_shape: Vec<usize>,
    classes: usize,
}

/// What every run of the suite shares.
struct Bench<'a> {
    kiln: PathBuf,
    python: &'a str,
    work: &'a Path,
    size: Size,
    threads: usize,
    plan: &'a RunPlan,
    data: &'a Data,
    /// This machine's CPU model and logical cores.
    cpu: (String, usize),
}

/// The model's PyTorch twin exported by torch.export (`ddp_step.py --export-program`), in the
/// work directory beside its datasets `prepared-<ranks>`.
const PROGRAM: &str = "transformer.pt2";

impl Bench<'_> {
    /// Exports the twin (`ddp_step.py --export-program`, the same initial weights).
    fn export_program(&self) -> Result<()> {
        let mut cmd = self.ddp_step(Command::new(self.python), 1);
        cmd.arg("--export-program").arg(self.work.join(PROGRAM));
        run(cmd).map(|_| ())
    }

    /// One `kiln train` on `world` ranks, of the built-in model or (`program`) of its PyTorch
    /// twin exported by torch.export: the figures of rank 0's `summary.json` (its samples and
    /// samples/s count every rank's).
    fn kiln_run(&self, world: usize, program: bool) -> Result<Value> {
        let runs = format!("kiln-runs-{world}-{}", u8::from(program));
        let runs = self.work.join(runs);
        remove_dir(&runs)?;
        let mut cmd = Command::new(&self.kiln);
        cmd.arg("train");
        if world > 1 {
            cmd.args(["--nproc-per-node", &world.to_string()]);
        }
        let mut sets = kiln_sets(&self.size, world, self.threads, &runs);
        if program {
            // A program brings its own model (dropout 0, as exported) and the prepared data.
            let own = ["model.name=", "model.dropout=", "data.synthetic_samples="];
            sets.retain(|s| !own.iter().any(|o| s.starts_with(o)));
            sets.push(format!("model.name={}", self.work.join(PROGRAM).display()));
            cmd.arg("--data")
                .arg(self.work.join(format!("prepared-{world}")));
        }
        for s in &sets {
            cmd.args(["--set", s]);
        }
        let (_, wall) = run(cmd)?;
        let (_, s) = read_summary(&runs)?;
        let num = |k: &str| kiln_benches::num(&s[k]);
        let all_ranks = (self.size.steps() * self.size.batch * world) as f64;
        if num("samples") != all_ranks {
            return Err(format!(
                "kiln's summary counts {} samples, expected {all_ranks} over {world} rank(s)",
                s["samples"]
            ));
        }
        let steps = num("steps");
        let between = (num("seconds") - steps * num("mean_step_time_s")) / steps;
        Ok(json!({
            "framework": "kiln", "world_size": world, "steps": s["steps"],
            "between_steps_ms": 1e3 * between,
            "mean_step_time_s": num("mean_step_time_s"),
            "samples_per_s": num("samples_per_s"),
            "final_train_loss": s["final_train_loss"], "fit_seconds": s["seconds"],
            "wall_seconds": wall, "parameters": s["parameters"],
        }))
    }

    /// One `ddp_step.py` on `world` ranks: plain Python alone, torch.distributed.run for more;
    /// with `malloc`, glibc's malloc thresholds as kiln sets them (every rank inherits them).
    fn torch_run(&self, world: usize, malloc: bool) -> Result<Value> {
        let mut cmd = Command::new(self.python);
        if malloc {
            kiln_benches::malloc_like_kiln(&mut cmd);
        }
        if world > 1 {
            // A port on 127.0.0.1 free right now, for torch.distributed.run's rendezvous.
            let port = kiln_benches::free_port()?;
            cmd.args(["-m", "torch.distributed.run", "--nproc-per-node"])
                .arg(world.to_string())
                .args(["--master-addr", "127.0.0.1", "--master-port"])
                .arg(port.to_string());
        }
        let (out, wall) = run(self.ddp_step(cmd, world))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let mut v = kiln_benches::last_json(&text)
            .map_err(|e| format!("ddp_step.py printed no JSON ({e}): {text}"))?;
        v["wall_seconds"] = json!(wall);
        Ok(v)
    }

    /// `cmd` (Python, and its launcher's arguments) running `ddp_step.py` on the raw files, with
    /// the plan's values for `world` ranks.
    fn ddp_step(&self, mut cmd: Command, world: usize) -> Command {
        let (d, shape) = (&self.plan.distributed, &self.data.sample_shape);
        cmd.arg(bench_root().join("python/ddp_step.py"));
        cmd.arg("--features-file")
            .arg(self.work.join("features.npy"));
        cmd.arg("--labels-file").arg(self.work.join("labels.npy"));
        for (name, v) in [
            ("--samples", self.size.samples(world).to_string()),
            ("--seq", shape[0].to_string()),
            ("--features", shape[1].to_string()),
            ("--classes", self.data.classes.to_string()),
            ("--bucket-cap-mb", d.bucket_cap_mb.to_string()),
            ("--first-bucket-mb", d.first_bucket_mb.to_string()),
        ] {
            cmd.args([name, &v]);
        }
        plan_args(&mut cmd, self.plan, self.threads);
        cmd
    }
}

/// The sides, in the order they run: `pytorch-malloc` is DDP with glibc's malloc thresholds
/// as kiln sets them for its runs (`performance.malloc_tuning`).
const SIDES: [(&str, usize); 7] = [
    ("kiln", 1),
    ("kiln", 2),
    ("pytorch", 1),
    ("pytorch", 2),
    ("program", 1),
    ("program", 2),
    ("pytorch-malloc", 2),
];

/// Every run of each side, in [`SIDES`]' order.
type Runs = [Vec<Value>; 7];

/// Runs the sides `repeats` times, the order reversed on odd repeats; checks each run took the
/// steps asked for.
fn measure(bench: &Bench<'_>, repeats: usize) -> Result<Runs> {
    let mut seen: Option<Value> = None;
    let runs = alternating(repeats, &SIDES, |r, (who, world)| {
        eprintln!("ddp: repeat {r}: {who}, {world} rank(s)");
        let v = match who {
            "kiln" => bench.kiln_run(world, false)?,
            "program" => bench.kiln_run(world, true)?,
            _ => bench.torch_run(world, who == "pytorch-malloc")?,
        };
        if v["steps"].as_u64() != Some(bench.size.steps() as u64) {
            return Err(format!(
                "{who} on {world} rank(s) took {} steps, expected {}",
                v["steps"],
                bench.size.steps()
            ));
        }
        let first = seen.get_or_insert_with(|| v.clone());
        if first["parameters"] != v["parameters"] {
            return Err(format!(
                "{who} on {world} rank(s) trains {} parameters, {} {} rank(s) {}: not the \
                 same model",
                v["parameters"], first["framework"], first["world_size"], first["parameters"]
            ));
        }
        Ok(Some(v))
    })?;
    runs.try_into()
        .map_err(|_| "the ddp suite has seven sides".to_owned())
}

fn suite(a: &SuiteArgs) -> Result<()> {
    let size = Size::of(a.quick);
    let repeats = a.repeats_or(if a.quick { 1 } else { 3 }).max(1);
    let threads = a.threads_or(1).max(1);
    let work = fresh_work_dir(a, "ddp")?;
    let plan = kiln_benches::resolve(&kiln_sets(&size, 2, threads, &work))?.plan;
    let data = write_data(&work, &plan, &size)?;
    let bench = Bench {
        kiln: kiln_exe("ddp")?,
        python: &a.python,
        work: &work,
        size,
        threads,
        plan: &plan,
        data: &data,
        cpu: (
            kiln_device::probe::probe().map_or_else(|_| "unknown CPU".to_owned(), |f| f.cpu.model),
            std::thread::available_parallelism().map_or(0, |n| n.get()),
        ),
    };
    bench.export_program()?;
    let runs = measure(&bench, repeats)?;
    let mut out = report(&bench, a.quick, &runs);
    out.details = json!({
        "quick": a.quick, "repeats": repeats, "threads_per_rank": threads,
        "model": plan.model.kind.to_string(), "batch_per_rank": size.batch,
        "steps": size.steps(), "epochs": size.epochs, "warmup": size.warmup,
        "bucket_cap_mb": plan.distributed.bucket_cap_mb,
        "first_bucket_mb": plan.distributed.first_bucket_mb,
        "hidden": plan.model.hidden, "d_model": plan.model.d_model, "layers": plan.model.layers,
        "heads": plan.model.heads, "ff": plan.model.ff, "sample_shape": data.sample_shape,
        "classes": data.classes,
        "cpu": bench.cpu.0, "logical_cpus": bench.cpu.1,
        "kiln_1_rank": runs[0], "kiln_2_ranks": runs[1],
        "pytorch_1_rank": runs[2], "pytorch_ddp_2_ranks": runs[3],
        "kiln_program_1_rank": runs[4], "kiln_program_2_ranks": runs[5],
        "pytorch_ddp_2_ranks_malloc": runs[6],
    });
    out.write(&a.out_or("ddp"))?;
    remove_dir(&work)
}

/// The suite's description: what each side runs, on which CPU.
fn describe(bench: &Bench<'_>, quick: bool, runs: &Runs) -> String {
    let (m, tp) = (&bench.plan.model, &bench.plan.train);
    let (d_model, layers, heads, ff) = (m.d_model, m.layers, m.heads, m.ff);
    let (lr, decay, warmup, clip) = (tp.lr, tp.weight_decay, tp.warmup_steps, tp.clip_grad_norm);
    let (shape, classes) = (&bench.data.sample_shape, bench.data.classes);
    let (seq, features) = (shape[0], shape[1]);
    let (steps, batch, t) = (bench.size.steps(), bench.size.batch, bench.threads);
    let ((cpu, cpus), repeats) = (&bench.cpu, runs[0].len());
    let params = median_of(&runs[0], "parameters");
    let quick = quick.then_some("QUICK (a few steps, shape check only): ");
    let allreduce = median_of(&runs[3], "gradient_allreduce_ms");
    let comm = communication(bench.plan, params, allreduce);
    let between = between_steps(runs);
    format!(
        "{}data-parallel training on the CPU ({cpu}, {cpus} logical cores), Gloo over \
         127.0.0.1: kiln's `transformer` (sequence {seq} × {features} features → d_model \
         {d_model}, {layers} layers, {heads} heads, ff {ff} → {classes} classes, {params} \
         parameters, fp32, dropout 0) on its synthetic data, {steps} steps of batch {batch} per \
         rank, AdamW (lr {lr}, weight decay {decay}), warmup {warmup} + cosine, clipping {clip}. \
         kiln: `kiln train` (1 rank × {t} thread) and `kiln train --nproc-per-node 2` (2 ranks × \
         {t} thread, c10d Reducer), 1 data worker per rank; PyTorch: python/ddp_step.py \
         (train_step.py's twin of the model), torch.nn.parallel.DistributedDataParallel on 2 \
         ranks × {t} thread launched by torch.distributed.run, and a plain loop alone (1 rank), \
         on the same samples, sliced from memory (DDP also with {malloc}); and kiln training \
         the PyTorch twin exported by torch.export through its compiled step (`kiln train \
         --model transformer.pt2`, the samples prepared by `kiln data prepare`; gradients \
         all-reduced in one coalesced call after the step). A 2-rank run has twice the \
         samples, so every run takes the same steps. \
         Step time is each side's own mean over every step (batch to optimizer step); samples/s \
         counts all ranks; median of {repeats} run(s) per side. {comm} {between}",
        quick.unwrap_or_default(),
        malloc = kiln_benches::MALLOC_AS_KILN
    )
}

/// What a step must communicate: the gradient's size, its buckets (in one, nothing can overlap
/// backward on either side), and a bare all-reduce's time.
fn communication(plan: &RunPlan, params: f64, allreduce_ms: f64) -> String {
    let mib = params * 4.0 / 1048576.0;
    let d = &plan.distributed;
    let (first, cap) = (d.first_bucket_mb, d.bucket_cap_mb);
    let buckets = if mib <= first {
        format!(
            ", within the first {first} MiB bucket (both sides), so its one all-reduce starts \
             after backward and nothing overlaps"
        )
    } else {
        let n = 1 + ((mib - first) / cap).ceil() as usize;
        format!(
            " in about {n} buckets (both sides: the first {first} MiB, then {cap} MiB each), \
             all-reduced as backward fills them"
        )
    };
    format!(
        "Each step all-reduces {mib:.2} MiB of gradients{buckets}; a bare Gloo all-reduce of \
         that size takes {allreduce_ms:.2} ms here (timed by the PyTorch ranks)."
    )
}

/// kiln's time between steps, outside the step time (its fit time less its steps' time, per
/// step): on 2 ranks it holds the one-value all-reduce by which the ranks agree whether to stop.
fn between_steps(runs: &Runs) -> String {
    let [one, two] = [&runs[0], &runs[1]].map(|r| median_of(r, "between_steps_ms"));
    format!(
        "kiln spends {two:.2} ms per step between steps on 2 ranks ({one:.2} ms on 1: the \
         difference is the ranks' vote on stopping, a one-value all-reduce counted while the \
         next step runs, and waiting for the slower rank)."
    )
}

const KILN_1: &str = "kiln 1 rank × 1 thread, same per-rank batch and steps";
const DDP_2: &str = "PyTorch DistributedDataParallel, Gloo, 2 ranks × 1 thread";
const TORCH_1: &str = "PyTorch plain loop, 1 process × 1 thread (no DDP)";

/// The suite's rows: kiln's scaling, kiln against DDP, the 1-rank reference and the exported
/// program's; those without goals show throughput and scaling against PyTorch's and the final
/// train losses (that the sides learn alike).
fn report(bench: &Bench<'_>, quick: bool, runs: &Runs) -> SuiteOutput {
    let mut out = SuiteOutput::new("ddp", &describe(bench, quick, runs));
    let [k1, k2, t1, t2, p1, p2, t2_malloc] = runs;
    let row = |group: &str, name: &str, unit, figures, base: &str| {
        Comparison::new("ddp", group, name, unit, figures, base)
    };
    let sps = |r: &Vec<Value>| median_of(r, "samples_per_s");
    let ms = |r: &Vec<Value>| 1e3 * median_of(r, "mean_step_time_s");
    let loss = |r: &Vec<Value>| median_of(r, "final_train_loss");
    let rate = |g, n, a, b, base| row(g, n, SAMPLES_S, (sps(a), sps(b)), base);
    let step = |g, n, a, b, base| row(g, n, MS_STEP, (ms(a), ms(b)), base);
    let learn = |g, n, a, b, base| {
        row(g, n, NATS, (loss(a), loss(b)), base).detail("difference", json!(loss(a) - loss(b)))
    };
    let (scaling, ddp, one) = ("kiln scaling", "vs PyTorch DDP", "1-rank reference");
    let name = "kiln 2 ranks vs 1 rank: samples/s (all ranks)";
    out.push(rate(scaling, name, k2, k1, KILN_1).at_least(1.8));
    let name = "kiln 2 ranks vs 1 rank: mean step time";
    out.push(step(scaling, name, k2, k1, KILN_1).at_most(1.1));
    let name = "2 ranks: mean step time vs DDP";
    out.push(step(ddp, name, k2, t2, DDP_2).at_most(1.0));
    let name = "2 ranks: samples/s (all ranks) vs DDP";
    out.push(rate(ddp, name, k2, t2, DDP_2));
    let name = "scaling 2 ranks / 1 rank (samples/s): kiln vs PyTorch";
    let scalings = (sps(k2) / sps(k1), sps(t2) / sps(t1));
    let base = "PyTorch DDP 2 ranks / PyTorch plain loop 1 rank";
    out.push(row(ddp, name, ("×", Better::Higher), scalings, base));
    let name = "2 ranks: mean step time vs DDP with kiln's malloc thresholds";
    let base = format!("{DDP_2}, {}", kiln_benches::MALLOC_AS_KILN);
    out.push(step(ddp, name, k2, t2_malloc, &base));
    let name = "2 ranks: final train loss vs DDP (learn alike)";
    out.push(learn(ddp, name, k2, t2, DDP_2));
    let name = "1 rank: mean step time vs PyTorch";
    out.push(step(one, name, k1, t1, TORCH_1));
    let name = "1 rank: final train loss vs PyTorch (learn alike)";
    out.push(learn(one, name, k1, t1, TORCH_1));
    // The exported program's compiled step returns the gradients, so no autograd hook can
    // start their all-reduce while backward runs; what that lost overlap costs is its 2-rank
    // step time over its 1-rank one, against the built-in model's (the Reducer overlapping).
    let group = "exported program (all-reduce after the compiled step)";
    let base = "the program on 1 rank × 1 thread, same per-rank batch and steps";
    let name = "program 2 ranks vs 1 rank: mean step time";
    out.push(step(group, name, p2, p1, base));
    let name = "the lost overlap: 2-rank / 1-rank step time, program vs built-in";
    let base = "the built-in transformer's 2-rank / 1-rank step time (c10d Reducer, all-reduce \
                during backward)";
    let overlap = (ms(p2) / ms(p1), ms(k2) / ms(k1));
    out.push(
        row(group, name, ("×", Better::Lower), overlap, base)
            .detail("program_2_ranks_ms", json!(ms(p2)))
            .detail("builtin_2_ranks_ms", json!(ms(k2))),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_run_takes_the_same_steps_of_whole_batches() {
        for quick in [true, false] {
            let s = Size::of(quick);
            assert_eq!(s.samples(2), 2 * s.samples(1));
            assert_eq!(s.samples(2) / (2 * s.batch) * s.epochs, s.steps());
        }
    }

    #[test]
    fn kilns_settings_are_keys_it_knows() {
        let sets = kiln_sets(&Size::of(true), 2, 1, Path::new("/tmp/runs"));
        let plan = kiln_benches::resolve(&sets).unwrap().plan;
        let size = Size::of(true);
        assert_eq!(plan.model.kind, MODEL);
        assert_eq!(
            plan.data.synthetic_samples as usize,
            2 * size.batch * size.steps_per_epoch
        );
        assert_eq!((plan.data.num_workers, plan.model.dropout), (1, 0.0));
        assert_eq!(plan.performance.backend.intra_op_threads, 1);
        assert_eq!(plan.train.warmup_steps as usize, size.warmup);
        // Gradient buckets as DDP's defaults (what ddp_step.py is told: the plan's).
        let d = &plan.distributed;
        assert_eq!((d.bucket_cap_mb, d.first_bucket_mb), (25.0, 1.0));
    }

    #[test]
    fn the_communication_note_says_when_nothing_can_overlap() {
        let sets = kiln_sets(&Size::of(true), 1, 1, Path::new("/r"));
        let plan = kiln_benches::resolve(&sets).unwrap().plan;
        let small = communication(&plan, 85_002.0, 1.25);
        assert!(
            small.contains("0.32 MiB") && small.contains("nothing overlaps"),
            "{small}"
        );
        assert!(small.contains("1.25 ms"), "{small}");
        let large = communication(&plan, 3_321_956.0, 10.0);
        assert!(!large.contains("nothing overlaps"), "{large}");
        assert!(large.contains("12.67 MiB"), "{large}");
    }
}
