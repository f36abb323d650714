//! The `kiln-fuzz` binary on the harness's self-check targets: a panic is caught, counted and
//! its input written out; a slow input is a hang; one that never returns, or asks for memory
//! past the limits, ends the run with the input written out; `--replay` runs one file.

use std::path::Path;
use std::process::{Command, Output};

fn kiln_fuzz(out: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln-fuzz"))
        .args(args)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn a_panic_is_counted_and_its_input_written_out() {
    let out = tempfile::tempdir().unwrap();
    let o = kiln_fuzz(
        out.path(),
        &["--target", "selftest-panic", "--inputs", "2", "--seed", "5"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let report = text(&o);
    assert!(report.contains("a panic on purpose"), "{report}");
    let row = report
        .lines()
        .find(|l| l.starts_with("selftest-panic"))
        .unwrap();
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!((cells[1], cells[4], cells[5]), ("2", "1", "0"), "{row}");
    let saved = out.path().join("selftest-panic-seed5-input1.panic");
    assert_eq!(std::fs::read(saved).unwrap(), b"!");
}

#[test]
fn an_input_slower_than_the_limit_is_a_hang() {
    let out = tempfile::tempdir().unwrap();
    let o = kiln_fuzz(out.path(), &["--target", "selftest-hang", "--inputs", "2"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("hang at input 1: took 1.5"),
        "{}",
        text(&o)
    );
    assert!(out.path().join("selftest-hang-seed0-input1.hang").exists());
}

#[test]
fn an_input_that_never_returns_ends_the_run_with_its_input_saved() {
    let out = tempfile::tempdir().unwrap();
    let o = kiln_fuzz(
        out.path(),
        &[
            "--target",
            "selftest-hang",
            "--inputs",
            "3",
            "--give-up-s",
            "2",
        ],
    );
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(
        text(&o).contains("input 2: still running after 2 s"),
        "{}",
        text(&o)
    );
    let saved = out.path().join("selftest-hang-seed0-input2.hang");
    assert_eq!(std::fs::read(saved).unwrap(), b"!!");
}

#[test]
fn an_allocation_past_the_limit_ends_the_run_with_its_input_saved() {
    let out = tempfile::tempdir().unwrap();
    let o = kiln_fuzz(
        out.path(),
        &["--target", "selftest-memory", "--inputs", "2"],
    );
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert!(
        text(&o).contains("asked the allocator for 1099511627776 bytes"),
        "{}",
        text(&o)
    );
    assert!(
        out.path()
            .join("selftest-memory-seed0-input1.memory")
            .exists()
    );
}

#[test]
fn a_clean_run_reports_every_target_asked_for_and_passes() {
    let out = tempfile::tempdir().unwrap();
    let o = kiln_fuzz(
        out.path(),
        &[
            "--target",
            "http-body",
            "--target",
            "onnx-metadata",
            "--inputs",
            "300",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let report = text(&o);
    for name in ["http-body", "onnx-metadata"] {
        let row = report.lines().find(|l| l.starts_with(name)).unwrap();
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!((cells[1], cells[4], cells[5]), ("300", "0", "0"), "{row}");
    }
}

#[test]
fn a_saved_input_replays() {
    let out = tempfile::tempdir().unwrap();
    let file = out.path().join("body.npy");
    std::fs::write(&file, b"\x93NUMPY\x01\x00\x05\x00{'a':").unwrap();
    let o = kiln_fuzz(
        out.path(),
        &["--target", "http-body", "--replay", file.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("http-body: Err("), "{}", text(&o));
}
