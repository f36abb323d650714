//! `train.lr = "auto"`: a learning-rate range test (Leslie Smith's, as Lightning's `lr_find`
//! runs it) on the run's model and data, after the batch size is known.
//!
//! The rate rises exponentially from `min_lr` (1e-8) to `max_lr` (1) over `steps` (100) real
//! optimizer steps with every setting of the plan (optimizer, weight decay, momentum,
//! clipping, precision, accumulation), one batch each. The loss is smoothed exponentially
//! (`beta` 0.98, debiased) and the sweep stops early once the smoothed loss passes 4× the best
//! seen (divergence). The answer is the rate at the steepest descent of the smoothed loss
//! (the most negative gradient over the step index, as `np.gradient` computes it), the first
//! 10 and the last point left out; where too few points remain, none is found and the plan's
//! rate (kiln's default) stays.
//!
//! The test trains its own model, built from the run's recipe with the run's seed (the same
//! initial weights the run starts from), so the run's weights and optimizer state are never
//! touched; the CPU (and CUDA) generators are put back afterwards, so the run draws what it
//! would have drawn without the test. The answer is cached per (model, data, batch size,
//! precision, optimizer and its settings, hardware) in `lr-find.json` under kiln's cache
//! directory; the curve is written into the run directory as `lr_find.json` and `lr_find.png`.

use std::path::Path;
use std::sync::Arc;

use kiln_config::RunPlan;
use kiln_config::keys;
use kiln_data::{Dataset, Loader, SamplerConfig};
use kiln_device::measured::{MeasuredCache, hardware_key};
use plotters::prelude::*;
use serde::{Deserialize, Serialize};
use tch::nn;

use crate::TrainError;
use crate::feed::{DeviceFeeder, loader_config};
use crate::model::{InputSpec, ModelRecipe};
use crate::plot::{FONT, PLOT_HEIGHT, PLOT_WIDTH, encode_png, register_fonts, tick_label, usable};
use crate::trainer::{TrainSettings, Trainer};

/// The sweep: Lightning's `lr_find` defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RangeTest {
    pub min_lr: f64,
    pub max_lr: f64,
    /// Steps, one batch each; the rate of step `i` is `min_lr · (max_lr/min_lr)^(i/(steps-1))`.
    pub steps: usize,
    /// Smoothing of the loss: `avg = beta·avg + (1-beta)·loss`, divided by `1 - beta^(i+1)`.
    pub beta: f64,
    /// Stop once the smoothed loss exceeds this many times the best so far.
    pub diverge: f64,
    /// Points left out of the suggestion at the start and at the end.
    pub skip_start: usize,
    pub skip_end: usize,
}

impl Default for RangeTest {
    fn default() -> Self {
        Self {
            min_lr: 1e-8,
            max_lr: 1.0,
            steps: 100,
            beta: 0.98,
            diverge: 4.0,
            skip_start: 10,
            skip_end: 1,
        }
    }
}

/// The most of a run's optimizer steps the range test of `train.lr = "auto"` may take, in
/// percent: the test's steps cost about what the run's do.
pub const MAX_SHARE_PERCENT: u64 = 10;
/// The shortest sweep worth running: 30 steps, 19 of them judged (the first 10 and the last
/// are left out).
pub const MIN_STEPS: usize = 30;

impl RangeTest {
    /// The test for a run of `planned` optimizer steps: Lightning's 100 steps, or fewer where
    /// 100 would be more than [`MAX_SHARE_PERCENT`] of the run, the smoothing scaled with the
    /// sweep (`beta = 1 - 2/steps`, Lightning's 0.98 at 100); `None` where even [`MIN_STEPS`]
    /// would be more.
    pub fn for_run(planned: u64) -> Option<Self> {
        let full = Self::default();
        let allowed =
            usize::try_from(planned.saturating_mul(MAX_SHARE_PERCENT) / 100).unwrap_or(usize::MAX);
        let steps = full.steps.min(allowed);
        (steps >= MIN_STEPS).then(|| Self {
            steps,
            beta: full.beta.min(1.0 - 2.0 / steps as f64),
            ..full
        })
    }

