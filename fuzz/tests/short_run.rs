//! The short run of every target that `cargo xtask test` makes (ignored by plain `cargo test`,
//! run there with `--ignored`): the whole `kiln-fuzz` binary, its counting allocator and
//! watchdog included, for about a minute in all.

use std::process::Command;

/// The seconds of fuzzing the run takes in all, split between the targets.
const SECONDS: &str = "60";

#[test]
#[ignore = "a minute of fuzzing: cargo xtask test runs it"]
fn every_target_survives_a_short_run() {
    let out = tempfile::tempdir().unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_kiln-fuzz"))
        .args(["--total-seconds", SECONDS, "--out"])
        .arg(out.path())
        .status()
        .unwrap();
    assert!(
        status.success(),
        "kiln-fuzz found failing inputs (see its report above; they are in {})",
        out.keep().display()
    );
}
