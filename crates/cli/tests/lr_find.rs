//! `kiln lr-find`: the learning-rate range test alone prints the rate it found, caches it, and
//! writes the curve; `kiln config --explain` shows that answer, and a `kiln train` with
//! `train.lr = auto` afterwards takes it from the cache.

mod common;

use common::{kiln_with_env, stderr, stdout};

#[test]
fn lr_find_prints_caches_and_plots_the_rate_and_train_takes_it_from_the_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, cache) = (tmp.path().join("curve"), tmp.path().join("cache"));
    let cache_env = [("KILN_CACHE_DIR", cache.to_str().unwrap())];
    let sets = [
        "--device",
        "cpu",
        "--model",
        "mlp",
        "--set",
        "data.synthetic_samples=256",
        "--set",
        "data.num_workers=0",
        "--set",
        "train.batch_size=32",
        "--set",
        "checkpoint.enabled=false",
    ];
    let mut args = vec!["lr-find"];
    args.extend(sets);
    let out_arg = out.to_str().unwrap();
    args.extend(["--out", out_arg]);
    let found = kiln_with_env(&args, &cache_env);
    assert!(found.status.success(), "{}", stderr(&found));
    let line = stdout(&found);
    assert!(
        line.starts_with("train.lr auto: ") && line.contains("range test"),
        "{line}"
    );
    assert!(out.join("lr_find.json").is_file() && out.join("lr_find.png").is_file());
    let cached = std::fs::read_to_string(cache.join("lr-find.json")).unwrap();
    assert!(cached.contains("\"lr\""), "{cached}");

    // `config --explain` shows the answer the cache holds for this model and data.
    let mut args = vec!["config", "--explain", "--set", "model.name=mlp"];
    args.extend(sets.iter().filter(|a| !["--model", "mlp"].contains(a)));
    args.extend(["--set", "train.lr=auto"]);
    let explained = kiln_with_env(&args, &cache_env);
    assert!(explained.status.success(), "{}", stderr(&explained));
    let text = stdout(&explained);
    assert!(
        text.lines().any(|l| l.starts_with("train.lr ")
            && l.contains("auto (found ")
            && l.contains("cached")),
        "{text}"
    );

    let runs = tmp.path().join("runs");
    let mut args = vec!["train"];
    args.extend(sets);
    let runs_set = format!("run.output_dir={}", runs.display());
    args.extend([
        "--epochs",
        "1",
        "--set",
        "train.lr=auto",
        "--set",
        &runs_set,
    ]);
    let trained = kiln_with_env(&args, &cache_env);
    assert!(trained.status.success(), "{}", stderr(&trained));
    let log = stderr(&trained);
    assert!(
        log.contains("train.lr auto:") && log.contains("cached"),
        "{log}"
    );
}
