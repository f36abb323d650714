//! Every target sets up from a fresh directory, reaches its parsers' success path with its
//! seeds (real files kiln writes and reads), and answers mutated inputs without a panic.

use kiln_fuzz::runner::{self, Options, Watchdog};
use kiln_fuzz::{Target, targets};

fn real_targets() -> Vec<Target> {
    targets::all().into_iter().filter(|t| !t.selftest).collect()
}

#[test]
fn every_parser_kiln_owns_has_a_target() {
    let names: Vec<&str> = real_targets().iter().map(|t| t.name).collect();
    for want in [
        "npy",
        "safetensors",
        "dataset-manifest",
        "windows-manifest",
        "checkpoint-json",
        "csv",
        "parquet",
        "http-body",
        "onnx-metadata",
        "config-toml",
        "config-yaml",
        "config-json",
        "profile-toml",
        "tiff",
        "model-archive",
    ] {
        assert!(names.contains(&want), "no target {want}: {names:?}");
    }
}

/// Targets whose every seed is an input all their parsers accept: a broken fixture or seed
/// would leave the target fuzzing only the first check.
#[test]
fn seeds_reach_the_parsers_success_path() {
    let valid = [
        "dataset-manifest",
        "windows-manifest",
        "checkpoint-json",
        "onnx-metadata",
        "config-toml",
        "config-yaml",
        "config-json",
        "profile-toml",
        "tiff",
    ];
    for name in valid {
        let target = targets::find(name).unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let mut harness = (target.make)(scratch.path()).unwrap();
        let seeds = harness.seeds();
        assert!(!seeds.is_empty(), "{name} has no seeds");
        for (k, seed) in seeds.iter().enumerate() {
            assert_eq!(harness.run(seed), Ok(()), "{name}: seed {k}");
        }
    }
}

#[test]
fn every_target_answers_mutated_inputs_without_a_panic_or_a_hang() {
    let watchdog = Watchdog::start(std::time::Duration::from_secs(60)).unwrap();
    let out = tempfile::tempdir().unwrap();
    let options = Options {
        inputs: Some(60),
        seconds: None,
        seed: 3,
        out_dir: out.path().to_owned(),
        hang: std::time::Duration::from_secs(5),
    };
    for target in real_targets() {
        let report = runner::run(&target, &options, &watchdog).unwrap();
        assert_eq!(report.inputs, 60, "{}", target.name);
        assert!(report.passed(), "{}: {:?}", target.name, report.failures);
    }
}
