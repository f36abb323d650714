//! `cargo xtask test`: the repository checks, cheapest first, stopping at the first failure.

use std::path::Path;
use std::process::Command;

use crate::libtorch::Settings;
use crate::onnx;
use crate::util::{self, Error, Result, bail, step};

/// One check: a name for the report and the cargo arguments that run it.
struct Check {
    name: &'static str,
    args: Vec<String>,
    /// Runs tests that export models from PyTorch, to ONNX too: they get the export packages.
    exports: bool,
}

/// What `cargo xtask test` was asked for.
#[derive(Debug, PartialEq)]
pub struct TestArgs {
    /// `--cuda`: also run the tests that need a CUDA device.
    pub cuda: bool,
    /// Everything else, for `cargo test`.
    pub cargo_test: Vec<String>,
}

impl TestArgs {
    /// Takes xtask's own `--cuda` out of the arguments; the rest go to `cargo test`. A `--cuda`
    /// after `--` belongs to the test binaries and is left alone.
    pub fn parse(args: &[String]) -> Self {
        let end = args.iter().position(|a| a == "--").unwrap_or(args.len());
        let (ours, theirs) = args.split_at(end);
        let cuda = ours.iter().any(|a| a == "--cuda");
        let mut cargo_test: Vec<String> = ours.iter().filter(|a| *a != "--cuda").cloned().collect();
        cargo_test.extend(theirs.iter().cloned());
        TestArgs { cuda, cargo_test }
    }
}

fn checks(args: &TestArgs) -> Vec<Check> {
    let owned = |args: &[&str]| args.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let mut test = owned(&["test", "--workspace"]);
    test.extend(args.cargo_test.iter().cloned());
    let mut all = vec![
        Check {
            name: "cargo fmt --check",
            args: owned(&["fmt", "--all", "--", "--check"]),
            exports: false,
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
            exports: false,
        },
        Check {
            name: "cargo test",
            args: test,
            exports: false,
        },
        // A minute of every fuzz target (`fuzz/tests/short_run.rs`, ignored by plain `cargo
        // test`). Run as a `--workspace` test so that it resolves features as the step before
        // did and reuses its build; the test runs the `kiln-fuzz` binary.
        Check {
            name: "cargo test: a short run of every fuzz target",
            args: owned(&[
                "test",
                "--workspace",
                "--test",
                FUZZ_TEST,
                "--",
                "--ignored",
                "--nocapture",
            ]),
            exports: false,
        },
        // Tests that compare with PyTorch itself are `#[ignore]`d (plain `cargo test` may have
        // no Python with torch) and named `…with_python_torch`; here the provisioned Python is
        // KILN_PYTHON, so they run; those that export to ONNX find the pinned onnx packages in
        // KILN_ONNX_PYTHONPATH.
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
            exports: true,
        },
    ];
    // Tests that need a CUDA device are `#[ignore]`d (most machines have none, and a test must
    // not pass by skipping its work) and named `…on_cuda…`; `--cuda` says this machine has one.
    if args.cuda {
        all.push(Check {
            name: "cargo test: the tests that need CUDA",
            args: owned(&[
                "test",
                "--workspace",
                "--tests",
                "--",
                "--ignored",
                CUDA_TESTS,
            ]),
            exports: false,
        });
    }
    all
}

/// What a fresh clone's checks write into the target directory: the debug build of every test
/// and clippy's metadata, 3.98 GB measured in a CI run (no incremental caches; a build with them,
/// as by default, adds about 1.2 GB), rounded up for the workspace's growth.
const TEST_BUILD_BYTES: u64 = 6_000_000_000;

/// Below this much free space after a failed step, the disk has most likely filled.
const DISK_FULL_BYTES: u64 = 1_000_000_000;

/// A warning when `free` bytes at `target` are fewer than a fresh build of the checks takes.
fn disk_warning(free: u64, target: &Path) -> Option<String> {
    (free < TEST_BUILD_BYTES).then(|| {
        format!(
            "only {} is free on the disk holding {}; a fresh build of the checks takes about {}, \
             so a step may fail with the disk full (free space, or set CARGO_TARGET_DIR to a \
             disk with room)",
            util::human_bytes(free),
            target.display(),
            util::human_bytes(TEST_BUILD_BYTES)
        )
    })
}

/// The cause a failed step most likely had when `free` bytes are left at `target`.
fn disk_full_hint(free: u64, target: &Path) -> Option<String> {
    (free < DISK_FULL_BYTES).then(|| {
        format!(
            "\nThe disk holding {} has only {} free: the step most likely failed because it \
             filled (a linker killed by SIGBUS, or \"No space left on device\"). Free space (e.g. \
             `cargo clean`), or set CARGO_TARGET_DIR to a disk with room, and run it again.",
            target.display(),
            util::human_bytes(free)
        )
    })
}

/// The test target of `kiln-fuzz` that runs every fuzz target briefly.
pub const FUZZ_TEST: &str = "short_run";

/// What the names of the tests that need Python's torch contain.
pub const PYTHON_TESTS: &str = "with_python_torch";

/// What the names of the tests that need a CUDA device contain.
pub const CUDA_TESTS: &str = "on_cuda";

