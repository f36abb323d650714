//! `kiln-bench`: every benchmark suite in one binary. `kiln-bench GROUP ARGS…` runs a group's
//! command line: `data`, `train` (its suites `train`, `optimizer`, `opts`), `serve` (`infer`,
//! `serve`), `quality`, `learning`, `job`, `ddp`, and `report`, which merges the suites' outputs.
//! Suites that measure in child processes start this binary again with their group's word.
//! `cargo xtask bench` builds and runs it; `kiln gpu-check` runs the train and infer suites.

// The groups' subcommands are parsed once per process: the size of a variant does not matter.
#![allow(clippy::large_enum_variant)]

#[path = "data_side_by_side.rs"]
mod data;
mod data_auto;
mod data_windows;
#[path = "ddp_side_by_side.rs"]
mod ddp;
#[path = "job_side_by_side.rs"]
mod job;
#[path = "learning_side_by_side.rs"]
mod learning;
#[path = "quality_side_by_side.rs"]
mod quality;
#[path = "report_main.rs"]
mod report;
#[path = "serve/main.rs"]
mod serve;
#[path = "train/main.rs"]
mod train;

use std::ffi::OsString;

/// A group's entry point: its command line, the group's name first.
type Entry = fn(Vec<OsString>);

/// The groups, each with its command line's entry point.
const GROUPS: [(&str, Entry); 8] = [
    ("data", data::main),
    ("train", train::main),
    ("serve", serve::main),
    ("quality", quality::main),
    ("learning", learning::main),
    ("job", job::main),
    ("ddp", ddp::main),
    ("report", report::main),
];

fn main() {
    let mut args = std::env::args_os().skip(1);
    let word = args.next();
    let group = word
        .as_ref()
        .and_then(|w| w.to_str())
        .and_then(|w| GROUPS.iter().find(|(name, _)| *name == w));
    let Some((name, run)) = group else {
        let names: Vec<&str> = GROUPS.iter().map(|(n, _)| *n).collect();
        eprintln!(
            "usage: kiln-bench GROUP [ARGS…], GROUP one of: {} (`kiln-bench GROUP --help` says \
             more); cargo xtask bench runs them",
            names.join(", ")
        );
        std::process::exit(2);
    };
    let mut line = vec![OsString::from(format!("kiln-bench {name}"))];
    line.extend(args);
    run(line);
}
