//! The infer suite's sliding-window rows: `kiln infer --sliding-window` against MONAI's
//! `sliding_window_inference` as a user writes it (goal rows) and with kiln's choices (no goal).

use super::infer::InferOpts;
use super::*;
use kiln_benches::report::SECONDS;
use kiln_benches::run_cli::{kiln_exe, run};
use kiln_benches::{figure, malloc_like_kiln, or_skip, peers, python_script};

/// The figures of one side's run: the whole sliding-window run and the time inside the forward.
fn figures(runs: &[Value], total: &str, forward: &str) -> Result<Vec<Value>> {
    let one = |run| -> Result<Value> {
        let (t, f) = (figure(run, total)?, figure(run, forward)?);
        Ok(json!({"total_s": t, "forward_s": f, "outside_s": t - f}))
    };
    runs.iter().map(one).collect()
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
    let diffs = va.iter().zip(&vb);
    Ok(nan_max(diffs.map(|(x, y)| f64::from((x - y).abs()))))
}

/// Pushes the rows (or says why they were not run); returns the runs for the details.
pub(super) fn rows(o: &InferOpts, out: &mut SuiteOutput, work: &Path) -> Result<Vec<Value>> {
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
    let (kiln_out, monai_out) = (dir.join("kiln.npy"), dir.join("monai.npy"));
    // kiln, then MONAI as a user writes it, and with kiln's layout and malloc thresholds by hand.
    let runs = alternating(o.repeats, &[0, 1, 2], |_, side| {
        if side == 0 {
            let _ = std::fs::remove_file(&kiln_out);
            let sets = [
                format!("infer.sliding_window.roi={roi}"),
                "infer.sliding_window.overlap=0.25".to_owned(),
                "infer.sliding_window.mode=gaussian".to_owned(),
                "infer.sliding_window.batch_size=4".to_owned(),
            ];
            let extra = ["--sliding-window", "--output"].map(std::ffi::OsStr::new);
            let extra = [&extra[..], &[kiln_out.as_os_str()]].concat();
            let (model, volume) = (dir.join("model.pt"), dir.join("volume.npy"));
            return kiln_infer(&kiln, (&model, &volume), &extra, &sets, &o.threads).map(Some);
        }
        let mut c = python(&["run", &dir_text, "--roi", &roi_text]);
        c.args(["--threads", &o.threads, "--out"]).arg(&monai_out);
        if side == 2 {
            c.arg("--channels-last");
            malloc_like_kiln(&mut c);
        }
        run_json(c).map(Some)
    })?;
    let max_abs = max_abs_between(&kiln_out, &monai_out)?;
    if max_abs > 1e-4 {
        let what = "kiln's and MONAI's sliding-window outputs";
        return Err(format!("{what} differ by {max_abs:e}"));
    }
    let kiln_figures = figures(&runs[0], "seconds", "forward_seconds")?;
    let monai_figures = figures(&runs[1], "total_s", "forward_s")?;
    let monai_chosen = figures(&runs[2], "total_s", "forward_s")?;
    let what = format!(
        "a 3-D segmenter (TorchScript: conv 1→8→2, 3³ kernels) over a {size}³ volume in {roi}³ \
         windows, overlap 0.25, Gaussian blending, 4 windows a batch, fp32, {} threads",
        o.threads
    );
    let monai = runs[1][0]["monai"].as_str().unwrap_or("?");
    let baseline = format!("MONAI {monai} sliding_window_inference");
    let medians = |key, b: &[Value]| (median_of(&kiln_figures, key), median_of(b, key));
    // Each of kiln's runs' layout, what it measured to choose it and its trial's seconds.
    let keys = ["layout", "layout_measured", "trial_seconds"];
    let layout = |r: &Value| keys.iter().map(|&k| (k.to_owned(), r[k].clone())).collect();
    let layouts = Value::Array(runs[0].iter().map(layout).collect());
    for (key, part, goal) in [
        ("total_s", "whole run", 0.9),
        ("outside_s", "outside the model's forward", 0.5),
    ] {
        let name = format!("sliding-window inference, {part}");
        let figures = medians(key, &monai_figures);
        let row = out.row("sliding window", name, SECONDS, figures, &baseline);
        let row = row.at_most(goal).detail("setup", json!(what));
        let row = row.detail("kiln_layout", layouts.clone());
        out.push(row.detail("max_abs_vs_monai", json!(max_abs)));
    }
    let name = "sliding-window inference, whole run, vs MONAI with kiln's layout and malloc";
    let malloc = kiln_benches::MALLOC_AS_KILN;
    let chosen = format!("{baseline}, the model's weights channels-last-3d by hand, {malloc}");
    let figures = medians("total_s", &monai_chosen);
    let row = out.row("sliding window", name, SECONDS, figures, chosen);
    out.push(row.detail("setup", json!(what)));
    Ok(vec![json!({"sliding_window": {
        "kiln": kiln_figures, "monai": monai_figures, "monai_kiln_choices": monai_chosen,
        "max_abs": max_abs,
    }})])
}