    /// How many steps apart the slope of the descent is measured: half a decade of rates (6
    /// steps of the 100-step sweep, 3 of a 46-step one), at least 1.
    pub fn slope_span(&self) -> usize {
        let decades = (self.max_lr / self.min_lr).log10().max(f64::MIN_POSITIVE);
        let per_decade = self.steps.saturating_sub(1) as f64 / decades;
        ((per_decade / 2.0).round() as usize).max(1)
    }

    /// The rate of step `i`.
    pub fn lr_at(&self, i: usize) -> f64 {
        let last = self.steps.saturating_sub(1).max(1) as f64;
        self.min_lr * (self.max_lr / self.min_lr).powf(i as f64 / last)
    }
}

/// What a range test saw: the rate of every step, the loss it measured there (before that
/// step's update) and the smoothed loss; the index of the suggestion, if one was found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LrCurve {
    pub lrs: Vec<f64>,
    pub losses: Vec<f64>,
    pub smoothed: Vec<f64>,
    /// Whether the sweep ended early because the loss diverged.
    pub diverged: bool,
    pub suggestion: Option<usize>,
}

impl LrCurve {
    /// The suggested rate.
    pub fn suggested_lr(&self) -> Option<f64> {
        self.suggestion.and_then(|i| self.lrs.get(i).copied())
    }
}

/// A sweep in progress: ask [`Sweep::next_lr`] for a step's rate, train the step, and
/// [`Sweep::record`] its loss; [`Sweep::finish`] gives the curve.
#[derive(Debug, Clone)]
pub struct Sweep {
    test: RangeTest,
    curve: LrCurve,
    avg: f64,
    best: f64,
}

impl Sweep {
    pub fn new(test: RangeTest) -> Self {
        Self {
            test,
            curve: LrCurve {
                lrs: Vec::new(),
                losses: Vec::new(),
                smoothed: Vec::new(),
                diverged: false,
                suggestion: None,
            },
            avg: 0.0,
            best: f64::INFINITY,
        }
    }

    /// The next step's rate; `None` once the sweep is over (every step taken, or diverged).
    pub fn next_lr(&self) -> Option<f64> {
        let i = self.curve.lrs.len();
        (i < self.test.steps && !self.curve.diverged).then(|| self.test.lr_at(i))
    }

    /// Records the loss of the step [`Sweep::next_lr`] gave the rate of. A non-finite loss
    /// ends the sweep as divergence does.
    pub fn record(&mut self, loss: f64) {
        let Some(lr) = self.next_lr() else {
            return;
        };
        let i = self.curve.lrs.len();
        let beta = self.test.beta;
        self.avg = beta * self.avg + (1.0 - beta) * loss;
        let smooth = self.avg / (1.0 - beta.powi(i32::try_from(i + 1).unwrap_or(i32::MAX)));
        self.curve.lrs.push(lr);
        self.curve.losses.push(loss);
        self.curve.smoothed.push(smooth);
        if !smooth.is_finite() || (i > 0 && smooth > self.test.diverge * self.best) {
            self.curve.diverged = true;
        }
        self.best = self.best.min(smooth);
    }

    /// The curve, with its suggestion.
    pub fn finish(mut self) -> LrCurve {
        let t = &self.test;
        let skips = (t.skip_start, t.skip_end);
        self.curve.suggestion = suggest(&self.curve.smoothed, skips, t.slope_span());
        self.curve
    }
}

/// Runs the sweep of `test`: `step(lr)` trains one step at `lr` and returns its loss.
pub fn sweep(
    test: &RangeTest,
    mut step: impl FnMut(f64) -> Result<f64, TrainError>,
) -> Result<LrCurve, TrainError> {
    let mut sweep = Sweep::new(*test);
    while let Some(lr) = sweep.next_lr() {
        sweep.record(step(lr)?);
    }
    Ok(sweep.finish())
}

