//! `cargo xtask fuzz [args…]`: builds the fuzz harness (`kiln-fuzz`) in the `fuzz` profile
//! (release speed, with overflow checks and debug assertions, so that an overflow a hostile
//! header causes is a panic it sees) and runs it with the provisioned libtorch; the arguments
//! go to `kiln-fuzz` (`--target NAME`, `--inputs N`, `--seconds S`, `--seed K`, `--list`, …).

use std::path::Path;
use std::process::{Command, ExitCode};

use crate::kiln::{apply_env, cargo_build, target_dir};
use crate::libtorch::Settings;
use crate::util::{self, Result};

/// The cargo profile the harness is built in (the workspace's `[profile.fuzz]`).
pub const PROFILE: &str = "fuzz";

pub fn usage_text() -> &'static str {
    "  fuzz [--target NAME]… [--inputs N | --seconds S] [--seed K] [--list]\n\
     \x20                   build the fuzz harness (profile fuzz: release with overflow checks)\n\
     \x20                   and fuzz every parser kiln owns; failing inputs go to\n\
     \x20                   target/fuzz-findings/ (kiln-fuzz --help: every option)\n"
}

/// The cargo arguments that build the harness.
pub fn build_args() -> Vec<String> {
    [
        "build",
        "--profile",
        PROFILE,
        "--package",
        "kiln-fuzz",
        "--bin",
        "kiln-fuzz",
    ]
    .map(String::from)
    .to_vec()
}

/// Builds the harness and runs it with `args`; its exit code.
pub fn run(root: &Path, settings: &Settings, args: &[String]) -> Result<ExitCode> {
    cargo_build(root, settings, &build_args(), "the fuzz harness")?;
    let exe = target_dir(root).join(PROFILE).join("kiln-fuzz");
    let mut fuzz = Command::new(&exe);
    fuzz.current_dir(root).args(args);
    apply_env(&mut fuzz, settings);
    let status = util::status_of(&mut fuzz)?;
    Ok(util::exit_code_of(status, "kiln-fuzz"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_harness_is_built_in_its_own_profile() {
        let args = build_args();
        assert_eq!(args[..3], ["build", "--profile", "fuzz"]);
        assert!(args.ends_with(&["--bin".to_owned(), "kiln-fuzz".to_owned()]));
    }
}
