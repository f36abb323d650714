//! `kiln data`: preparing sharded datasets from CSV or `.npy` files, and inspecting them.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use kiln_data::{
    CsvOptions, Manifest, PrepareOptions, PrepareSource, ShardFormat, ShardedDataset, StoredTarget,
};

use crate::args::{DataAction, Format, PrepareArgs, ShardFormatArg};

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

fn inspect(dir: &Path, format: Format) -> anyhow::Result<ExitCode> {
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
