//! `kiln-bench report`: merges one run's suite outputs (`DIR/suites/<suite>.json`) into
//! `report.json`, `report.md` and plots, and checks the report's shape (never its speed).
//!
//! ```text
//! kiln-bench report DIR --suites train,serve [--quick] [--created TIME]   assemble
//! kiln-bench report --check DIR --suites train,serve                      check only
//! ```

use std::path::{Path, PathBuf};

use clap::Parser;
use kiln_benches::plot::write_plots;
use kiln_benches::report::{
    Report, SWEEP_GROUP, SuiteOutput, apply_learning_check, assemble, list, markdown, read_json,
    validate, write_json,
};
use kiln_benches::{Msg, Result};
use serde_json::{Map, Value, json};

/// `kiln-bench report`: assembles the suites' outputs under DIR, or checks a report.
#[derive(Debug, Parser)]
#[command(name = "kiln-bench report")]
struct Cli {
    /// The run's directory (suites' outputs under DIR/suites): assemble the report there.
    #[arg(required_unless_present = "check", conflicts_with = "check")]
    dir: Option<PathBuf>,
    /// Only check the report under this directory.
    #[arg(long, value_name = "DIR")]
    check: Option<PathBuf>,
    /// The suites, e.g. train,serve.
    #[arg(long, value_name = "S1,S2…", value_delimiter = ',', required = true)]
    suites: Vec<String>,
    /// The suites ran with --quick.
    #[arg(long)]
    quick: bool,
    /// When the run started (the report's `created`).
    #[arg(long, value_name = "TIME", default_value = "unknown")]
    created: String,
}

/// Runs the suite's command line (`args[0]` is its name, as clap takes a program name).
pub fn main(args: Vec<std::ffi::OsString>) {
    let mut cli = Cli::parse_from(args);
    cli.suites.retain(|s| !s.is_empty());
    let result = match (&cli.check, &cli.dir) {
        (Some(dir), _) => check(dir, &cli.suites),
        (None, Some(dir)) => build(dir, &cli),
        (None, None) => Err("give DIR or --check DIR".to_owned()),
    };
    kiln_benches::run_cli::exit_on_error(result);
}

/// What this machine is, for the report's `machine`.
fn machine() -> Value {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let facts = kiln_device::probe::probe().ok();
    let gpus: Vec<Value> = facts
        .iter()
        .flat_map(|f| f.cuda_gpus())
        .map(|(i, g)| json!({"index": i, "name": g.name, "memory_gib": g.memory_gib()}))
        .collect();
    let cpu_model = facts.as_ref().map_or("", |f| &f.cpu.model);
    let description = match gpus.first() {
        Some(g) => format!(
            "{} ({} GiB) · CPU {cpu_model}, {cpus} logical cores",
            g["name"].as_str().unwrap_or("CUDA GPU"),
            g["memory_gib"].as_f64().map_or(0.0, f64::round)
        ),
        None => format!("CPU only: {cpu_model}, {cpus} logical cores"),
    };
    let features = cpu_features(&std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default());
    json!({
        "description": format!("{description} · precision features: {}", features_text(&features)),
        "cpus": cpus,
        "cpu_model": cpu_model,
        "cpu_features": features,
        "gpus": gpus,
        "device": if gpus.is_empty() { "cpu" } else { "cuda" },
        "kiln_version": env!("CARGO_PKG_VERSION"),
        "torch_version": kiln_torch_ext::runtime::torch_version(),
    })
}

/// The CPU features that decide kiln's precision choices, as `/proc/cpuinfo` flags them.
const PRECISION_FEATURES: [(&str, &str); 5] = [
    ("avx2", "AVX2"),
    ("avx512f", "AVX-512"),
    ("avx512_bf16", "AVX512-BF16"),
    ("amx_tile", "AMX"),
    ("amx_bf16", "AMX-BF16"),
];

/// Which [`PRECISION_FEATURES`] the `flags` line of a `/proc/cpuinfo` text lists (none if empty).
fn cpu_features(cpuinfo: &str) -> Map<String, Value> {
    let (.., flags) = kiln_device::probe::parse_cpuinfo(cpuinfo);
    let has = |(flag, name): &(&str, &str)| ((*name).to_owned(), json!(flags.contains(*flag)));
    PRECISION_FEATURES.iter().map(has).collect()
}

/// The features present, e.g. `AVX2, AVX-512, AVX512-BF16 (no AMX)`.
fn features_text(features: &Map<String, Value>) -> String {
    let has: Vec<&str> = PRECISION_FEATURES
        .iter()
        .map(|(_, name)| *name)
        .filter(|name| features.get(*name) == Some(&json!(true)))
        .collect();
    match has.as_slice() {
        [] => "none of AVX2/AVX-512/AMX".to_owned(),
        _ if has.contains(&"AMX") => has.join(", "),
        _ => format!("{} (no AMX)", has.join(", ")),
    }
}

