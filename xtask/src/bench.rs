//! `cargo xtask bench`: builds the benchmark suites (binaries of `kiln-benches`) in release
//! mode, runs each against its baseline with the provisioned torch's Python, and has
//! `kiln-bench report` merge their outputs into `report.json`, `report.md` and plots under
//! `runs/bench-<timestamp>/` (or `--out DIR`), checking the report's shape.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::kiln::{apply_env, python_of, target_dir};
use crate::libtorch::{Libtorch, Settings};
use crate::util::{self, Error, Result, bail};
use crate::{onnx, peers};

/// A suite: its name, and the `kiln-bench` group and subcommand that run it.
struct Suite {
    name: &'static str,
    group: &'static str,
    sub: &'static str,
    what: &'static str,
}

const SUITES: [Suite; 10] = [
    Suite {
        name: "quality",
        group: "quality",
        sub: "quality",
        what: "learning vs a PyTorch loop (same job, data, split, init; 2+ seeds); lr = auto \
               vs Lightning's lr_find, also on a regression",
    },
    Suite {
        name: "train",
        group: "train",
        sub: "train",
        what: "train step vs PyTorch eager (MFU, step breakdown; --batch-sizes sweep)",
    },
    Suite {
        name: "optimizer",
        group: "train",
        sub: "optimizer",
        what: "fused AdamW vs per-tensor ops and torch.optim.AdamW",
    },
    Suite {
        name: "data",
        group: "data",
        sub: "",
        what: "loader vs torch.utils.data.DataLoader",
    },
    Suite {
        name: "infer",
        group: "serve",
        sub: "infer",
        what: "offline inference vs PyTorch inference_mode (--batch-sizes sweep)",
    },
    Suite {
        name: "serve",
        group: "serve",
        sub: "serve",
        what: "dynamic batching vs batch-size-1 serving",
    },
    Suite {
        name: "opts",
        group: "train",
        sub: "opts",
        what: "one optimization at a time (also: --compare-opts)",
    },
    Suite {
        name: "job",
        group: "job",
        sub: "job",
        what: "the default job end to end: kiln train vs Lightning Trainer.fit and a plain loop",
    },
    Suite {
        name: "learning",
        group: "learning",
        sub: "learning",
        what: "same learning as PyTorch from kiln's initial weights: fp32 per step, bf16 final",
    },
    Suite {
        name: "ddp",
        group: "ddp",
        sub: "ddp",
        what: "kiln train on 2 CPU ranks (Gloo) vs 1 rank and vs PyTorch DistributedDataParallel",
    },
];

/// The suites a plain `cargo xtask bench` runs (`opts` joins with `--compare-opts`).
const DEFAULT: [&str; 9] = [
    "quality",
    "learning",
    "train",
    "optimizer",
    "data",
    "infer",
    "serve",
    "job",
    "ddp",
];

/// The suites that run the release CLI (`kiln train`; `data` for its `num_workers = auto` row).
const RUN_THE_CLI: [&str; 4] = ["job", "ddp", "data", "infer"];

/// The suites that export their model to ONNX (for their onnxruntime rows).
const EXPORT_ONNX: [&str; 2] = ["infer", "serve"];

/// Options passed through to the suites, with whether they take a value.
const PASSED: [(&str, bool); 13] = [
    ("--quick", false),
    ("--seeds", true),
    ("--repeats", true),
    ("--threads", true),
    ("--device", true),
    ("--python", true),
    ("--work-dir", true),
    ("--clients", true),
    ("--requests", true),
    ("--max-batch", true),
    ("--max-wait-ms", true),
    ("--batch-sizes", true),
    ("--filter", true),
];

