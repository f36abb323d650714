//! `cargo xtask gpu-check`: builds the release `kiln` and the benchmark binary (`kiln-bench`),
//! then runs `kiln gpu-check` here; with `--pack DIR`, writes instead a bundle (stripped
//! binaries, the benchmarks' Python scripts, `run-gpu-check.sh`) to copy to a GPU machine that
//! has torch 2.11 in its python3 (docs/gpu.md).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use crate::kiln::{apply_env, python_of, target_dir};
use crate::libtorch::{Libtorch, Settings};
use crate::util::{self, Error, Result, bail};

use crate::bench::BENCH_BIN;

/// What the command was asked to do.
#[derive(Debug, Default, PartialEq, Eq)]
struct Request {
    pack: Option<PathBuf>,
    /// Arguments for `kiln gpu-check`.
    kiln_args: Vec<String>,
}

fn parse(args: &[String]) -> Result<Request> {
    let mut req = Request::default();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--pack" => {
                let dir = it.next().ok_or("--pack needs a directory")?;
                req.pack = Some(PathBuf::from(dir));
            }
            "--out" | "--steps" | "--skip" => {
                let value = it
                    .next()
                    .ok_or_else(|| Error(format!("{arg} needs a value")))?;
                req.kiln_args.extend([arg.clone(), value.clone()]);
            }
            "--require-gpu" => req.kiln_args.push(arg.clone()),
            other => bail!(
                "`cargo xtask gpu-check` does not take `{other}`; it takes --out DIR, \
                 --require-gpu, --steps A,B, --skip A,B and --pack DIR"
            ),
        }
    }
    if req.pack.is_some() && !req.kiln_args.is_empty() {
        bail!(
            "--pack only writes the bundle; give --out/--require-gpu/--steps/--skip to \
             run-gpu-check.sh"
        );
    }
    Ok(req)
}

pub fn usage_text() -> &'static str {
    "  gpu-check [--out DIR] [--require-gpu] [--steps A,B] [--skip A,B]\n\
     \x20                   build release kiln and the train/infer benchmarks, then check every\n\
     \x20                   CUDA path (CPU steps only without a GPU); report.json/md in DIR\n\
     \x20 gpu-check --pack DIR\n\
     \x20                   write a bundle (~45 MB: binaries, CUDA tests, scripts) for a GPU machine with torch 2.11\n\
     \x20                   (docs/gpu.md)\n"
}

pub fn run(
    root: &Path,
    settings: &Settings,
    libtorch: &Libtorch,
    args: &[String],
) -> Result<ExitCode> {
    let req = parse(args)?;
    util::step("building release kiln and the benchmark binaries");
    crate::kiln::build_cli(root, settings)?;
    crate::bench::build(root, settings)?;
    let release = target_dir(root).join("release");
    if let Some(dir) = &req.pack {
        pack(root, &release, dir)?;
        util::step("building the CUDA tests (release) for the bundle");
        let targets = crate::cuda_tests::find(root)?;
        crate::cuda_tests::pack(root, settings, &targets, &dir.join("tests"))?;
        write_script(
            &dir.join("run-cuda-tests.sh"),
            crate::cuda_tests::RUN_SCRIPT,
        )?;
        util::info(&format!(
            "wrote {} ({}): copy it to the GPU machine; there run-gpu-all.sh (everything, \
             within a time budget), or run-gpu-check.sh, run-gpu-bench.sh and \
             run-cuda-tests.sh (docs/gpu.md)",
            dir.display(),
            util::human_bytes(walk_size(dir)),
        ));
        return Ok(ExitCode::SUCCESS);
    }
    let mut cmd = Command::new(release.join("kiln"));
    cmd.arg("gpu-check")
        .args(&req.kiln_args)
        .arg("--bench-dir")
        .arg(&release);
    cmd.env("KILN_BENCH_PYTHON", python_of(libtorch, settings));
    apply_env(&mut cmd, settings);
    let status = util::status_of(&mut cmd)?;
    Ok(ExitCode::from(
        status
            .code()
            .and_then(|c| u8::try_from(c).ok())
            .unwrap_or(1),
    ))
}

/// The bundle: `bin/` (kiln and the bench binaries, stripped), `python/` (the baselines'
/// scripts) and `run-gpu-check.sh`. An existing, non-empty `dir` is refused.
fn pack(root: &Path, release: &Path, dir: &Path) -> Result<()> {
    if std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some()) {
        bail!(
            "--pack {}: already exists and is not empty; give a new directory",
            dir.display()
        );
    }
    let io = |what: &Path, e: std::io::Error| Error(format!("{}: {e}", what.display()));
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).map_err(|e| io(&bin, e))?;
    for name in ["kiln", BENCH_BIN] {
        let to = bin.join(name);
        std::fs::copy(release.join(name), &to).map_err(|e| io(&to, e))?;
        strip(&to);
    }
    let python = dir.join("python");
    std::fs::create_dir_all(&python).map_err(|e| io(&python, e))?;
    let scripts = root.join("benches").join("python");
    for entry in std::fs::read_dir(&scripts)
        .map_err(|e| io(&scripts, e))?
        .flatten()
    {
        let path = entry.path();
        if path.is_file() {
            let to = python.join(entry.file_name());
            std::fs::copy(&path, &to).map_err(|e| io(&to, e))?;
        }
    }
    write_script(&dir.join("run-gpu-check.sh"), RUN_SCRIPT)?;
    write_script(&dir.join("run-gpu-bench.sh"), BENCH_SCRIPT)?;
    write_script(&dir.join("run-gpu-all.sh"), ALL_SCRIPT)
}

