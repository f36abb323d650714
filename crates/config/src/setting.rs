//! How one configuration key is read, checked and shown, and the `config_keys!` macro that turns
//! the key table ([`crate::keys`]) into the raw sections, the key list, the defaults layer,
//! per-key validation and the `--explain` entries.
//!
//! A key's type decides what its raw field holds ([`Setting::Raw`], lenient where the
//! environment gives strings) and how it is parsed; a key's row in the table adds its default,
//! any check on the parsed value and where `--explain` reads it in the [`RunPlan`].

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use kiln_core::DeviceRequest;
use kiln_core::OptionError;
use kiln_core::options::{
    AmpDtype, AttentionKernel, BlendMode, CudaGraphs, Determinism, InferEngineKind, LossKind,
    MatmulPrecision, MetricMode, MetricName, OptimizerKind, OutputDevice, PadMode, ProfileUnit,
    ScheduleKind,
};

use crate::ConfigError;
use crate::plan::{ModelKind, Provenance};
use crate::raw::{Num, RawCount, RawKeepBest, RawText, RawWidths};

/// A key's value type: what the raw layer holds for it and how that becomes the value.
pub trait Setting: Sized {
    /// What the raw section holds.
    type Raw;
    /// The value, or what is valid instead (the key, value and layer are added by the caller).
    fn parse(raw: Self::Raw) -> Result<Self, String>;
    /// The raw value as an error message shows it: numbers plain, text quoted.
    fn raw_text(raw: &Self::Raw) -> String;
    /// The value of a key no layer sets: `None` (an error) unless the key is optional.
    fn absent() -> Option<Self> {
        None
    }
    /// False for a value no check accepts (a non-finite number).
    fn finite(&self) -> bool {
        true
    }
}

impl Setting for bool {
    type Raw = bool;
    fn parse(raw: bool) -> Result<Self, String> {
        Ok(raw)
    }
    fn raw_text(raw: &bool) -> String {
        raw.to_string()
    }
}

impl Setting for u64 {
    type Raw = Num<u64>;
    fn parse(raw: Num<u64>) -> Result<Self, String> {
        Ok(raw.0)
    }
    fn raw_text(raw: &Num<u64>) -> String {
        raw.0.to_string()
    }
}

impl Setting for f64 {
    type Raw = Num<f64>;
    fn parse(raw: Num<f64>) -> Result<Self, String> {
        Ok(raw.0)
    }
    fn raw_text(raw: &Num<f64>) -> String {
        raw.0.to_string()
    }
    fn finite(&self) -> bool {
        self.is_finite()
    }
}

/// A TCP port (`serve.port`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Port(pub u16);

impl Setting for Port {
    type Raw = Num<u64>;
    fn parse(raw: Num<u64>) -> Result<Self, String> {
        u16::try_from(raw.0)
            .map(Port)
            .map_err(|_| "must be a TCP port, 0 to 65535 (0 = any free port)".to_owned())
    }
    fn raw_text(raw: &Num<u64>) -> String {
        raw.0.to_string()
    }
}

impl Setting for String {
    type Raw = String;
    fn parse(raw: String) -> Result<Self, String> {
        Ok(raw)
    }
    fn raw_text(raw: &String) -> String {
        format!("{raw:?}")
    }
}

impl Setting for PathBuf {
    type Raw = String;
    fn parse(raw: String) -> Result<Self, String> {
        Ok(PathBuf::from(raw))
    }
    fn raw_text(raw: &String) -> String {
        format!("{raw:?}")
    }
}

/// An optional key: absent is a value (`None`), shown as `(none)`.
impl<T: Setting<Raw = String>> Setting for Option<T> {
    type Raw = RawText;
    fn parse(raw: RawText) -> Result<Self, String> {
        T::parse(raw.0).map(Some)
    }
    fn raw_text(raw: &RawText) -> String {
        format!("{:?}", raw.0)
    }
    fn absent() -> Option<Self> {
        Some(None)
    }
}

