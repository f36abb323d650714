//! `kiln data`: preparing sharded datasets from CSV or `.npy` files, and inspecting them.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use kiln_data::{CsvOptions, Manifest, PrepareOptions, PrepareSource, ShardFormat, ShardedDataset};

use crate::args::{DataAction, Format, PrepareArgs, ShardFormatArg};

pub fn run(action: DataAction) -> anyhow::Result<ExitCode> {
    match action {
        DataAction::Prepare(args) => prepare(&args),
        DataAction::Inspect { dir, format } => inspect(&dir, format),
    }
}

fn prepare(args: &PrepareArgs) -> anyhow::Result<ExitCode> {
    let source = match (&args.csv, &args.features, &args.labels) {
        (Some(csv), None, None) => {
            let delimiter = u8::try_from(args.delimiter)
                .ok()
                .filter(u8::is_ascii)
                .with_context(|| {
                    format!(
                        "--delimiter `{}` must be a single ASCII character",
                        args.delimiter
                    )
                })?;
            PrepareSource::Csv {
                path: csv.clone(),
                options: CsvOptions {
                    label_column: args.label_column.clone(),
                    feature_columns: args.feature_columns.clone(),
                    delimiter,
                },
            }
        }
        (None, Some(features), Some(labels)) => PrepareSource::Npy {
            features: features.clone(),
            labels: labels.clone(),
        },
        _ => anyhow::bail!("give either --csv FILE, or --features FILE and --labels FILE"),
    };
    let options = PrepareOptions {
        shard_samples: args.shard_samples,
        format: match args.shard_format {
            ShardFormatArg::Safetensors => ShardFormat::Safetensors,
            ShardFormatArg::Npy => ShardFormat::Npy,
        },
    };
    let manifest =
        kiln_data::prepare(&source, &args.out, &options).context("kiln data prepare failed")?;
    report(&args.out, &manifest, args.format, "wrote")?;
    Ok(ExitCode::SUCCESS)
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
                .flat_map(|s| [&s.features, &s.labels])
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .filter_map(|f| std::fs::metadata(dir.join(f)).ok())
                .map(|md| md.len())
                .sum();
            println!("{verb} {}", dir.display());
            println!("  samples   {}", m.samples);
            println!(
                "  features  {} {:?} per sample",
                m.features.dtype, m.features.shape
            );
            let names = m
                .labels
                .class_names
                .as_ref()
                .map(|n| format!(" ({})", n.join(", ")))
                .unwrap_or_default();
            println!(
                "  labels    {}, {} classes{names}",
                m.labels.dtype, m.labels.classes
            );
            println!(
                "  shards    {} ({:.1} MiB on disk)",
                m.shards.len(),
                bytes as f64 / (1024.0 * 1024.0)
            );
        }
    }
    Ok(())
}
