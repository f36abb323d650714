//! Forecasts (`kiln infer` of a windowed time-series dataset): a trained forecaster over the
//! windows whose horizons follow each series' cutoff (`data.val_steps`; by default the last
//! horizon of every series), in the original units; judged per horizon step by the forecast
//! metrics training reports, and written as a CSV of the group, the time index, the step, the
//! actual value and one column per quantile.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use kiln_data::{Dataset, Loader, LoaderConfig, WindowedDataset};
use kiln_train::feed::DeviceFeeder;
use kiln_train::inputs::Inputs;
use kiln_train::metrics::{ForecastSpec, MetricKind, MetricSet, MetricValues, Tally};
use serde::Serialize;
use tch::{Kind, Tensor};

use crate::{InferError, LoadedModel};

/// Every window's forecast, `[windows, horizon, targets, levels]` (one level for a point
/// forecast), with the actual values `[windows, horizon, targets]`.
#[derive(Debug, Clone)]
pub struct Forecasts {
    /// The dataset's window indices, in order.
    pub windows: Vec<usize>,
    pub horizon: usize,
    pub targets: usize,
    /// The quantile levels of the last dimension; `None` for a point forecast.
    pub levels: Option<Vec<f64>>,
    pub values: Vec<f32>,
    pub actual: Vec<f32>,
    pub report: ForecastReport,
}

/// What a forecast run measured.
#[derive(Debug, Clone, Serialize)]
pub struct ForecastReport {
    pub model: String,
    pub inputs: String,
    pub windows: usize,
    pub horizon: usize,
    pub quantiles: Option<Vec<f64>>,
    pub samples_per_second: f64,
    /// MAE, RMSE (of the median, for quantiles) and the quantile loss, over the horizon and
    /// per step (`mae_h1`, …), in the original units.
    pub metrics: MetricValues,
}

/// The forecasts of `model` for every window of `data`, in batches of `batch_size`; `levels`
/// names the quantiles of the output's last dimension (`model.quantiles`).
pub fn forecast(
    model: &LoadedModel,
    data: &WindowedDataset,
    levels: Option<Vec<f64>>,
    batch_size: usize,
) -> Result<Forecasts, InferError> {
    let _guard = tch::no_grad_guard();
    let m = data.manifest();
    let (horizon, targets) = (m.horizon, m.columns.target.len());
    let spec = Arc::new(ForecastSpec {
        horizon,
        levels: levels.clone(),
    });
    let set = MetricSet::for_task(MetricKind::LossOnly).forecasting(spec)?;
    let mut tally = Tally::new(&set, model.device())?;
    let config = LoaderConfig {
        batch_size: batch_size.max(1),
        by_name: true,
        ..LoaderConfig::default()
    };
    let mut loader = Loader::new(Arc::new(data.clone()), config)?;
    let (mut windows, mut values, mut actual) = (Vec::new(), Vec::new(), Vec::new());
    let zero = Tensor::f_zeros([], (Kind::Float, model.device()))?;
    let started = Instant::now();
    let mut point = levels.is_none();
    for batch in DeviceFeeder::new(loader.epoch(0), model.device()) {
        let batch = batch?;
        let inputs = in_kind(&batch.inputs, model.kind())?;
        let output = model.predict(&inputs, &batch.targets)?;
        check_output(&output, &batch.targets, levels.as_deref(), model)?;
        // A point forecast (shaped like the target) has no levels, whatever model.quantiles says.
        point = output.size() == batch.targets.size();
        let n = batch.indices.len() as u64;
        tally.add(&set.batch_sums(&zero, &output, &batch.targets)?, n)?;
        values.extend(host_f32(&output)?);
        actual.extend(host_f32(&batch.targets)?);
        windows.extend(batch.indices);
    }
    let seconds = started.elapsed().as_secs_f64();
    let levels = levels.filter(|_| !point);
    let report = ForecastReport {
        model: model.description().to_owned(),
        inputs: format!("{} ({} windows)", data_dir(data), data.len()),
        windows: windows.len(),
        horizon,
        quantiles: levels.clone(),
        samples_per_second: windows.len() as f64 / seconds.max(1e-9),
        metrics: without_loss(tally.read()?),
    };
    Ok(Forecasts {
        windows,
        horizon,
        targets,
        levels,
        values,
        actual,
        report,
    })
}

/// An error unless `output` is a forecast of `target`: shaped like it, or like it with a last
/// dimension of the quantile levels.
fn check_output(
    output: &Tensor,
    target: &Tensor,
    levels: Option<&[f64]>,
    model: &LoadedModel,
) -> Result<(), InferError> {
    let (out, tgt) = (output.size(), target.size());
    let mut quantiles = tgt.clone();
    quantiles.push(levels.map_or(0, |l| l.len() as i64));
    if out == tgt || out == quantiles {
        return Ok(());
    }
    if out.is_empty() {
        return Err(InferError::Model {
            model: model.description().to_owned(),
            message: "its output is one value, not a forecast: a program computing its own \
                      loss gives its prediction where model.output names it (1 for a program \
                      returning (loss, prediction))"
                .to_owned(),
        });
    }
    let expected = match levels {
        Some(l) => format!(
            "{tgt:?} (a point forecast) or {quantiles:?} ({} quantiles)",
            l.len()
        ),
        None => format!(
            "{tgt:?}, a point forecast of the horizon (for quantiles in a last dimension, set \
             model.quantiles to their levels, e.g. \"0.1,0.5,0.9\")"
        ),
    };
    Err(InferError::Model {
        model: model.description().to_owned(),
        message: format!("its output is {out:?}; a forecast of these windows is {expected}"),
    })
}

