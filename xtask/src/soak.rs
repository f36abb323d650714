//! `cargo xtask soak KIND [args…]`: the long abuse runs, outside CI. Builds the release `kiln`
//! and `kiln-soak` and runs `kiln-soak KIND args…` with the provisioned libtorch;
//! `server`: `kiln serve` under mixed, partly hostile traffic with its memory watched; `kill`:
//! `kiln train` killed with SIGKILL at chosen phases and resumed.

use std::path::Path;
use std::process::{Command, ExitCode};

use crate::kiln::{apply_env, build_cli, target_dir};
use crate::libtorch::Settings;
use crate::util::{self, Result, bail};

/// The soak binary (package `kiln-soak`).
const SOAK_BIN: &str = "kiln-soak";

/// The soaks `kiln-soak` runs.
pub const KINDS: [&str; 2] = ["server", "kill"];

pub fn usage_text() -> &'static str {
    "  soak server [--minutes M] [--out FILE] [kiln-soak server --help: all]\n\
     \x20                   kiln serve for 10 minutes under mixed traffic at twice its\n\
     \x20                   measured capacity (valid, malformed, oversize, slow, abandoned\n\
     \x20                   requests): statuses, p99 latency, memory slope; fails on a goal\n\
     \x20                   missed (not part of cargo xtask test)\n\
     \x20 soak kill [--kills N] [--scenarios single,ddp,batch-search] [--seed K]\n\
     \x20                   kiln train killed (SIGKILL) N times (20) per scenario, mid-step,\n\
     \x20                   mid-checkpoint-write, mid-validation, during the batch-size search\n\
     \x20                   (KILN_FAULT=POINT:N) and at random times, and resumed: every resume\n\
     \x20                   completes, no checkpoint damaged, the finished run equal bit for bit\n\
     \x20                   to an uninterrupted one\n"
}

/// `args` (`KIND rest…`) checked for `kiln-soak`, or what is wrong with them.
pub fn soak_args(args: &[String]) -> Result<&[String]> {
    match args.first() {
        Some(kind) if KINDS.contains(&kind.as_str()) => Ok(args),
        Some(kind) => bail!("no soak `{kind}`; the soaks are: {}", KINDS.join(", ")),
        None => bail!(
            "which soak? cargo xtask soak KIND, KIND one of: {}",
            KINDS.join(", ")
        ),
    }
}

/// Builds the release binaries and runs the soak; its exit code.
pub fn run(root: &Path, settings: &Settings, args: &[String]) -> Result<ExitCode> {
    let args = soak_args(args)?;
    util::step("building kiln and kiln-soak (release)");
    build_cli(root, settings)?;
    build(root, settings)?;
    let exe = target_dir(root).join("release").join(SOAK_BIN);
    let mut soak = Command::new(&exe);
    soak.current_dir(root).args(args);
    apply_env(&mut soak, settings);
    let status = util::status_of(&mut soak)?;
    Ok(util::exit_code_of(status, "the soak"))
}

/// `cargo build --release -p kiln-soak`.
fn build(root: &Path, settings: &Settings) -> Result<()> {
    let args = ["build", "--release", "--package", SOAK_BIN];
    crate::kiln::cargo_build(root, settings, &args, "the soaks")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_soak_is_named_and_its_arguments_pass_through() {
        let server = strings(&["server", "--minutes", "2"]);
        assert_eq!(soak_args(&server).unwrap(), server);
        assert_eq!(soak_args(&strings(&["kill"])).unwrap(), strings(&["kill"]));
        let e = soak_args(&strings(&["power"])).unwrap_err().to_string();
        assert!(
            e.contains("no soak `power`") && e.contains("server, kill"),
            "{e}"
        );
        let e = soak_args(&[]).unwrap_err().to_string();
        assert!(e.contains("which soak"), "{e}");
    }
}