impl Setting for IpAddr {
    type Raw = String;
    fn parse(raw: String) -> Result<Self, String> {
        raw.trim().parse().map_err(|_| {
            "must be an IP address such as 127.0.0.1 (this machine only) or 0.0.0.0 (every \
             interface)"
                .to_owned()
        })
    }
    fn raw_text(raw: &String) -> String {
        format!("{raw:?}")
    }
}

impl Setting for DeviceRequest {
    type Raw = String;
    fn parse(raw: String) -> Result<Self, String> {
        raw.parse()
            .map_err(|_| "use one of auto, cpu, cuda, cuda:N, mps".to_owned())
    }
    fn raw_text(raw: &String) -> String {
        format!("{raw:?}")
    }
}

/// The option enums: their one parse, and "use a, b or c" when the word is not one of them.
macro_rules! option_settings {
    ($($option:ty),* $(,)?) => {$(
        impl Setting for $option {
            type Raw = String;
            fn parse(raw: String) -> Result<Self, String> {
                raw.parse().map_err(|e: OptionError| e.usage())
            }
            fn raw_text(raw: &String) -> String {
                format!("{raw:?}")
            }
        }

        impl Show for $option {
            fn show(&self) -> String {
                self.to_string()
            }
        }
    )*};
}

option_settings!(
    MatmulPrecision,
    Determinism,
    AmpDtype,
    CudaGraphs,
    AttentionKernel,
    InferEngineKind,
    ProfileUnit,
    OptimizerKind,
    ScheduleKind,
    LossKind,
    BlendMode,
    PadMode,
    OutputDevice,
    MetricMode,
);

/// `infer.sliding_window.roi`: a window's spatial size, comma separated, or one number for every
/// dimension; a size of 0 or less stands for the input's own size in that dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Roi(pub Vec<i64>);

impl Setting for Roi {
    type Raw = RawText;
    fn parse(raw: RawText) -> Result<Self, String> {
        let sizes: Option<Vec<i64>> = raw.0.split(',').map(|w| w.trim().parse().ok()).collect();
        sizes.filter(|v| !v.is_empty()).map(Roi).ok_or_else(|| {
            "use comma-separated window sizes, one per spatial dimension (\"64,64,32\"), or one \
             for every dimension (\"64\"); 0 or less takes the input's own size"
                .to_owned()
        })
    }
    fn raw_text(raw: &RawText) -> String {
        format!("{:?}", raw.0)
    }
}

/// Window sizes as written: "64,64,32".
impl Show for Vec<i64> {
    fn show(&self) -> String {
        self.iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Comma-separated widths of at least 1 (`model.hidden`, `model.channels`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Widths(pub Vec<u64>);

impl Setting for Widths {
    type Raw = RawWidths;
    fn parse(raw: RawWidths) -> Result<Self, String> {
        let parsed: Option<Vec<u64>> = raw
            .0
            .split(',')
            .map(|w| w.trim().parse::<u64>().ok().filter(|&w| w >= 1))
            .collect();
        parsed
            .filter(|v| !v.is_empty())
            .map(Widths)
            .ok_or_else(|| "use comma-separated widths of at least 1, like \"256,256\"".to_owned())
    }
    fn raw_text(raw: &RawWidths) -> String {
        format!("{:?}", raw.0)
    }
}

/// `model.quantiles`: the quantile levels of a forecaster's last output dimension, comma
/// separated, each in (0, 1) and rising ("0.1,0.5,0.9").
#[derive(Debug, Clone, PartialEq)]
pub struct Quantiles(pub Vec<f64>);

impl Setting for Quantiles {
    type Raw = String;
    fn parse(raw: String) -> Result<Self, String> {
        let levels: Option<Vec<f64>> = raw
            .split(',')
            .map(|q| {
                q.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|q| *q > 0.0 && *q < 1.0)
            })
            .collect();
        levels
            .filter(|v| v.windows(2).all(|w| w[0] < w[1]))
            .map(Quantiles)
            .ok_or_else(|| {
                "use comma-separated quantile levels in (0, 1), rising, like \"0.1,0.5,0.9\""
                    .to_owned()
            })
    }
    fn raw_text(raw: &String) -> String {
        format!("{raw:?}")
    }
}

/// `train.batch_size`: a number, or a search on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchSize {
    Fixed(u64),
    Auto,
}

impl Setting for BatchSize {
    type Raw = RawCount;
    fn parse(raw: RawCount) -> Result<Self, String> {
        match raw {
            RawCount::Number(n) if n >= 1 => Ok(BatchSize::Fixed(n)),
            RawCount::Number(_) => Err("must be at least 1".to_owned()),
            auto if auto.is_auto() => Ok(BatchSize::Auto),
            RawCount::Text(_) => Err(
                "use a whole number of at least 1, or \"auto\" to search this machine for one"
                    .to_owned(),
            ),
        }
    }
    fn raw_text(raw: &RawCount) -> String {
        raw.text()
    }
}

/// `train.lr` as written: a number (or text that reads as one, from the environment), or a
/// word ("auto") checked in validation.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum RawRate {
    Number(f64),
    Text(String),
}

