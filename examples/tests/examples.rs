//! The library examples run as tests, so `cargo test` (and `cargo xtask test`) trains them the
//! way a user runs them: `regression.rs` is compiled in here as a module and its `train` called.

#[allow(dead_code)] // its `main` is the example's, not the test's
#[path = "../regression.rs"]
mod regression;

#[test]
fn the_regression_example_learns_and_leaves_a_run_directory() {
    let out = tempfile::tempdir().unwrap();
    let outcome = regression::train(out.path().to_str().unwrap()).unwrap();
    assert!(outcome.run_dir.starts_with(out.path()));
    for file in ["config.json", "metrics.jsonl", "summary.json", "curves.png"] {
        assert!(outcome.run_dir.join(file).is_file(), "{file}");
    }
    assert_eq!(outcome.summary.task, "regression");
    assert!(outcome.summary.final_val_mae.unwrap() < 0.2);
}