pub fn usage_text() -> String {
    let mut text = String::from(
        "  bench [--suite NAME]… [--quick] [--out DIR] [--batch-sizes N N …] [--compare-opts]\n\
         \x20       [--repeats N] [--threads N] [--device cpu|cuda] [--seeds N] [--filter TEXT]\n\
         \x20       [--write-docs [--from REPORT_DIR]]\n\
         \x20                   side-by-side benchmarks; writes runs/bench-<time>/report.json,\n\
         \x20                   report.md and plots/ (--out DIR instead); --write-docs puts a\n\
         \x20                   full run's tables into docs/benchmarks.md (--from: an existing\n\
         \x20                   report's, without running). Suites:\n",
    );
    for s in &SUITES {
        text.push_str(&format!(
            "                      {:<10} {}\n",
            s.name, s.what
        ));
    }
    text.push_str(
        "                    default: all but opts. Criterion benches of the hot pieces, in\n\
         \x20                   the crates they time: cargo bench -p kiln-data --bench loader;\n\
         \x20                   cargo bench -p kiln-train --bench collate (and metric_sums);\n\
         \x20                   cargo bench -p kiln-infer --bench stitch\n",
    );
    text
}

/// What the command line asked for.
#[derive(Debug, PartialEq)]
struct Request {
    suites: Vec<&'static str>,
    out: Option<PathBuf>,
    quick: bool,
    /// Options for the suites' binaries, `--batch-sizes` joined with commas.
    passed: Vec<String>,
    /// Put the run's tables into docs/benchmarks.md (`--write-docs`).
    write_docs: bool,
    /// With `--write-docs`: an existing report to take them from, instead of running.
    from: Option<PathBuf>,
}

fn suite_named(name: &str) -> Result<&'static Suite> {
    SUITES.iter().find(|s| s.name == name).ok_or_else(|| {
        let names: Vec<&str> = SUITES.iter().map(|s| s.name).collect();
        Error(format!(
            "`{name}` is not a benchmark suite; the suites are: {}",
            names.join(", ")
        ))
    })
}

fn parse(args: &[String]) -> Result<Request> {
    let mut req = Request {
        suites: vec![],
        out: None,
        quick: false,
        passed: vec![],
        write_docs: false,
        from: None,
    };
    let mut compare_opts = false;
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_str();
        let value = |what: &str| {
            args.get(i + 1)
                .filter(|v| !v.starts_with("--"))
                .cloned()
                .ok_or_else(|| Error(format!("{arg} needs {what}")))
        };
        match arg {
            "--suite" => {
                let name = value("a suite name")?;
                req.suites.push(suite_named(&name)?.name);
                i += 2;
            }
            "--out" => {
                req.out = Some(PathBuf::from(value("a directory")?));
                i += 2;
            }
            "--compare-opts" => {
                compare_opts = true;
                i += 1;
            }
            "--write-docs" => {
                req.write_docs = true;
                i += 1;
            }
            "--from" => {
                req.from = Some(PathBuf::from(value("a report directory")?));
                i += 2;
            }
            "--batch-sizes" => {
                let mut sizes = vec![];
                i += 1;
                while let Some(v) = args.get(i).filter(|v| !v.starts_with("--")) {
                    for part in v.split(',').filter(|p| !p.is_empty()) {
                        match part.parse::<u64>() {
                            Ok(n) if n > 0 => sizes.push(n.to_string()),
                            _ => bail!(
                                "--batch-sizes: `{part}` is not a positive integer \
                                 (expected e.g. --batch-sizes 1 2 4 8)"
                            ),
                        }
                    }
                    i += 1;
                }
                if sizes.is_empty() {
                    bail!(
                        "--batch-sizes needs at least one batch size, e.g. --batch-sizes 1 2 4 8"
                    );
                }
                req.passed.push("--batch-sizes".to_owned());
                req.passed.push(sizes.join(","));
            }
            _ if arg.starts_with("--") => {
                let Some((_, takes_value)) = PASSED.iter().find(|(name, _)| *name == arg) else {
                    let known: Vec<&str> = PASSED.iter().map(|(n, _)| *n).collect();
                    bail!(
                        "`{arg}` is not an option of `cargo xtask bench`; the options are \
                         --suite, --out, --batch-sizes, --compare-opts, --write-docs, --from, {}",
                        known.join(", ")
                    );
                };
                req.passed.push(arg.to_owned());
                if *takes_value {
                    req.passed.push(value("a value")?);
                    i += 2;
                } else {
                    req.quick |= arg == "--quick";
                    i += 1;
                }
            }
            name => {
                req.suites.push(suite_named(name)?.name);
                i += 1;
            }
        }
    }
    if req.write_docs && req.quick {
        bail!(
            "--write-docs takes a full run's figures: --quick is CI-sized and never written \
             into docs/benchmarks.md"
        );
    }
    if req.from.is_some() && !req.write_docs {
        bail!("--from DIR goes with --write-docs (it rewrites docs/benchmarks.md from DIR)");
    }
    if req.suites.is_empty() {
        req.suites = DEFAULT.to_vec();
    }
    if compare_opts && !req.suites.contains(&"opts") {
        req.suites.push("opts");
    }
    req.suites.dedup();
    Ok(req)
}