fn write_script(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| Error(format!("{}: {e}", path.display())))?;
    set_executable(path)
}

/// Drops debug information (the release profile keeps line tables) with `strip`, when there
/// is one; otherwise the binary stays as it is, only larger.
pub fn strip(path: &Path) {
    let stripped = Command::new("strip")
        .arg(path)
        .status()
        .is_ok_and(|s| s.success());
    if !stripped {
        util::info(&format!(
            "`strip` unavailable: {} keeps its debug info",
            path.display()
        ));
    }
}

fn set_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| Error(format!("{}: {e}", path.display())))
}

fn walk_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| {
            let p = e.path();
            if p.is_dir() {
                walk_size(&p)
            } else {
                e.metadata().map_or(0, |m| m.len())
            }
        })
        .sum()
}

/// Runs the bundle's kiln against python3's torch (which must be 2.11, the libtorch kiln was
/// built against).
const RUN_SCRIPT: &str = r#"#!/bin/sh
# kiln gpu-check on this machine, against the torch 2.11 of python3 (or $KILN_PYTHON).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
py=${KILN_PYTHON:-python3}
version=$("$py" -c 'import torch; print(torch.__version__)') || {
    echo "run-gpu-check.sh: $py has no torch; install torch==2.11.* or set KILN_PYTHON" >&2; exit 3; }
case "$version" in
    2.11.*) ;;
    *) echo "run-gpu-check.sh: $py has torch $version; kiln was built against libtorch 2.11" >&2; exit 3 ;;
esac
lib=$("$py" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KILN_BENCH_ROOT="$here" KILN_BENCH_PYTHON="$py" KILN_PYTHON="$py"
# Every AOTInductor package checks its inputs (dtype, sizes, strides, batch range) itself.
export AOTI_RUNTIME_CHECK_INPUTS=1
exec "$here/bin/kiln" gpu-check --bench-dir "$here/bin" "$@"
"#;

/// Everything a short GPU lease should run, the most important first, within a budget of
/// seconds; each stage's output in one directory, a summary last.
const ALL_SCRIPT: &str = r#"#!/bin/bash
# kiln on this machine's GPU, the most important first, within a budget of seconds:
#   1. gpu-check's compiled-train step (exported programs through kiln's compiled step)
#   2. the exported-program rows of the train suite (against eager and torch.compile)
#   3. every other gpu-check step but the two bench steps
#   4. the CUDA tests
#   5. the train and infer suites, --quick
# usage: run-gpu-all.sh OUT [BUDGET_S]   (OUT must not exist; BUDGET_S default 540)
# OUT/summary.txt says how each stage ended; each stage's log and report are beside it.
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: run-gpu-all.sh OUT [BUDGET_S]}
budget=${2:-540}
if [ -e "$out" ]; then echo "run-gpu-all.sh: $out exists; give a new directory" >&2; exit 2; fi
mkdir -p "$out" || exit 2
end=$(( $(date +%s) + budget ))
# stage NAME CAP COMMAND…: COMMAND for at most CAP seconds, less where the budget is shorter;
# whatever it left running is stopped before the next stage.
stage() {
    name=$1; cap=$2; shift 2
    left=$(( end - $(date +%s) - 5 ))
    [ "$left" -lt "$cap" ] && cap=$left
    if [ "$cap" -lt 30 ]; then echo "$name: not run (the budget is spent)" >> "$out/summary.txt"; return; fi
    start=$(date +%s)
    timeout -k 5 "$cap" "$@" > "$out/$name.log" 2>&1
    rc=$?
    pkill -f "$here/bin/"; pkill -f "$here/python/"; pkill -f compile_program.py
    echo "$name: exit $rc after $(( $(date +%s) - start )) s (at most $cap s)" >> "$out/summary.txt"
}
stage compiled-train 240 "$here/run-gpu-check.sh" --out "$out/compiled" --require-gpu --steps compiled-train
stage program-rows 360 "$here/run-gpu-bench.sh" --out "$out/program" --suites train --repeats 2 --filter "exported program"
stage gpu-check 180 "$here/run-gpu-check.sh" --out "$out/check" --require-gpu --skip compiled-train,bench-train,bench-infer
stage cuda-tests 60 "$here/run-cuda-tests.sh"
stage bench-quick 240 "$here/run-gpu-bench.sh" --out "$out/bench" --quick
grep -hE "^[a-z0-9-]+ +(pass|FAIL|not run) " "$out"/compiled.log "$out"/gpu-check.log >> "$out/summary.txt" 2>/dev/null
cat "$out/summary.txt"
"#;