/// `inputs` with their floating-point arrays in `kind`, the element type a model converted to
/// reduced precision computes in (integer and boolean arrays as they are).
fn in_kind(inputs: &Inputs, kind: Kind) -> Result<Inputs, InferError> {
    let tensors = inputs
        .iter()
        .map(|(name, t)| {
            let t = match t.is_floating_point() && t.kind() != kind {
                true => t.f_to_kind(kind)?,
                false => t.shallow_clone(),
            };
            Ok((name.to_owned(), t))
        })
        .collect::<Result<Vec<_>, InferError>>()?;
    Ok(Inputs::named(tensors))
}

fn host_f32(t: &Tensor) -> Result<Vec<f32>, InferError> {
    let flat = t
        .f_to_kind(Kind::Float)?
        .f_to_device(tch::Device::Cpu)?
        .f_reshape([-1])?;
    Ok(Vec::<f32>::try_from(&flat)?)
}

fn data_dir(data: &WindowedDataset) -> String {
    let m = data.manifest();
    format!(
        "windows of {} series (encoder {} + horizon {} steps)",
        m.series.len(),
        m.encoder_length,
        m.horizon
    )
}

/// The metrics without the (zero) loss a forecast run has no use for.
fn without_loss(values: MetricValues) -> MetricValues {
    let mut out = MetricValues::default();
    for (name, v) in values.iter().filter(|(n, _)| *n != "loss") {
        out.push(name, v);
    }
    out
}

impl Forecasts {
    /// The CSV's header: the group columns, the time column, `step`, then per target its
    /// actual value (its own name) and the forecast (`<target>_q<level>` per quantile, or
    /// `<target>_forecast`).
    fn header(&self, data: &WindowedDataset) -> Vec<String> {
        let c = &data.manifest().columns;
        let mut names: Vec<String> = c.group.clone();
        names.extend([c.time.clone(), "step".to_owned()]);
        for t in &c.target {
            names.push(t.clone());
            match &self.levels {
                Some(levels) => names.extend(levels.iter().map(|q| format!("{t}_q{q}"))),
                None => names.push(format!("{t}_forecast")),
            }
        }
        names
    }

    /// Writes the forecasts as CSV at `path` (which must not exist): a row per window and
    /// horizon step.
    pub fn write_csv(&self, data: &WindowedDataset, path: &Path) -> Result<(), InferError> {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| InferError::file(path, format!("cannot create: {e}")))?;
        let mut out = std::io::BufWriter::new(file);
        let io = |e: std::io::Error| InferError::file(path, format!("cannot write: {e}"));
        let header: Vec<String> = self.header(data).iter().map(|h| csv_field(h)).collect();
        writeln!(out, "{}", header.join(",")).map_err(io)?;
        let m = data.manifest();
        let levels = self.levels.as_ref().map_or(1, Vec::len);
        for (k, &index) in self.windows.iter().enumerate() {
            let missing = || InferError::Input(format!("window {index} is not in the data"));
            let (series, place) = data.window(index).ok_or_else(missing)?;
            let encoder = data.encoder_of(index).ok_or_else(missing)?;
            let s = &m.series[series];
            let t0 = s.first_time + (place + encoder) as i64;
            for step in 0..self.horizon {
                let mut row: Vec<String> = s.key.iter().map(|v| csv_field(v)).collect();
                row.extend([(t0 + step as i64).to_string(), (step + 1).to_string()]);
                for t in 0..self.targets {
                    let at = (k * self.horizon + step) * self.targets + t;
                    row.push(self.actual[at].to_string());
                    let v = &self.values[at * levels..(at + 1) * levels];
                    row.extend(v.iter().map(f32::to_string));
                }
                writeln!(out, "{}", row.join(",")).map_err(io)?;
            }
        }
        out.flush().map_err(io)
    }
}

/// A CSV field: quoted where it holds a comma, a quote or a line break.
fn csv_field(v: &str) -> String {
    if v.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", v.replace('"', "\"\""))
    } else {
        v.to_owned()
    }
}

/// The windows a forecast covers: those whose horizons follow the cutoff `val_steps` steps
/// before each series' end; an error naming `data.val_steps` where there are none.
pub fn forecast_windows(
    windows: &kiln_data::Windows,
    val_steps: usize,
) -> Result<WindowedDataset, InferError> {
    let horizon = windows.manifest().horizon;
    let after = match val_steps >= horizon {
        true => Some(windows.forecast(val_steps)?),
        false => None,
    };
    let Some(after) = after.filter(|a| !a.is_empty()) else {
        return Err(InferError::Input(format!(
            "{}: no window's horizon follows a cutoff {val_steps} steps before each series' end \
             (data.val_steps = {val_steps}); set data.val_steps to the steps to forecast, at \
             least the horizon ({}), in series long enough for a window",
            windows.dir().display(),
            horizon
        )));
    };
    Ok(after)
}

#[cfg(test)]
mod tests {
    use super::csv_field;

    #[test]
    fn csv_fields_are_quoted_only_where_needed() {
        assert_eq!(csv_field("north"), "north");
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
    }
}
