//! `cargo xtask bench --suite ddp`: data-parallel training on the CPU, Gloo over loopback:
//! `kiln train` (its transformer, and the torch.export'ed twin through its compiled step) on 1
//! and 2 ranks against PyTorch DDP and a plain loop (`python/ddp_step.py`), same plan and data.

use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Subcommand;
use kiln_benches::report::{Better, Comparison, MS_STEP, NATS, SAMPLES_S, SuiteOutput};
use kiln_benches::run_cli::{Cli, exit_on_error, fresh_work_dir, kiln_exe, plan_args};
use kiln_benches::run_cli::{read_summary, remove_dir, run};
use kiln_benches::{MALLOC_AS_KILN, Msg, Result, SuiteArgs, alternating, command, datasets};
use kiln_benches::{median_of, resolve};
use kiln_config::{ModelKind, RunPlan};
use serde_json::{Value, json};

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

/// The job: every side and rank count trains the same steps of the same per-rank batch.
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

/// `kiln train`'s settings on `world` ranks; the plan they resolve to is what PyTorch is told.
fn kiln_sets(size: &Size, world: usize, threads: usize, runs: &Path) -> Vec<String> {
    let (warmup, batch, epochs, samples) =
        (size.warmup, size.batch, size.epochs, size.samples(world));
    let sets = format!(
        "device.request=cpu train.amp=fp32 model.dropout=0 data.num_workers=1 \
         data.val_fraction=0 checkpoint.enabled=false train.optimizer=adamw \
         train.schedule=cosine train.min_lr=0 run.name=ddp model.name={MODEL} \
         train.warmup_steps={warmup} performance.intra_op_threads={threads} \
         performance.inter_op_threads={threads} train.batch_size={batch} train.epochs={epochs} \
         data.synthetic_samples={samples}"
    );
    let mut sets: Vec<String> = sets.split_whitespace().map(str::to_owned).collect();
    sets.push(format!("run.output_dir={}", runs.display()));
    sets
}

/// The synthetic samples of a 1- and 2-rank run as kiln's `prepared-<ranks>` (the 2-rank ones
/// also as `.npy` files for PyTorch) under `dir`; returns their shape and classes.
fn write_data(dir: &Path, plan: &RunPlan, size: &Size) -> Result<(Vec<usize>, usize)> {
    let seed = plan.performance.backend.seed;
    let mut shape_classes = (vec![], 0);
    for world in [1, 2] {
        let data = kiln_train::models::synthetic_dataset(MODEL, size.samples(world), seed).msg()?;
        let no_classes = || format!("the {MODEL}'s synthetic data have no classes");
        let classes = data.classes().ok_or_else(no_classes)?;
        shape_classes = (data.sample_shape().to_vec(), classes);
        datasets::write_prepared(dir, &format!("prepared-{world}"), &*data, None, world == 2)?;
    }
    Ok(shape_classes)
}

/// What every run of the suite shares.
struct Bench<'a> {
    kiln: PathBuf,
    python: &'a str,
    work: &'a Path,
    size: Size,
    threads: usize,
    plan: &'a RunPlan,
    /// The samples' shape (`[sequence, features]`) and classes.
    sample_shape: Vec<usize>,
    classes: usize,
    /// This machine's CPU model and logical cores.
    cpu: (String, usize),
}

/// The model's PyTorch twin exported by torch.export, in the work directory.
const PROGRAM: &str = "transformer.pt2";

