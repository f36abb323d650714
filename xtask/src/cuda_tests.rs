//! The CUDA tests of the GPU bundle: finds the test targets that hold `…on_cuda…` tests, builds
//! them in release mode (beside the release `kiln` the bundle carries) and copies them, stripped,
//! into the bundle's `tests/`, where `run-cuda-tests.sh` runs them on a GPU machine without Rust.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::checks::CUDA_TESTS;
use crate::kiln::apply_env;
use crate::libtorch::Settings;
use crate::util::{self, Error, Result, bail};

/// A test target holding CUDA tests: a package's unit tests (`--lib`) or one integration test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub package: String,
    /// `None`: the library's unit tests; else the integration test's name.
    pub test: Option<String>,
}

impl Target {
    /// The file name the test binary gets in the bundle.
    pub fn file_name(&self) -> String {
        format!("{}-{}", self.package, self.test.as_deref().unwrap_or("lib"))
    }
}

/// Every test target under `root/crates` whose source names a test `…on_cuda…`.
pub fn find(root: &Path) -> Result<Vec<Target>> {
    let crates = root.join("crates");
    let mut dirs: Vec<PathBuf> = read_dir(&crates)?
        .into_iter()
        .filter(|p| p.join("Cargo.toml").is_file())
        .collect();
    dirs.sort();
    let mut found = vec![];
    for dir in dirs {
        let manifest = read(&dir.join("Cargo.toml"))?;
        let package = package_name(&manifest)
            .ok_or_else(|| Error(format!("{}: no package name", dir.display())))?;
        if any_cuda_test(&dir.join("src"))? {
            found.push(Target {
                package: package.clone(),
                test: None,
            });
        }
        let tests = dir.join("tests");
        let mut files: Vec<PathBuf> = if tests.is_dir() {
            read_dir(&tests)?
        } else {
            vec![]
        };
        files.sort();
        for file in files
            .iter()
            .filter(|f| f.extension().is_some_and(|e| e == "rs"))
        {
            if has_cuda_test(&read(file)?) {
                let stem = file.file_stem().map(|s| s.to_string_lossy().into_owned());
                found.push(Target {
                    package: package.clone(),
                    test: stem,
                });
            }
        }
    }
    Ok(found)
}

/// Whether a source file defines a test function named `…on_cuda…`.
fn has_cuda_test(source: &str) -> bool {
    source.lines().any(|l| {
        l.trim_start()
            .strip_prefix("fn ")
            .and_then(|rest| rest.split('(').next())
            .is_some_and(|name| name.contains(CUDA_TESTS))
    })
}

/// Whether any `.rs` file under `dir` (recursively) has a CUDA test.
fn any_cuda_test(dir: &Path) -> Result<bool> {
    if !dir.is_dir() {
        return Ok(false);
    }
    for path in read_dir(dir)? {
        let hit = if path.is_dir() {
            any_cuda_test(&path)?
        } else {
            path.extension().is_some_and(|e| e == "rs") && has_cuda_test(&read(&path)?)
        };
        if hit {
            return Ok(true);
        }
    }
    Ok(false)
}

/// `name = "…"` of a manifest's `[package]` table.
fn package_name(manifest: &str) -> Option<String> {
    let mut in_package = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if in_package && let Some(value) = line.strip_prefix("name") {
            let value = value.trim_start().strip_prefix('=')?.trim();
            return Some(value.trim_matches('"').to_owned());
        }
    }
    None
}

/// Builds `targets` in release mode and copies their test binaries, stripped, into `dir`.
/// Returns the files written.
pub fn pack(
    root: &Path,
    settings: &Settings,
    targets: &[Target],
    dir: &Path,
) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| Error(format!("{}: {e}", dir.display())))?;
    let mut written = vec![];
    for t in targets {
        let exe = build(root, settings, t)?;
        let to = dir.join(t.file_name());
        std::fs::copy(&exe, &to).map_err(|e| Error(format!("{}: {e}", to.display())))?;
        crate::gpu_check::strip(&to);
        written.push(to);
    }
    Ok(written)
}