/// How far below its value at the steepest descent the smoothed loss must fall afterwards, as
/// a share of that value, for the descent to count. A model that learns nothing within the
/// test has a flat curve whose steepest point is noise (a 4-layer transformer on 100 classes
/// wandered within 0.5 % of ln 100 for the whole sweep, and its "steepest descent" sat at the
/// first point allowed, 6e-8, where training then learned nothing).
pub const MIN_DROP: f64 = 0.02;

/// The index of the steepest descent of `smoothed` on the way down to its lowest point: the
/// middle of the `span` steps over which it falls the most, among those that end at the lowest
/// point or before it. Left out: the first and last points of `skips`, non-finite points, and
/// everything after the lowest point (a fall there is the loss coming back from a spike past
/// the useful rates, not learning). `None` where fewer than two points remain, or where the
/// loss falls less than [`MIN_DROP`] from there to its lowest point (no descent, only noise).
///
/// The slope is measured over half a decade of rates rather than between neighbours because
/// 100 steps of small batches are noisy: on an MLP regression at batch 32, neighbour
/// differences found their "steepest descent" in the noise of the flat start (6e-8, where
/// training learns nothing; Lightning's `lr_find` suggested 1e-7 on the same job) or in the
/// recovery after a spike, while the real descent sat at 2e-3.
pub fn suggest(
    smoothed: &[f64],
    (skip_start, skip_end): (usize, usize),
    span: usize,
) -> Option<usize> {
    let end = smoothed.len().checked_sub(skip_end)?;
    let mut kept: Vec<(usize, f64)> = (skip_start..end)
        .map(|i| (i, smoothed[i]))
        .filter(|(_, v)| v.is_finite())
        .collect();
    let bottom = (0..kept.len()).min_by(|&a, &b| kept[a].1.total_cmp(&kept[b].1))?;
    kept.truncate(bottom + 1);
    let span = span.clamp(1, kept.len().checked_sub(1).filter(|&n| n > 0)?);
    let fall = |a: usize| kept[a + span].1 - kept[a].1;
    let start = (0..kept.len() - span).min_by(|&a, &b| fall(a).total_cmp(&fall(b)))?;
    let (at, value) = kept[start + span / 2];
    let lowest = kept[bottom].1;
    (lowest < value - MIN_DROP * value.abs()).then_some(at)
}

/// Runs the range test for `plan` (its batch size already known) on `data`: a model built by
/// `recipe` with the run's seed, trained one batch per step by a trainer with the plan's
/// settings. The CPU and CUDA generators are put back afterwards.
pub fn run_range_test<D: Dataset>(
    plan: &RunPlan,
    recipe: &ModelRecipe<'_>,
    input: &InputSpec,
    data: Arc<D>,
    device: tch::Device,
    test: &RangeTest,
) -> Result<LrCurve, TrainError> {
    let generator = kiln_torch_ext::rng::cpu_generator_lock();
    let cpu_rng = kiln_torch_ext::rng::cpu_rng_state()?;
    let cuda_rng = match device {
        tch::Device::Cuda(i) => Some((i, kiln_torch_ext::rng::cuda_rng_state(i)?)),
        _ => None,
    };
    let curve = range_test(plan, recipe, input, data, device, test);
    kiln_torch_ext::rng::set_cpu_rng_state(&cpu_rng)?;
    if let Some((i, state)) = cuda_rng {
        kiln_torch_ext::rng::set_cuda_rng_state(i, &state)?;
    }
    drop(generator);
    curve
}

