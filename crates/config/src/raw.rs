//! Stage one: the layered values as the user wrote them, one struct per section, every field
//! optional, unknown keys rejected. The sections and [`KEYS`] are made from the key table
//! ([`crate::keys`]); this module holds the raw value types they use. Numbers may arrive as
//! strings from the environment (`KILN_TRAIN__LR=5e-4`), so numeric fields accept both.

use serde::{Deserialize, Deserializer, Serialize};

pub use crate::keys::{
    KEYS, RawCheckpoint, RawConfig, RawData, RawDevice, RawDistributed, RawInfer, RawModel,
    RawPerformance, RawProfiling, RawRun, RawServe, RawTrain,
};

#[derive(Deserialize)]
#[serde(untagged)]
enum NumOrString<T> {
    Num(T),
    Str(String),
}

/// A number as written: a number, or a string that parses as one (from the environment).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Num<T>(pub T);

impl<'de, T> Deserialize<'de> for Num<T>
where
    T: Deserialize<'de> + std::str::FromStr,
{
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match NumOrString::<T>::deserialize(d)? {
            NumOrString::Num(n) => Ok(Num(n)),
            NumOrString::Str(s) => s.trim().parse().map(Num).map_err(|_| {
                serde::de::Error::custom(format!("`{s}` is not a number of the right kind"))
            }),
        }
    }
}

/// Text as written, where a number is text too: an optional key's value (`model.output = 1`, an
/// index; `model.quantiles = 0.5`, one level).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(transparent)]
pub struct RawText(pub String);

/// One value as written: a number or text.
#[derive(Deserialize)]
#[serde(untagged)]
enum Scalar {
    Int(i64),
    Float(f64),
    Text(String),
}

impl Scalar {
    fn text(self) -> String {
        match self {
            Scalar::Int(n) => n.to_string(),
            Scalar::Float(x) => x.to_string(),
            Scalar::Text(s) => s,
        }
    }
}

impl<'de> Deserialize<'de> for RawText {
    /// Text, a number, or a list of them (`[64, 64, 32]` in a file: "64,64,32").
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            One(Scalar),
            Many(Vec<Scalar>),
        }
        match Written::deserialize(d) {
            Ok(Written::One(v)) => Ok(RawText(v.text())),
            Ok(Written::Many(vs)) => Ok(RawText(
                vs.into_iter()
                    .map(Scalar::text)
                    .collect::<Vec<_>>()
                    .join(","),
            )),
            Err(_) => Err(serde::de::Error::custom(
                "expected text, a number, or a list of them",
            )),
        }
    }
}

/// A count as written (`train.batch_size`, `data.num_workers`): a number, or a word ("auto")
/// checked in validation.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum RawCount {
    Number(u64),
    Text(String),
}

impl RawCount {
    /// Whether it is the word "auto" (any case, surrounding spaces ignored).
    pub fn is_auto(&self) -> bool {
        matches!(self, RawCount::Text(t) if t.trim().eq_ignore_ascii_case("auto"))
    }

    /// As written, for error messages: the number, or the quoted word.
    pub fn text(&self) -> String {
        match self {
            RawCount::Number(n) => n.to_string(),
            RawCount::Text(text) => format!("{text:?}"),
        }
    }
}

impl<'de> Deserialize<'de> for RawCount {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match NumOrString::<u64>::deserialize(d)? {
            NumOrString::Num(n) => RawCount::Number(n),
            NumOrString::Str(s) => match s.trim().parse::<u64>() {
                Ok(n) => RawCount::Number(n),
                Err(_) => RawCount::Text(s),
            },
        })
    }
}

/// `checkpoint.keep_best` as written: true or false, or a metric's name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum RawKeepBest {
    Flag(bool),
    Text(String),
}

impl<'de> Deserialize<'de> for RawKeepBest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Flag(bool),
            Text(String),
        }
        Ok(match Either::deserialize(d)? {
            Either::Flag(b) => RawKeepBest::Flag(b),
            Either::Text(s) => match s.trim().to_ascii_lowercase().as_str() {
                "true" => RawKeepBest::Flag(true),
                "false" => RawKeepBest::Flag(false),
                _ => RawKeepBest::Text(s),
            },
        })
    }
}

/// A list of widths as written: "256,128", or one width as a number (`--set model.hidden=64`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct RawWidths(pub String);

impl<'de> Deserialize<'de> for RawWidths {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(RawWidths(match NumOrString::<u64>::deserialize(d)? {
            NumOrString::Num(n) => n.to_string(),
            NumOrString::Str(s) => s,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_list_exactly_the_fields_of_every_section() {
        let sections = [
            "device",
            "performance",
            "data",
            "model",
            "train",
            "checkpoint",
            "infer",
            "serve",
            "profiling",
            "run",
        ];
        for section in sections {
            // serde lists a struct's fields when it meets an unknown one.
            let text = format!("[{section}]\nzzz_unknown = 1\n");
            let err = toml::from_str::<RawConfig>(&text).unwrap_err().to_string();
            let expected_part = err.split("expected").nth(1).unwrap_or("");
            let fields: Vec<String> = expected_part
                .split('`')
                .skip(1)
                .step_by(2)
                .map(|f| format!("{section}.{f}"))
                .collect();
            // A nested section is one field of its parent (`infer.sliding_window`).
            let mut keys: Vec<String> = vec![];
            for key in KEYS
                .iter()
                .filter_map(|k| k.strip_prefix(&format!("{section}.")))
            {
                let field = format!("{section}.{}", key.split('.').next().unwrap_or(key));
                if !keys.contains(&field) {
                    keys.push(field);
                }
            }
            assert_eq!(fields, keys, "section {section}: {err}");
        }
    }
}
