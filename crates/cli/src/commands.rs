//! The commands: each loads what it needs from the library crates and prints a report.

use std::process::ExitCode;

use anyhow::Context;
use kiln_config::{ConfigRequest, Machine, Resolution};
use kiln_device::libtorch::libtorch_info;
use kiln_device::{ComputeCapability, DeviceRequest};
use kiln_profiles::ProfileSet;

use crate::args::{ConfigArgs, Format, ProfilesAction, TrainArgs};
use crate::progress::ProgressView;
use crate::report;

pub fn version() -> anyhow::Result<ExitCode> {
    let info = libtorch_info()?;
    print!("{}", report::version(&info));
    Ok(ExitCode::SUCCESS)
}

fn parse_cc(text: Option<&str>, flag: &str) -> anyhow::Result<Option<ComputeCapability>> {
    text.map(|t| t.parse::<ComputeCapability>())
        .transpose()
        .map_err(|e| anyhow::anyhow!("{flag}: {e}"))
}

/// Loads the configuration the arguments describe, on this machine or a simulated one.
pub fn load(args: &ConfigArgs) -> anyhow::Result<Resolution> {
    load_with_flags(args, args.flags())
}

/// Like [`load`], with these friendly flags as the command-line layer.
fn load_with_flags(
    args: &ConfigArgs,
    flags: Vec<(String, String, String)>,
) -> anyhow::Result<Resolution> {
    load_layers(args, flags, None)
}

/// Like [`load_with_flags`], with a checkpoint's settings as a layer under the user's.
pub fn load_layers(
    args: &ConfigArgs,
    flags: Vec<(String, String, String)>,
    checkpoint: Option<(String, Vec<(String, String)>)>,
) -> anyhow::Result<Resolution> {
    let machine = if args.simulating() {
        let profiles = ProfileSet::builtin()?;
        let cc = parse_cc(args.compute_capability.as_deref(), "--compute-capability")?;
        let cpu = kiln_device::probe::probe_cpu();
        Machine::Simulated(kiln_config::simulated_machine(
            &profiles,
            args.simulate_gpu.as_deref(),
            args.memory_gib,
            cc,
            args.cpus,
            cpu,
        )?)
    } else {
        Machine::Probed(kiln_device::probe::probe()?)
    };
    let mut req = ConfigRequest::new(machine);
    req.file = args.config.clone();
    req.sets = args.sets.clone();
    req.flags = flags;
    req.checkpoint = checkpoint;
    Ok(kiln_config::load(&req)?)
}

pub fn doctor(args: &ConfigArgs, format: Format) -> anyhow::Result<ExitCode> {
    let info = libtorch_info()?;
    let resolution = load(args);
    match format {
        Format::Json => {
            let value =
                report::doctor_json(&info, resolution.as_ref().map_err(|e| format!("{e:#}")));
            println!("{}", serde_json::to_string_pretty(&value)?);
        }
        Format::Text => print!("{}", report::doctor_text(&info, resolution.as_ref())),
    }
    // A configuration that does not load is a finding, and a failure of the command.
    Ok(if resolution.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

pub fn profiles(
    action: Option<ProfilesAction>,
    profiles_dir: Option<&std::path::Path>,
    format: Format,
) -> anyhow::Result<ExitCode> {
    let set = match profiles_dir {
        Some(dir) => ProfileSet::with_user_dir(dir)?,
        None => ProfileSet::builtin()?,
    };
    match action.unwrap_or(ProfilesAction::List) {
        ProfilesAction::List => match format {
            Format::Json => {
                let list: Vec<_> = set.all().iter().map(report::profile_json).collect();
                println!("{}", serde_json::to_string_pretty(&list)?);
            }
            Format::Text => print!("{}", report::profile_list(&set)),
        },
        ProfilesAction::Show { name } => {
            let profile = set.get(&name)?;
            match format {
                Format::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&report::profile_json(profile))?
                ),
                Format::Text => print!("{}", report::profile_text(profile)),
            }
        }
        ProfilesAction::Match { gpu, cpus } => {
            let cc = parse_cc(gpu.compute_capability.as_deref(), "--compute-capability")?;
            let cpu = kiln_device::probe::probe_cpu();
            let facts = kiln_config::simulated_machine(
                &set,
                Some(&gpu.name),
                gpu.memory_gib,
                cc,
                cpus,
                cpu,
            )?;
            let selection = kiln_device::select::select(DeviceRequest::Auto, &facts)?;
            let resolved = kiln_profiles::resolve(&set, &selection, &facts.cpu, None)?;
            match format {
                Format::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&report::resolved_json(&gpu.name, &resolved))?
                ),
                Format::Text => print!("{}", report::resolved_text(&gpu.name, &resolved)),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn config(args: &ConfigArgs, explain: bool, format: Format) -> anyhow::Result<ExitCode> {
    let r = load(args)?;
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&report::plan_json(&r))?),
        Format::Text => print!("{}", report::plan_text(&r, explain, &lr_shown(&r, args))),
    }
    Ok(ExitCode::SUCCESS)
}

/// `train.lr = auto` as `config --explain` shows it where this machine's cache holds its
/// answer for the plan's model and data (not for a simulated machine).
fn lr_shown(r: &Resolution, args: &ConfigArgs) -> Vec<(&'static str, String)> {
    if !r.plan.train.lr_auto || args.simulating() {
        return Vec::new();
    }
    let Some(cache) = kiln_device::measured::cache_dir() else {
        return Vec::new();
    };
    match kiln_train::run::cached_lr(&r.plan, r.selection.device, None, &cache) {
        Ok(Some(lr)) => vec![(
            kiln_config::keys::train::lr,
            format!("auto (found {lr:.1e} by a range test, cached)"),
        )],
        Ok(None) => Vec::new(),
        Err(e) => {
            tracing::debug!("no cached train.lr: {e}");
            Vec::new()
        }
    }
}

