//! `kiln-bench GROUP ARGS…`: every benchmark suite in one binary (`cargo xtask bench`, gpu-check).

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

/// The groups, each with its entry point.
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
    let word = args.next().unwrap_or_default();
    let Some((name, run)) = GROUPS.iter().find(|(n, _)| word == **n) else {
        let names = GROUPS.map(|(n, _)| n).join(", ");
        eprintln!(
            "usage: kiln-bench GROUP [ARGS…], GROUP one of: {names} (`kiln-bench GROUP --help` \
             says more); cargo xtask bench runs them"
        );
        std::process::exit(2);
    };
    let name = OsString::from(format!("kiln-bench {name}"));
    run(std::iter::once(name).chain(args).collect());
}
