//! `cargo xtask bench --suite ddp`: data-parallel training on the CPU, Gloo over loopback, in
//! one run side by side. The real CLI trains kiln's `transformer` reference model (its default
//! shape, 3.3 M parameters; fp32, dropout 0, one data worker, `--threads` libtorch threads per
//! rank, default 1) on its synthetic sequences: `kiln train` alone (1 rank) and `kiln train
//! --nproc-per-node 2` (2 ranks, c10d Reducer), each rank taking the same batch and the same
//! number of steps (the 2-rank run gets twice the samples): a job whose compute per step
//! (~140 ms on one core) outweighs its communication (12.7 MiB of gradients, in the default
//! buckets of both sides: a first of 1 MiB, all-reduced while backward goes on, then the rest),
//! as a real one's does. PyTorch trains the same transformer (train_step.py's twin)
//! on the same samples in `python/ddp_step.py`: wrapped in
//! `torch.nn.parallel.DistributedDataParallel` on 2 ranks launched by `python -m
//! torch.distributed.run`, and alone as a plain loop (the 1-rank reference). Every training
//! value (shape, lr, AdamW's weight decay, warmup + cosine, clipping, buckets, seed) is the one
//! kiln resolves for the job.
//!
//! kiln also trains the model's PyTorch twin exported by torch.export (`ddp_step.py
//! --export-program`, the same initial weights) through its compiled step, on the same samples
//! prepared by `kiln data prepare`, on 1 and 2 ranks: the step returns the gradients, so they
//! are all-reduced in one coalesced call after it, with nothing to overlap; its rows show what
//! that lost overlap costs against the built-in model's Reducer.
//!
//! Figures: kiln's samples/s over all ranks and mean step time on 2 ranks against 1 (goals
//! ≥ 1.8× and ≤ 1.1×: the all-reduce hidden behind backward), kiln's mean step time against
//! DDP's (goal ≤ 1.0×), and the final train loss of every side (they learn alike); the
//! description adds kiln's time between steps (the ranks' stop vote). `--quick` (CI) runs
//! a few steps of each to check the suite's shape.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use clap::{Parser, Subcommand};
use kiln_benches::report::{Better, Comparison, SuiteOutput};
use kiln_benches::{SuiteArgs, alternating, bench_root, median};
use kiln_config::{ModelKind, RunPlan};
use serde_json::{Value, json};

use kiln_benches::Result;

/// `kiln-bench ddp`: the ddp suite.
#[derive(Debug, Parser)]
#[command(name = "kiln-bench ddp", args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Sub>,
    /// Without a subcommand: the `ddp` suite.
    #[command(flatten)]
    suite: SuiteArgs,
}

#[derive(Debug, Subcommand)]
enum Sub {
    /// kiln 1 vs 2 ranks and kiln vs PyTorch DDP on 2 ranks, CPU, Gloo.
    Ddp(SuiteArgs),
}