/// Applies the plan's backend settings (threads, TF32, matmul precision, …), logging each.
pub fn apply_backend(r: &Resolution) {
    kiln_train::run::apply_backend(&r.plan, r.selection.device);
}

/// The start-of-run lines: device, profile adjustments, settings.
fn announce(r: &Resolution) {
    eprintln!(
        "device {} ({}): {}",
        r.selection.device, r.plan.device_request, r.selection.reason
    );
    for a in &r.profile.adjustments {
        eprintln!(
            "profile {}: {} {} → {} ({})",
            r.profile.profile.name, a.key, a.from, a.to, a.reason
        );
    }
    eprintln!("{}", report::start_line(r));
    eprintln!("{}", report::train_line(r));
}

pub fn train(train: &TrainArgs, args: &ConfigArgs) -> anyhow::Result<ExitCode> {
    if args.simulating() {
        anyhow::bail!(
            "kiln train runs on this machine; --simulate-gpu/--cpus only work with `kiln config` \
             and `kiln doctor`"
        );
    }
    let mut request_flags = args.flags();
    request_flags.extend(train.flags());
    let r = load_with_flags(args, request_flags).context("cannot start the run")?;
    // SIGINT/SIGTERM: finish the step, checkpoint, stop. A second one stops at once.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register_conditional_shutdown(signal, 130, stop.clone())
            .and_then(|_| signal_hook::flag::register(signal, stop.clone()))
            .context("cannot install the signal handlers")?;
    }
    let mut builder = kiln_train::learner::Learner::builder()
        .resolution(r)
        .stop_flag(stop)
        .cache_batch_sizes(true)
        .join_launched_ranks(true);
    if let Some(resume) = &train.resume {
        builder = builder.resume(match resume {
            Some(path) => kiln_train::run::Resume::From(path.clone()),
            None => kiln_train::run::Resume::Latest,
        });
    }
    let learner = builder.build().context("cannot join the other ranks")?;
    // Other ranks than 0 only report errors, and every rank's errors say which rank failed.
    let (rank, world) = learner.rank();
    let lead = rank == 0;
    let failed = match world {
        1 => "training failed".to_owned(),
        _ => format!("rank {rank} of {world}: training failed"),
    };
    if lead {
        announce(learner.resolution());
    }
    let mut view = ProgressView::new();
    let mut quiet = kiln_train::record::Silent;
    let observer: &mut dyn kiln_train::record::Observer = if lead { &mut view } else { &mut quiet };
    let result = learner.fit_plan(train.data.as_deref(), observer);
    let outcome = match result {
        Err(e @ kiln_train::TrainError::Stopped { .. }) => {
            eprintln!("kiln train: {e}");
            return Ok(ExitCode::from(130));
        }
        // A collective's failure already names the rank.
        Err(e @ kiln_train::TrainError::Distributed { .. }) => {
            return Err(anyhow::Error::new(e).context("training failed"));
        }
        other => other.context(failed)?,
    };
    if lead {
        eprintln!("{}", wrote_line(&outcome.run_dir));
    }
    Ok(ExitCode::SUCCESS)
}

/// The line `kiln train` ends with: the files the run directory holds (the run's record, its
/// curves, TensorBoard events, the learning-rate range test's curve), in name order, and its
/// checkpoints' directory.
fn wrote_line(run_dir: &std::path::Path) -> String {
    let mut names: Vec<String> = std::fs::read_dir(run_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let dir = e.file_type().ok()?.is_dir();
            (!name.starts_with('.')).then(|| if dir { format!("{name}/") } else { name })
        })
        .collect();
    names.sort();
    format!("wrote {}/{{{}}}", run_dir.display(), names.join(", "))
}

/// `kiln lr-find`: the range test alone; prints the rate and how it was found.
pub fn lr_find(
    train: &TrainArgs,
    args: &ConfigArgs,
    out: Option<std::path::PathBuf>,
) -> anyhow::Result<ExitCode> {
    if args.simulating() {
        anyhow::bail!(
            "kiln lr-find runs on this machine; --simulate-gpu/--cpus only work with `kiln config` and `kiln doctor`"
        );
    }
    if train.resume.is_some() || train.nproc_per_node.is_some() {
        anyhow::bail!(
            "kiln lr-find runs on one process from fresh weights: --resume and --nproc-per-node do not apply"
        );
    }
    let mut request_flags = args.flags();
    request_flags.extend(train.flags());
    let r = load_with_flags(args, request_flags).context("cannot start the range test")?;
    apply_backend(&r);
    announce(&r);
    let out = out.unwrap_or_else(|| r.plan.run.output_dir.clone());
    let control = kiln_train::run::RunControl {
        cache_dir: kiln_device::measured::cache_dir(),
        ..kiln_train::run::RunControl::default()
    };
    let found = kiln_train::run::find_lr(
        &r.plan,
        r.selection.device,
        train.data.as_deref(),
        &control,
        &out,
    )
    .context("the learning-rate range test failed")?;
    println!("train.lr {}", found.note);
    if found.curve.is_some() {
        eprintln!("wrote {}/{{lr_find.json, lr_find.png}}", out.display());
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::wrote_line;

    #[test]
    fn the_last_line_lists_what_the_run_directory_holds() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "metrics.jsonl",
            "config.json",
            "lr_find.json",
            ".metrics.jsonl.tmp",
        ] {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        std::fs::create_dir(dir.path().join("checkpoints")).unwrap();
        let line = wrote_line(dir.path());
        let listed = "{checkpoints/, config.json, lr_find.json, metrics.jsonl}";
        assert_eq!(line, format!("wrote {}/{listed}", dir.path().display()));
    }
}
