//! Time-series windows for forecasters: long series per entity stored once, and samples that
//! are windows over them (an encoder length of history, a horizon to predict), read as the
//! named arrays a forecaster takes.
//!
//! `kiln data prepare --windows` ([`prepare_windows`]) reads a long-format CSV (one row per
//! entity and time step), sorts it into one series per group, and stores the series' values
//! column by column (`targets.npy`, `reals.npy`) with a `kiln-windows.json` manifest naming
//! each column's role. A window is an index range over a stored series, never a copy.
//! [`Windows::split`] cuts every series at its own time: the last `val_steps` steps are for
//! validation, a window trains when its horizon ends before that cutoff and validates when its
//! horizon starts after it, so nothing from the future reaches training. Per-series target
//! scales come from the training part only. The semantics follow
//! `pytorch_forecasting.TimeSeriesDataSet` with equal minimum and maximum lengths; where kiln
//! differs, the README's "Time-series windows" says.

mod build;
mod pages;
mod read;
mod table;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use build::{WindowsSource, prepare_windows};
pub use read::WindowedDataset;
pub use table::TableFormat;

use crate::shards::{MappedArray, map_file, open_npy};
use crate::{DType, DataError};

/// The manifest of a windowed dataset, in its directory.
pub const WINDOWS_FILE: &str = "kiln-windows.json";
/// The format name in [`WINDOWS_FILE`].
const FORMAT: &str = "kiln-windows";
/// The version this kiln writes and reads.
const VERSION: u32 = 1;
/// The stored target columns, `f32 [rows, targets]`.
const TARGETS_FILE: &str = "targets.npy";
/// The stored real columns (known, then unknown), `f32 [rows, reals]`.
const REALS_FILE: &str = "reals.npy";

/// What each of the CSV's columns is to a forecaster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowColumns {
    /// The integer time index: consecutive within a series, no gaps.
    pub time: String,
    /// The columns whose values together name a series (an entity).
    pub group: Vec<String>,
    /// The values to forecast.
    pub target: Vec<String>,
    /// Real columns known in advance (prices, calendar features): in the encoder and decoder.
    pub known: Vec<String>,
    /// Real columns observed only up to the present: in the encoder only. A target may be
    /// among them (its history as an input).
    pub unknown: Vec<String>,
    /// Categorical columns constant within a series.
    pub static_categoricals: Vec<String>,
}

/// How targets are scaled for the model's inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum TargetNormalizer {
    /// Targets as stored.
    #[default]
    None,
    /// Per series: minus the mean, divided by the standard deviation of the series' training
    /// part (pytorch-forecasting's `GroupNormalizer`).
    Group,
}

/// One stored series.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Series {
    /// Its group columns' values.
    pub key: Vec<String>,
    /// Its first row in the stored columns.
    pub start: usize,
    /// Its rows (time steps).
    pub len: usize,
    /// The time index of its first row; row `k` is at `first_time + k`.
    pub first_time: i64,
    /// Its static categoricals, each a number into [`WindowsManifest::categories`].
    pub statics: Vec<i64>,
}

/// `kiln-windows.json`: the columns' roles, the window lengths and the series.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowsManifest {
    pub format: String,
    pub version: u32,
    pub columns: WindowColumns,
    /// Time steps of history a window gives the model.
    pub encoder_length: usize,
    /// Time steps a window predicts.
    pub horizon: usize,
    /// The shortest history a window may give, where a series' end allows no full one (as
    /// pytorch-forecasting's `min_encoder_length`): absent, every window has `encoder_length`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_encoder_length: Option<usize>,
    pub normalize: TargetNormalizer,
    /// Rows stored, all series together.
    pub rows: usize,
    /// Each static categorical column's values, in sorted order: a value's number is its place.
    pub categories: BTreeMap<String, Vec<String>>,
    /// In the order of their keys.
    pub series: Vec<Series>,
}

impl WindowsManifest {
    /// The shortest history a window gives (the encoder length, unless variable).
    pub fn min_encoder(&self) -> usize {
        self.min_encoder_length.unwrap_or(self.encoder_length)
    }

