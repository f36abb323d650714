//! The infer suite's sliding-window rows: `kiln infer --sliding-window` against MONAI's
//! `sliding_window_inference` on the same TorchScript 3-D segmenter, volume and settings (a
//! Gaussian blend, fp32 on the CPU), each side after one trial window and timing the model's
//! forward apart; the outputs must agree within 1e-4, or the rows fail. kiln picks the layout by
//! itself (timing both on its trial window) and keeps freed memory for reuse (glibc's malloc
//! thresholds); MONAI runs as a user writes it (the goal rows) and with both of kiln's choices
//! by hand (a row without a goal).

use super::infer::InferOpts;
use super::*;
use kiln_benches::report::SECONDS;
use kiln_benches::run_cli::{kiln_exe, run};
use kiln_benches::{Msg, figure, malloc_like_kiln, peers};
use kiln_benches::{or_skip, python_script};

/// The figures of one side's run: the whole sliding-window run and the time inside the forward.
fn figures(run: &Value, total: &str, forward: &str) -> Result<Value> {
    let (t, f) = (figure(run, total)?, figure(run, forward)?);
    Ok(json!({"total_s": t, "forward_s": f, "outside_s": t - f}))
}

/// The largest difference between two `.npy` outputs of the same shape.
fn max_abs_between(a: &Path, b: &Path) -> Result<f64> {
    let read = |p: &Path| -> Result<(Vec<usize>, Vec<f32>)> {
        let bytes = std::fs::read(p).at(p)?;
        let array = kiln_data::NpyArray::parse(&bytes).at(p)?;
        Ok((array.shape.clone(), array.to_f32()))
    };
    let ((sa, va), (sb, vb)) = (read(a)?, read(b)?);
    if sa != sb {
        return Err(format!("outputs of {sa:?} and {sb:?}"));
    }
    Ok(nan_max(
        va.iter().zip(&vb).map(|(x, y)| f64::from((x - y).abs())),
    ))
}

/// Pushes the rows (or says why they were not run); returns the runs for the details.
pub(super) fn sliding_rows(
    o: &InferOpts,
    out: &mut SuiteOutput,
    work: &Path,
) -> Result<Vec<Value>> {
    let setup = peers::dir().and_then(|p| Ok((p, kiln_exe("infer")?)));
    let Some((peer_dir, kiln)) = or_skip(out, "sliding-window rows", setup) else {
        return Ok(vec![]);
    };
    let (size, roi) = if o.quick { (64, 48) } else { (96, 64) };
    let dir = work.join("sliding");
    std::fs::create_dir_all(&dir).at(&dir)?;
    let python = |args: &[&str]| {
        let mut c = python_script(&o.python, "sliding_monai.py");
        c.args(args);
        peers::put_first_on_path(&mut c, &peer_dir);
        c
    };
    let (dir_text, roi_text) = (dir.display().to_string(), roi.to_string());
    run(python(&["make", &dir_text, "--size", &size.to_string()]))?;
    let kiln_out = dir.join("kiln.npy");
    let monai_out = dir.join("monai.npy");
    let kiln_run = || {
        let _ = std::fs::remove_file(&kiln_out);
        let sets = [
            format!("infer.sliding_window.roi={roi}"),
            "infer.sliding_window.overlap=0.25".to_owned(),
            "infer.sliding_window.mode=gaussian".to_owned(),
            "infer.sliding_window.batch_size=4".to_owned(),
            format!("performance.intra_op_threads={}", o.threads),
        ];
        let extra = [
            "--sliding-window".as_ref(),
            "--output".as_ref(),
            kiln_out.as_os_str(),
        ];
        let (model, volume) = (dir.join("model.pt"), dir.join("volume.npy"));
        kiln_infer(&kiln, (&model, &volume), &extra, &sets)
    };
    // MONAI as a user writes it, and with kiln's choices by hand: the model channels-last-3d,
    // glibc's malloc thresholds as kiln sets them.
    let monai_cmd = |kiln_choices: bool| {
        let mut c = python(&["run", &dir_text, "--roi", &roi_text]);
        c.args(["--threads", &o.threads])
            .arg("--out")
            .arg(&monai_out);
        if kiln_choices {
            c.arg("--channels-last");
            malloc_like_kiln(&mut c);
        }
        c
    };
    let runs = alternating(o.repeats, &[0, 1, 2], |_, side| {
        Ok(Some(match side {
            0 => kiln_run()?,
            _ => run_json(monai_cmd(side == 2))?,
        }))
    })?;
    let max_abs = max_abs_between(&kiln_out, &monai_out)?;
    if max_abs > 1e-4 {
        return Err(format!(
            "kiln's and MONAI's sliding-window outputs differ by {max_abs:e}"
        ));
    }
    let kiln_figures: Vec<Value> = runs[0]
        .iter()
        .map(|r| figures(r, "seconds", "forward_seconds"))
        .collect::<Result<_>>()?;
    let monai = |runs: &[Value]| -> Result<Vec<Value>> {
        runs.iter()
            .map(|r| figures(r, "total_s", "forward_s"))
            .collect()
    };
    let (monai_figures, monai_chosen) = (monai(&runs[1])?, monai(&runs[2])?);
    let what = format!(
        "a 3-D segmenter (TorchScript: conv 1→8→2, 3³ kernels) over a {size}³ volume in {roi}³ \
         windows, overlap 0.25, Gaussian blending, 4 windows a batch, fp32, {} threads",
        o.threads
    );
    let baseline = format!(
        "MONAI {} sliding_window_inference",
        runs[1][0]["monai"].as_str().unwrap_or("?")
    );
    let rows = [
        ("total_s", "whole run", 0.9),
        ("outside_s", "outside the model's forward", 0.5),
    ];
    for (key, part, goal) in rows {
        let name = format!("sliding-window inference, {part}");
        let medians = (
            median_of(&kiln_figures, key),
            median_of(&monai_figures, key),
        );
        let row = out.row("sliding window", name, SECONDS, medians, &baseline);
        let row = row.at_most(goal).detail("setup", json!(what));
        let row = row.detail("kiln_layout", layouts(&runs[0]));
        out.push(row.detail("max_abs_vs_monai", json!(max_abs)));
    }
    let name = "sliding-window inference, whole run, vs MONAI with kiln's layout and malloc";
    let total = |runs: &[Value]| median_of(runs, "total_s");
    let medians = (total(&kiln_figures), total(&monai_chosen));
    let chosen_baseline = format!(
        "{baseline}, the model's weights channels-last-3d by hand, {}",
        kiln_benches::MALLOC_AS_KILN
    );
    let row = out.row("sliding window", name, SECONDS, medians, chosen_baseline);
    out.push(row.detail("setup", json!(what)));
    Ok(vec![json!({"sliding_window": {
        "kiln": kiln_figures, "monai": monai_figures, "monai_kiln_choices": monai_chosen,
        "max_abs": max_abs,
    }})])
}

/// The layout of each of kiln's runs, what it measured to choose it, and the seconds of its
/// trial window and that measurement (before the timed run, as MONAI's trial window is).
fn layouts(runs: &[Value]) -> Value {
    let keys = ["layout", "layout_measured", "trial_seconds"];
    let per_run: Vec<Value> = runs
        .iter()
        .map(|r| keys.iter().map(|&k| (k.to_owned(), r[k].clone())).collect())
        .collect();
    json!(per_run)
}