fn range_test<D: Dataset>(
    plan: &RunPlan,
    recipe: &ModelRecipe<'_>,
    input: &InputSpec,
    data: Arc<D>,
    device: tch::Device,
    test: &RangeTest,
) -> Result<LrCurve, TrainError> {
    let seed = plan.performance.backend.seed;
    tch::manual_seed(i64::from_ne_bytes(seed.to_ne_bytes()));
    let mut vs = nn::VarStore::new(if recipe.init_on_cpu {
        tch::Device::Cpu
    } else {
        device
    });
    let model = (recipe.build)(&vs, input)?;
    model.check_inputs(&data.inputs())?;
    if vs.device() != device {
        vs.set_device(device);
    }
    let settings = TrainSettings::from_plan(&plan.train, plan.performance.empty_cache_interval);
    let mut trainer = Trainer::new(model.as_ref(), "lr-find", &vs, settings, device)?;
    trainer.set_target(&data.target())?;
    let sampler = SamplerConfig {
        shuffle: true,
        seed,
        ..SamplerConfig::default()
    };
    let mut config = loader_config(plan, sampler, true)?;
    config.by_name = model.reads_by_name();
    let mut loader = Loader::new(Arc::clone(&data), config)?;
    let accum = usize::try_from(plan.train.grad_accum_steps.max(1)).unwrap_or(1);
    let mut sweep = Sweep::new(*test);
    let mut pending = Vec::with_capacity(accum);
    // One epoch may hold fewer batches than the test has steps: the next epoch follows.
    let mut epoch = 0u64;
    while sweep.next_lr().is_some() {
        let mut any = false;
        for batch in DeviceFeeder::new(loader.epoch(epoch), device) {
            any = true;
            pending.push(batch?);
            if pending.len() < accum {
                continue;
            }
            let Some(lr) = sweep.next_lr() else {
                break;
            };
            let outcome = trainer.train_step(&pending, lr)?;
            pending.clear();
            let sum = outcome.sums.values.f_double_value(&[0])?;
            sweep.record(sum / outcome.samples.max(1) as f64);
        }
        if !any {
            return Err(TrainError::InvalidPlan {
                key: keys::train::lr,
                value: "\"auto\"".to_owned(),
                expected: "training data for its range test (the training set holds no full \
                           batch)"
                    .to_owned(),
            });
        }
        epoch += 1;
    }
    Ok(sweep.finish())
}

/// One cached answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CachedLr {
    pub lr: f64,
    /// Unix seconds when it was measured.
    pub measured_at: u64,
}

/// Answers by key ([`cache_key`]), in `<dir>/lr-find.json`.
pub type LrCache = MeasuredCache<CachedLr>;

/// Opens the learning-rate cache in `dir`.
pub fn open_lr_cache(dir: &Path) -> LrCache {
    MeasuredCache::open_file(dir, "lr-find.json", "learning-rate cache")
}

/// The version of how a curve is read ([`suggest`]), in the cache key: an answer read by an
/// older rule is measured again (2: the descent is looked for only before the lowest point).
pub const RULE: u32 = 2;

/// The cache key: everything the answer depends on (the model, the data, the batch size, the
/// precision, the optimizer and its settings, the hardware, the seed, the rule).
pub fn cache_key(
    plan: &RunPlan,
    identity: &str,
    input: &InputSpec,
    samples: usize,
    hardware: &str,
) -> String {
    let t = &plan.train;
    format!(
        "{identity} on {samples}×{:?}×{} | {hardware} | {} | batch {} accum {} | {} weight_decay {} \
         momentum {} clip {} | seed {} | kiln {} rule {RULE}",
        input.sample_shape,
        input.classes,
        t.amp,
        t.batch_size,
        t.grad_accum_steps,
        t.optimizer,
        t.weight_decay,
        t.momentum,
        t.clip_grad_norm,
        plan.performance.backend.seed,
        env!("CARGO_PKG_VERSION"),
    )
}