/// Runs the suite's command line (`args[0]` is its name, as clap takes a program name).
pub fn main(args: Vec<std::ffi::OsString>) {
    let cli = Cli::parse_from(args);
    let args = match cli.command {
        Some(Sub::Ddp(a)) => a,
        None => cli.suite,
    };
    if let Err(e) = suite(&args) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// The job; every side and rank count trains the same model on the same steps of the same
/// per-rank batch, with the same gradient buckets.
#[derive(Debug, Clone, Copy)]
struct Size {
    model: ModelKind,
    batch: usize,
    steps_per_epoch: usize,
    epochs: usize,
    /// Warmup steps of the lr schedule (then cosine to 0).
    warmup: usize,
}

impl Size {
    fn of(quick: bool) -> Self {
        if quick {
            Self {
                model: ModelKind::Transformer,
                batch: 4,
                steps_per_epoch: 8,
                epochs: 1,
                warmup: 2,
            }
        } else {
            Self {
                model: ModelKind::Transformer,
                batch: 8,
                steps_per_epoch: 30,
                epochs: 2,
                warmup: 10,
            }
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

/// `kiln train`'s settings for a run on `world` ranks (its rank count comes from the launcher).
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
        format!("model.name={}", size.model),
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

/// The plan `kiln train` resolves for these settings (what the PyTorch side is told).
fn resolve(sets: &[String]) -> Result<RunPlan> {
    Ok(kiln_benches::resolve(sets)?.plan)
}

/// Writes the model's synthetic dataset of `samples`, as `kiln train` makes it, as raw
/// little-endian files: float32 features `[samples, ..sample_shape]` and int64 labels. Returns
/// their paths, the sample's shape and the classes.
fn write_data(dir: &Path, plan: &RunPlan, samples: usize) -> Result<Data> {
    let seed = plan.performance.backend.seed;
    let data = kiln_train::models::synthetic_dataset(plan.model.kind, samples, seed)
        .map_err(|e| e.to_string())?;
    let numel = data.sample_numel();
    let classes = data
        .classes()
        .ok_or_else(|| format!("the {}'s synthetic data have no classes", plan.model.kind))?;
    let (mut x, mut y) = (Vec::with_capacity(samples * numel * 4), vec![]);
    let mut sample = vec![0f32; numel];
    for i in 0..samples {
        let label = data.read(i, &mut sample).map_err(|e| e.to_string())?;
        x.extend(sample.iter().flat_map(|v| v.to_le_bytes()));
        y.extend(label.to_le_bytes());
    }
    let out = Data {
        features_file: dir.join("features.f32"),
        labels_file: dir.join("labels.i64"),
        sample_shape: data.sample_shape().to_vec(),
        classes,
    };
    for (path, bytes) in [(&out.features_file, x), (&out.labels_file, y)] {
        std::fs::write(path, bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(out)
}

/// The raw data files the PyTorch side reads.
struct Data {
    features_file: PathBuf,
    labels_file: PathBuf,
    /// `[features]` (mlp) or `[sequence, features]` (transformer).
    sample_shape: Vec<usize>,
    classes: usize,
}

impl Data {
    /// The features per sample (mlp) or per position (transformer).
    fn features(&self) -> usize {
        self.sample_shape.last().copied().unwrap_or(0)
    }
}

/// Runs `cmd`; its output, or an error with the end of its stderr.
fn run(mut cmd: Command) -> Result<(Output, f64)> {
    let started = Instant::now();
    let out = cmd
        .output()
        .map_err(|e| format!("cannot start {cmd:?}: {e}"))?;
    let seconds = started.elapsed().as_secs_f64();
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(20).collect();
        return Err(format!(
            "{cmd:?} failed ({}):\n{}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        ));
    }
    Ok((out, seconds))
}

/// A port on 127.0.0.1 free right now, for torch.distributed.run's rendezvous.
fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| format!("cannot find a free port for the PyTorch ranks: {e}"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| e.to_string())
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
    program: ProgramJob,
}

/// The model's PyTorch twin exported by torch.export (`ddp_step.py --export-program`), and the
/// same samples as prepared datasets for 1 and 2 ranks.
struct ProgramJob {
    file: PathBuf,
    data: [PathBuf; 2],
}

impl Bench<'_> {
    /// Exports the twin and prepares its datasets (`kiln data prepare` of the raw files' first
    /// samples of a 1- and a 2-rank run).
    fn program_job(&self) -> Result<ProgramJob> {
        let file = self.work.join("transformer.pt2");
        let mut cmd = Command::new(self.python);
        cmd.arg(bench_root().join("python/ddp_step.py"))
            .arg("--features-file")
            .arg(&self.data.features_file)
            .arg("--labels-file")
            .arg(&self.data.labels_file)
            .arg("--export-program")
            .arg(&file);
        for (name, v) in self.torch_args(1) {
            cmd.args([name, &v]);
        }
        run(cmd)?;
        let data = [1, 2].map(|world| self.work.join(format!("prepared-{world}")));
        for (world, dir) in [1, 2].iter().zip(&data) {
            self.prepare(self.size.samples(*world), dir)?;
        }
        Ok(ProgramJob { file, data })
    }

    /// The first `samples` of the raw files as `.npy`, prepared by `kiln data prepare` in `dir`.
    fn prepare(&self, samples: usize, dir: &Path) -> Result<()> {
        let read = |p: &Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
        let numel: usize = self.data.sample_shape.iter().product();
        let x = read(&self.data.features_file)?;
        let values: Vec<f32> = x[..samples * numel * 4]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let mut shape = vec![samples];
        shape.extend(&self.data.sample_shape);
        let (fx, fy) = (dir.with_extension("x.npy"), dir.with_extension("y.npy"));
        let bytes = kiln_data::npy_f32_bytes(&shape, &values).map_err(|e| e.to_string())?;
        std::fs::write(&fx, bytes).map_err(|e| format!("{}: {e}", fx.display()))?;
        let y = read(&self.data.labels_file)?;
        kiln_data::write_npy(&fy, kiln_data::DType::I64, &[samples], &y[..samples * 8])
            .map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&self.kiln);
        cmd.args(["data", "prepare", "--features"])
            .arg(&fx)
            .arg("--labels")
            .arg(&fy)
            .arg("--out")
            .arg(dir);
        run(cmd).map(|_| ())
    }
}

impl Bench<'_> {
    /// One `kiln train` on `world` ranks, of the built-in model or (`program`) of its PyTorch
    /// twin exported by torch.export: the figures of rank 0's `summary.json` (its samples and
    /// samples/s count every rank's).
    fn kiln_run(&self, world: usize, program: bool) -> Result<Value> {
        let runs = self
            .work
            .join(format!("kiln-runs-{world}-{}", u8::from(program)));
        if runs.exists() {
            std::fs::remove_dir_all(&runs).map_err(|e| format!("{}: {e}", runs.display()))?;
        }
        let mut cmd = Command::new(&self.kiln);
        cmd.arg("train");
        if world > 1 {
            cmd.args(["--nproc-per-node", &world.to_string()]);
        }
        // A program brings its own model (dropout 0, as exported) and the prepared data.
        let own = ["model.name=", "model.dropout=", "data.synthetic_samples="];
        for s in kiln_sets(&self.size, world, self.threads, &runs) {
            if !(program && own.iter().any(|o| s.starts_with(o))) {
                cmd.args(["--set", &s]);
            }
        }
        if program {
            let p = &self.program;
            cmd.arg("--set")
                .arg(format!("model.name={}", p.file.display()));
            cmd.arg("--data").arg(&p.data[world - 1]);
        }
        let (_, wall) = run(cmd)?;
        let s = read_summary(&runs)?;
        let num = |k: &str| s[k].as_f64().unwrap_or(f64::NAN);
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

    /// One `ddp_step.py` on `world` ranks: plain Python alone, torch.distributed.run for more.
    fn torch_run(&self, world: usize) -> Result<Value> {
        let mut cmd = Command::new(self.python);
        if world > 1 {
            cmd.args(["-m", "torch.distributed.run", "--nproc-per-node"])
                .arg(world.to_string())
                .args(["--master-addr", "127.0.0.1", "--master-port"])
                .arg(free_port()?.to_string());
        }
        cmd.arg(bench_root().join("python/ddp_step.py"))
            .arg("--features-file")
            .arg(&self.data.features_file)
            .arg("--labels-file")
            .arg(&self.data.labels_file);
        for (name, v) in self.torch_args(world) {
            cmd.args([name, &v]);
        }
        let (out, wall) = run(cmd)?;
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().rev().find(|l| l.starts_with('{'));
        let mut v: Value = line
            .and_then(|l| serde_json::from_str(l).ok())
            .ok_or_else(|| format!("ddp_step.py printed no JSON: {text}"))?;
        v["wall_seconds"] = json!(wall);
        Ok(v)
    }

    /// `ddp_step.py`'s options: the plan's values.
    fn torch_args(&self, world: usize) -> Vec<(&'static str, String)> {
        let (p, t, m) = (self.plan, &self.plan.train, &self.plan.model);
        let mut args = vec![
            ("--model", m.kind.to_string()),
            ("--samples", self.size.samples(world).to_string()),
            ("--features", self.data.features().to_string()),
            ("--classes", self.data.classes.to_string()),
        ];
        if m.kind == ModelKind::Transformer {
            args.extend([
                ("--seq", self.data.sample_shape[0].to_string()),
                ("--d-model", m.d_model.to_string()),
                ("--heads", m.heads.to_string()),
                ("--layers", m.layers.to_string()),
                ("--ff", m.ff.to_string()),
            ]);
        } else {
            let hidden: Vec<String> = m.hidden.iter().map(u64::to_string).collect();
            args.push(("--hidden", hidden.join(",")));
        }
        args.extend([
            ("--bucket-cap-mb", p.distributed.bucket_cap_mb.to_string()),
            (
                "--first-bucket-mb",
                p.distributed.first_bucket_mb.to_string(),
            ),
            ("--batch", self.size.batch.to_string()),
            ("--epochs", self.size.epochs.to_string()),
            ("--seed", p.performance.backend.seed.to_string()),
            ("--lr", t.lr.to_string()),
            ("--weight-decay", t.weight_decay.to_string()),
            ("--warmup", t.warmup_steps.to_string()),
            ("--clip", t.clip_grad_norm.to_string()),
            ("--dropout", p.model.dropout.to_string()),
            ("--threads", self.threads.to_string()),
        ]);
        args
    }
}

/// The `summary.json` of the run under `runs`.
fn read_summary(runs: &Path) -> Result<Value> {
    let dir = std::fs::read_dir(runs)
        .map_err(|e| format!("{}: {e}", runs.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("summary.json").is_file())
        .ok_or_else(|| format!("kiln train wrote no summary.json under {}", runs.display()))?;
    let path = dir.join("summary.json");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The sides, in the order they run.
const SIDES: [(&str, usize); 6] = [
    ("kiln", 1),
    ("kiln", 2),
    ("pytorch", 1),
    ("pytorch", 2),
    ("program", 1),
    ("program", 2),
];

/// Every run of one side.
#[derive(Default)]
struct Runs(Vec<Value>);

impl Runs {
    /// The median over runs of `key`.
    fn median(&self, key: &str) -> f64 {
        median(
            self.0
                .iter()
                .map(|r| r[key].as_f64().unwrap_or(f64::NAN))
                .collect(),
        )
    }
}

/// Runs the sides `repeats` times, the order reversed on odd repeats; checks each run took the
/// steps asked for.
fn measure(bench: &Bench<'_>, repeats: usize) -> Result<[Runs; 6]> {
    let mut seen: Option<Value> = None;
    let runs = alternating(repeats, &SIDES, |r, (who, world)| {
        eprintln!("ddp: repeat {r}: {who}, {world} rank(s)");
        let v = match who {
            "kiln" => bench.kiln_run(world, false)?,
            "program" => bench.kiln_run(world, true)?,
            _ => bench.torch_run(world)?,
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
    let runs: Vec<Runs> = runs.into_iter().map(Runs).collect();
    runs.try_into()
        .map_err(|_| "the ddp suite has six sides".to_owned())
}

fn suite(a: &SuiteArgs) -> Result<()> {
    let size = Size::of(a.quick);
    let repeats = a.repeats_or(if a.quick { 1 } else { 3 }).max(1);
    let threads = a.threads_or(1).max(1);
    let work = a.work_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("kiln-bench-ddp-{}", std::process::id()))
    });
    let work = work.join("ddp");
    if work.exists() {
        std::fs::remove_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    }
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let plan = resolve(&kiln_sets(&size, 2, threads, &work))?;
    let data = write_data(&work, &plan, size.samples(2))?;
    let mut bench = Bench {
        kiln: kiln_exe()?,
        python: &a.python,
        work: &work,
        size,
        threads,
        plan: &plan,
        data: &data,
        program: ProgramJob {
            file: PathBuf::new(),
            data: Default::default(),
        },
    };
    bench.program = bench.program_job()?;
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
        "cpu": cpu_model(), "logical_cpus": logical_cpus(),
        "kiln_1_rank": runs[0].0, "kiln_2_ranks": runs[1].0,
        "pytorch_1_rank": runs[2].0, "pytorch_ddp_2_ranks": runs[3].0,
        "kiln_program_1_rank": runs[4].0, "kiln_program_2_ranks": runs[5].0,
    });
    out.write(&a.out_or("ddp"))?;
    std::fs::remove_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))
}

/// The release CLI beside this binary.
fn kiln_exe() -> Result<PathBuf> {
    let exe = std::env::current_exe()
        .map_err(|e| e.to_string())?
        .with_file_name("kiln");
    if exe.is_file() {
        Ok(exe)
    } else {
        Err(format!(
            "{} is missing: the ddp suite runs the release CLI (cargo xtask bench builds it; by \
             hand: cargo build --release -p kiln-cli)",
            exe.display()
        ))
    }
}

fn cpu_model() -> String {
    kiln_device::probe::probe().map_or_else(|_| "unknown CPU".to_owned(), |f| f.cpu.model)
}

fn logical_cpus() -> usize {
    std::thread::available_parallelism().map_or(0, |n| n.get())
}

/// The suite's description: what each side runs, on which CPU.
fn describe(bench: &Bench<'_>, quick: bool, runs: &[Runs; 6]) -> String {
    let (s, p, d) = (&bench.size, bench.plan, bench.data);
    let t = bench.threads;
    let params = runs[0].median("parameters");
    let model = match p.model.kind {
        ModelKind::Transformer => format!(
            "`transformer` (sequence {} × {} features → d_model {}, {} layers, {} heads, ff {} → \
             {} classes",
            d.sample_shape[0],
            d.features(),
            p.model.d_model,
            p.model.layers,
            p.model.heads,
            p.model.ff,
            d.classes
        ),
        _ => format!(
            "`{}` ({} → {:?} → {}",
            p.model.kind,
            d.features(),
            p.model.hidden,
            d.classes
        ),
    };
    format!(
        "{}data-parallel training on the CPU ({}, {} logical cores), Gloo over 127.0.0.1: \
         kiln's {model}, {params} parameters, fp32, dropout 0) on its synthetic data, {} steps \
         of batch {} per rank, AdamW (lr {}, weight decay {}), warmup {} + cosine, clipping {}. \
         kiln: `kiln train` (1 rank × {t} thread) and `kiln train --nproc-per-node 2` (2 ranks \
         × {t} thread, c10d Reducer), 1 data worker per rank; PyTorch: python/ddp_step.py \
         (train_step.py's twin of the model), torch.nn.parallel.DistributedDataParallel on 2 \
         ranks × {t} thread launched by torch.distributed.run, and a plain loop alone (1 rank), \
         on the same samples, sliced from memory; and kiln training the PyTorch twin exported by \
         torch.export through its compiled step (`kiln train --model transformer.pt2`, the \
         samples prepared by `kiln data prepare`; gradients all-reduced in one coalesced call \
         after the step). A 2-rank run has twice the samples, so every \
         run takes the same steps. Step time is each side's own mean over every step (batch to \
         optimizer step); samples/s counts all ranks; median of {} run(s) per side. {} {}",
        if quick {
            "QUICK (a few steps, shape check only): "
        } else {
            ""
        },
        cpu_model(),
        logical_cpus(),
        s.steps(),
        s.batch,
        p.train.lr,
        p.train.weight_decay,
        p.train.warmup_steps,
        p.train.clip_grad_norm,
        runs[0].0.len(),
        communication(p, params, runs[3].median("gradient_allreduce_ms")),
        between_steps(runs),
    )
}

/// What a step must communicate: the gradient's size, its buckets (in one, nothing can overlap
/// backward on either side), and a bare all-reduce's time.
fn communication(plan: &RunPlan, params: f64, allreduce_ms: f64) -> String {
    let mib = params * 4.0 / 1048576.0;
    let (first, cap) = (
        plan.distributed.first_bucket_mb,
        plan.distributed.bucket_cap_mb,
    );
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
fn between_steps(runs: &[Runs; 6]) -> String {
    let (one, two) = (
        runs[0].median("between_steps_ms"),
        runs[1].median("between_steps_ms"),
    );
    format!(
        "kiln spends {two:.2} ms per step between steps on 2 ranks ({one:.2} ms on 1: the \
         difference is the ranks' vote on stopping, a one-value all-reduce counted while the \
         next step runs, and waiting for the slower rank)."
    )
}

const KILN_1: &str = "kiln 1 rank × 1 thread, same per-rank batch and steps";
const DDP_2: &str = "PyTorch DistributedDataParallel, Gloo, 2 ranks × 1 thread";
const TORCH_1: &str = "PyTorch plain loop, 1 process × 1 thread (no DDP)";

/// The suite's rows: kiln's scaling, kiln against DDP, and the 1-rank reference.
fn report(bench: &Bench<'_>, quick: bool, runs: &[Runs; 6]) -> SuiteOutput {
    let mut out = SuiteOutput::new("ddp", &describe(bench, quick, runs));
    let [k1, k2, _, t2, ..] = runs;
    let row = |group: &str, name: &str, unit: &str, better, figures, base: &str| {
        Comparison::new("ddp", group, name, unit, better, figures, base)
    };
    let sps = "samples_per_s";
    let ms = |r: &Runs| 1e3 * r.median("mean_step_time_s");
    out.push(
        row(
            "kiln scaling",
            "kiln 2 ranks vs 1 rank: samples/s (all ranks)",
            "samples/s",
            Better::Higher,
            (k2.median(sps), k1.median(sps)),
            KILN_1,
        )
        .at_least(1.8),
    );
    out.push(
        row(
            "kiln scaling",
            "kiln 2 ranks vs 1 rank: mean step time",
            "ms/step",
            Better::Lower,
            (ms(k2), ms(k1)),
            KILN_1,
        )
        .at_most(1.1),
    );
    out.push(
        row(
            "vs PyTorch DDP",
            "2 ranks: mean step time vs DDP",
            "ms/step",
            Better::Lower,
            (ms(k2), ms(t2)),
            DDP_2,
        )
        .at_most(1.0),
    );
    push_learning_and_reference(&mut out, runs);
    push_program(&mut out, runs);
    out
}

/// The rows of the exported program: its compiled step returns the gradients, so no autograd
/// hook can start their all-reduce while backward runs; what that lost overlap costs is its
/// 2-rank step time over its 1-rank one, against the built-in model's (the Reducer overlapping).
fn push_program(out: &mut SuiteOutput, runs: &[Runs; 6]) {
    let [k1, k2, _, _, p1, p2] = runs;
    let ms = |r: &Runs| 1e3 * r.median("mean_step_time_s");
    let group = "exported program (all-reduce after the compiled step)";
    out.push(Comparison::new(
        "ddp",
        group,
        "program 2 ranks vs 1 rank: mean step time",
        "ms/step",
        Better::Lower,
        (ms(p2), ms(p1)),
        "the program on 1 rank × 1 thread, same per-rank batch and steps",
    ));
    out.push(
        Comparison::new(
            "ddp",
            group,
            "the lost overlap: 2-rank / 1-rank step time, program vs built-in",
            "×",
            Better::Lower,
            (ms(p2) / ms(p1), ms(k2) / ms(k1)),
            "the built-in transformer's 2-rank / 1-rank step time (c10d Reducer, all-reduce \
             during backward)",
        )
        .detail("program_2_ranks_ms", json!(ms(p2)))
        .detail("builtin_2_ranks_ms", json!(ms(k2))),
    );
}

/// The rows without goals: throughput and scaling against PyTorch's, the final train losses
/// (that the sides learn alike), and the 1-rank reference.
fn push_learning_and_reference(out: &mut SuiteOutput, runs: &[Runs; 6]) {
    let [k1, k2, t1, t2, ..] = runs;
    let (sps, loss) = ("samples_per_s", "final_train_loss");
    let row = |group: &str, name: &str, unit: &str, better, figures, base: &str| {
        Comparison::new("ddp", group, name, unit, better, figures, base)
    };
    out.push(row(
        "vs PyTorch DDP",
        "2 ranks: samples/s (all ranks) vs DDP",
        "samples/s",
        Better::Higher,
        (k2.median(sps), t2.median(sps)),
        DDP_2,
    ));
    out.push(row(
        "vs PyTorch DDP",
        "scaling 2 ranks / 1 rank (samples/s): kiln vs PyTorch",
        "×",
        Better::Higher,
        (
            k2.median(sps) / k1.median(sps),
            t2.median(sps) / t1.median(sps),
        ),
        "PyTorch DDP 2 ranks / PyTorch plain loop 1 rank",
    ));
    out.push(
        row(
            "vs PyTorch DDP",
            "2 ranks: final train loss vs DDP (learn alike)",
            "nats",
            Better::Lower,
            (k2.median(loss), t2.median(loss)),
            DDP_2,
        )
        .detail("difference", json!(k2.median(loss) - t2.median(loss))),
    );
    out.push(row(
        "1-rank reference",
        "1 rank: mean step time vs PyTorch",
        "ms/step",
        Better::Lower,
        (
            1e3 * k1.median("mean_step_time_s"),
            1e3 * t1.median("mean_step_time_s"),
        ),
        TORCH_1,
    ));
    out.push(
        row(
            "1-rank reference",
            "1 rank: final train loss vs PyTorch (learn alike)",
            "nats",
            Better::Lower,
            (k1.median(loss), t1.median(loss)),
            TORCH_1,
        )
        .detail("difference", json!(k1.median(loss) - t1.median(loss))),
    );
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
        let plan = resolve(&sets).unwrap();
        let size = Size::of(true);
        assert_eq!(plan.model.kind, size.model);
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
        let plan = resolve(&kiln_sets(&Size::of(true), 1, 1, Path::new("/r"))).unwrap();
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