/// `YYYYMMDD-HHMMSS` and RFC 3339 for a time in seconds since the epoch (UTC).
fn timestamps(secs: u64) -> (String, String) {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    (
        format!("{y:04}{mo:02}{d:02}-{h:02}{m:02}{s:02}"),
        format!("{y:04}-{mo:02}-{d:02}T{h:02}:{m:02}:{s:02}Z"),
    )
}

/// The one binary every suite runs in (`kiln-bench GROUP …`).
pub const BENCH_BIN: &str = "kiln-bench";

/// `cargo build --release -p kiln-benches --bin kiln-bench`.
pub fn build(root: &Path, settings: &Settings) -> Result<()> {
    let args = [
        "build",
        "--release",
        "--package",
        "kiln-benches",
        "--bin",
        BENCH_BIN,
    ];
    crate::kiln::cargo_build(root, settings, &args, "the benchmarks")
}

pub fn run(
    root: &Path,
    settings: &Settings,
    libtorch: &Libtorch,
    args: &[String],
) -> Result<ExitCode> {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        print!("usage: cargo xtask\n{}", usage_text());
        return Ok(ExitCode::SUCCESS);
    }
    let req = parse(args)?;
    if let Some(from) = &req.from {
        crate::bench_docs::write(root, from)?;
        util::info(&format!(
            "docs/benchmarks.md rewritten from {}",
            from.display()
        ));
        return Ok(ExitCode::SUCCESS);
    }
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (stamp, created) = timestamps(secs);
    let dir = req
        .out
        .clone()
        .unwrap_or_else(|| root.join("runs").join(format!("bench-{stamp}")));
    if dir.join("report.json").exists() {
        bail!(
            "{} already holds a benchmark report; it is left as it is. Choose another --out \
             directory (or leave --out out for runs/bench-<time>/)",
            dir.display()
        );
    }
    let suites_dir = dir.join("suites");
    std::fs::create_dir_all(&suites_dir)
        .map_err(|e| Error(format!("cannot create {}: {e}", suites_dir.display())))?;

    let chosen: Vec<&Suite> = req
        .suites
        .iter()
        .map(|n| suite_named(n))
        .collect::<Result<_>>()?;
    util::step(&format!("building the benchmarks ({BENCH_BIN})"));
    build(root, settings)?;
    if req.suites.iter().any(|s| RUN_THE_CLI.contains(s)) {
        // These suites run `kiln train`: the CLI as `cargo xtask train` builds it.
        crate::kiln::build_cli(root, settings)?;
    }

    let release = target_dir(root).join("release");
    let python = python_of(libtorch, settings);
    // Lightning, LitServe and pytorch-forecasting, pinned, for the suites whose peers need them.
    let peers = chosen
        .iter()
        .any(|s| peers::needed_by(s.name))
        .then(|| peers::ensure(root, &settings.cache_dir, &python));
    // onnx, pinned, for the suites that export their model to ONNX; without it their onnxruntime
    // rows say "not run" (the library itself comes from setup).
    let export_packages = if req.suites.iter().any(|s| EXPORT_ONNX.contains(s)) {
        match onnx::ensure_export_packages(root, &settings.cache_dir, &python) {
            Ok(dir) => Some(dir),
            Err(Error(why)) => {
                util::warn(&format!(
                    "the ONNX export packages are not available, so the onnxruntime rows will \
                     say \"not run\": {why}"
                ));
                None
            }
        }
    } else {
        None
    };
    for suite in &chosen {
        util::step(&format!("benchmark suite `{}`", suite.name));
        let mut run = Command::new(release.join(BENCH_BIN));
        run.arg(suite.group);
        if !suite.sub.is_empty() {
            run.arg(suite.sub);
        }
        run.arg("--python")
            .arg(&python)
            .args(&req.passed)
            .arg("--out")
            .arg(suites_dir.join(format!("{}.json", suite.name)));
        apply_env(&mut run, settings);
        if let Some(peers) = &peers {
            peers.apply(&mut run);
        }
        if let Some(dir) = &export_packages
            && EXPORT_ONNX.contains(&suite.name)
        {
            onnx::apply_export_env(&mut run, &python, dir);
        }
        let status = util::status_of(&mut run)?;
        if !status.success() {
            bail!(
                "the `{}` benchmark failed ({})",
                suite.name,
                util::describe_status(status)
            );
        }
    }
    util::step("report");
    let mut report = Command::new(release.join(BENCH_BIN));
    report
        .arg("report")
        .arg(&dir)
        .args(["--suites", &req.suites.join(","), "--created", &created]);
    if req.quick {
        report.arg("--quick");
    }
    apply_env(&mut report, settings);
    let status = util::status_of(&mut report)?;
    if !status.success() {
        bail!(
            "assembling the report under {} failed ({})",
            dir.display(),
            util::describe_status(status)
        );
    }
    util::info(&format!(
        "benchmark report: {}/report.json, report.md and plots/",
        dir.display()
    ));
    if req.write_docs {
        crate::bench_docs::write(root, &dir)?;
        util::info("docs/benchmarks.md rewritten from this run");
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn defaults_to_every_suite_but_opts() {
        let r = parse(&[]).unwrap();
        assert_eq!(r.suites, DEFAULT.to_vec());
        assert!(!r.quick);
        let r = parse(&args("--compare-opts --quick")).unwrap();
        assert_eq!(r.suites.last(), Some(&"opts"));
        assert!(r.quick);
        assert_eq!(r.passed, args("--quick"));
    }

    #[test]
    fn suites_options_and_batch_sizes() {
        let r = parse(&args(
            "--suite train serve --out /tmp/x --batch-sizes 1 2 4,8 --repeats 5",
        ))
        .unwrap();
        assert_eq!(r.suites, vec!["train", "serve"]);
        assert_eq!(r.out, Some(PathBuf::from("/tmp/x")));
        assert_eq!(r.passed, args("--batch-sizes 1,2,4,8 --repeats 5"));
    }

    #[test]
    fn write_docs_takes_a_full_run_or_an_existing_report() {
        let r = parse(&args("--suite train --write-docs")).unwrap();
        assert!(r.write_docs && r.from.is_none());
        let r = parse(&args("--write-docs --from runs/bench-1")).unwrap();
        assert_eq!(r.from, Some(PathBuf::from("runs/bench-1")));
        let err = |a: &str| parse(&args(a)).unwrap_err().0;
        assert!(err("--write-docs --quick").contains("--quick is CI-sized"));
        assert!(err("--from runs/bench-1").contains("goes with --write-docs"));
    }

    #[test]
    fn bad_input_names_what_is_wrong() {
        let err = |a: &str| parse(&args(a)).unwrap_err().0;
        assert!(err("--suite nope").contains(
            "`nope` is not a benchmark suite; the suites are: quality, train, optimizer"
        ));
        assert!(err("--batch-sizes 1 x").contains("--batch-sizes: `x` is not a positive integer"));
        assert!(err("--batch-sizes --quick").contains("needs at least one batch size"));
        assert!(err("--out").contains("--out needs a directory"));
        assert!(err("--fast").contains("`--fast` is not an option of `cargo xtask bench`"));
    }

    #[test]
    fn timestamps_are_utc_calendar_times() {
        assert_eq!(timestamps(0).1, "1970-01-01T00:00:00Z");
        // 2026-11-21 13:05:09 UTC
        assert_eq!(
            timestamps(1_795_266_309),
            (
                "20261121-130509".to_owned(),
                "2026-11-21T13:05:09Z".to_owned()
            )
        );
        assert_eq!(timestamps(951_782_400).1, "2000-02-29T00:00:00Z");
    }
}