/// The train and infer suites on this machine's GPU against python3's torch 2.11 (eager and
/// `torch.compile`, alternating, medians), assembled into one report.
const BENCH_SCRIPT: &str = r#"#!/bin/sh
# kiln's train and infer benchmark suites on this machine's GPU, side by side with PyTorch
# eager and torch.compile in python3 (or $KILN_PYTHON), torch 2.11.
# usage: run-gpu-bench.sh [--out DIR] [--quick] [--repeats N] [--suites train,infer]
#                         [--filter TEXT]   (train: only the rows whose name contains TEXT)
set -u
here=$(cd "$(dirname "$0")" && pwd)
py=${KILN_PYTHON:-python3}
out=gpu-bench; quick=""; repeats=""; suites="train,infer"; filter=""
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out=$2; shift 2 ;;
        --quick) quick=--quick; shift ;;
        --repeats) repeats="--repeats $2"; shift 2 ;;
        --suites) suites=$2; shift 2 ;;
        --filter) filter=$2; shift 2 ;;
        *) echo "run-gpu-bench.sh: unknown option $1 (--out DIR, --quick, --repeats N, --suites S,…, --filter TEXT)" >&2; exit 2 ;;
    esac
done
case "$("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null)" in
    2.11.*) ;;
    *) echo "run-gpu-bench.sh: $py has no torch 2.11; kiln was built against libtorch 2.11" >&2; exit 3 ;;
esac
if [ -d "$out" ] && [ -n "$(ls -A "$out")" ]; then
    echo "run-gpu-bench.sh: --out $out is not empty; give a new directory" >&2; exit 2
fi
mkdir -p "$out/suites" || exit 2
lib=$("$py" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KILN_BENCH_ROOT="$here" KILN_BENCH_PYTHON="$py" KILN_PYTHON="$py"
# Every AOTInductor package checks its inputs (dtype, sizes, strides, batch range) itself.
export AOTI_RUNTIME_CHECK_INPUTS=1
created=$(date -u +%Y-%m-%dT%H:%M:%SZ)
rc=0
for suite in $(echo "$suites" | tr ',' ' '); do
    case "$suite" in
        train) group=train ;;
        infer) group=serve ;;
        *) echo "run-gpu-bench.sh: --suites: $suite is not train or infer" >&2; exit 2 ;;
    esac
    echo "== $suite" >&2
    # shellcheck disable=SC2086
    "$here/bin/kiln-bench" "$group" "$suite" --device cuda $quick $repeats ${filter:+--filter "$filter"} \
        --out "$out/suites/$suite.json" || rc=1
done
"$here/bin/kiln-bench" report "$out" --suites "$suites" $quick --created "$created" || rc=1
exit $rc
"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn options_pass_through_to_kiln_or_pack() {
        let r = parse(&args("--out /tmp/r --require-gpu --steps doctor,serve")).unwrap();
        let skip = parse(&args("--skip nccl,serve")).unwrap();
        assert_eq!(skip.kiln_args, args("--skip nccl,serve"));
        assert_eq!(
            r.kiln_args,
            args("--out /tmp/r --require-gpu --steps doctor,serve")
        );
        assert_eq!(
            parse(&args("--pack b")).unwrap().pack,
            Some(PathBuf::from("b"))
        );
    }

    #[test]
    fn bad_input_names_what_is_wrong() {
        let e = parse(&args("--fast")).unwrap_err().to_string();
        assert!(e.contains("`--fast`") && e.contains("--pack DIR"), "{e}");
        assert!(
            parse(&args("--out"))
                .unwrap_err()
                .to_string()
                .contains("--out needs a value")
        );
        let e = parse(&args("--pack b --require-gpu"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("run-gpu-check.sh"), "{e}");
    }

    #[test]
    fn the_run_script_checks_torch_and_sets_the_library_path() {
        for script in [RUN_SCRIPT, BENCH_SCRIPT, crate::cuda_tests::RUN_SCRIPT] {
            assert!(script.contains("2.11.*") && script.contains("LD_LIBRARY_PATH"));
        }
        assert!(RUN_SCRIPT.contains("--bench-dir \"$here/bin\""));
        for stage in ["run-gpu-check.sh", "run-gpu-bench.sh", "run-cuda-tests.sh"] {
            assert!(
                ALL_SCRIPT.contains(&format!("\"$here/{stage}\"")),
                "{stage}"
            );
        }
        assert!(ALL_SCRIPT.contains("--steps compiled-train"));
        assert!(ALL_SCRIPT.contains("--skip compiled-train,bench-train,bench-infer"));
        assert!(
            BENCH_SCRIPT.contains("--device cuda") && BENCH_SCRIPT.contains("kiln-bench\" report")
        );
    }
}