impl<'de> serde::Deserialize<'de> for RawRate {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Written {
            Number(f64),
            Text(String),
        }
        Ok(match Written::deserialize(d)? {
            Written::Number(x) => RawRate::Number(x),
            Written::Text(t) => match t.trim().parse::<f64>() {
                Ok(x) => RawRate::Number(x),
                Err(_) => RawRate::Text(t),
            },
        })
    }
}

/// `train.lr`: a learning rate, or `auto`: a learning-rate range test on the run's model and
/// data before training (after `train.batch_size = "auto"`'s search).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LearningRate {
    Fixed(f64),
    Auto,
}

impl Setting for LearningRate {
    type Raw = RawRate;
    fn parse(raw: RawRate) -> Result<Self, String> {
        match raw {
            RawRate::Number(x) if x.is_finite() && x > 0.0 => Ok(LearningRate::Fixed(x)),
            RawRate::Text(t) if t.trim().eq_ignore_ascii_case("auto") => Ok(LearningRate::Auto),
            _ => Err(
                "use a number > 0, or \"auto\" to find one with a range test before \
                 training"
                    .to_owned(),
            ),
        }
    }
    fn raw_text(raw: &RawRate) -> String {
        match raw {
            RawRate::Number(x) => x.to_string(),
            RawRate::Text(t) => format!("{t:?}"),
        }
    }
}

/// `data.num_workers`: a fixed number of loader threads (0 reads on the training thread), or
/// `auto`: measured on the first training steps, the profile's count the ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workers {
    Fixed(u64),
    Auto,
}

impl Setting for Workers {
    type Raw = RawCount;
    fn parse(raw: RawCount) -> Result<Self, String> {
        match raw {
            RawCount::Number(n) => Ok(Workers::Fixed(n)),
            auto if auto.is_auto() => Ok(Workers::Auto),
            RawCount::Text(_) => Err("use a whole number (0 reads batches on the training \
                 thread), or \"auto\" to measure the fastest count on the first steps"
                .to_owned()),
        }
    }
    fn raw_text(raw: &RawCount) -> String {
        raw.text()
    }
}

/// `data.val_steps`: for a windowed time-series dataset, how many last steps of every series
/// are for validation: a number (0: none), or `horizon`, the dataset's own horizon (one
/// validation window per series).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValSteps {
    Horizon,
    Steps(u64),
}

impl Setting for ValSteps {
    type Raw = RawCount;
    fn parse(raw: RawCount) -> Result<Self, String> {
        match raw {
            RawCount::Number(n) => Ok(ValSteps::Steps(n)),
            RawCount::Text(t) if t.trim().eq_ignore_ascii_case("horizon") => Ok(ValSteps::Horizon),
            RawCount::Text(_) => Err("use a whole number of time steps (0: no validation), or \
                 \"horizon\" for the dataset's horizon"
                .to_owned()),
        }
    }
    fn raw_text(raw: &RawCount) -> String {
        raw.text()
    }
}

