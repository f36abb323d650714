//! A full disk as a user meets it, on a real tmpfs: each test runs `kiln` inside a private
//! mount namespace (`unshare -rm`, which needs no privileges beyond unprivileged user
//! namespaces, and root in CI's container has them) where a small tmpfs is mounted, so nothing
//! is left mounted if the test dies. A checkpoint that does not fit ends `kiln train` with an
//! error naming the checkpoint and the bytes needed and free, its earlier checkpoint intact and
//! resumable once there is room; a dataset that does not fit is refused naming its directory,
//! and nothing half-written is left by either.

use std::path::{Path, PathBuf};
use std::process::Command;

use kiln_data::DType;

/// Runs `script` with `sh` in a new user and mount namespace, after mounting a tmpfs of `size`
/// (a `mount -o size=` value) at `$DISK`; `$KILN` is the kiln binary, `$OUT` a directory
/// outside the tmpfs for what the test reads afterwards, and `args` the script's `$@`.
/// Panics (failing the test) if the namespace or the mount cannot be made.
fn in_small_tmpfs(tmp: &Path, size: &str, script: &str, args: &[String]) -> PathBuf {
    let (disk, out) = (tmp.join("disk"), tmp.join("out"));
    std::fs::create_dir_all(&disk).unwrap();
    std::fs::create_dir_all(&out).unwrap();
    let mounted = format!(
        "mount -t tmpfs -o size={size} kiln-test \"$DISK\" || {{ echo 'cannot mount a tmpfs' \
         >&2; exit 90; }}\n{script}"
    );
    let o = Command::new("unshare")
        .args(["-rm", "sh", "-c", &mounted, "sh"])
        .args(args)
        .env("KILN", env!("CARGO_BIN_EXE_kiln"))
        .env("DISK", &disk)
        .env("OUT", &out)
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("RUST_LOG")
        .env_remove("KILN_DEVICE__REQUEST")
        .output()
        .expect("unshare runs (util-linux)");
    assert!(
        o.status.success(),
        "the tmpfs script failed ({}): {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        std::fs::read_dir(&disk).unwrap().next().is_none(),
        "the tmpfs was left mounted, or written through: {}",
        disk.display()
    );
    out
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// The numbers of bytes an error message gives, in order ("(958464 bytes)").
fn byte_counts(message: &str) -> Vec<u64> {
    message
        .split(" bytes")
        .filter_map(|before| before.rsplit(['(', ' ']).next()?.parse().ok())
        .collect()
}

/// Every file under `dir` with its contents, by relative path.
fn contents(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = vec![];
    for name in names(dir) {
        let path = dir.join(&name);
        if path.is_dir() {
            out.extend(
                contents(&path)
                    .into_iter()
                    .map(|(p, b)| (Path::new(&name).join(p), b)),
            );
        } else {
            out.push((PathBuf::from(name), std::fs::read(&path).unwrap()));
        }
    }
    out
}

/// An MLP whose checkpoint (weights and AdamW's two moments, 76,810 parameters) takes about
/// 0.9 MiB: one fits in 1.5 MiB with the run's other files, two do not. Three steps, a
/// checkpoint after the second and one at the epoch's end.
const TRAIN: &[&str] = &[
    "train",
    "--model",
    "mlp",
    "--epochs",
    "1",
    "--precision",
    "fp32",
    "--workers",
    "1",
    "--batch-size",
    "16",
    "--set",
    "model.hidden=1024",
    "--set",
    "data.synthetic_samples=64",
    "--set",
    "checkpoint.every_steps=2",
];

/// The first run fills the tmpfs with its step-2 checkpoint and fails to write the step-3 one;
/// the tmpfs is then grown (as a user frees space) and the run resumed from step 2.
const FULL_THEN_RESUMED: &str = r#"
"$KILN" "$@" > "$OUT/first.log" 2>&1; echo $? > "$OUT/first.rc"
cp -a "$DISK/runs" "$OUT/after-failure"
mount -o remount,size=16m "$DISK" || exit 91
"$KILN" "$@" --resume > "$OUT/resume.log" 2>&1; echo $? > "$OUT/resume.rc"
cp -a "$DISK/runs" "$OUT/after-resume"
"#;

#[test]
fn a_checkpoint_that_does_not_fit_ends_the_run_clearly_and_the_last_one_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let mut args: Vec<String> = TRAIN.iter().map(|s| (*s).to_owned()).collect();
    let runs = tmp.path().join("disk/runs");
    args.extend([
        "--set".to_owned(),
        format!("run.output_dir={}", runs.display()),
    ]);
    let out = in_small_tmpfs(tmp.path(), "1536k", FULL_THEN_RESUMED, &args);

    let log = read(&out.join("first.log"));
    assert_ne!(read(&out.join("first.rc")).trim(), "0", "{log}");
    let run = names(&out.join("after-failure")).pop().unwrap();
    let ckpts = runs.join(&run).join("checkpoints");
    let error = log.lines().find(|l| l.starts_with("error:")).unwrap_or("");
    let step3 = ckpts.join("step-000000003");
    assert!(
        error.contains(&format!(
            "{}: not enough free space for the checkpoint",
            step3.display()
        )),
        "{log}"
    );
    assert!(error.contains("--resume"), "{error}");
    let [needed, available] = byte_counts(error)[..] else {
        panic!("two byte counts in: {error}");
    };
    assert!(
        (900_000..1_100_000).contains(&needed) && available < needed,
        "{error}"
    );

    // The step-2 checkpoint alone, whole; no temporary directory left.
    let failed = out.join("after-failure").join(&run).join("checkpoints");
    assert_eq!(names(&failed), ["step-000000002"], "{log}");
    assert_eq!(
        names(&failed.join("step-000000002")),
        ["checkpoint.json", "model.safetensors", "state.safetensors"]
    );

    let resumed = read(&out.join("resume.log"));
    assert_eq!(read(&out.join("resume.rc")).trim(), "0", "{resumed}");
    let from = format!(
        "resumed from {} at step 2",
        ckpts.join("step-000000002").display()
    );
    assert!(resumed.contains(&from), "{resumed}");
    let done = out.join("after-resume").join(&run).join("checkpoints");
    assert_eq!(names(&done), ["step-000000002", "step-000000003"]);
}

