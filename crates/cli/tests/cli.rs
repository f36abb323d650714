//! The `kiln` binary as a user runs it.

use std::process::{Command, Output};

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("RUST_LOG")
        .output()
        .expect("the kiln binary runs")
}

#[test]
fn version_reports_libtorch_and_loads_its_cuda_library() {
    let out = kiln(&["version"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("libtorch 2.11.0 at "), "{stdout}");
    // The binary must not have dropped libtorch_cuda (the as-needed trap) when it exists.
    let lib_dir = stdout
        .lines()
        .find_map(|l| l.strip_prefix("libtorch 2.11.0 at "))
        .unwrap();
    let shipped = std::path::Path::new(lib_dir)
        .join("libtorch_cuda.so")
        .exists();
    let expected = if shipped {
        "libtorch_cuda: linked"
    } else {
        "libtorch_cuda: not shipped"
    };
    assert!(
        stdout.contains(expected),
        "expected `{expected}` in:\n{stdout}"
    );
}

#[test]
fn train_says_clearly_that_it_is_not_built_yet() {
    let out = kiln(&["train"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("training is not built yet"), "{stderr}");
}

#[test]
fn unknown_commands_fail_with_usage() {
    let out = kiln(&["frobnicate"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("unrecognized subcommand 'frobnicate'"),
        "{stderr}"
    );
}
