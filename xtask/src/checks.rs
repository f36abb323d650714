//! `cargo xtask test`: the repository checks, cheapest first, stopping at the first failure.

use std::path::Path;
use std::process::Command;

use crate::libtorch::Settings;
use crate::util::{self, Result, bail, step};

/// One check: a name for the report and the cargo arguments that run it.
struct Check {
    name: &'static str,
    args: Vec<String>,
}

fn checks(extra_test_args: &[String]) -> Vec<Check> {
    let owned = |args: &[&str]| args.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let mut test = owned(&["test", "--workspace"]);
    test.extend(extra_test_args.iter().cloned());
    vec![
        Check {
            name: "cargo fmt --check",
            args: owned(&["fmt", "--all", "--", "--check"]),
        },
        Check {
            name: "cargo clippy",
            args: owned(&[
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ]),
        },
        Check {
            name: "cargo test",
            args: test,
        },
        // Tests that compare with PyTorch itself are `#[ignore]`d (plain `cargo test` may have
        // no Python with torch) and named `…with_python_torch`; here the provisioned Python is
        // KILN_PYTHON, so they run.
        Check {
            name: "cargo test: the tests that need Python's torch",
            args: owned(&[
                "test",
                "--workspace",
                "--tests",
                "--",
                "--ignored",
                PYTHON_TESTS,
            ]),
        },
    ]
}

/// What the names of the tests that need Python's torch contain.
pub const PYTHON_TESTS: &str = "with_python_torch";

/// Runs every check in order; the error names the step that failed. `python` (the one with
/// libtorch's torch) is `KILN_PYTHON` for the tests that export models from PyTorch.
pub fn run_all(
    root: &Path,
    settings: &Settings,
    python: &Path,
    extra_test_args: &[String],
) -> Result<()> {
    let all = checks(extra_test_args);
    let total = all.len();
    for (i, check) in all.into_iter().enumerate() {
        step(&format!(
            "[{}/{total}] cargo {}",
            i + 1,
            check.args.join(" ")
        ));
        let mut cmd = Command::new(util::cargo());
        cmd.current_dir(root).args(&check.args);
        crate::kiln::apply_env(&mut cmd, settings);
        cmd.env("KILN_PYTHON", python);
        let status = util::status_of(&mut cmd)?;
        if !status.success() {
            bail!(
                "xtask test: step {}/{total} `{}` failed ({}); the steps after it did not run",
                i + 1,
                check.name,
                util::describe_status(status)
            );
        }
    }
    step("all checks passed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_run_cheapest_first_and_pass_extra_args_to_cargo_test() {
        let all = checks(&["--".to_owned(), "--nocapture".to_owned()]);
        let names: Vec<_> = all.iter().map(|c| c.name).collect();
        assert_eq!(
            names,
            [
                "cargo fmt --check",
                "cargo clippy",
                "cargo test",
                "cargo test: the tests that need Python's torch"
            ]
        );
        assert!(
            all[3]
                .args
                .ends_with(&["--ignored".to_owned(), PYTHON_TESTS.to_owned()])
        );
        assert!(
            all[1]
                .args
                .ends_with(&["-D".to_owned(), "warnings".to_owned()])
        );
        assert_eq!(
            all[2].args,
            ["test", "--workspace", "--", "--nocapture"].map(String::from)
        );
    }
}