/// `train.max_time`: how long a run may train, counted over its resumes: a number of seconds,
/// a duration with units (`"90m"`, `"1h30m"`, `"2d"`), Lightning's `"DD:HH:MM:SS"` (or
/// `"HH:MM:SS"`), or `0`/`"off"` for no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeLimit(pub Option<std::time::Duration>);

impl TimeLimit {
    fn parse_text(text: &str) -> Option<u64> {
        let t = text.trim().to_ascii_lowercase();
        if t == "off" || t == "none" {
            return Some(0);
        }
        if t.contains(':') {
            let parts: Option<Vec<u64>> = t.split(':').map(|p| p.trim().parse().ok()).collect();
            let parts = parts.filter(|p| (3..=4).contains(&p.len()))?;
            let scale = [86_400, 3_600, 60, 1];
            let scale = &scale[4 - parts.len()..];
            return parts
                .iter()
                .zip(scale)
                .try_fold(0u64, |acc, (v, s)| acc.checked_add(v.checked_mul(*s)?));
        }
        let mut total = 0u64;
        let mut number = String::new();
        for c in t.chars().filter(|c| !c.is_whitespace()) {
            match c {
                '0'..='9' => number.push(c),
                'd' | 'h' | 'm' | 's' if !number.is_empty() => {
                    let unit = match c {
                        'd' => 86_400,
                        'h' => 3_600,
                        'm' => 60,
                        _ => 1,
                    };
                    total = total.checked_add(number.parse::<u64>().ok()?.checked_mul(unit)?)?;
                    number.clear();
                }
                _ => return None,
            }
        }
        number.is_empty().then_some(total)
    }
}

impl std::fmt::Display for TimeLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Some(d) = self.0 else {
            return f.write_str("off");
        };
        let s = d.as_secs();
        let (days, h, m, s) = (s / 86_400, s % 86_400 / 3_600, s % 3_600 / 60, s % 60);
        write!(f, "{days:02}:{h:02}:{m:02}:{s:02}")
    }
}

impl Setting for TimeLimit {
    type Raw = RawCount;
    fn parse(raw: RawCount) -> Result<Self, String> {
        let seconds = match &raw {
            RawCount::Number(n) => Some(*n),
            RawCount::Text(t) => Self::parse_text(t),
        };
        let seconds = seconds.ok_or_else(|| {
            "use seconds (3600), a duration with units (\"90m\", \"1h30m\", \"2d\"), \
             \"DD:HH:MM:SS\", or 0 / \"off\" for no limit"
                .to_owned()
        })?;
        Ok(TimeLimit(
            (seconds > 0).then(|| std::time::Duration::from_secs(seconds)),
        ))
    }
    fn raw_text(raw: &RawCount) -> String {
        raw.text()
    }
}

/// `checkpoint.keep_best`: besides the newest checkpoints, keep the best one by a metric —
/// `true`: the task's own (validation accuracy where there is one, else the validation loss),
/// or a metric named ([`MetricName`]); `false`: none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepBest {
    Off,
    TaskDefault,
    By(MetricName),
}

impl std::fmt::Display for KeepBest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeepBest::Off => f.write_str("false"),
            KeepBest::TaskDefault => f.write_str("true"),
            KeepBest::By(m) => write!(f, "{m}"),
        }
    }
}

impl Setting for KeepBest {
    type Raw = RawKeepBest;
    fn parse(raw: RawKeepBest) -> Result<Self, String> {
        match raw {
            RawKeepBest::Flag(true) => Ok(KeepBest::TaskDefault),
            RawKeepBest::Flag(false) => Ok(KeepBest::Off),
            RawKeepBest::Text(text) => text.parse().map(KeepBest::By).map_err(|_| {
                format!(
                    "use true (the task's metric), false, or a metric: {}",
                    MetricName::NAMES.join(", ")
                )
            }),
        }
    }
    fn raw_text(raw: &RawKeepBest) -> String {
        match raw {
            RawKeepBest::Flag(b) => b.to_string(),
            RawKeepBest::Text(text) => format!("{text:?}"),
        }
    }
}