/// Runs every check in order; the error names the step that failed. `python` (the one with
/// libtorch's torch) is `KILN_PYTHON` for the tests that export models from PyTorch; the ONNX
/// export packages and the bench peers (pytorch-forecasting, for the windows comparison) are
/// installed (on first use) just before the step that needs them.
pub fn run_all(root: &Path, settings: &Settings, python: &Path, args: &TestArgs) -> Result<()> {
    let target = crate::kiln::target_dir(root);
    if let Some(low) = util::free_bytes(&target).and_then(|free| disk_warning(free, &target)) {
        util::warn(&low);
    }
    let all = checks(args);
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
        // Every AOTInductor package the tests run checks its inputs (dtype, sizes, strides and
        // the batch range it was compiled for) itself, and fails the test on a mismatch.
        cmd.env("AOTI_RUNTIME_CHECK_INPUTS", "1");
        if check.exports {
            crate::peers::ensure(root, &settings.cache_dir, python).apply(&mut cmd);
            match onnx::ensure_export_packages(root, &settings.cache_dir, python) {
                Ok(dir) => onnx::apply_export_env(&mut cmd, python, &dir),
                Err(Error(why)) => util::warn(&format!(
                    "the ONNX export packages are not installed, so the tests that export to \
                     ONNX will fail: {why}"
                )),
            }
        }
        let status = util::status_of(&mut cmd)?;
        if !status.success() {
            let full = util::free_bytes(&target).and_then(|free| disk_full_hint(free, &target));
            bail!(
                "xtask test: step {}/{total} `{}` failed ({}); the steps after it did not run{}",
                i + 1,
                check.name,
                util::describe_status(status),
                full.unwrap_or_default()
            );
        }
    }
    step("all checks passed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_disk_too_small_for_the_build_is_named_before_and_after_a_failed_step() {
        let target = Path::new("/repo/target");
        assert_eq!(disk_warning(TEST_BUILD_BYTES, target), None);
        let low = disk_warning(2_500_000_000, target).expect("2.5 GB is too little");
        assert!(
            low.contains("2.5 GB") && low.contains("/repo/target"),
            "{low}"
        );
        assert!(low.contains("CARGO_TARGET_DIR"), "{low}");
        assert_eq!(disk_full_hint(DISK_FULL_BYTES, target), None);
        let full = disk_full_hint(287_000_000, target).expect("287 MB left is a full disk");
        assert!(
            full.contains("287.0 MB") && full.contains("No space left"),
            "{full}"
        );
    }

    #[test]
    fn checks_run_cheapest_first_and_pass_extra_args_to_cargo_test() {
        let all = checks(&TestArgs::parse(&strings(&["--", "--nocapture"])));
        let names: Vec<_> = all.iter().map(|c| c.name).collect();
        assert_eq!(
            names,
            [
                "cargo fmt --check",
                "cargo clippy",
                "cargo test",
                "cargo test: a short run of every fuzz target",
                "cargo test: the tests that need Python's torch"
            ]
        );
        assert!(
            all[4]
                .args
                .ends_with(&["--ignored".to_owned(), PYTHON_TESTS.to_owned()])
        );
        assert_eq!(
            all[3].args[..4],
            ["test", "--workspace", "--test", FUZZ_TEST].map(String::from)
        );
        let exports: Vec<_> = all.iter().map(|c| c.exports).collect();
        assert_eq!(
            exports,
            [false, false, false, false, true],
            "only the Python step exports"
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

    #[test]
    fn the_cuda_tests_run_only_with_cuda_and_the_flag_is_not_passed_to_cargo() {
        let without = checks(&TestArgs::parse(&strings(&["-p", "kiln-train"])));
        assert_eq!(without.len(), 5);
        assert!(
            without
                .iter()
                .all(|c| !c.args.iter().any(|a| a == "--cuda" || a == CUDA_TESTS))
        );

        let with = checks(&TestArgs::parse(&strings(&[
            "--cuda",
            "-p",
            "kiln-train",
            "--",
            "--nocapture",
        ])));
        let names: Vec<_> = with.iter().map(|c| c.name).collect();
        assert_eq!(names.len(), 6);
        assert_eq!(names[5], "cargo test: the tests that need CUDA");
        assert_eq!(
            with[5].args,
            strings(&[
                "test",
                "--workspace",
                "--tests",
                "--",
                "--ignored",
                CUDA_TESTS
            ])
        );
        assert_eq!(
            with[2].args,
            strings(&[
                "test",
                "--workspace",
                "-p",
                "kiln-train",
                "--",
                "--nocapture"
            ])
        );
    }

    #[test]
    fn only_a_cuda_flag_before_the_double_dash_is_xtasks() {
        let args = TestArgs::parse(&strings(&["--release", "--", "--cuda"]));
        assert!(!args.cuda);
        assert_eq!(args.cargo_test, strings(&["--release", "--", "--cuda"]));
        let args = TestArgs::parse(&strings(&["--release", "--cuda"]));
        assert!(args.cuda);
        assert_eq!(args.cargo_test, strings(&["--release"]));
    }
}
