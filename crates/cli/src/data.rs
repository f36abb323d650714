//! `kiln data`: preparing sharded datasets from CSV or `.npy` files and time-series windows from
//! long-format CSV, and inspecting them.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use kiln_data::{
    CsvOptions, Dataset, Manifest, PrepareOptions, PrepareSource, ShardFormat, ShardedDataset,
    StoredTarget, Windows,
};

use crate::args::{DataAction, Format, NormalizeArg, PrepareArgs, ShardFormatArg};

pub fn run(action: DataAction) -> anyhow::Result<ExitCode> {
    match action {
        DataAction::Prepare(args) => prepare(&args),
        DataAction::Inspect { dir, format } => inspect(&dir, format),
    }
}

fn prepare(args: &PrepareArgs) -> anyhow::Result<ExitCode> {
    if args.classes.is_some() && args.targets.is_none() && args.target.is_none() {
        anyhow::bail!("--classes counts the classes of --targets or --target; give one of them");
    }
    if args.windows.windows {
        return prepare_windows(args);
    }
    let source = match (&args.csv, &args.features, &args.labels, &args.targets) {
        _ if args.target.is_some() => arrays_source(args)?,
        (Some(csv), None, None, None) => csv_source(csv, args)?,
        (None, Some(features), Some(labels), None) => PrepareSource::Npy {
            features: features.clone(),
            labels: labels.clone(),
        },
        (None, Some(features), None, Some(targets)) => PrepareSource::NpyTargets {
            features: features.clone(),
            targets: targets.clone(),
            classes: args.classes,
        },
        _ => anyhow::bail!(
            "give either --csv FILE, or --features FILE with --labels FILE or --targets FILE, or \
             --array NAME=FILE (for each input) with --target NAME=FILE"
        ),
    };
    let options = PrepareOptions {
        shard_samples: args.shard_samples,
        format: match args.shard_format {
            ShardFormatArg::Safetensors => ShardFormat::Safetensors,
            ShardFormatArg::Npy => ShardFormat::Npy,
        },
        integer_features: args.integer_features,
    };
    let manifest =
        kiln_data::prepare(&source, &args.out, &options).context("kiln data prepare failed")?;
    report(&args.out, &manifest, args.format, "wrote")?;
    Ok(ExitCode::SUCCESS)
}

/// `--array NAME=FILE … --target NAME=FILE`, or with `--csv` `NAME=COLUMN,…`.
fn arrays_source(args: &PrepareArgs) -> anyhow::Result<PrepareSource> {
    let target = args.target.as_deref().unwrap_or_default();
    if args.arrays.is_empty() {
        anyhow::bail!(
            "--target {target} needs the input arrays: give --array NAME=FILE for each input"
        );
    }
    if let Some(csv) = &args.csv {
        let group = |flag: &str, value: &str| {
            let (name, columns) = named_file(flag, value)?;
            let columns = columns.to_string_lossy();
            let columns: Vec<String> = columns.split(',').map(|c| c.trim().to_owned()).collect();
            if columns.iter().any(String::is_empty) {
                anyhow::bail!("{flag} `{value}` names an empty column: give NAME=COLUMN,COLUMN…");
            }
            Ok(kiln_data::ColumnGroup { name, columns })
        };
        let inputs = args
            .arrays
            .iter()
            .map(|a| group("--array", a))
            .collect::<anyhow::Result<_>>()?;
        return Ok(PrepareSource::CsvArrays {
            path: csv.clone(),
            inputs,
            target: group("--target", target)?,
            classes: args.classes,
            delimiter: delimiter(args)?,
        });
    }
    let inputs = args
        .arrays
        .iter()
        .map(|a| named_file("--array", a))
        .collect::<anyhow::Result<_>>()?;
    Ok(PrepareSource::Arrays {
        inputs,
        target: named_file("--target", target)?,
        classes: args.classes,
    })
}

/// `NAME=FILE` of option `flag`.
fn named_file(flag: &str, value: &str) -> anyhow::Result<(String, std::path::PathBuf)> {
    match value.split_once('=') {
        Some((name, file)) if !name.is_empty() && !file.is_empty() => {
            Ok((name.to_owned(), file.into()))
        }
        _ => anyhow::bail!(
            "{flag} `{value}` is not NAME=FILE: give the array's name, `=`, and its .npy file \
             (e.g. {flag} encoder_cont=encoder_cont.npy), or with --csv its columns (e.g. \
             {flag} encoder_cont=temp,humidity)"
        ),
    }
}

