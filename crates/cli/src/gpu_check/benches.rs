//! gpu-check steps that run the train and infer benchmark suites (`--quick`) on the device,
//! against PyTorch in this machine's python3, and read their rows back: MFU against the
//! measured bf16 GEMM peak, and kiln's ratio to the baseline per row.

use std::path::Path;
use std::process::Command;

use anyhow::Context;
use serde_json::Value;

use super::{Ctx, Outcome};

pub fn train(ctx: &Ctx) -> anyhow::Result<Outcome> {
    suite(ctx, "train", "train")
}

pub fn infer(ctx: &Ctx) -> anyhow::Result<Outcome> {
    suite(ctx, "serve", "infer")
}

/// Runs `kiln-bench group sub --quick --device cuda --out DIR/sub.json` and summarises its rows.
fn suite(ctx: &Ctx, group: &str, sub: &str) -> anyhow::Result<Outcome> {
    let dir = ctx.bench_dir.as_deref().context("no --bench-dir")?;
    let exe = dir.join("kiln-bench");
    anyhow::ensure!(
        exe.is_file(),
        "{} is missing: build the suites (`cargo xtask gpu-check` does) or pass --bench-dir",
        exe.display()
    );
    let out = ctx.dir.join(format!("{sub}.json"));
    let status = Command::new(&exe)
        .args([group, sub, "--quick", "--device", ctx.device_key(), "--out"])
        .arg(&out)
        .status()
        .with_context(|| format!("cannot run {}", exe.display()))?;
    anyhow::ensure!(
        status.success(),
        "kiln-bench {group} {sub} ended with {status} (see the step's log)"
    );
    summarise(&out)
}

/// Each row's ratio (and MFU where the row has one) from a suite's JSON.
fn summarise(path: &Path) -> anyhow::Result<Outcome> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let v: Value = serde_json::from_str(&text)?;
    let rows = v["comparisons"]
        .as_array()
        .context("no comparisons in the suite's output")?;
    let mut outcome = Outcome::new(!rows.is_empty(), String::new());
    let mut mfus = vec![];
    for row in rows {
        let name = row["name"].as_str().unwrap_or("?");
        let ratio = row["ratio"].as_f64().unwrap_or(f64::NAN);
        outcome = outcome.figure(&format!("{name} (ratio)"), ratio);
        if let Some(mfu) = row["details"]["mfu"].as_f64() {
            mfus.push(mfu);
            outcome = outcome.figure(&format!("{name} (MFU)"), mfu);
        }
    }
    if let Some(peaks) = v["peaks"].as_object() {
        for (k, p) in peaks {
            outcome = outcome.figure(k, p.clone());
        }
    }
    let best = mfus.iter().copied().fold(0.0, f64::max);
    outcome.summary = format!(
        "{} rows{}; full output {}",
        rows.len(),
        if mfus.is_empty() {
            String::new()
        } else {
            format!(", best MFU {:.1}%", best * 100.0)
        },
        path.file_name().unwrap_or_default().to_string_lossy()
    );
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_ratios_mfu_and_peaks_are_read_from_a_suite_output() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("train.json");
        let suite = serde_json::json!({
            "suite": "train",
            "comparisons": [
                {"name": "transformer bf16 b=16", "ratio": 0.9, "details": {"mfu": 0.41}},
                {"name": "mlp fp32 b=64", "ratio": 1.1, "details": {}}
            ],
            "peaks": {"bf16_gemm_gflops": 700000.0}
        });
        std::fs::write(&path, suite.to_string()).unwrap();
        let o = summarise(&path).unwrap();
        assert!(o.pass);
        assert_eq!(o.figures["transformer bf16 b=16 (MFU)"], 0.41);
        assert_eq!(o.figures["mlp fp32 b=64 (ratio)"], 1.1);
        assert_eq!(o.figures["bf16_gemm_gflops"], 700000.0);
        assert!(
            o.summary.starts_with("2 rows, best MFU 41.0%"),
            "{}",
            o.summary
        );
        std::fs::write(&path, r#"{"comparisons": []}"#).unwrap();
        assert!(
            !summarise(&path).unwrap().pass,
            "a suite with no rows fails"
        );
    }
}