/// `cargo test --release --no-run -p PACKAGE (--lib | --test NAME)`; the test binary it built.
fn build(root: &Path, settings: &Settings, t: &Target) -> Result<PathBuf> {
    let mut cmd = Command::new(util::cargo());
    cmd.current_dir(root)
        .args([
            "test",
            "--release",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .args(["--package", &t.package]);
    match &t.test {
        Some(name) => cmd.args(["--test", name]),
        None => cmd.arg("--lib"),
    };
    apply_env(&mut cmd, settings);
    cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
    let out = cmd
        .output()
        .map_err(|e| Error(format!("cannot run cargo: {e}")))?;
    if !out.status.success() {
        bail!(
            "building the CUDA tests of {} failed ({}); see the compiler output above",
            t.file_name(),
            util::describe_status(out.status)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    test_executable(&stdout).ok_or_else(|| {
        Error(format!(
            "cargo built no test binary for {} (no test artifact in its output)",
            t.file_name()
        ))
    })
}

/// The `executable` of the last test artifact (its `profile` says `"test":true`; a binary the
/// integration tests run also has a target that says so) in cargo's JSON messages.
fn test_executable(messages: &str) -> Option<PathBuf> {
    let built_for_test = |l: &str| {
        let Some(start) = l.find("\"profile\":{") else {
            return false;
        };
        let profile = &l[start..];
        profile[..profile.find('}').unwrap_or(profile.len())].contains("\"test\":true")
    };
    messages
        .lines()
        .filter(|l| l.contains("\"reason\":\"compiler-artifact\"") && built_for_test(l))
        .filter_map(|l| {
            let start = l.find("\"executable\":\"")? + "\"executable\":\"".len();
            let len = l[start..].find('"')?;
            Some(PathBuf::from(&l[start..start + len]))
        })
        .next_back()
}

fn read_dir(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error(format!("{}: {e}", dir.display())))?;
    Ok(entries.flatten().map(|e| e.path()).collect())
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| Error(format!("{}: {e}", path.display())))
}

/// Runs every test binary in the bundle's `tests/` with `--ignored on_cuda`, against the torch
/// of python3 (or `$KILN_PYTHON`); `KILN_TEST_KILN` points the CLI's tests at the bundle's kiln.
pub const RUN_SCRIPT: &str = r#"#!/bin/sh
# The CUDA tests of kiln (`…on_cuda…`), built beforehand, run against python3's torch 2.11.
set -u
here=$(cd "$(dirname "$0")" && pwd)
py=${KILN_PYTHON:-python3}
case "$("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null)" in
    2.11.*) ;;
    *) echo "run-cuda-tests.sh: $py has no torch 2.11; kiln was built against libtorch 2.11" >&2; exit 3 ;;
esac
lib=$("$py" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KILN_TEST_KILN="$here/bin/kiln" KILN_PYTHON="$py"
failed=""
for t in "$here"/tests/*; do
    echo "== $(basename "$t")"
    "$t" --ignored on_cuda --test-threads 1 || failed="$failed $(basename "$t")"
done
if [ -n "$failed" ]; then
    echo "run-cuda-tests.sh: failed:$failed" >&2
    exit 1
fi
echo "run-cuda-tests.sh: every CUDA test passed"
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_tests_are_found_by_their_names_and_targets_named_by_package() {
        assert!(has_cuda_test(
            "#[test]\n#[ignore]\nfn memory_stats_on_cuda_track() {}"
        ));
        assert!(has_cuda_test("    fn on_cuda_batches_arrive() {"));
        assert!(!has_cuda_test(
            "fn runs_on_cpu() {}\n// fn not_on_cuda_really"
        ));
        assert!(!has_cuda_test("let on_cuda = true;"));
        let manifest = "[package]\nname = \"kiln-train\"\n[dependencies]\nname = \"x\"\n";
        assert_eq!(package_name(manifest).as_deref(), Some("kiln-train"));
        assert_eq!(package_name("[lib]\nname = \"y\"\n"), None);
        let t = Target {
            package: "kiln-train".into(),
            test: Some("feed".into()),
        };
        assert_eq!(t.file_name(), "kiln-train-feed");
    }

    #[test]
    fn the_workspace_cuda_targets_include_the_known_ones() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let names: Vec<String> = find(root).unwrap().iter().map(Target::file_name).collect();
        for known in [
            "kiln-torch-ext-lib",
            "kiln-train-devices",
            "kiln-cli-distributed",
        ] {
            assert!(names.iter().any(|n| n == known), "{known} not in {names:?}");
        }
        assert!(!names.iter().any(|n| n == "kiln-config-lib"), "{names:?}");
    }

    #[test]
    fn the_test_binary_is_read_from_cargos_messages() {
        let messages = concat!(
            r#"{"reason":"compiler-artifact","target":{"test":true},"profile":{"test":false},"executable":"/t/release/kiln"}"#,
            "\n",
            r#"{"reason":"compiler-artifact","profile":{"test":true},"executable":"/t/release/deps/feed-abc"}"#,
            "\n",
            r#"{"reason":"compiler-artifact","target":{"test":true},"profile":{"test":false},"executable":"/t/release/kiln2"}"#,
            "\n",
            r#"{"reason":"build-finished","success":true}"#
        );
        assert_eq!(
            test_executable(messages),
            Some(PathBuf::from("/t/release/deps/feed-abc"))
        );
        assert_eq!(test_executable(r#"{"reason":"build-finished"}"#), None);
    }
}