/// `--delimiter` as a byte.
fn delimiter(args: &PrepareArgs) -> anyhow::Result<u8> {
    u8::try_from(args.delimiter)
        .ok()
        .filter(u8::is_ascii)
        .with_context(|| {
            format!(
                "--delimiter `{}` must be a single ASCII character",
                args.delimiter
            )
        })
}

fn csv_source(csv: &Path, args: &PrepareArgs) -> anyhow::Result<PrepareSource> {
    let delimiter = delimiter(args)?;
    if let Some(columns) = &args.target_columns
        && columns.iter().any(|c| c.trim().is_empty())
    {
        anyhow::bail!(
            "--target-columns `{}` names an empty column: give the target columns' headers, \
             comma-separated",
            columns.join(",")
        );
    }
    Ok(PrepareSource::Csv {
        path: csv.to_owned(),
        options: CsvOptions {
            label_column: args.label_column.clone(),
            target_columns: args.target_columns.clone(),
            feature_columns: args.feature_columns.clone(),
            delimiter,
        },
    })
}

/// `--windows`: the long-format CSV's series and their windows.
fn prepare_windows(args: &PrepareArgs) -> anyhow::Result<ExitCode> {
    let w = &args.windows;
    let columns = |flag: &str, names: &[String]| -> anyhow::Result<Vec<String>> {
        let names: Vec<String> = names.iter().map(|c| c.trim().to_owned()).collect();
        if names.iter().any(String::is_empty) {
            anyhow::bail!("--{flag} names an empty column: give column headers, comma-separated");
        }
        Ok(names)
    };
    let target: Vec<String> = args
        .target
        .as_deref()
        .unwrap_or_default()
        .split(',')
        .map(str::to_owned)
        .collect();
    if target.iter().any(|t| t.contains('=')) {
        anyhow::bail!(
            "--target with --windows names the target column(s) of the CSV, comma-separated \
             (e.g. --target sales), not NAME=FILE"
        );
    }
    let (table, format) = match (&args.csv, &w.parquet) {
        (Some(csv), _) => (csv.clone(), kiln_data::TableFormat::Csv),
        (None, Some(parquet)) => (parquet.clone(), kiln_data::TableFormat::Parquet),
        (None, None) => {
            anyhow::bail!("--windows reads a long-format table: give --csv FILE or --parquet FILE")
        }
    };
    let source = kiln_data::WindowsSource {
        table,
        format,
        delimiter: delimiter(args)?,
        columns: kiln_data::WindowColumns {
            time: w.time.clone().unwrap_or_default(),
            group: columns("group", &w.group)?,
            target: columns("target", &target)?,
            known: columns("known", &w.known)?,
            unknown: columns("unknown", &w.unknown)?,
            static_categoricals: columns("static", &w.statics)?,
        },
        encoder_length: w.encoder_length.unwrap_or_default(),
        min_encoder_length: w.min_encoder_length,
        horizon: w.horizon.unwrap_or_default(),
        normalize: match w.normalize {
            NormalizeArg::None => kiln_data::TargetNormalizer::None,
            NormalizeArg::Group => kiln_data::TargetNormalizer::Group,
        },
    };
    kiln_data::prepare_windows(&source, &args.out).context("kiln data prepare failed")?;
    let windows = Windows::open(&args.out).context("kiln data prepare failed")?;
    report_windows(&windows, args.format, "wrote")?;
    Ok(ExitCode::SUCCESS)
}