/// The optimizer steps a run of `plan` over `samples` training samples will take, as the
/// trainer's schedule counts them: full batches per epoch (the last partial one is dropped),
/// by `grad_accum_steps`, times the epochs, capped by `train.max_steps`.
pub fn planned_steps(plan: &RunPlan, samples: usize) -> u64 {
    let t = &plan.train;
    let batches = samples as u64 / t.batch_size.max(1);
    crate::schedule::total_steps(batches, t.grad_accum_steps, t.epochs, t.max_steps)
}

/// The cache key for `plan` on `device` (the hardware read from it).
pub fn key_for<D: Dataset>(
    plan: &RunPlan,
    recipe: &ModelRecipe<'_>,
    input: &InputSpec,
    data: &D,
    device: tch::Device,
) -> Result<String, TrainError> {
    Ok(cache_key(
        plan,
        &recipe.identity,
        input,
        data.len(),
        &hardware_key(device)?,
    ))
}

/// What `train.lr = "auto"` resolved to: the rate, a line saying how, and the curve when a
/// test ran (a cached answer has none).
#[derive(Debug, Clone, PartialEq)]
pub struct LrFound {
    pub lr: f64,
    pub note: String,
    pub curve: Option<LrCurve>,
}

/// The learning rate for `plan` with `train.lr = "auto"`: the cached answer for this model,
/// data, batch size, settings and hardware, or a range test (cached afterwards). Where the
/// test finds no steepest descent, the plan's rate stays and the note says so.
pub fn resolve_auto<D: Dataset>(
    plan: &RunPlan,
    recipe: &ModelRecipe<'_>,
    input: &InputSpec,
    data: Arc<D>,
    device: tch::Device,
    cache: Option<&Path>,
) -> Result<LrFound, TrainError> {
    let planned = planned_steps(plan, data.len());
    let test = RangeTest::for_run(planned);
    let keys = run_keys(
        key_for(plan, recipe, input, data.as_ref(), device)?,
        test.as_ref(),
    );
    let mut store = cache.map(open_lr_cache);
    let hit = store.as_ref().and_then(|c| lookup(c, &keys));
    if let (Some(hit), Some(c)) = (hit, store.as_ref()) {
        return Ok(LrFound {
            lr: hit.lr,
            note: format!(
                "auto: {:.3e} (found by a range test, cached in {}; delete the entry to test again)",
                hit.lr,
                c.path().display()
            ),
            curve: None,
        });
    }
    let Some(test) = test else {
        return Ok(LrFound {
            lr: plan.train.lr,
            note: format!(
                "auto: the run's {planned} optimizer steps are too few for a range test (one of \
                 {MIN_STEPS} steps would be more than {MAX_SHARE_PERCENT}% of them); keeping {} \
                 (`kiln lr-find` runs a full test, and runs then take its answer)",
                plan.train.lr
            ),
            curve: None,
        });
    };
    let key = keys.last().map_or("", String::as_str);
    let store = store.as_mut().map(|c| (c, key));
    measure(plan, (recipe, input, data), device, &test, store)
}

/// The keys a run looks its rate up under, given the full test's key and the test the run
/// would take: the full test's first (`kiln lr-find`'s answer is the better one), then, for a
/// shorter sweep, the key it stores its own answer under.
pub fn run_keys(full: String, test: Option<&RangeTest>) -> Vec<String> {
    let short = test
        .filter(|t| t.steps != RangeTest::default().steps)
        .map(|t| format!("{full} | sweep {} steps", t.steps));
    std::iter::once(full).chain(short).collect()
}

/// The first answer `cache` holds under `keys`.
pub fn lookup<'a>(cache: &'a LrCache, keys: &[String]) -> Option<&'a CachedLr> {
    keys.iter().find_map(|k| cache.get(k))
}