/// `n` samples of `width` f32 features and their labels as `.npy` files in `dir`.
fn npy_dataset(dir: &Path, n: usize, width: usize) -> (PathBuf, PathBuf) {
    let (features, labels) = (dir.join("features.npy"), dir.join("labels.npy"));
    let values: Vec<u8> = (0..n * width)
        .flat_map(|i| (i as f32).to_le_bytes())
        .collect();
    kiln_data::write_npy(&features, DType::F32, &[n, width], &values).unwrap();
    let classes: Vec<u8> = (0..n).flat_map(|i| (i as i64 % 3).to_le_bytes()).collect();
    kiln_data::write_npy(&labels, DType::I64, &[n], &classes).unwrap();
    (features, labels)
}

/// A small dataset is prepared on the tmpfs first; then one of 2 MiB, which does not fit.
const PREPARE_TWO: &str = r#"
"$KILN" data prepare --csv "$1" --label-column label --out "$DISK/small" > "$OUT/small.log" 2>&1 \
    || { cat "$OUT/small.log" >&2; exit 92; }
cp -a "$DISK/small" "$OUT/small-before"
"$KILN" data prepare --features "$2" --labels "$3" --out "$DISK/big" > "$OUT/big.log" 2>&1
echo $? > "$OUT/big.rc"
ls -A "$DISK" > "$OUT/listing"
cp -a "$DISK/small" "$OUT/small-after"
"#;

#[test]
fn a_dataset_that_does_not_fit_is_refused_and_nothing_else_is_touched() {
    let tmp = tempfile::tempdir().unwrap();
    let csv = tmp.path().join("small.csv");
    std::fs::write(&csv, "x,y,label\n1,2,0\n3,4,1\n5,6,0\n").unwrap();
    let (features, labels) = npy_dataset(tmp.path(), 2048, 256);
    let args = [csv, features, labels].map(|p| p.display().to_string());
    let out = in_small_tmpfs(tmp.path(), "1m", PREPARE_TWO, &args);

    let log = read(&out.join("big.log"));
    assert_ne!(read(&out.join("big.rc")).trim(), "0", "{log}");
    let big = tmp.path().join("disk/big");
    assert!(
        log.contains(&format!(
            "{}: not enough free space for the dataset",
            big.display()
        )),
        "{log}"
    );
    let [needed, available] = byte_counts(&log)[..] else {
        panic!("two byte counts in: {log}");
    };
    // 2 MiB of features and 16 KiB of labels, in whole blocks.
    let data = 2048 * (256 * 4 + 8);
    assert!((data..data + 64 * 1024).contains(&needed), "{log}");
    assert!(available < 1024 * 1024, "{log}");
    // Nothing of the new dataset (no staging directory), the small one as it was.
    assert_eq!(read(&out.join("listing")).trim(), "small", "{log}");
    assert_eq!(
        contents(&out.join("small-after")),
        contents(&out.join("small-before"))
    );
}