/// A windowed dataset's series, arrays and windows (split as `data.val_steps` defaults: the
/// horizon).
fn report_windows(windows: &Windows, format: Format, verb: &str) -> anyhow::Result<()> {
    let m = windows.manifest();
    // Series too short to keep a horizon for validation still train with data.val_steps = 0.
    let (val_steps, (train, val)) = match windows.split(m.horizon) {
        Ok(split) => (m.horizon, split),
        Err(_) => (0, windows.split(0)?),
    };
    match format {
        Format::Json => {
            let value = serde_json::json!({
                "dir": windows.dir(),
                "windows": m,
                "default_split": {"val_steps": val_steps, "train": train.len(), "val": val.len()},
            });
            println!("{}", serde_json::to_string_pretty(&value)?);
        }
        Format::Text => {
            let c = &m.columns;
            println!("{verb} {}", windows.dir().display());
            println!(
                "  series    {} by {} ({} rows; {} too short for a window)",
                m.series.len(),
                c.group.join(", "),
                m.rows,
                m.short_series()
            );
            let split = if val_steps == m.horizon {
                format!("data.val_steps = {val_steps} (the default: the horizon)")
            } else {
                format!(
                    "data.val_steps = 0 (no series keeps a training window before its last {} \
                     steps, so the default split, the horizon, leaves none)",
                    m.horizon
                )
            };
            let encoder = match m.min_encoder_length {
                Some(min) => format!("{min} to {}", m.encoder_length),
                None => m.encoder_length.to_string(),
            };
            println!(
                "  windows   encoder {} + horizon {} steps of `{}`: {} train, {} validate with \
                 {split}",
                encoder,
                m.horizon,
                c.time,
                train.len(),
                val.len(),
            );
            for a in train.inputs() {
                println!(
                    "  input     {}: {} {:?} per window",
                    a.name, a.dtype, a.shape
                );
            }
            let scaled = match m.normalize {
                kiln_data::TargetNormalizer::None => "",
                kiln_data::TargetNormalizer::Group => "; scaled per series among the reals",
            };
            println!(
                "  target    regression: {} over the horizon, {:?} per window{scaled}",
                c.target.join(", "),
                train.target().shape()
            );
        }
    }
    Ok(())
}

fn inspect(dir: &Path, format: Format) -> anyhow::Result<ExitCode> {
    if Windows::is_windows_dir(dir) {
        let windows = Windows::open(dir).context("kiln data inspect failed")?;
        report_windows(&windows, format, "checked")?;
        return Ok(ExitCode::SUCCESS);
    }
    let dataset = ShardedDataset::open(dir).context("kiln data inspect failed")?;
    report(dir, dataset.manifest(), format, "checked")?;
    Ok(ExitCode::SUCCESS)
}

fn report(dir: &Path, m: &Manifest, format: Format, verb: &str) -> anyhow::Result<()> {
    match format {
        Format::Json => {
            let value = serde_json::json!({ "dir": dir, "manifest": m });
            println!("{}", serde_json::to_string_pretty(&value)?);
        }
        Format::Text => {
            let bytes: u64 = m
                .shards
                .iter()
                .flat_map(|s| s.files.values())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .filter_map(|f| std::fs::metadata(dir.join(f)).ok())
                .map(|md| md.len())
                .sum();
            println!("{verb} {}", dir.display());
            println!("  samples   {}", m.samples);
            match &m.inputs[..] {
                [f] if f.name == kiln_data::FEATURES_TENSOR => {
                    let ids = if f.ids { " (integer ids)" } else { "" };
                    println!("  features  {} {:?} per sample{ids}", f.dtype, f.shape);
                }
                inputs => {
                    for a in inputs {
                        let to = a.dtype.model();
                        let reaches = if to == a.dtype {
                            String::new()
                        } else {
                            format!(", reaching the model as {to}")
                        };
                        println!(
                            "  input     {}: {} {:?} per sample{reaches}",
                            a.name, a.dtype, a.shape
                        );
                    }
                }
            }
            println!("  target    {}", describe_target(&m.target));
            println!(
                "  shards    {} ({:.1} MiB on disk)",
                m.shards.len(),
                bytes as f64 / (1024.0 * 1024.0)
            );
        }
    }
    Ok(())
}

/// "regression: f32 [24] per sample", "classification: i64, 2 classes (cat, dog)".
fn describe_target(t: &StoredTarget) -> String {
    let shape = if t.shape.is_empty() {
        String::new()
    } else {
        format!(" {:?} per sample", t.shape)
    };
    let classes = match t.classes {
        Some(n) => {
            let names = t
                .class_names
                .as_ref()
                .map(|n| format!(" ({})", n.join(", ")))
                .unwrap_or_default();
            format!(", {n} classes{names}")
        }
        None => String::new(),
    };
    let name = match t.name() {
        kiln_data::TARGETS_TENSOR | kiln_data::LABELS_TENSOR => String::new(),
        name => format!(" (array `{name}`)"),
    };
    format!(
        "{}{name}: {}{shape}{classes}",
        t.task.name().replace('_', " "),
        t.dtype
    )
}
