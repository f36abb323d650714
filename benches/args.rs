//! The options `cargo xtask bench` passes to every suite, and the value parsers the probes share.

use std::path::PathBuf;

use clap::Args;

use crate::{Msg, report_path};

/// The options of a suite run, the same for every suite: each reads those it has a use for.
#[derive(Debug, Clone, Default, Args)]
pub struct SuiteArgs {
    /// CI-sized run: checks the report's shape, not speed.
    #[arg(long)]
    pub quick: bool,
    /// Runs per side (the suite's default where absent).
    #[arg(long, value_name = "N")]
    pub repeats: Option<usize>,
    /// libtorch threads per side (the suite's default where absent).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// cpu, cuda or cuda:N (default: the first CUDA GPU libtorch sees, else the CPU).
    #[arg(long, value_name = "D", value_parser = parse_device)]
    pub device: Option<tch::Device>,
    /// The baseline's Python.
    #[arg(long, value_name = "PY", env = "KILN_BENCH_PYTHON")]
    #[arg(default_value = "python3")]
    pub python: String,
    /// The suite's JSON output (default: <target>/kiln-bench/<suite>.json).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Scratch directory for data and runs.
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Seeds per side (quality).
    #[arg(long, value_name = "N")]
    pub seeds: Option<usize>,
    /// Concurrent clients (serve).
    #[arg(long, value_name = "N")]
    pub clients: Option<usize>,
    /// Requests per run (serve).
    #[arg(long, value_name = "N")]
    pub requests: Option<usize>,
    /// Dynamic batching's largest batch (serve).
    #[arg(long, value_name = "N")]
    pub max_batch: Option<usize>,
    /// Dynamic batching's longest wait (serve).
    #[arg(long, value_name = "MS")]
    pub max_wait_ms: Option<f64>,
    /// Batch sizes to sweep, e.g. 1,2,4,8 (train, infer).
    #[arg(long, value_name = "N,N…", value_parser = parse_sizes)]
    pub batch_sizes: Option<Sizes>,
    /// Only the cases whose row name contains this text (train), e.g. `torch.compile`; the
    /// groups named so (infer); the job named so (quality: `reference` or `regression`).
    #[arg(long, value_name = "TEXT")]
    pub filter: Option<String>,
}

impl SuiteArgs {
    /// `--repeats`, else `default`.
    pub fn repeats_or(&self, default: usize) -> usize {
        self.repeats.unwrap_or(default)
    }

    /// `--threads`, else `default`.
    pub fn threads_or(&self, default: usize) -> usize {
        self.threads.unwrap_or(default)
    }

    /// `--device`, else the first CUDA GPU when libtorch sees one, else the CPU.
    pub fn device(&self) -> tch::Device {
        self.device.unwrap_or_else(tch::Device::cuda_if_available)
    }

    /// Where the suite writes its output: `--out FILE`, else `<target>/kiln-bench/<suite>.json`.
    pub fn out_or(&self, suite: &str) -> PathBuf {
        let default = || report_path(&format!("{suite}.json"));
        self.out.clone().unwrap_or_else(default)
    }

    /// Whether a case named `name` runs: no `--filter`, or `name` contains it.
    pub fn selects(&self, name: &str) -> bool {
        self.filter.as_deref().is_none_or(|f| name.contains(f))
    }

    /// `--batch-sizes`, empty where absent.
    pub fn batch_sizes(&self) -> &[usize] {
        self.batch_sizes.as_ref().map_or(&[], |s| &s.0)
    }
}

/// Where a probe runs: its thread count and device.
#[derive(Debug, Args)]
pub struct Place {
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// cpu, cuda or cuda:N (default: the first CUDA GPU, else the CPU).
    #[arg(long, value_parser = parse_device)]
    pub device: Option<tch::Device>,
}

impl Place {
    /// The device (the first CUDA GPU by default, else the CPU).
    pub fn device(&self) -> tch::Device {
        self.device.unwrap_or_else(tch::Device::cuda_if_available)
    }

    /// Sets libtorch's thread count (at least 1); returns it.
    pub fn set_threads(&self) -> crate::Result<usize> {
        let threads = self.threads.max(1);
        kiln_torch_ext::memory::set_num_threads(threads).msg()?;
        Ok(threads)
    }
}

/// A list of positive batch sizes, given as `1,2,4`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sizes(pub Vec<usize>);

/// Parses `1,2,4` (empty items skipped) into [`Sizes`].
pub fn parse_sizes(v: &str) -> crate::Result<Sizes> {
    v.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| match s.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!(
                "`{s}` is not a positive integer (expected e.g. --batch-sizes 1,2,4,8)"
            )),
        })
        .collect::<Result<_, _>>()
        .map(Sizes)
}

/// `cpu`, `cuda` (the first GPU) or `cuda:N`.
pub fn parse_device(v: &str) -> crate::Result<tch::Device> {
    match v {
        "cpu" => Ok(tch::Device::Cpu),
        "cuda" => Ok(tch::Device::Cuda(0)),
        other => other
            .strip_prefix("cuda:")
            .and_then(|i| i.parse().ok())
            .map(tch::Device::Cuda)
            .ok_or_else(|| format!("`{other}`: expected cpu, cuda or cuda:N")),
    }
}

/// `on` or `off`.
pub fn parse_on_off(v: &str) -> crate::Result<bool> {
    match v {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("`{other}`: expected on or off")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::FromArgMatches;

    fn parse(line: &str) -> crate::Result<SuiteArgs> {
        let words = std::iter::once("bench").chain(line.split_whitespace());
        let matches = SuiteArgs::augment_args(clap::Command::new("bench"))
            .try_get_matches_from(words)
            .msg()?;
        SuiteArgs::from_arg_matches(&matches).msg()
    }

    #[test]
    fn every_option_xtask_passes_is_accepted() {
        let line = "--quick --seeds 3 --repeats 5 --threads 4 --device cuda:1 --python py \
            --work-dir /w --clients 8 --requests 100 --max-batch 16 --max-wait-ms 2.5 \
            --batch-sizes 1,2,,4 --out /o.json";
        let a = parse(line).unwrap();
        assert!(a.quick);
        assert_eq!((a.seeds, a.repeats_or(1), a.threads_or(2)), (Some(3), 5, 4));
        assert_eq!(a.device(), tch::Device::Cuda(1));
        assert_eq!(a.python, "py");
        assert_eq!(a.batch_sizes(), [1, 2, 4]);
        assert_eq!(a.max_wait_ms, Some(2.5));
        assert_eq!(a.out_or("train"), PathBuf::from("/o.json"));
        let d = parse("").unwrap();
        assert_eq!((d.repeats_or(3), d.threads_or(1)), (3, 1));
        assert!(d.batch_sizes().is_empty());
        assert!(d.out_or("train").ends_with("kiln-bench/train.json"));
    }

    #[test]
    fn bad_values_and_unknown_options_are_errors_naming_them() {
        for (line, needle) in [
            ("--frobnicate", "--frobnicate"),
            ("--device gpu", "expected cpu, cuda or cuda:N"),
            ("--batch-sizes 1,0", "`0` is not a positive integer"),
            ("--repeats x", "--repeats"),
        ] {
            let err = parse(line).unwrap_err();
            assert!(err.contains(needle), "{line}: {err}");
        }
        assert_eq!(parse_on_off("on"), Ok(true));
        let err = parse_on_off("yes").unwrap_err();
        assert!(err.contains("expected on or off"), "{err}");
    }
}