/// Runs `test` for `plan` whatever the cache holds, and records its answer in the cache under
/// the key (from [`key_for`]) where one is given (`kiln lr-find`).
pub fn measure<D: Dataset>(
    plan: &RunPlan,
    (recipe, input, data): (&ModelRecipe<'_>, &InputSpec, Arc<D>),
    device: tch::Device,
    test: &RangeTest,
    store: Option<(&mut LrCache, &str)>,
) -> Result<LrFound, TrainError> {
    let curve = run_range_test(plan, recipe, input, data, device, test)?;
    let steps = curve.lrs.len();
    let Some(lr) = curve.suggested_lr() else {
        return Ok(LrFound {
            lr: plan.train.lr,
            note: format!(
                "auto: no steepest descent in a range test of {steps} steps{}; keeping {}",
                if curve.diverged {
                    " (the loss diverged early)"
                } else {
                    ""
                },
                plan.train.lr
            ),
            curve: Some(curve),
        });
    };
    let mut note = format!(
        "auto: {lr:.3e} (a range test of {steps} steps from {:.0e} to {:.0e}{}, the steepest \
         descent of the smoothed loss)",
        test.min_lr,
        test.max_lr,
        if curve.diverged {
            ", stopped where the loss diverged"
        } else {
            ""
        }
    );
    if let Some((c, key)) = store {
        let measured_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        c.store(key, CachedLr { lr, measured_at })?;
        note.push_str(&format!("; cached in {}", c.path().display()));
    }
    Ok(LrFound {
        lr,
        note,
        curve: Some(curve),
    })
}

/// Writes `curve` into `dir` as `lr_find.json` (the raw curve and the suggestion) and
/// `lr_find.png` (the smoothed loss against the rate, log scale, the suggestion marked).
pub fn write_curve(dir: &Path, curve: &LrCurve) -> Result<(), TrainError> {
    let json = dir.join("lr_find.json");
    let text = serde_json::to_string_pretty(&serde_json::json!({
        "lr": curve.lrs,
        "loss": curve.losses,
        "smoothed_loss": curve.smoothed,
        "diverged": curve.diverged,
        "suggestion": curve.suggested_lr(),
    }))
    .map_err(|e| TrainError::File {
        path: json.clone(),
        message: e.to_string(),
    })?;
    std::fs::write(&json, text).map_err(|e| TrainError::File {
        path: json.clone(),
        message: e.to_string(),
    })?;
    let png = dir.join("lr_find.png");
    let fail = |message: String| TrainError::File {
        path: png.clone(),
        message,
    };
    if !register_fonts() {
        return Err(fail("the embedded font could not be loaded".to_owned()));
    }
    let mut rgb = vec![255u8; PLOT_WIDTH as usize * PLOT_HEIGHT as usize * 3];
    draw(&mut rgb, curve).map_err(&fail)?;
    let bytes = encode_png(&rgb, PLOT_WIDTH, PLOT_HEIGHT).map_err(|e| fail(e.to_string()))?;
    std::fs::write(&png, bytes).map_err(|e| fail(e.to_string()))
}

/// Draws the smoothed loss against log10 of the rate, the suggestion as a red point.
fn draw(rgb: &mut [u8], curve: &LrCurve) -> Result<(), String> {
    let points: Vec<(f64, f64)> = curve
        .lrs
        .iter()
        .zip(&curve.smoothed)
        .map(|(lr, l)| (lr.log10(), *l))
        .filter(|&(x, y)| usable(x) && usable(y))
        .collect();
    let root = BitMapBackend::with_buffer(rgb, (PLOT_WIDTH, PLOT_HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let lo_hi = |f: fn(&(f64, f64)) -> f64| {
        points
            .iter()
            .map(f)
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(v), hi.max(v))
            })
    };
    let (x_lo, x_hi) = lo_hi(|p| p.0);
    let (y_lo, y_hi) = lo_hi(|p| p.1);
    let (x_lo, x_hi) = if x_lo < x_hi {
        (x_lo, x_hi)
    } else {
        (-8.0, 0.0)
    };
    let (y_lo, y_hi) = if y_lo < y_hi {
        let pad = (y_hi - y_lo) * 0.05;
        (y_lo - pad, y_hi + pad)
    } else if y_lo.is_finite() {
        (y_lo - 1.0, y_lo + 1.0)
    } else {
        (0.0, 1.0)
    };
    let title = match curve.suggested_lr() {
        Some(lr) => format!("learning-rate range test: suggestion {lr:.3e}"),
        None => "learning-rate range test: no suggestion".to_owned(),
    };
    let err = |e: DrawingAreaErrorKind<_>| e.to_string();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 22))
        .margin(16)
        .margin_right(32)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x_lo..x_hi, y_lo..y_hi)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("learning rate (log10)")
        .y_desc("smoothed loss")
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 15))
        .light_line_style(RGBColor(235, 235, 235))
        .bold_line_style(RGBColor(210, 210, 210))
        .x_label_formatter(&|v| tick_label(*v, x_hi - x_lo))
        .y_label_formatter(&|v| tick_label(*v, y_hi - y_lo))
        .draw()
        .map_err(err)?;
    chart
        .draw_series(LineSeries::new(
            points.iter().copied(),
            RGBColor(31, 119, 180).stroke_width(2),
        ))
        .map_err(err)?;
    if let Some(i) = curve.suggestion
        && let (Some(lr), Some(l)) = (curve.lrs.get(i), curve.smoothed.get(i))
        && usable(lr.log10())
        && usable(*l)
    {
        chart
            .draw_series(std::iter::once(Circle::new(
                (lr.log10(), *l),
                6,
                RGBColor(214, 39, 40).filled(),
            )))
            .map_err(err)?;
    }
    root.present().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_takes_a_full_test_a_shorter_one_or_none_by_its_length() {
        let full = RangeTest::default();
        assert_eq!(RangeTest::for_run(5_000), Some(full));
        assert_eq!(RangeTest::for_run(1_000), Some(full));
        let short = RangeTest::for_run(460).unwrap();
        assert_eq!(short.steps, 46);
        assert!((short.beta - (1.0 - 2.0 / 46.0)).abs() < 1e-12);
        assert_eq!((short.min_lr, short.max_lr), (full.min_lr, full.max_lr));
        assert_eq!(RangeTest::for_run(300).map(|t| t.steps), Some(MIN_STEPS));
        assert_eq!(RangeTest::for_run(299), None);
        assert_eq!(RangeTest::for_run(0), None);
    }

    #[test]
    fn a_shorter_sweep_is_cached_under_a_key_of_its_own_after_the_full_one() {
        let full = "mlp | batch 8".to_owned();
        let short = RangeTest::for_run(460);
        assert_eq!(
            run_keys(full.clone(), short.as_ref()),
            [full.clone(), format!("{full} | sweep 46 steps")]
        );
        let alone = vec![full.clone()];
        assert_eq!(run_keys(full.clone(), Some(&RangeTest::default())), alone);
        assert_eq!(run_keys(full, None), alone);
    }

    #[test]
    fn the_schedule_runs_from_min_to_max_exponentially() {
        let t = RangeTest::default();
        assert!((t.lr_at(0) - 1e-8).abs() < 1e-20);
        assert!((t.lr_at(99) - 1.0).abs() < 1e-12);
        let ratio = t.lr_at(51) / t.lr_at(50);
        assert!((ratio - t.lr_at(1) / t.lr_at(0)).abs() < 1e-9);
    }

    #[test]
    fn the_suggestion_is_the_steepest_descent_and_divergence_stops_the_sweep() {
        // A loss that falls fastest around 1e-3, then blows up past 1e-1.
        let t = RangeTest::default();
        let curve = sweep(&t, |lr: f64| {
            let x = lr.log10() + 3.0;
            Ok(if lr > 0.1 {
                1e3
            } else {
                1.0 - (x * 2.0).tanh()
            })
        })
        .unwrap();
        assert!(curve.diverged);
        assert!(curve.lrs.len() < 100);
        let lr = curve.suggested_lr().unwrap();
        // The smoothing lags the raw curve: the steepest smoothed descent is a little later.
        assert!((1e-3..1e-2).contains(&lr), "{lr}");
        assert_eq!(suggest(&[1.0; 5], (10, 1), 1), None);
        assert_eq!(suggest(&[3.0, 2.0, 0.0, -0.5], (0, 0), 1), Some(1));
        // Over 2 steps the fall from 3 to 0 is the largest: its middle.
        assert_eq!(suggest(&[3.0, 2.0, 0.0, -0.5], (0, 0), 2), Some(1));
        assert_eq!(t.slope_span(), 6);
        assert_eq!(RangeTest::for_run(460).unwrap().slope_span(), 3);
    }

    /// A curve that falls gently to its lowest point, then spikes and comes back down steeply
    /// (as a noisy regression's did at rates past 0.1): the suggestion is on the way down to
    /// the lowest point, never in the recovery after it.
    #[test]
    fn a_fall_after_the_lowest_point_is_not_the_descent() {
        let mut smoothed = vec![1.0; 10];
        smoothed.extend((1..=10).map(|i| 1.0 - 0.02 * f64::from(i))); // down to 0.8 at 19
        smoothed.extend([3.0, 2.0, 1.2, 1.1]); // the spike and its recovery
        let at = suggest(&smoothed, (0, 0), 1).expect("a descent to 0.8");
        // (Over one step, a fall is marked at its upper end.)
        assert!((9..=19).contains(&at), "{at}");
        // Without the gentle fall, nothing before the lowest point descends: no suggestion,
        // although the recovery falls steeply.
        let flat: Vec<f64> = [vec![0.9; 20], vec![3.0, 2.0, 1.2, 1.1]].concat();
        assert_eq!(suggest(&flat, (0, 0), 1), None);
    }

    /// A flat start with one dip of noise steeper than any single step of the real descent
    /// later on: measured over half a decade (6 steps of the 100-step sweep), the descent is
    /// the steeper, and the suggestion is in it; between neighbours, the dip would win.
    #[test]
    fn noise_on_the_flat_start_is_not_the_descent() {
        let mut smoothed = vec![1.0; 60];
        smoothed[15] = 0.96;
        smoothed.extend((1..=12).map(|i| 1.0 - 0.01 * f64::from(i))); // down to 0.88 at 71
        smoothed.extend([0.95, 1.2, 2.0]);
        let span = RangeTest::default().slope_span();
        let at = suggest(&smoothed, (10, 1), span).expect("a descent to 0.88");
        assert!((60..=71).contains(&at), "{at}");
        assert_eq!(suggest(&smoothed, (10, 1), 1), Some(14));
    }

    /// A model that learns nothing within the test: the loss wanders around ln 100 (±1 %,
    /// deterministic noise) until it diverges. Its steepest smoothed descent is noise, and the
    /// sweep suggests nothing (the run keeps its rate).
    #[test]
    fn a_flat_curve_has_no_suggestion() {
        let t = RangeTest::default();
        let mut k = 0u32;
        let curve = sweep(&t, |lr: f64| {
            k += 1;
            let noise = 0.046 * ((k as f64) * 2.399).sin();
            Ok(if lr > 1e-2 {
                4.6 * (1.0 + lr * 50.0)
            } else {
                4.6 + noise
            })
        })
        .unwrap();
        assert_eq!(curve.suggestion, None, "{:?}", curve.smoothed);
        // The same noise on a curve that does fall is still read.
        let mut k = 0u32;
        let curve = sweep(&t, |lr: f64| {
            k += 1;
            let noise = 0.046 * ((k as f64) * 2.399).sin();
            Ok(4.6 - 2.0 * (lr.log10() + 4.0).tanh().max(0.0) + noise)
        })
        .unwrap();
        let lr = curve
            .suggested_lr()
            .expect("a falling curve has a suggestion");
        assert!((1e-4..1e-1).contains(&lr), "{lr}");
    }
}