/// `model.name`: a built-in model, or the path of the user's own model: a `torch.export`
/// program (`.pt2`) or a TorchScript file (`.pt`, `.pth`, `.ts`, or any other existing file;
/// the file's content decides when it loads).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelChoice {
    pub kind: ModelKind,
    pub script: Option<PathBuf>,
}

impl Setting for ModelChoice {
    type Raw = String;
    fn parse(name: String) -> Result<Self, String> {
        if let Ok(kind) = name.parse::<ModelKind>() {
            return Ok(ModelChoice { kind, script: None });
        }
        let path = PathBuf::from(name.trim());
        let extension = path.extension().and_then(|e| e.to_str());
        let kind = match extension {
            Some("pt2") => ModelKind::Program,
            Some("pt" | "pth" | "ts") => ModelKind::TorchScript,
            // Any other existing file: what it holds is told by its content when it loads.
            _ if path.is_file() => ModelKind::TorchScript,
            _ => {
                return Err(
                    "use transformer, mlp, convnet or unet3d, or the path of your own model: a program \
                     saved with torch.export.save (.pt2), or a TorchScript file (.pt)"
                        .to_owned(),
                );
            }
        };
        Ok(ModelChoice {
            kind,
            script: Some(path),
        })
    }
    fn raw_text(raw: &String) -> String {
        format!("{raw:?}")
    }
}

/// A plan value as `--explain`, reports and `config.json` print it.
pub trait Show {
    fn show(&self) -> String;
}

macro_rules! show_by_display {
    ($($t:ty),*) => {$(
        impl Show for $t {
            fn show(&self) -> String {
                self.to_string()
            }
        }
    )*};
}

show_by_display!(
    bool,
    u16,
    u64,
    f64,
    String,
    IpAddr,
    DeviceRequest,
    KeepBest,
    TimeLimit
);

impl Show for PathBuf {
    fn show(&self) -> String {
        self.display().to_string()
    }
}

/// How an optional key without a value is shown (and written into a run's `config.json`).
pub const UNSET: &str = "(none)";

impl<T: Show> Show for Option<T> {
    fn show(&self) -> String {
        self.as_ref().map_or_else(|| UNSET.to_owned(), Show::show)
    }
}