    /// Windows a series of `len` steps holds.
    fn windows_in(&self, len: usize) -> usize {
        (len + 1).saturating_sub(self.min_encoder() + self.horizon)
    }

    /// Series too short for one window.
    pub fn short_series(&self) -> usize {
        self.series
            .iter()
            .filter(|s| self.windows_in(s.len) == 0)
            .count()
    }

    /// The real columns (known, then unknown).
    fn reals(&self) -> impl Iterator<Item = &String> {
        self.columns.known.iter().chain(&self.columns.unknown)
    }
}

/// An opened windowed dataset: the manifest and the mapped series, cut into training and
/// validation windows by [`Windows::split`].
#[derive(Debug, Clone)]
pub struct Windows {
    store: Arc<Store>,
}

/// The mapped columns.
#[derive(Debug)]
pub(crate) struct Store {
    pub manifest: WindowsManifest,
    pub dir: PathBuf,
    pub targets: MappedArray,
    pub reals: Option<MappedArray>,
}

impl Windows {
    /// Whether `dir` holds a windowed dataset.
    pub fn is_windows_dir(dir: &Path) -> bool {
        dir.join(WINDOWS_FILE).is_file()
    }

    /// Opens the windowed dataset in `dir`, checking its columns against the manifest.
    pub fn open(dir: &Path) -> Result<Self, DataError> {
        let path = dir.join(WINDOWS_FILE);
        let text = std::fs::read_to_string(&path)
            .map_err(|e| DataError::file(&path, format!("cannot read: {e}")))?;
        let manifest: WindowsManifest = serde_json::from_str(&text)
            .map_err(|e| DataError::file(&path, format!("not a windows manifest: {e}")))?;
        check_manifest(&path, &manifest)?;
        let columns = |file: &str, width: usize| -> Result<MappedArray, DataError> {
            let path = dir.join(file);
            let array = open_npy(&path, map_file(&path)?)?;
            let want = [manifest.rows, width];
            if array.dtype != DType::F32 || array.shape != want {
                return Err(DataError::file(
                    &path,
                    format!(
                        "holds {} {:?}; the manifest says f32 {want:?}",
                        array.dtype, array.shape
                    ),
                ));
            }
            Ok(array)
        };
        let targets = columns(TARGETS_FILE, manifest.columns.target.len())?;
        let width = manifest.reals().count();
        let reals = (width > 0)
            .then(|| columns(REALS_FILE, width))
            .transpose()?;
        let store = Store {
            manifest,
            dir: dir.to_owned(),
            targets,
            reals,
        };
        Ok(Self {
            store: Arc::new(store),
        })
    }

    /// The manifest.
    pub fn manifest(&self) -> &WindowsManifest {
        &self.store.manifest
    }

    /// The directory it was opened from.
    pub fn dir(&self) -> &Path {
        &self.store.dir
    }

    /// Training and validation windows, with every series cut `val_steps` before its end:
    /// a training window's horizon ends at or before the cutoff, a validation window's starts
    /// after it (its history may reach back before). Target scales come from the rows before
    /// each cutoff. `val_steps = 0`: every window trains and none validates.
    pub fn split(&self, val_steps: usize) -> Result<(WindowedDataset, WindowedDataset), DataError> {
        let m = &self.store.manifest;
        if val_steps > 0 && val_steps < m.horizon {
            return Err(DataError::InvalidConfig {
                key: "data.val_steps",
                value: val_steps.to_string(),
                expected: format!(
                    "0 (no validation) or at least the horizon ({}): a validation window's \
                     whole horizon lies in the last `val_steps` steps",
                    m.horizon
                ),
            });
        }
        let scales = read::scales(&self.store, val_steps)?;
        let (train, val) = read::split_ranges(m, val_steps);
        if train.is_empty() {
            return Err(DataError::InvalidConfig {
                key: "data.val_steps",
                value: val_steps.to_string(),
                expected: format!(
                    "fewer steps: no series keeps {} steps (encoder {} + horizon {}) before its \
                     last {val_steps}, so there is no training window",
                    m.min_encoder() + m.horizon,
                    m.min_encoder(),
                    m.horizon
                ),
            });
        }
        let dataset = |ranges| WindowedDataset::new(self.store.clone(), ranges, scales.clone());
        Ok((dataset(train), dataset(val)))
    }
}

