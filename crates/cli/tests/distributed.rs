//! `kiln train --nproc-per-node 2`: two ranks on c10d/Gloo over loopback train one run; rank 0
//! alone writes it.

mod common;

use common::{kiln, stderr};

#[test]
fn two_local_ranks_train_one_run_written_by_rank_0() {
    let tmp = tempfile::tempdir().unwrap();
    let out = format!("run.output_dir={}", tmp.path().display());
    let o = kiln(&[
        "train",
        "--nproc-per-node",
        "2",
        "--model",
        "mlp",
        "--epochs",
        "1",
        "--set",
        "data.synthetic_samples=712",
        "--set",
        "train.amp=fp32",
        "--set",
        "data.num_workers=1",
        "--set",
        "train.batch_size=32",
        "--set",
        "distributed.timeout_s=60",
        "--set",
        &out,
    ]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("data-parallel: 2 ranks on c10d/Gloo"), "{err}");
    assert!(err.contains("global batch 64"), "{err}");
    let runs: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().collect();
    assert_eq!(runs.len(), 1, "one run directory");
    assert!(runs[0].path().join("metrics.jsonl").is_file());
}