/// Quantile levels as written: "0.1,0.5,0.9".
impl Show for Vec<f64> {
    fn show(&self) -> String {
        self.iter()
            .map(f64::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Widths as written: "256,256".
impl Show for Vec<u64> {
    fn show(&self) -> String {
        self.iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Reads raw values into settings, with errors that name the key, the value, what is valid and
/// the layer that set it.
#[derive(Debug)]
pub(crate) struct Checker<'a> {
    provenance: &'a BTreeMap<String, Provenance>,
}

impl<'a> Checker<'a> {
    pub(crate) fn new(provenance: &'a BTreeMap<String, Provenance>) -> Self {
        Self { provenance }
    }

    fn source(&self, key: &str) -> String {
        self.provenance.get(key).map_or_else(
            || "kiln's built-in defaults".to_owned(),
            |p| p.source.clone(),
        )
    }

    /// `key` = `value` is invalid: `expected`.
    pub(crate) fn invalid(&self, key: &str, value: String, expected: String) -> ConfigError {
        ConfigError::InvalidValue {
            key: key.to_owned(),
            value,
            expected,
            set_by: self.source(key),
        }
    }

    /// The setting `key` from its raw value, and that value as errors show it.
    pub(crate) fn read<T: Setting>(
        &self,
        key: &str,
        raw: Option<T::Raw>,
    ) -> Result<(T, String), ConfigError> {
        let Some(raw) = raw else {
            return T::absent()
                .map(|v| (v, UNSET.to_owned()))
                .ok_or_else(|| ConfigError::Other(format!("`{key}` has no value in any layer")));
        };
        let text = T::raw_text(&raw);
        match T::parse(raw) {
            Ok(value) => Ok((value, text)),
            Err(expected) => Err(self.invalid(key, text, expected)),
        }
    }
}

/// One section of the key table (top-level, or nested under another as `parent.sub`): its raw
/// struct (with its nested sections' raw structs as fields), its values and their read, and the
/// module of its key constants. `$path` is the section's dotted name as a string literal.
macro_rules! config_section {
    (
        [$($smeta:meta),*] $keymod:ident, $path:expr, ($raw:ident, $values:ident)
        [$($child:ident : $child_raw:ident),*]
        {
            $(
                $(#[$kmeta:meta])*
                $key:ident : $ty:ty $(= $default:expr)? => $show:expr
                    $(, valid |$v:ident| $cond:expr => $expected:literal)? ;
            )*
        }
    ) => {
        $(#[$smeta])*
        #[doc = "\n\nStage one: every field optional, unknown keys rejected."]
        #[derive(Debug, Default, Clone, serde::Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct $raw {
            $( $(#[$kmeta])* pub $key: Option<<$ty as $crate::setting::Setting>::Raw>, )*
            $( pub $child: $child_raw, )*
        }

        /// The section's values, each parsed and checked on its own.
        #[derive(Debug)]
        pub(crate) struct $values {
            $( pub(crate) $key: $ty, )*
        }

        impl $values {
            fn read(
                raw: $raw,
                check: &$crate::setting::Checker<'_>,
            ) -> Result<Self, $crate::ConfigError> {
                Ok(Self {
                    $( $key: {
                        let key = concat!($path, ".", stringify!($key));
                        let (value, _text) = check.read::<$ty>(key, raw.$key)?;
                        $(
                            let $v = &value;
                            if !($crate::setting::Setting::finite($v) && $cond) {
                                return Err(check.invalid(key, _text, $expected.to_owned()));
                            }
                        )?
                        value
                    }, )*
                })
            }
        }

        /// The keys of this section as constants, for code that names a key.
        #[allow(non_upper_case_globals)]
        pub mod $keymod {
            $(
                $(#[$kmeta])*
                pub const $key: &str = concat!($path, ".", stringify!($key));
            )*
        }
    };
}

pub(crate) use config_section;

/// Turns the key table into everything keyed by it; see [`crate::keys`] for the row syntax. A
/// section may hold nested sections (`infer.sliding_window`): the parent names each child's raw
/// struct in brackets after its own, and the child is declared after every top-level section,
/// under `@nested`, as `alias = parent.sub (Raw, Values) { rows }`; its keys read
/// `parent.sub.key` and its constants live in `keys::alias`.
macro_rules! config_keys {
    (
        plan = $p:ident;
        $(
            $(#[$smeta:meta])*
            $section:ident ($raw:ident, $values:ident)
            $([$($child:ident : $child_raw:ident),* $(,)?])?
            {
                $(
                    $(#[$kmeta:meta])*
                    $key:ident : $ty:ty $(= $default:expr)? => $show:expr
                        $(, valid |$v:ident| $cond:expr => $expected:literal)? ;
                )*
            }
        )*
        @nested {
            $(
                $(#[$nmeta:meta])*
                $alias:ident = $parent:ident . $sub:ident ($nraw:ident, $nvalues:ident) {
                    $(
                        $(#[$nkmeta:meta])*
                        $nkey:ident : $nty:ty $(= $ndefault:expr)? => $nshow:expr
                            $(, valid |$nv:ident| $ncond:expr => $nexpected:literal)? ;
                    )*
                }
            )*
        }
    ) => {
        $(
            $crate::setting::config_section! {
                [$($smeta),*] $section, stringify!($section), ($raw, $values)
                [$($($child : $child_raw),*)?]
                {
                    $(
                        $(#[$kmeta])*
                        $key : $ty $(= $default)? => $show
                            $(, valid |$v| $cond => $expected)? ;
                    )*
                }
            }
        )*
        $(
            $crate::setting::config_section! {
                [$($nmeta),*] $alias, concat!(stringify!($parent), ".", stringify!($sub)),
                ($nraw, $nvalues) []
                {
                    $(
                        $(#[$nkmeta])*
                        $nkey : $nty $(= $ndefault)? => $nshow
                            $(, valid |$nv| $ncond => $nexpected)? ;
                    )*
                }
            }
        )*

        /// Every top-level section; the field names are the keys users write.
        #[derive(Debug, Default, Clone, serde::Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct RawConfig {
            $( pub $section: $raw, )*
        }

        /// Every valid key, as `section.key` (nested: `section.sub.key`), in the order
        /// `--explain` shows them.
        pub const KEYS: &[&str] = &[
            $( $( concat!(stringify!($section), ".", stringify!($key)), )* )*
            $( $( concat!(stringify!($parent), ".", stringify!($sub), ".", stringify!($nkey)), )* )*
        ];

        /// Every section's values, each key parsed and checked on its own.
        #[derive(Debug)]
        pub(crate) struct Values {
            $( pub(crate) $section: $values, )*
            $( pub(crate) $alias: $nvalues, )*
        }

        impl Values {
            pub(crate) fn read(
                raw: RawConfig,
                check: &$crate::setting::Checker<'_>,
            ) -> Result<Self, $crate::ConfigError> {
                // (The nested sections' raw values are taken before their parents move.)
                $( let $alias = raw.$parent.$sub.clone(); )*
                Ok(Self {
                    $( $section: $values::read(raw.$section, check)?, )*
                    $( $alias: $nvalues::read($alias, check)?, )*
                })
            }
        }

        /// kiln's built-in defaults, the lowest layer.
        pub(crate) fn defaults() -> $crate::layers::NamedLayer {
            let layer = $crate::layers::NamedLayer::defaults();
            $( $( $(
                let layer = layer.set(
                    concat!(stringify!($section), ".", stringify!($key)),
                    $default,
                );
            )? )* )*
            $( $( $(
                let layer = layer.set(
                    concat!(stringify!($parent), ".", stringify!($sub), ".", stringify!($nkey)),
                    $ndefault,
                );
            )? )* )*
            layer
        }

        impl $crate::plan::RunPlan {
            /// Every key with its resolved value as text, in the order of [`KEYS`].
            pub fn entries(&self) -> Vec<(&'static str, String)> {
                let $p = self;
                vec![
                    $( $( (
                        concat!(stringify!($section), ".", stringify!($key)),
                        $crate::setting::Show::show(&$show),
                    ), )* )*
                    $( $( (
                        concat!(stringify!($parent), ".", stringify!($sub), ".", stringify!($nkey)),
                        $crate::setting::Show::show(&$nshow),
                    ), )* )*
                ]
            }
        }
    };
}

pub(crate) use config_keys;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn limit(raw: RawCount) -> Result<Option<u64>, String> {
        TimeLimit::parse(raw).map(|t| t.0.map(|d| d.as_secs()))
    }

    #[test]
    fn a_time_limit_reads_seconds_units_and_lightnings_clock_form() {
        let text = |t: &str| limit(RawCount::Text(t.to_owned()));
        assert_eq!(limit(RawCount::Number(90)), Ok(Some(90)));
        assert_eq!(limit(RawCount::Number(0)), Ok(None));
        assert_eq!(text("off"), Ok(None));
        assert_eq!(text("1h30m"), Ok(Some(5_400)));
        assert_eq!(text("2d 1s"), Ok(Some(172_801)));
        assert_eq!(text("45s"), Ok(Some(45)));
        assert_eq!(text("00:01:30:00"), Ok(Some(5_400)));
        assert_eq!(text("01:30:00"), Ok(Some(5_400)));
        for bad in ["90x", "h", "1:2", "1h30", "-5m", "1:2:3:4:5"] {
            assert!(text(bad).is_err(), "{bad}");
        }
        let shown = TimeLimit(Some(Duration::from_secs(93_784))).to_string();
        assert_eq!(shown, "01:02:03:04");
        assert_eq!(TimeLimit(None).to_string(), "off");
    }
}