impl Windows {
    /// The windows to forecast, with every series cut `val_steps` (at least the horizon)
    /// before its end: for each horizon that starts at the cutoff or later, one window with the
    /// longest history the series has (none of the shortened duplicates that validation
    /// windows of variable length include). Target scales come from the rows before each
    /// cutoff. Unlike [`Windows::split`], a series needs no training window.
    pub fn forecast(&self, val_steps: usize) -> Result<WindowedDataset, DataError> {
        let m = &self.store.manifest;
        if val_steps < m.horizon {
            return Err(DataError::InvalidConfig {
                key: "data.val_steps",
                value: val_steps.to_string(),
                expected: format!(
                    "at least the horizon ({}): the steps after each series' cutoff to forecast",
                    m.horizon
                ),
            });
        }
        let scales = read::scales(&self.store, val_steps)?;
        let runs = read::forecast_ranges(m, val_steps);
        Ok(WindowedDataset::new(self.store.clone(), runs, scales))
    }
}

/// An error unless the manifest is one this kiln reads and consistent with itself.
fn check_manifest(path: &Path, m: &WindowsManifest) -> Result<(), DataError> {
    let bad = |message: String| Err(DataError::file(path, message));
    if m.format != FORMAT || m.version != VERSION {
        return bad(format!(
            "is {} version {}; this kiln reads {FORMAT} version {VERSION}",
            m.format, m.version
        ));
    }
    let window = m.encoder_length.checked_add(m.horizon);
    if m.encoder_length == 0 || m.horizon == 0 || m.columns.target.is_empty() || window.is_none() {
        return bad(format!(
            "needs an encoder length and a horizon of at least 1 step, of sizes a series can \
             hold, and a target (it says encoder {}, horizon {}, {} target columns)",
            m.encoder_length,
            m.horizon,
            m.columns.target.len()
        ));
    }
    // A window's buffers are `encoder_length` and `horizon` steps long: neither may exceed
    // the rows the dataset holds (a manifest claiming 2³² steps asked for 192 GiB a window).
    if m.encoder_length > m.rows || m.horizon > m.rows {
        return bad(format!(
            "its encoder length ({}) and horizon ({}) must each be at most the {} rows it \
             holds: no window looks further back or ahead than the data",
            m.encoder_length, m.horizon, m.rows
        ));
    }
    if m.min_encoder_length
        .is_some_and(|n| n == 0 || n > m.encoder_length)
    {
        return bad(format!(
            "its min_encoder_length must be 1 to the encoder length ({})",
            m.encoder_length
        ));
    }
    let mut next = 0usize;
    for (k, s) in m.series.iter().enumerate() {
        let times_fit = i64::try_from(s.len)
            .ok()
            .and_then(|n| s.first_time.checked_add(n))
            .is_some();
        if s.start != next
            || s.len == 0
            || s.len > m.rows
            || !times_fit
            || s.statics.len() != m.columns.static_categoricals.len()
        {
            return bad(format!(
                "series[{k}] does not follow the one before it (start {}, {} rows, {} statics)",
                s.start,
                s.len,
                s.statics.len()
            ));
        }
        for (c, &code) in m.columns.static_categoricals.iter().zip(&s.statics) {
            let known = m.categories.get(c).map_or(0, Vec::len);
            if code < 0 || code as usize >= known {
                return bad(format!(
                    "series[{k}]'s `{c}` is {code}, outside the column's {known} categories"
                ));
            }
        }
        next = next.saturating_add(s.len);
    }
    if next != m.rows {
        return bad(format!(
            "its series hold {next} rows; `rows` says {}",
            m.rows
        ));
    }
    Ok(())
}