/// Assembles the report of `cli.suites` under `dir`, writes it, prints its Markdown, checks it.
fn build(dir: &Path, cli: &Cli) -> Result<()> {
    let mut outputs = vec![];
    for suite in &cli.suites {
        let path = dir.join("suites").join(format!("{suite}.json"));
        let out = SuiteOutput::read(&path)?;
        if out.suite != *suite {
            let (path, found) = (path.display(), &out.suite);
            return Err(format!("{path} holds suite `{found}`, expected `{suite}`"));
        }
        outputs.push(out);
    }
    let failed = apply_learning_check(&mut outputs);
    if failed > 0 {
        eprintln!("report: {failed} train row(s) fail: their model's sides did not learn the same");
    }
    let meta = json!({"created": cli.created, "quick": cli.quick, "machine": machine()});
    let report = assemble(meta, &outputs);
    validate(&report, &names(&cli.suites))
        .map_err(|e| format!("the assembled report is malformed:\n{e}"))?;
    let [json_path, md_path, plots] = ["report.json", "report.md", "plots"].map(|p| dir.join(p));
    write_json(&json_path, &report)?;
    let md = markdown(&report);
    std::fs::write(&md_path, &md).at(&md_path)?;
    let written = write_plots(&Report::from_value(&report)?, &plots)?;
    println!("{md}");
    let (json_path, md_path) = (json_path.display(), md_path.display());
    let (n, plots) = (written.len(), plots.display());
    eprintln!("report: {json_path} and {md_path}, {n} plot file(s) under {plots}");
    check(dir, &cli.suites)
}

fn names(suites: &[String]) -> Vec<&str> {
    suites.iter().map(String::as_str).collect()
}

/// Checks DIR's report.json (shape, suites), report.md (a row per comparison) and bar plots.
fn check(dir: &Path, suites: &[String]) -> Result<()> {
    let json_path = dir.join("report.json");
    let report: Value = read_json(&json_path, "JSON")?;
    let mut problems: Vec<String> = validate(&report, &names(suites))
        .err()
        .map_or(vec![], |e| e.lines().map(str::to_owned).collect());
    let comparisons = list(&report["comparisons"]);
    let md_path = dir.join("report.md");
    match std::fs::read_to_string(&md_path) {
        Ok(md) => {
            for c in comparisons {
                let name = c["name"].as_str().unwrap_or_default().replace('|', "\\|");
                if !md.contains(&format!("| {name} |")) {
                    problems.push(format!("report.md has no row for `{name}`"));
                }
            }
        }
        Err(e) => problems.push(format!("{}: {e}", md_path.display())),
    }
    for suite in suites {
        let has_bars = comparisons
            .iter()
            .any(|c| c["suite"] == **suite && c["group"] != SWEEP_GROUP);
        for ext in ["png", "svg"].into_iter().filter(|_| has_bars) {
            let plot = dir.join("plots").join(format!("{suite}.{ext}"));
            if std::fs::metadata(&plot).map_or(0, |m| m.len()) == 0 {
                problems.push(format!("plot {} is missing or empty", plot.display()));
            }
        }
    }
    if !problems.is_empty() {
        let (dir, problems) = (dir.display(), problems.join("\n  "));
        return Err(format!(
            "the report under {dir} is malformed:\n  {problems}"
        ));
    }
    let (path, n, s) = (json_path.display(), comparisons.len(), suites.len());
    eprintln!("report check: {path} is well-formed ({n} comparisons over {s} suite(s))");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precision_features_come_from_the_flags_line() {
        let epyc = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 sha_ni\n";
        let f = cpu_features(epyc);
        assert_eq!(f["AVX2"], json!(true));
        assert_eq!(f["AMX"], json!(false));
        assert_eq!(features_text(&f), "AVX2, AVX-512, AVX512-BF16 (no AMX)");
        let xeon = cpu_features("flags : avx2 avx512f avx512_bf16 amx_tile amx_bf16\n");
        let all = "AVX2, AVX-512, AVX512-BF16, AMX, AMX-BF16";
        assert_eq!(features_text(&xeon), all);
        assert_eq!(features_text(&cpu_features("")), "none of AVX2/AVX-512/AMX");
    }

    #[test]
    fn the_command_lines_xtask_uses_parse() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        let parse = |line: &str| Cli::try_parse_from(line.split_whitespace());
        let cli = parse("kiln-bench-report DIR --suites train,serve --created T --quick").unwrap();
        assert_eq!(cli.suites, ["train", "serve"]);
        assert_eq!((cli.created.as_str(), cli.quick), ("T", true));
        assert_eq!(cli.dir, Some(PathBuf::from("DIR")));
        let cli = parse("kiln-bench-report --check D --suites a").unwrap();
        assert_eq!(cli.check, Some(PathBuf::from("D")));
        assert!(parse("kiln-bench-report --suites a").is_err());
        assert!(parse("kiln-bench-report DIR").is_err());
    }
}