impl Bench<'_> {
    /// One `kiln train` on `world` ranks of the model or (`program`) its twin: rank 0's figures.
    fn kiln_run(&self, world: usize, program: bool) -> Result<Value> {
        let runs = format!("kiln-runs-{world}-{}", u8::from(program));
        let runs = self.work.join(runs);
        remove_dir(&runs)?;
        let mut cmd = command(&self.kiln, &["train"]);
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
        cmd.args(sets.iter().flat_map(|s| ["--set", s]));
        let (_, wall) = run(cmd)?;
        let (_, s) = read_summary(&runs)?;
        let num = |k: &str| kiln_benches::num(&s[k]);
        let all_ranks = (self.size.steps() * self.size.batch * world) as f64;
        if num("samples") != all_ranks {
            let counts = format!("counts {} samples, expected {all_ranks}", s["samples"]);
            return Err(format!("kiln's summary {counts} over {world} rank(s)"));
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

    /// `cmd` (Python and a launcher) running `ddp_step.py` with the plan's values for `world`.
    fn ddp_step(&self, mut cmd: Command, world: usize) -> Command {
        let (d, shape) = (&self.plan.distributed, &self.sample_shape);
        cmd.arg(kiln_benches::bench_root().join("python/ddp_step.py"));
        cmd.arg("--features-file")
            .arg(self.work.join("features.npy"));
        cmd.arg("--labels-file").arg(self.work.join("labels.npy"));
        for (name, v) in [
            ("--samples", self.size.samples(world).to_string()),
            ("--seq", shape[0].to_string()),
            ("--features", shape[1].to_string()),
            ("--classes", self.classes.to_string()),
            ("--bucket-cap-mb", d.bucket_cap_mb.to_string()),
            ("--first-bucket-mb", d.first_bucket_mb.to_string()),
        ] {
            cmd.args([name, &v]);
        }
        plan_args(&mut cmd, self.plan, self.threads);
        cmd
    }
}

/// The sides, in the order they run, with their runs' key in the details: `pytorch-malloc` is
/// DDP with glibc's malloc thresholds as kiln sets them (`performance.malloc_tuning`).
const SIDES: [(&str, usize, &str); 7] = [
    ("kiln", 1, "kiln_1_rank"),
    ("kiln", 2, "kiln_2_ranks"),
    ("pytorch", 1, "pytorch_1_rank"),
    ("pytorch", 2, "pytorch_ddp_2_ranks"),
    ("program", 1, "kiln_program_1_rank"),
    ("program", 2, "kiln_program_2_ranks"),
    ("pytorch-malloc", 2, "pytorch_ddp_2_ranks_malloc"),
];

/// Every run of each side, in [`SIDES`]' order.
type Runs = [Vec<Value>; 7];

/// Runs the sides `repeats` times, alternating; checks each took the steps asked for.
fn measure(bench: &Bench<'_>, repeats: usize) -> Result<Runs> {
    let mut seen: Option<Value> = None;
    let runs = alternating(repeats, &SIDES, |r, (who, world, _)| {
        eprintln!("ddp: repeat {r}: {who}, {world} rank(s)");
        let v = match who {
            "kiln" => bench.kiln_run(world, false)?,
            "program" => bench.kiln_run(world, true)?,
            _ => bench.torch_run(world, who == "pytorch-malloc")?,
        };
        let steps = bench.size.steps();
        if v["steps"].as_u64() != Some(steps as u64) {
            let took = format!("took {} steps, expected {steps}", v["steps"]);
            return Err(format!("{who} on {world} rank(s) {took}"));
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
    let plan = resolve(&kiln_sets(&size, 2, threads, &work))?.plan;
    let (sample_shape, classes) = write_data(&work, &plan, &size)?;
    let bench = Bench {
        kiln: kiln_exe("ddp")?,
        python: &a.python,
        work: &work,
        size,
        threads,
        plan: &plan,
        sample_shape,
        classes,
        cpu: (
            kiln_device::probe::probe().map_or_else(|_| "unknown CPU".to_owned(), |f| f.cpu.model),
            std::thread::available_parallelism().map_or(0, |n| n.get()),
        ),
    };
    // The twin, exported with the same initial weights.
    let mut export = bench.ddp_step(Command::new(&a.python), 1);
    export.arg("--export-program").arg(work.join(PROGRAM));
    run(export)?;
    let runs = measure(&bench, repeats)?;
    let mut out = report(&bench, a.quick, &runs);
    let (m, d) = (&plan.model, &plan.distributed);
    out.details = json!({
        "quick": a.quick, "repeats": repeats, "threads_per_rank": threads,
        "model": m.kind.to_string(), "batch_per_rank": size.batch,
        "steps": size.steps(), "epochs": size.epochs, "warmup": size.warmup,
        "bucket_cap_mb": d.bucket_cap_mb, "first_bucket_mb": d.first_bucket_mb,
        "hidden": m.hidden, "d_model": m.d_model, "layers": m.layers, "heads": m.heads,
        "ff": m.ff, "sample_shape": bench.sample_shape, "classes": bench.classes,
        "cpu": bench.cpu.0, "logical_cpus": bench.cpu.1,
    });
    for ((.., key), r) in SIDES.iter().zip(&runs) {
        out.details[*key] = json!(r);
    }
    out.write(&a.out_or("ddp"))?;
    remove_dir(&work)
}

/// The suite's description: what each side runs, on which CPU.
fn describe(bench: &Bench<'_>, quick: bool, runs: &Runs) -> String {
    let (m, tp) = (&bench.plan.model, &bench.plan.train);
    let (d_model, layers, heads, ff) = (m.d_model, m.layers, m.heads, m.ff);
    let (lr, decay, warmup, clip) = (tp.lr, tp.weight_decay, tp.warmup_steps, tp.clip_grad_norm);
    let (seq, features, classes) = (bench.sample_shape[0], bench.sample_shape[1], bench.classes);
    let (steps, batch, t) = (bench.size.steps(), bench.size.batch, bench.threads);
    let ((cpu, cpus), repeats) = (&bench.cpu, runs[0].len());
    let params = median_of(&runs[0], "parameters");
    let quick = quick.then_some("QUICK (a few steps, shape check only): ");
    let allreduce = median_of(&runs[3], "gradient_allreduce_ms");
    let comm = communication(bench.plan, params, allreduce);
    // kiln's time between steps (fit time less step time, per step): on 2 ranks, the stop vote.
    let [one, two] = [&runs[0], &runs[1]].map(|r| median_of(r, "between_steps_ms"));
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
         counts all ranks; median of {repeats} run(s) per side. {comm} kiln spends {two:.2} ms \
         per step between steps on 2 ranks ({one:.2} ms on 1: the difference is the ranks' vote \
         on stopping, a one-value all-reduce counted while the next step runs, and waiting for \
         the slower rank).",
        quick.unwrap_or_default(),
        malloc = MALLOC_AS_KILN
    )
}

/// What a step communicates: the gradients' size, their buckets, a bare all-reduce's time.
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

const KILN_1: &str = "kiln 1 rank × 1 thread, same per-rank batch and steps";
const DDP_2: &str = "PyTorch DistributedDataParallel, Gloo, 2 ranks × 1 thread";
const TORCH_1: &str = "PyTorch plain loop, 1 process × 1 thread (no DDP)";

/// The suite's rows: kiln's scaling, kiln against DDP, the 1-rank reference and the program's.
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
    let base = format!("{DDP_2}, {MALLOC_AS_KILN}");
    out.push(step(ddp, name, k2, t2_malloc, &base));
    let name = "2 ranks: final train loss vs DDP (learn alike)";
    out.push(learn(ddp, name, k2, t2, DDP_2));
    let name = "1 rank: mean step time vs PyTorch";
    out.push(step(one, name, k1, t1, TORCH_1));
    let name = "1 rank: final train loss vs PyTorch (learn alike)";
    out.push(learn(one, name, k1, t1, TORCH_1));
    // The program's step returns the gradients (no all-reduce during backward): what that lost
    // overlap costs is its 2-rank / 1-rank step time against the built-in model's.
    let group = "exported program (all-reduce after the compiled step)";
    let base = "the program on 1 rank × 1 thread, same per-rank batch and steps";
    let name = "program 2 ranks vs 1 rank: mean step time";
    out.push(step(group, name, p2, p1, base));
    let name = "the lost overlap: 2-rank / 1-rank step time, program vs built-in";
    let base = "the built-in transformer's 2-rank / 1-rank step time (c10d Reducer, all-reduce \
                during backward)";
    let overlap = (ms(p2) / ms(p1), ms(k2) / ms(k1));
    let row = row(group, name, ("×", Better::Lower), overlap, base);
    let row = row.detail("program_2_ranks_ms", json!(ms(p2)));
    out.push(row.detail("builtin_2_ranks_ms", json!(ms(k2))));
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
        let plan = resolve(&sets).unwrap().plan;
        let size = Size::of(true);
        assert_eq!(plan.model.kind, MODEL);
        let two_ranks = 2 * size.batch * size.steps_per_epoch;
        assert_eq!(plan.data.synthetic_samples as usize, two_ranks);
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
        let plan = resolve(&sets).unwrap().plan;
        let small = communication(&plan, 85_002.0, 1.25);
        assert!(small.contains("0.32 MiB"), "{small}");
        assert!(small.contains("nothing overlaps"), "{small}");
        assert!(small.contains("1.25 ms"), "{small}");
        let large = communication(&plan, 3_321_956.0, 10.0);
        assert!(!large.contains("nothing overlaps"), "{large}");
        assert!(large.contains("12.67 MiB"), "{large}");
    }
}
